"""The demo's derived model (models.tiny_llava_nullu: Nullu on tiny_llava), built and evaluated through the DAG."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import yaml
from safetensors.torch import load_file

from verbmirage.models.derived import DERIVED_FOLDER
from verbmirage.data.hico import load_hico
from verbmirage.core.io import read_table
from verbmirage.core.schemas import NULLU_PAIRS

pytestmark = pytest.mark.slow

SLUG = "tiny_llava_nullu"
QSETS = ["yn_obj", "yn_verb", "mc_obj", "mc_verb"]


def _entry(demo_run) -> dict:
    return yaml.safe_load((demo_run / "config.yaml").read_text())["models"][SLUG]


def test_the_nullu_folder_is_the_edited_base(demo_run):
    folder = demo_run / DERIVED_FOLDER.format(model=SLUG)
    record = json.loads((folder / "nullu.json").read_text())
    derive = _entry(demo_run)["derive"]
    assert (record["method"], record["pair_source"], record["embedding"]) == ("nullu", "hico_train", "mean")
    assert record["top_k"] == 4 and record["layers"] == [1] and record["decoder_layers"] == 2  # upper half of 2
    assert record["pairs"] == derive["pairs"] == 40
    # the saved weights: the base's, but for the upper layer's down_proj
    base = load_file(demo_run / "resources/models/tiny_llava/model.safetensors")
    edited = load_file(folder / "model.safetensors")
    assert set(base) == set(edited)
    changed = {name for name in base if not (base[name] == edited[name]).all()}
    assert len(changed) == 1 and changed.pop().endswith("language_model.model.layers.1.mlp.down_proj.weight")
    # the pairs: demo training images, a positive HOI against a label -1 verb of its object
    pairs = read_table(folder / "pairs.parquet", NULLU_PAIRS)
    anno = load_hico(demo_run / "resources/demo/hico_20150920")
    train = {anno.image_relpath("train", name): row for row, name in enumerate(anno.images["train"])}
    assert len(pairs) == 40 and pairs.image.is_unique and set(pairs.image) <= set(train)
    rows = pairs.image.map(train).to_numpy()
    assert (anno.labels["train"][rows, pairs.hoi_id] == 1).all()
    assert (anno.labels["train"][rows, pairs.negative_hoi_id] == -1).all()


def test_its_predictions_and_table5_row(demo_run):
    from workflow_run import derived_model_runs

    from verbmirage.evaluation.paper_methods import paper_methods_from_config

    # its HalluSpace comes from HICO training pairs, not the official LURE captions: a variant of Nullu's row
    method = paper_methods_from_config(yaml.safe_load((demo_run / "config.yaml").read_text()))[SLUG]
    assert method == ("Nullu (variant of the official method: HalluSpace from HICO training pairs, the official one "
                      "from LURE's captions)")
    # the job loaded the effective entry: the base's backend and settings, the built folder as path
    for model in derived_model_runs(demo_run, SLUG, QSETS, method):
        assert model["backend"] == "llava"
        assert model["path"] == DERIVED_FOLDER.format(model=SLUG) and "derive" not in model


def _planned(demo_run, edit):
    from workflow_run import planned_jobs, write_config

    write_config(demo_run, edit)
    try:
        return planned_jobs(demo_run)
    finally:
        write_config(demo_run)


def test_changing_the_base_rebuilds_the_derived_model(demo_run):
    jobs = _planned(demo_run, lambda c: c["models"]["tiny_llava"].update(conversation="llava_v1"))
    # every model derived from it (the demo's Nullu edit and its Pangea fine-tune) is rebuilt and asked again
    assert sorted(w["model"] for rule, w in jobs if rule == "derive_model") == [SLUG, "tiny_llava_pangea"]
    predicted = {w["model"] for rule, w in jobs if rule == "predict_suite"}
    assert predicted == {"tiny_llava", SLUG, "tiny_llava_pangea"}


def test_changing_only_the_bases_planning_does_not_rebuild(demo_run):
    jobs = _planned(demo_run, lambda c: c["models"]["tiny_llava"].update(batch_size=16))
    assert "derive_model" not in {rule for rule, _ in jobs}


def test_adding_a_derived_model_runs_only_its_jobs(demo_run):
    def add(config):
        config["models"]["tiny_llava_nullu_k2"] = {
            "derive": {"method": "nullu", "base": "tiny_llava", "pairs": 20, "top_k": 2},
            "variants": ["beam5"], "qsets": ["yn_obj"]}

    jobs = _planned(demo_run, add)
    per_rule = Counter(re.sub(r"_\d+$", "", rule) for rule, _ in jobs)
    aggregates = {"metrics", "tables", "mitigation_tables", "all", "fov", "fov_report", "object_reliance",
                  "reliance_report", "paper_figures", "uncertainty", "uncertainty_figures", "report_pages"}
    # its build, then one run: yn_obj under clean with beam5 (beam5 runs on clean only)
    assert {rule: n for rule, n in per_rule.items() if rule not in aggregates} == {
        "derive_model": 1, "predict_suite": 1, "merge_predictions": 1, "metric_part": 1}
    assert {w["model"] for rule, w in jobs if "model" in w} == {"tiny_llava_nullu_k2"}


def test_adding_a_derived_model_plans_only_its_jobs(tmp_path):
    """A scratch dry run of the demo with and without its Nullu entry: the difference is its build, its inference
    jobs (its sets under each condition, its variants) and their merges and metrics; the aggregates are planned
    anyway."""
    from workflow_run import planned_jobs, write_config

    def jobs(folder, edit):
        folder.mkdir()
        write_config(folder, edit)
        # merge and vote rules are numbered per (dataset, condition, sets asked): compare them by family
        return Counter((re.sub(r"_\d+$", "", rule), tuple(sorted(w.items()))) for rule, w in planned_jobs(folder))

    def without(config):
        config["models"].pop(SLUG)

    def with_nullu(config):
        assert config["models"][SLUG]["qsets"] == QSETS and config["models"][SLUG]["variants"] == ["default", "beam5"]

    before, after = jobs(tmp_path / "before", without), jobs(tmp_path / "after", with_nullu)
    assert not before - after  # nothing planned before disappears
    added = after - before
    assert {dict(w).get("model") for _, w in added} == {SLUG}
    per_rule = Counter(rule for rule, _ in added.elements())
    # clean: default + beam5; saltpepper and crop: default (beam5 runs on clean only); no CharadesEgo set asked
    assert per_rule == {"derive_model": 1, "predict_suite": 4, "merge_predictions": 4, "metric_part": 4,
                        "consistency_part": 2}
