"""Calibrated decisions: the threshold fit, contextual calibration, the calibration set.

Oracles (hand-computed): a cut of 0 is the plain score-based decision, a uniform
content-free answer changes nothing; the fitted cut equals a brute-force search and sklearn's metrics over
every candidate cut; calibration sets ask about training images only.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from sklearn.metrics import accuracy_score, f1_score

from verbmirage.variants.decisions import (
    CONTENT_FREE_RULE,
    THRESHOLD_RULE,
    candidate_cuts,
    fit_threshold,
    mean_probability_margin,
    read_cuts,
    sigmoid,
    write_cuts,
)
from verbmirage.variants.settings import Variant, decision_plan
from verbmirage.models.calibrated import (
    CalibratedModel,
    ContentFreeRule,
    ThresholdRule,
    apply_threshold,
    content_free_choice,
    content_free_yes_no,
    decision_model,
)
from verbmirage.benchmark.question_sets import calibration_qsets
from verbmirage.benchmark.calibration import (
    BLANK_GREY,
    build_calibration_set,
    calibration_images,
    check_training_only,
    write_content_free_images,
)
from verbmirage.models import Question, create_model
from verbmirage.models.base import MultipleChoiceResult, YesNoResult
from verbmirage.benchmark.questions import QuestionSettings, build_question_set


def _yes_no(margin: float, prediction: str = "yes", rule: str = "greedy:first-token") -> YesNoResult:
    return YesNoResult(p_yes=sigmoid(margin), prediction=prediction, raw_answer="The", confidence=0.3,
                       parse_rule=rule, yes_margin=margin)


# ---- threshold ------------------------------------------------------------------------------------------------
def _brute_force(margins, answers, metric):
    """Every candidate cut tried one by one with plain Python counting (no shared code with the fit)."""
    best_cut, best_value = None, -1.0
    defined = [m for m in margins if not math.isnan(m)]
    for cut in sorted(set(defined) | {math.nextafter(max(defined), math.inf)}):
        pairs = [(m >= cut, a == "yes") for m, a in zip(margins, answers) if not math.isnan(m)]
        tp = sum(p and t for p, t in pairs)
        fp = sum(p and not t for p, t in pairs)
        fn = sum(t and not p for p, t in pairs)
        tn = sum(not p and not t for p, t in pairs)
        value = (tp + tn) / len(pairs) if metric == "accuracy" else (2 * tp / (2 * tp + fp + fn) if tp else 0.0)
        if value > best_value:  # strictly better only: ties keep the smaller cut seen first
            best_cut, best_value = cut, value
    return best_cut, best_value


@pytest.mark.parametrize("metric", ["accuracy", "f1"])
@pytest.mark.parametrize("seed", range(6))
def test_fitted_cut_equals_brute_force_and_sklearn(metric, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 80))
    answers = np.where(rng.random(n) < 1 / 3, "yes", "no")
    margins = np.round(rng.normal(0.8 * (answers == "yes"), 1.0), 1)  # rounded: many tied margins
    margins[rng.random(n) < 0.1] = np.nan  # undefined scores are left out
    fit = fit_threshold(margins, answers, metric)
    cut, value = _brute_force(list(margins), list(answers), metric)
    assert fit.cut == cut
    assert fit.metric_at_cut == pytest.approx(value)
    # sklearn over the same candidates: the best value, and no smaller cut reaches it
    defined = ~np.isnan(margins)
    truth = answers[defined] == "yes"
    score = accuracy_score if metric == "accuracy" else lambda t, p: f1_score(t, p, zero_division=0)
    values = {c: score(truth, margins[defined] >= c) for c in candidate_cuts(margins)}
    assert fit.metric_at_cut == pytest.approx(max(values.values()))
    assert all(v < fit.metric_at_cut - 1e-12 for c, v in values.items() if c < fit.cut)
    assert fit.metric_at_zero == pytest.approx(score(truth, margins[defined] >= 0))
    assert (fit.n, fit.n_yes, fit.undefined) == (defined.sum(), truth.sum(), (~defined).sum())


def test_ties_take_the_smallest_cut():
    # cuts 0.5 and 2.0 both give accuracy 3/4 (one error each); the smaller one wins
    fit = fit_threshold([0.0, 0.5, 1.0, 2.0], ["no", "yes", "no", "yes"], "accuracy")
    assert fit.cut == 0.5 and fit.metric_at_cut == 0.75
    # all "no" is a candidate too: just above the largest margin (finite, so scores stay ranked)
    fit = fit_threshold([3.0, 2.0, 1.0], ["no", "no", "no"], "accuracy")
    assert fit.cut == math.nextafter(3.0, math.inf) and fit.metric_at_cut == 1.0
    assert apply_threshold(_yes_no(3.0), fit.cut).prediction == "no"
    assert apply_threshold(_yes_no(3.5), fit.cut).yes_margin == pytest.approx(0.5)


def test_cut_zero_is_the_plain_score_decision():
    for margin in (-3.0, -1e-9, 0.0, 1e-9, 2.5, 40.0):
        # the model's decoded answer says otherwise; the score-based decision is margin >= 0 (P(yes) >= 0.5)
        result = _yes_no(margin, prediction="no" if margin >= 0 else "yes")
        calibrated = apply_threshold(result, 0.0)
        assert calibrated.prediction == ("yes" if result.p_yes >= 0.5 else "no")
        assert calibrated.p_yes == result.p_yes and calibrated.yes_margin == margin
        assert calibrated.parse_rule == THRESHOLD_RULE and calibrated.raw_answer == "The"
        assert calibrated.confidence == result.confidence


def test_threshold_shifts_scores_and_keeps_errors():
    calibrated = apply_threshold(_yes_no(1.0), 1.5)
    assert calibrated.prediction == "no" and calibrated.yes_margin == pytest.approx(-0.5)
    assert calibrated.p_yes == pytest.approx(sigmoid(-0.5))
    assert apply_threshold(_yes_no(1.5), 1.5).prediction == "yes"  # yes iff margin >= cut
    # no yes_margin (a backend without logits): logit(p_yes) is the score
    text_only = YesNoResult(p_yes=0.8, prediction="yes", raw_answer="Yes", confidence=0.8, parse_rule="x")
    assert apply_threshold(text_only, math.log(4) + 1e-9).prediction == "no"
    assert apply_threshold(text_only, math.log(4) - 1e-9).prediction == "yes"
    undefined = YesNoResult(p_yes=math.nan, prediction="unknown", raw_answer="", confidence=0.1, parse_rule="x")
    assert apply_threshold(undefined, 0.0).prediction == "unknown"
    failed = YesNoResult.failed("boom")
    assert apply_threshold(failed, 0.0) is failed


def test_threshold_rule_cuts_only_yes_no_sets_with_a_cut():
    rule = ThresholdRule({"yn_obj": 1.0}, {"a": "yn_obj", "b": "yn_exo", "c": "mc_obj"})
    questions = [Question("a", "p"), Question("b", "p"), Question("c", "p", options=("x", "y"))]
    mc = MultipleChoiceResult((0.2, 0.8), "B", "B", 0.8, "greedy:first-token")
    out = rule.decide(questions, [False, False, True], [_yes_no(0.5), _yes_no(0.5), mc])
    assert out[0].prediction == "no" and out[0].parse_rule == THRESHOLD_RULE
    assert out[1] == _yes_no(0.5) and out[2] is mc


def test_cuts_file_round_trip(tmp_path):
    fits = {"yn_obj": fit_threshold([0.1, 0.2], ["yes", "no"]), "yn_verb": fit_threshold([math.inf], ["no"])}
    write_cuts(tmp_path / "cuts.json", fits, {"model": "m"})
    document = json.loads((tmp_path / "cuts.json").read_text())  # strict JSON: an infinite cut is "inf"
    assert document["cuts"]["yn_verb"]["cut"] == "inf" and document["model"] == "m"
    assert read_cuts(tmp_path / "cuts.json") == {"yn_obj": fits["yn_obj"].cut, "yn_verb": math.inf}
    (tmp_path / "bad.json").write_text('{"cuts": {"yn_obj": {}}}')
    with pytest.raises(ValueError, match="bad.json"):
        read_cuts(tmp_path / "bad.json")


# ---- content-free -----------------------------------------------------------------------------------------------
def test_uniform_content_free_answer_changes_nothing():
    for margin in (-2.0, 0.0, 0.7):
        result = _yes_no(margin, prediction="no")
        calibrated = content_free_yes_no(result, [0.0, 0.0])  # p_cf = (0.5, 0.5)
        assert calibrated.yes_margin == margin and calibrated.p_yes == pytest.approx(result.p_yes, abs=1e-15)
        assert calibrated.prediction == ("yes" if margin >= 0 else "no")
        assert calibrated.parse_rule == CONTENT_FREE_RULE and calibrated.raw_answer == "The"
    mc = MultipleChoiceResult((0.1, 0.6, 0.3), "A", "A", 0.4, "greedy:first-token")
    calibrated = content_free_choice(mc, [(1 / 3, 1 / 3, 1 / 3), (1 / 3, 1 / 3, 1 / 3)])
    np.testing.assert_allclose(calibrated.option_probs, mc.option_probs)
    assert calibrated.prediction == "B" and calibrated.raw_answer == "A" and calibrated.confidence == 0.4


def test_content_free_is_diag_inverse_then_renormalise():
    """The two-class shift equals W = diag(p_cf)^-1 on (p_yes, p_no), renormalised (Zhao et al. 2021)."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        margin, cf = rng.normal(0, 3), rng.normal(0, 3, size=2)
        p_cf_yes = np.mean([sigmoid(m) for m in cf])  # averaged probability vectors
        p = np.array([sigmoid(margin), 1 - sigmoid(margin)])
        weighted = p / np.array([p_cf_yes, 1 - p_cf_yes])
        expected = weighted[0] / weighted.sum()
        calibrated = content_free_yes_no(_yes_no(margin), cf)
        assert calibrated.p_yes == pytest.approx(expected, rel=1e-9)
        assert calibrated.yes_margin == pytest.approx(margin - math.log(p_cf_yes / (1 - p_cf_yes)), rel=1e-9)
        assert calibrated.prediction == ("yes" if expected >= 0.5 else "no")
    assert mean_probability_margin([800.0, -800.0]) == pytest.approx(0.0)  # no overflow at saturation


