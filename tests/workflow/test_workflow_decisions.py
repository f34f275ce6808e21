"""Calibrated decisions in the demo run: the threshold variant's cuts file, its calibration
sets on training images, the calibrated and content-free prediction rows and their metric rows."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from verbmirage.variants.decisions import CONTENT_FREE_RULE, THRESHOLD_RULE, read_cuts
from verbmirage.benchmark.calibration import check_training_only
from verbmirage.data.hico import load_hico
from verbmirage.core.io import read_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import PREDICTIONS

pytestmark = pytest.mark.slow

YN_SETS = ["yn_obj", "yn_verb"]  # the HICO YN sets the demo's decision variants ask (variants.<slug>.qsets)
CALIBRATION_IMAGES = 20  # variants.calibrated.decision.calibration_images in config.yaml


def _predictions(demo_run, qset, variant):
    path = demo_run / f"results/predictions/hico/{qset}/clean/tiny_llava/{variant}.parquet"
    return read_table(path, PREDICTIONS).set_index("question_id")


def test_cuts_file_and_calibration_sets(demo_run):
    cuts_file = demo_run / "results/calibration/hico/clean/tiny_llava/calibrated.json"
    document = json.loads(cuts_file.read_text())
    assert (document["method"], document["model"], document["condition"]) == ("threshold", "tiny_llava", "clean")
    assert sorted(document["cuts"]) == sorted(YN_SETS)
    anno = load_hico(demo_run / "resources/demo/hico_20150920")
    for qset, entry in document["cuts"].items():
        calibration = read_table(demo_run / f"results/benchmark/hico/calibration/{qset}.parquet", QUESTIONS)
        check_training_only(calibration, anno)  # raises on any test image
        assert calibration.image.nunique() <= CALIBRATION_IMAGES
        assert entry["n"] + entry["undefined"] == len(calibration) and entry["n"] > 0
        assert 0 <= entry["metric_at_zero"] <= entry["metric_at_cut"] <= 1  # the cut is at least as good as 0
        answers = read_table(demo_run / f"results/calibration/hico/clean/tiny_llava/calibrated.answers/{qset}.parquet",
                             PREDICTIONS)
        assert set(answers.question_id) == set(calibration.question_id)
    # no calibration under saltpepper: the demo runs the decision variants on clean images only
    assert not (demo_run / "results/calibration/hico/saltpepper").exists()


def test_threshold_rows_are_the_default_margins_cut(demo_run):
    cuts = read_cuts(demo_run / "results/calibration/hico/clean/tiny_llava/calibrated.json")
    for qset in YN_SETS:
        ours, plain = _predictions(demo_run, qset, "calibrated"), _predictions(demo_run, qset, "default")
        plain = plain.loc[ours.index]
        assert (ours.parse_rule == THRESHOLD_RULE).all()
        margins = plain.yes_margin.to_numpy(float)
        decided = np.abs(margins - cuts[qset]) > 1e-4
        expected = np.where(margins >= cuts[qset], "yes", "no")
        assert (ours.prediction.to_numpy()[decided] == expected[decided]).all()
        if np.isfinite(cuts[qset]):
            np.testing.assert_allclose(ours.yes_margin.to_numpy(float), margins - cuts[qset], atol=1e-4)
    for qset in ("mc_obj", "mc_verb"):  # MC keeps the plain decision
        ours, plain = _predictions(demo_run, qset, "calibrated"), _predictions(demo_run, qset, "default")
        assert (ours.parse_rule == plain.loc[ours.index].parse_rule).all()


def test_content_free_rows_and_images(demo_run):
    for qset in [*YN_SETS, "mc_obj", "mc_verb"]:
        ours, plain = _predictions(demo_run, qset, "content_free"), _predictions(demo_run, qset, "default")
        assert (ours.parse_rule == CONTENT_FREE_RULE).all()
        assert (ours.raw_answer == plain.loc[ours.index].raw_answer).mean() > 0.95  # the model's text is kept
        if qset.startswith("mc"):
            assert all(abs(sum(p) - 1) < 1e-6 for p in ours.option_probs)
        else:
            defined = ours.yes_margin.notna()
            assert ((ours.yes_margin[defined] >= 0) == (ours.prediction[defined] == "yes")).all()
    folder = demo_run / "results/images/content_free/hico"
    note = json.loads((folder / "content_free.json").read_text())
    assert note["mean_of"] == CALIBRATION_IMAGES and all(i.startswith("images/train2015/") for i in note["images"])
    from PIL import Image

    blank = np.asarray(Image.open(folder / "blank.png"))
    assert blank.shape == (note["size"][1], note["size"][0], 3) and (blank == 128).all()


def test_metric_rows_of_the_decision_variants(demo_run):
    metrics = pd.read_parquet(demo_run / "results/metrics/metrics.parquet")
    for variant in ("calibrated", "content_free"):
        rows = metrics[metrics.variant.eq(variant)]
        assert set(rows.model) == {"tiny_llava"}  # baselines and CLIP do not run decision variants
        assert set(rows.condition) == {"clean"}
        hico = rows[rows.dataset.eq("hico") & rows.subset.eq("all") & rows.metric.eq("accuracy")]
        assert set(hico.qset) == {*YN_SETS, "mc_obj", "mc_verb"}
        assert hico.value.between(0, 1).all()
