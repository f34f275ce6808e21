"""Two configs in one checkout, data replaced under old dates, an incomplete images folder: each replayed in
Snakemake on small demo data, building only the targets it needs (README, "Several configs in one checkout",
"Changed data rebuilds what was built from it", "An incomplete images folder stops the image stage")."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.io import read_table
from verbmirage.core.schemas import PREDICTIONS
from verbmirage.data.demo import DemoSizes, write_demo_hico
from workflow_run import REPO, planned_jobs, write_config

pytestmark = pytest.mark.slow

OLD = (1442700000, 1442700000)  # 2015-09-19: the dates `tar x`, `cp -a` and `rsync -a` keep
SMALL = DemoSizes(train=20, test=12, seed=7)


def _small(config):
    config["demo"].update(train_images=20, test_images=12)
    config["job_server"] = False


def _other_config(workdir: Path, name: str, root: str) -> Path:
    """A copy of the demo's config as a new user makes one: another file name, HICO at ``root``."""
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    config["datasets"]["hico"] = {"root": root, "det_root": f"{root}_det"}  # as write_demo_hico lays them
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _snakemake(workdir: Path, configfile: Path, *targets: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *targets, "--snakefile", str(REPO / "Snakefile"), "--directory",
         str(workdir), "--configfile", str(configfile), "--cores", "1"],
        capture_output=True, text=True, timeout=600,
    )