def test_content_free_multiple_choice_by_hand():
    mc = MultipleChoiceResult((0.5, 0.3, 0.2), "A", "A", 0.5, "greedy:first-token")
    calibrated = content_free_choice(mc, [(0.7, 0.2, 0.1), (0.5, 0.2, 0.3)])  # mean p_cf = (0.6, 0.2, 0.2)
    weighted = np.array([0.5 / 0.6, 0.3 / 0.2, 0.2 / 0.2])
    np.testing.assert_allclose(calibrated.option_probs, weighted / weighted.sum())
    assert calibrated.prediction == "B"
    zero = content_free_choice(mc, [(0.0, 0.5, 0.5)])
    assert zero.prediction == "unknown" and all(math.isnan(p) for p in zero.option_probs)


# ---- calibration set ----------------------------------------------------------------------------------------------
def test_calibration_set_uses_training_images_only(demo_anno):
    settings = QuestionSettings()
    names = calibration_images(demo_anno, 20, settings.seed)
    assert len(names) == 20 and set(names) <= set(demo_anno.images["train"])
    assert names == calibration_images(demo_anno, 20, settings.seed)  # seeded
    assert names != calibration_images(demo_anno, 20, settings.seed + 1)
    frame = build_calibration_set(demo_anno, "yn_obj", settings, 20)
    train = {demo_anno.image_relpath("train", n) for n in names}
    assert set(frame.image) <= train and frame.image.str.startswith("images/train2015/").all()
    # the benchmark's protocol: the same builder on the training split gives these rows for these images
    full = build_question_set(demo_anno, "yn_obj", replace(settings, split="train"))
    expected = full[full.image.isin(train)].reset_index(drop=True)
    pd.testing.assert_frame_equal(frame.reset_index(drop=True), expected)
    assert (frame.answer == "no").sum() == 2 * (frame.answer == "yes").sum()  # paired 1:2
    # a planted test image is refused
    planted = frame.copy()
    test_name = demo_anno.images["test"][0]
    planted.loc[0, ["image", "image_id"]] = [demo_anno.image_relpath("test", test_name), test_name.rsplit(".", 1)[0]]
    with pytest.raises(ValueError, match="not a training image"):
        check_training_only(planted, demo_anno)
    with pytest.raises(ValueError, match="YN sets"):
        build_calibration_set(demo_anno, "mc_obj", settings, 20)


