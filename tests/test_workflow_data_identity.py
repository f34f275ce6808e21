"""Two configs in one checkout, replayed in Snakemake on small demo data, building only the targets it needs
(README, "Several configs in one checkout")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from verbmirage.demo import DemoSizes, write_demo_hico
from workflow_run import REPO, planned_jobs, write_config

pytestmark = pytest.mark.slow

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
