"""Calibrated decisions end to end on the tiny LLaVA (random weights): the inference job applies them.

A threshold variant's rows are the plain variant's margins cut at the fitted threshold; a content_free
variant's rows are the plain scores shifted by the model's own answers on the content-free images.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from verbmirage.benchmark.conditions import apply_condition
from verbmirage.variants.decisions import (
    CONTENT_FREE_RULE,
    THRESHOLD_RULE,
    fit_threshold,
    mean_probability_margin,
    write_cuts,
)
from verbmirage.inference.calibration import calibrate
from verbmirage.models.calibrated import margin_of
from verbmirage.benchmark.calibration import build_calibration_set, write_content_free_images
from verbmirage.inference.runs import RunSpec, run_suite, suite_table
from verbmirage.core.io import read_table, write_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import PREDICTIONS
from verbmirage.models import Question, create_model
from verbmirage.benchmark.questions import QuestionSettings, build_question_set
from verbmirage.models.tiny import build_tiny_llava

CALIBRATION_IMAGES = 4
YN_SETS = ("yn_obj", "yn_verb")


@pytest.fixture(scope="module")
def setup(demo_anno, demo_roots, tmp_path_factory):
    """Calibration sets on 4 training images, the test sets (two YN, one MC) on 3 test images, clean folders."""
    base = tmp_path_factory.mktemp("decisions")
    settings = QuestionSettings()
    calibration = {}
    for qset in YN_SETS:
        calibration[qset] = base / f"calibration_{qset}.parquet"
        write_table(build_calibration_set(demo_anno, qset, settings, CALIBRATION_IMAGES), calibration[qset], QUESTIONS)
    tables = {qset: build_question_set(demo_anno, qset, settings) for qset in (*YN_SETS, "mc_verb")}
    images = sorted(set(tables["yn_obj"].image) & set(tables["mc_verb"].image))[:3]
    paths = {}
    for qset, table in tables.items():
        paths[qset] = base / f"{qset}.parquet"
        write_table(table[table.image.isin(images)].reset_index(drop=True), paths[qset], QUESTIONS)
    calibration_images = sorted(set().union(*(set(read_table(p).image) for p in calibration.values())))
    apply_condition(demo_roots[0], calibration_images, base / "calibration_clean", "clean", {"type": "clean"})
    apply_condition(demo_roots[0], images, base / "clean", "clean", {"type": "clean"})
    entry = {"backend": "llava", "path": str(build_tiny_llava(base / "tiny_llava")), "local_files_only": True}
    plain = base / "plain"
    run_suite(paths, plain, RunSpec("tiny_llava", entry, base / "clean", batch_size=8))
    return base, calibration, paths, entry, plain


def test_threshold_variant_cuts_the_plain_margins(setup, tmp_path):
    base, calibration, paths, entry, plain = setup
    variant = {"decision": {"method": "threshold", "calibration_images": CALIBRATION_IMAGES}}
    cuts_file = tmp_path / "cuts.json"
    fits = calibrate(calibration, tmp_path / "answers", cuts_file, RunSpec("tiny_llava", entry, base / "calibration_clean", variant, batch_size=8), about={"condition": "clean"})
    document = json.loads(cuts_file.read_text())
    assert set(document["cuts"]) == set(YN_SETS) and document["condition"] == "clean"
    for qset, fit in fits.items():
        # the cut is the one a plain run on the calibration questions gives (the calibration job adds no decision)
        answers = read_table(suite_table(tmp_path / "answers", qset), PREDICTIONS)
        assert not answers.parse_rule.str.startswith("calibrated").any()
        truth = read_table(calibration[qset], QUESTIONS).set_index("question_id").answer
        again = fit_threshold(answers.yes_margin.to_numpy(float), truth[answers.question_id].to_numpy(), "accuracy")
        assert again == fit
        assert document["cuts"][qset]["metric_at_zero"] == pytest.approx(fit.metric_at_zero)
    calibrated = tmp_path / "calibrated"
    run_suite(paths, calibrated, RunSpec("tiny_llava", entry, base / "clean", variant, batch_size=8, decision_input=cuts_file))
    _assert_cut(calibrated, plain, paths, fits)
    # a cut at the median plain margin of each set: both answers occur, so the rows really follow the cut
    medians = {}
    for qset in YN_SETS:
        margins = read_table(suite_table(plain, qset), PREDICTIONS).yes_margin.to_numpy(float)
        medians[qset] = replace(fits[qset], cut=float(np.median(margins)))
    write_cuts(tmp_path / "median.json", medians, {})
    run_suite(paths, tmp_path / "median", RunSpec("tiny_llava", entry, base / "clean", variant, batch_size=8, decision_input=tmp_path / "median.json"))
    for qset in YN_SETS:
        assert set(read_table(suite_table(tmp_path / "median", qset), PREDICTIONS).prediction) == {"yes", "no"}
    _assert_cut(tmp_path / "median", plain, paths, medians)


def _assert_cut(calibrated, plain, paths, fits):
    """The calibrated job's rows: YN = the plain margins cut at the set's cut, MC = the plain rows."""
    for qset in paths:
        ours = read_table(suite_table(calibrated, qset), PREDICTIONS).set_index("question_id")
        theirs = read_table(suite_table(plain, qset), PREDICTIONS).set_index("question_id").loc[ours.index]
        assert (ours.raw_answer == theirs.raw_answer).all()
        if qset == "mc_verb":  # MC keeps the plain decision
            assert (ours.prediction == theirs.prediction).all() and (ours.parse_rule == theirs.parse_rule).all()
            continue
        cut = fits[qset].cut
        margins = theirs.yes_margin.to_numpy(float)
        decided = np.abs(margins - cut) > 1e-4  # batching noise (float32) may flip a margin within 1e-5 of the cut
        assert decided.mean() > 0.9
        expected = np.where(margins >= cut, "yes", "no")
        assert (ours.prediction.to_numpy()[decided] == expected[decided]).all()
        assert (ours.parse_rule == THRESHOLD_RULE).all()
        if np.isfinite(cut):
            np.testing.assert_allclose(ours.yes_margin.to_numpy(float), margins - cut, atol=1e-4)


def test_content_free_variant_shifts_by_the_models_content_free_answers(setup, demo_roots, demo_anno, tmp_path):
    base, _, paths, entry, plain = setup
    folder = tmp_path / "content_free"
    write_content_free_images(demo_roots[0], demo_anno, CALIBRATION_IMAGES, 0, folder)
    variant = {"decision": {"method": "content_free", "calibration_images": CALIBRATION_IMAGES}}
    output = tmp_path / "cf"
    run_suite(paths, output, RunSpec("tiny_llava", entry, base / "clean", variant, batch_size=8, decision_input=folder))
    model = create_model("tiny_llava", entry)  # the model asked directly on the content-free images
    model.continue_tokens = 0
    reference = [folder / "blank.png", folder / "mean.png"]
    for qset in paths:
        ours = read_table(suite_table(output, qset), PREDICTIONS).set_index("question_id")
        theirs = read_table(suite_table(plain, qset), PREDICTIONS).set_index("question_id").loc[ours.index]
        questions = read_table(paths[qset], QUESTIONS).set_index("question_id").loc[ours.index]
        assert (ours.parse_rule == CONTENT_FREE_RULE).all() and (ours.raw_answer == theirs.raw_answer).all()
        if qset == "mc_verb":
            rows = questions.head(8)
            asked = [Question(qid, row.prompt, image, tuple(row.options)) for qid, row in rows.iterrows()
                     for image in reference]
            answers = model.score_multiple_choice(asked)
            for index, qid in enumerate(rows.index):
                p_cf = np.mean([r.option_probs for r in answers[2 * index : 2 * index + 2]], axis=0)
                weighted = np.asarray(theirs.option_probs[qid]) / p_cf
                np.testing.assert_allclose(ours.option_probs[qid], weighted / weighted.sum(), atol=1e-4)
            continue
        prompts = list(questions.prompt.unique())
        answers = model.score_yes_no([Question("cf", prompt, image) for prompt in prompts for image in reference])
        shifts = {prompt: mean_probability_margin([margin_of(r) for r in answers[2 * i : 2 * i + 2]])
                  for i, prompt in enumerate(prompts)}
        expected = theirs.yes_margin.to_numpy(float) - questions.prompt.map(shifts).to_numpy(float)
        np.testing.assert_allclose(ours.yes_margin.to_numpy(float), expected, atol=1e-4)
        decided = np.abs(expected) > 1e-4
        assert (ours.prediction.to_numpy()[decided] == np.where(expected >= 0, "yes", "no")[decided]).all()