def test_calibration_sets_and_plan():
    assert calibration_qsets("hico", ["yn_obj", "mc_obj", "obj_exist", "yn_ko"]) == ["yn_obj", "obj_exist", "yn_ko"]
    assert calibration_qsets("charadesego", ["yn_exo", "yn_ego"]) == []
    config = {"variants": {"default": {}, "cal": {"decision": {"method": "threshold", "calibration_images": 20}},
                           "cf": {"decision": {"method": "content_free", "calibration_images": 20}}}}
    assert decision_plan(config) == {"threshold": ["cal"], "content_free": ["cf"], "calibration_images": 20}
    config["variants"]["cf"]["decision"]["calibration_images"] = 30
    with pytest.raises(ValueError, match="calibration_images"):
        decision_plan(config)


def test_content_free_images(demo_roots, demo_anno, tmp_path):
    note = write_content_free_images(demo_roots[0], demo_anno, 5, 0, tmp_path)
    names = calibration_images(demo_anno, 5, 0)
    sources = [Image.open(demo_roots[0] / demo_anno.image_relpath("train", n)).convert("RGB") for n in names]
    size = (int(np.median([s.width for s in sources])), int(np.median([s.height for s in sources])))
    assert tuple(note["size"]) == size and note["mean_of"] == 5
    blank = np.asarray(Image.open(tmp_path / "blank.png"))
    assert blank.shape == (size[1], size[0], 3) and (blank == BLANK_GREY).all()
    expected = np.mean([np.asarray(s.resize(size, Image.BILINEAR), float) for s in sources], axis=0)
    mean = np.asarray(Image.open(tmp_path / "mean.png"), float)
    assert np.abs(mean - expected).max() <= 0.5 + 1e-9  # rounded to 8 bits