def _build(workdir: Path, configfile: Path, *targets: str) -> None:
    result = _snakemake(workdir, configfile, *targets)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _backdate(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        os.utime(path, OLD, follow_symlinks=False)


def test_a_second_config_builds_into_its_own_tree_and_leaves_the_demo_done(tmp_path):
    """A copy of config.yaml pointing at other data builds results/<file name>/; the demo's question set is
    untouched and a dry run of the demo has nothing to do (it had 141 of 179 jobs to redo)."""
    demo = write_config(tmp_path, _small)
    question_set = "results/benchmark/hico/yn_obj.parquet"
    _build(tmp_path, demo, question_set)
    built = (tmp_path / question_set).read_bytes(), (tmp_path / question_set).stat().st_mtime_ns
    write_demo_hico(tmp_path / "data/hico_real", tmp_path / "data/hico_real_det", SMALL)
    real = _other_config(tmp_path, "real", "data/hico_real")
    _build(tmp_path, real, "results/real/benchmark/hico/yn_obj.parquet")
    assert (tmp_path / "results/real/benchmark/hico/yn_obj.parquet").read_bytes() != built[0]
    assert (tmp_path / "logs/real/question_set/hico/yn_obj.log").is_file()
    assert ((tmp_path / question_set).read_bytes(), (tmp_path / question_set).stat().st_mtime_ns) == built
    assert planned_jobs(tmp_path, demo, targets=[question_set]) == []


def test_data_replaced_under_old_dates_rebuilds_the_question_sets_and_images(tmp_path):
    """Probe 39: question sets and clean images built, then the data folder replaced by other data with 2015
    dates; the plan rebuilds both (it said "Nothing to be done"). Images alone replaced: the images only."""
    write_config(tmp_path, _small)
    write_demo_hico(tmp_path / "data/hico2", tmp_path / "data/hico2_det", SMALL)
    _backdate(tmp_path / "data")
    config = _other_config(tmp_path, "swap", "data/hico2")
    targets = ["results/swap/benchmark/hico/yn_obj.parquet", "results/swap/images/hico/clean"]
    _build(tmp_path, config, *targets)
    assert planned_jobs(tmp_path, config, targets=targets) == []

    kept = tmp_path / "kept"
    shutil.move(tmp_path / "data/hico2", kept)
    write_demo_hico(tmp_path / "data/hico2", tmp_path / "data/hico2_det", DemoSizes(train=20, test=12, seed=11))
    _backdate(tmp_path / "data")
    rules = {rule for rule, _ in planned_jobs(tmp_path, config, targets=targets)}
    assert {"question_set", "image_condition"} <= rules, rules

    shutil.rmtree(tmp_path / "data/hico2/images")  # the old labels back, only the images swapped
    shutil.move(kept / "anno.mat", tmp_path / "data/hico2/anno.mat")
    shutil.move(kept / "images", tmp_path / "data/hico2/images")
    (tmp_path / "data/hico2/images/test2015/HICO_test2015_00000001.jpg").write_bytes(
        (tmp_path / "data/hico2/images/test2015/HICO_test2015_00000002.jpg").read_bytes())
    _backdate(tmp_path / "data")
    rules = {rule for rule, _ in planned_jobs(tmp_path, config, targets=targets)}
    assert rules == {"image_condition"}, rules


def test_missing_images_stop_the_image_stage_naming_them(tmp_path):
    """The real annotation with only some of its images: the image condition job stops, naming how many are
    missing and the first few, before any model job could start (they all take its folder as input)."""
    write_config(tmp_path, _small)
    write_demo_hico(tmp_path / "data/hico_part", tmp_path / "data/hico_part_det", SMALL)
    for index in (3, 5, 6):
        (tmp_path / f"data/hico_part/images/test2015/HICO_test2015_{index:08d}.jpg").unlink()
    config = _other_config(tmp_path, "partial", "data/hico_part")
    result = _snakemake(tmp_path, config, "results/partial/images/hico/clean")
    assert result.returncode != 0
    log = (tmp_path / "logs/partial/image_condition/hico/clean.log").read_text()
    assert "MissingImagesError: condition clean: 3 of the 12 images the question sets ask about are missing " \
           "under data/hico_part (first: images/test2015/HICO_test2015_00000003.jpg, " \
           "images/test2015/HICO_test2015_00000005.jpg, images/test2015/HICO_test2015_00000006.jpg)" in log, log
    assert not (tmp_path / "results/partial/images/hico/clean").exists()


def _pixel_config(workdir: Path, name: str) -> Path:
    """The demo's config cut to one image-reading model (tests/slow_backend.py) on HICO clean, yn_obj."""
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    config["datasets"] = {"hico": {"root": "data/hico_px", "det_root": "data/hico_px_det"}}
    config["questions"]["sets"] = ["yn_obj"]
    config["conditions"] = {"clean": config["conditions"]["clean"]}
    config["custom_backends"] = ["slow_backend"]
    config["models"] = {"pixels": {"backend": "slow_backend:PixelModel", "seconds_per_batch": 0.2, "batch_size": 4}}
    config["progress_interval"] = 0.3
    config["variants"] = {"default": {}}
    config["ensembles"] = {}
    config.pop("analysis", None)
    config["metrics"]["error_consistency"] = []
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_an_image_rewritten_in_place_reasks_exactly_its_questions(tmp_path, monkeypatch):
    """An image rewritten under its old name, size and dates after a run: the plan rebuilds its condition and
    reruns the inference job (it said "Nothing to be done"), and the job asks only that image's questions
    again (it resumed every old answer), ending with the table a fresh run writes."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO / "tests"),
                                                                   os.environ.get("PYTHONPATH")])))
    runs = {}
    for name in ("rewritten", "fresh"):
        workdir = tmp_path / name
        workdir.mkdir()
        write_config(workdir, _small)
        write_demo_hico(workdir / "data/hico_px", workdir / "data/hico_px_det", SMALL)
        runs[name] = workdir, _pixel_config(workdir, "px")
    target = "results/px/predictions/hico/yn_obj/clean/pixels/default.parquet"

    def build(name):
        workdir, config = runs[name]
        result = subprocess.run(
            [sys.executable, "-m", "snakemake", target, "--snakefile", str(REPO / "Snakefile"), "--directory",
             str(workdir), "--configfile", str(config), "--cores", "1"],
            capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        outputs[name] = result.stderr
        return read_table(workdir / target, PREDICTIONS)

    outputs = {}
    workdir, config = runs["rewritten"]
    before = build("rewritten")
    # the terminal shows the inference job's progress, not only its log (questions done, rate)
    assert re.search(r"running predict/hico/clean/pixels/default/0: pixels 1 sets \d+/\d+ \(\d+%\)",
                     outputs["rewritten"]), outputs["rewritten"][-3000:]
    questions = read_table(workdir / "results/px/benchmark/hico/yn_obj.parquet", QUESTIONS)
    changed = questions.image.iloc[0]
    image = workdir / "data/hico_px" / changed
    old, other = image.stat(), (workdir / "data/hico_px" / questions.image[questions.image.ne(changed)].iloc[0])
    image.write_bytes(other.read_bytes()[:old.st_size].ljust(old.st_size, b"\0"))  # same name, size and dates
    os.utime(image, ns=(old.st_atime_ns, old.st_mtime_ns))
    _backdate(workdir / "data")
    rules = {rule for rule, _ in planned_jobs(workdir, config, targets=[target])}
    assert {"image_condition", "predict_suite"} <= rules, rules
    after = build("rewritten")
    log = (workdir / "logs/px/predict/hico/clean/pixels/default/0.log").read_text()
    asked_again = questions.image.eq(changed)
    assert f"yn_obj: asking {asked_again.sum()} questions again whose image has changed" in log, log
    assert f"yn_obj: resuming: {len(questions) - asked_again.sum()} of {len(questions)}" in log, log
    moved = after.set_index("question_id").p_yes.ne(before.set_index("question_id").p_yes)
    assert set(moved[moved].index) <= set(questions.question_id[asked_again]) and moved.any()

    fresh_dir, _ = runs["fresh"]
    shutil.copy2(image, fresh_dir / "data/hico_px" / changed)
    pd.testing.assert_frame_equal(after, build("fresh"))


def test_two_config_files_of_one_name_do_not_share_a_tree(tmp_path):
    """a/x.yaml, run first, owns results/x/; planning b/x.yaml stops, naming both files (it overwrote a's
    question sets, and the two then rebuilt over each other in turn). A dry run claims nothing."""
    write_config(tmp_path, _small)
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        shutil.copy(tmp_path / "config.yaml", tmp_path / folder / "x.yaml")
    target = "results/x/benchmark/hico/yn_obj.parquet"
    assert planned_jobs(tmp_path, tmp_path / "b/x.yaml", targets=[target])  # a dry run: b claims nothing
    _build(tmp_path, tmp_path / "a/x.yaml", target)
    refused = _snakemake(tmp_path, tmp_path / "b/x.yaml", "--dry-run")
    assert refused.returncode != 0
    assert "results/x/ holds the results of a/x.yaml, not of b/x.yaml" in refused.stdout + refused.stderr
    assert planned_jobs(tmp_path, tmp_path / "a/x.yaml", targets=[target]) == []