# ---- the wrapper on a real backend ---------------------------------------------------------------------------
def test_content_free_rule_scores_each_prompt_once(demo_roots, demo_anno, tmp_path):
    """The random baseline (a real backend) through the wrapper: one content-free score per distinct prompt."""
    write_content_free_images(demo_roots[0], demo_anno, 3, 0, tmp_path)
    model = create_model("random", {"backend": "random", "seed": 0})
    variant = Variant.from_config({"decision": {"method": "content_free"}})
    questions = [Question(f"q{i}", prompt, tmp_path / "blank.png") for i, prompt in enumerate(["a?", "b?", "a?"])]
    wrapped = decision_model(model, variant, {q.question_id: "yn_obj" for q in questions}, "hico", tmp_path)
    assert isinstance(wrapped, CalibratedModel) and isinstance(wrapped.rule, ContentFreeRule)
    first = wrapped.score_yes_no(questions)
    assert len(wrapped.rule._cache) == 2  # "a?" and "b?"
    assert [r.parse_rule for r in first] == [CONTENT_FREE_RULE] * 3
    assert wrapped.fingerprint_extra()["decision"]["method"] == "content_free"
    plain = Variant.from_config({})
    assert decision_model(model, plain, {}, "hico", None) is model


def test_threshold_needs_a_cut_for_every_calibrated_set(tmp_path):
    model = create_model("random", {"backend": "random", "seed": 0})
    variant = Variant.from_config({"decision": {"method": "threshold"}})
    sets = {"a": "yn_obj", "b": "yn_verb", "c": "mc_obj"}
    write_cuts(tmp_path / "cuts.json", {"yn_obj": fit_threshold([0.1], ["yes"])}, {})
    with pytest.raises(ValueError, match=r"\['yn_verb'\]"):
        decision_model(model, variant, sets, "hico", tmp_path / "cuts.json")
    with pytest.raises(ValueError, match="none given"):
        decision_model(model, variant, sets, "hico", None)
    # CharadesEgo has no calibration set: its runs keep the plain decision
    wrapped = decision_model(model, variant, {"a": "yn_exo"}, "charadesego", None)
    assert wrapped.rule.cuts == {}


def test_calibration_set_on_the_real_hico(real_anno):
    """The real anno.mat: 200 training images give a paired 1:2 yn_obj calibration set with no test image."""
    frame = build_calibration_set(real_anno, "yn_obj", QuestionSettings(), 200)
    check_training_only(frame, real_anno)
    assert frame.image.nunique() <= 200 and len(frame) > 500  # measured: 951 questions on 179 images
    assert (frame.answer == "no").sum() == 2 * (frame.answer == "yes").sum()
