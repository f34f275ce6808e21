"""Metrics against hand-computed cases and against scikit-learn."""

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import accuracy_score, precision_recall_fscore_support

from verbmirage.evaluation.metrics import (
    YES_NO_METRICS,
    BootstrapSettings,
    consistency_scores,
    correctness,
    error_consistency,
    evaluate,
    evaluate_consistency,
    yes_no_count_columns,
    yes_no_scores,
)

NO_BOOTSTRAP = BootstrapSettings(resamples=0)


def test_paper_table5_f1_arithmetic():
    # LLaVA-1.5 YN w/ obj: precision 40.99, recall 97.35 -> F1 57.69.
    precision, recall = 0.4099, 0.9735
    tp = 9735.0
    fn = tp / recall - tp
    fp = tp / precision - tp
    scores = dict(zip(YES_NO_METRICS, yes_no_scores([tp, fp, fn, 0, 0, 0])))
    assert round(100 * scores["f1"], 2) == 57.69


def test_geirhos_example():
    assert error_consistency([1, 1, 0, 0], [1, 0, 0, 0]) == pytest.approx(0.5)
    kappa, observed, expected = consistency_scores([4, 3, 2, 1])
    assert (observed, expected, kappa) == pytest.approx((0.75, 0.5, 0.5))


def test_consistency_undefined_when_always_right():
    assert np.isnan(error_consistency([1, 1, 1], [1, 1, 1]))


def test_yes_no_scores_equal_sklearn():
    rng = np.random.default_rng(0)
    answer = pd.Series(rng.choice(["yes", "no"], 500))
    prediction = pd.Series(rng.choice(["yes", "no", "unknown"], 500, p=[0.5, 0.4, 0.1]))
    counts = yes_no_count_columns(answer, prediction).sum().to_numpy()
    ours = dict(zip(YES_NO_METRICS, yes_no_scores(counts)))
    for positive, suffix in (("yes", ""), ("no", "_no")):
        p, r, f, _ = precision_recall_fscore_support(
            answer, prediction, labels=[positive], average=None, zero_division=np.nan
        )
        assert ours[f"precision{suffix}"] == pytest.approx(p[0])
        assert ours[f"recall{suffix}"] == pytest.approx(r[0])
        assert ours[f"f1{suffix}"] == pytest.approx(f[0])
    assert ours["accuracy"] == pytest.approx(accuracy_score(answer, prediction))
    assert ours["yes_ratio"] == pytest.approx((prediction == "yes").mean())
    assert ours["unknown_ratio"] == pytest.approx((prediction == "unknown").mean())


@pytest.mark.parametrize("answers, predictions", [
    (["yes", "yes", "no"], ["no", "no", "no"]),  # never says yes: precision undefined, F1 0
    (["no", "no"], ["yes", "no"]),  # no yes question: recall undefined
    (["no", "no"], ["no", "unknown"]),  # neither: precision, recall and F1 undefined
    (["yes", "yes"], ["yes", "yes"]),  # never says no: precision_no and recall_no undefined
    (["yes", "no"], ["unknown", "yes"]),
])
def test_zero_denominator_is_nan_as_in_sklearn(answers, predictions):
    """A metric whose denominator is 0 is NaN (sklearn ``zero_division=np.nan``), never 0."""
    answer, prediction = pd.Series(answers), pd.Series(predictions)
    ours = dict(zip(YES_NO_METRICS, yes_no_scores(yes_no_count_columns(answer, prediction).sum().to_numpy())))
    for positive, suffix in (("yes", ""), ("no", "_no")):
        expected = precision_recall_fscore_support(
            answer, prediction, labels=[positive], average=None, zero_division=np.nan
        )[:3]
        got = [ours[f"{name}{suffix}"] for name in ("precision", "recall", "f1")]
        np.testing.assert_array_equal(got, [e[0] for e in expected])  # NaN where sklearn has NaN
    never_yes = dict(zip(YES_NO_METRICS, yes_no_scores([0, 0, 2, 1, 0, 0])))
    assert np.isnan(never_yes["precision"]) and never_yes["recall"] == 0.0 and never_yes["f1"] == 0.0


def test_recall_on_rare_no_is_nan_and_intervals_skip_undefined_resamples():
    questions, predictions = _yes_no_frame(n_images=12)
    rows = evaluate(questions, predictions, "yn", {}, BootstrapSettings(resamples=200, seed=3))
    rare_no = rows[rows.subset == "rare_no"].set_index("metric")
    assert np.isnan(rare_no.loc["recall", ["value", "ci_low", "ci_high"]].astype(float)).all()  # no yes question
    assert rare_no.at["accuracy", "value"] == pytest.approx(rare_no.at["recall_no", "value"])
    # 'all': some resamples may lack a wrong yes, but the interval is still over the defined ones
    everything = rows[rows.subset == "all"].set_index("metric")
    for metric in ("precision", "recall", "f1", "precision_no"):
        low, value, high = everything.loc[metric, ["ci_low", "value", "ci_high"]]
        assert np.isfinite([low, high]).all() and low <= value <= high, metric


def test_interval_equals_scipy_where_every_resample_is_defined():
    import scipy.stats

    from verbmirage.evaluation.metrics import mc_scores, score_with_interval

    rng = np.random.default_rng(0)
    # groups, circular correct, plain correct, rows (4 rotations per group), unknown rows
    per_image = np.column_stack([np.full(30, 2), rng.integers(0, 3, 30), rng.integers(0, 3, 30), np.full(30, 8),
                                 rng.integers(0, 9, 30)])
    settings = BootstrapSettings(resamples=500, seed=4)
    value, low, high = score_with_interval(per_image, mc_scores, settings)
    reference = scipy.stats.bootstrap(
        tuple(per_image.T), lambda *c, axis=-1: mc_scores(np.stack([x.sum(axis=axis) for x in c], -1)),
        paired=True, vectorized=True, n_resamples=500, method="percentile",
        random_state=np.random.default_rng(4),
    ).confidence_interval
    np.testing.assert_allclose(low, reference.low)
    np.testing.assert_allclose(high, reference.high)
    assert value == pytest.approx(mc_scores(per_image.sum(axis=0)))


def test_resampled_sums_are_scipys_paired_resamples_batch_for_batch():
    """The sums come from scipy.stats.bootstrap's own draws, also where the resamples run in several batches."""
    import scipy.stats

    from verbmirage.evaluation.metrics import resampled_sums

    per_image = np.random.default_rng(1).integers(0, 5, (2000, 6)).astype(float)
    batch = 2_000_000 // per_image.size
    assert batch < 300
    ours = resampled_sums(per_image, 300, seed=3)
    reference = scipy.stats.bootstrap(
        tuple(per_image.T), lambda *c, axis=-1: np.stack([x.sum(axis=axis) for x in c]), paired=True,
        vectorized=True, n_resamples=300, batch=batch, method="percentile", random_state=np.random.default_rng(3),
    ).bootstrap_distribution
    np.testing.assert_array_equal(ours.T, reference)


def _yes_no_frame(n_images=40, per_image=3, p_correct=0.7, seed=0):
    rng = np.random.default_rng(seed)
    rows, predictions = [], []
    for i in range(n_images):
        for j in range(per_image):
            answer = "yes" if j == 0 else "no"
            right = rng.random() < p_correct
            qid = f"q{i}_{j}"
            rows.append({"question_id": qid, "image_id": f"img{i}", "answer": answer, "rotation": 0,
                         "group_id": qid, "rare": j == 1, "common": False})
            predictions.append({"question_id": qid, "prediction": answer if right else ("no" if answer == "yes" else "yes")})
    return pd.DataFrame(rows), pd.DataFrame(predictions)


def test_evaluate_yes_no_with_interval():
    questions, predictions = _yes_no_frame()
    keys = dict(dataset="hico", qset="yn_obj", condition="clean", model="m", variant="default")
    rows = evaluate(questions, predictions, "yn", keys, BootstrapSettings(resamples=300, seed=1))
    accuracy = rows[(rows.subset == "all") & (rows.metric == "accuracy")].iloc[0]
    truth = (questions.answer.values == predictions.prediction.values).mean()
    assert accuracy.value == pytest.approx(truth)
    assert accuracy.ci_low < accuracy.value < accuracy.ci_high
    assert accuracy.n == 120
    # no common question in this frame; no image tags given, so no image subsets
    assert set(rows.subset) == {"all", "rare", "rare_no", "non_rare", "non_common", "non_rare_no", "non_common_no",
                                "non_rare_yes", "non_common_yes"}
    assert rows[rows.subset == "rare"].n.iloc[0] == 40
    again = evaluate(questions, predictions, "yn", keys, BootstrapSettings(resamples=300, seed=1))
    pd.testing.assert_frame_equal(rows, again)  # seeded


def test_interval_narrows_with_more_images():
    keys = dict(dataset="hico", qset="yn_obj", condition="clean", model="m", variant="default")
    widths = []
    for n_images in (20, 500):
        rows = evaluate(*_yes_no_frame(n_images), "yn", keys, BootstrapSettings(resamples=300))
        acc = rows[(rows.subset == "all") & (rows.metric == "accuracy")].iloc[0]
        widths.append(acc.ci_high - acc.ci_low)
    assert widths[1] < widths[0] / 2


def test_missing_prediction_counts_as_unknown():
    questions, predictions = _yes_no_frame(n_images=5)
    rows = evaluate(questions, predictions.iloc[1:], "yn", {}, NO_BOOTSTRAP)
    unknown = rows[(rows.subset == "all") & (rows.metric == "unknown_ratio")].value.iloc[0]
    assert unknown == pytest.approx(1 / 15)
    with pytest.raises(ValueError, match="answer no known question"):
        evaluate(questions.iloc[1:], predictions, "yn", {}, NO_BOOTSTRAP)


def test_rare_and_common_subsets_split_by_answer():
    """Fig. 3: rare / non-rare (and common / non-common) split the answer-No and the answer-Yes questions."""
    # (answer, rare, common, prediction) per question, one image each
    spec = [("no", True, False, "yes"), ("no", True, True, "no"), ("no", False, True, "yes"),
            ("no", False, False, "no"), ("no", False, False, "no"), ("yes", True, False, "no"),
            ("yes", False, True, "yes"), ("yes", False, False, "yes")]
    questions = pd.DataFrame([{"question_id": f"q{i}", "image_id": f"img{i}", "answer": a, "rotation": 0,
                               "group_id": f"q{i}", "rare": r, "common": c} for i, (a, r, c, _) in enumerate(spec)])
    predictions = pd.DataFrame({"question_id": questions.question_id, "prediction": [p for *_, p in spec]})
    rows = evaluate(questions, predictions, "yn", {}, NO_BOOTSTRAP)
    accuracy = rows[rows.metric == "accuracy"].set_index("subset")
    expected = {  # subset: (questions, accuracy)
        "rare_no": (2, 1 / 2), "non_rare_no": (3, 2 / 3), "common_no": (2, 1 / 2), "non_common_no": (3, 2 / 3),
        "rare_yes": (1, 0.0), "non_rare_yes": (2, 1.0), "common_yes": (1, 1.0), "non_common_yes": (2, 1 / 2),
    }
    for subset, (n, value) in expected.items():
        assert accuracy.at[subset, "n"] == n, subset
        assert accuracy.at[subset, "value"] == pytest.approx(value), subset
    # on a yes-only subset accuracy is recall
    recall = rows[(rows.subset == "rare_yes") & (rows.metric == "recall")].value.iloc[0]
    assert recall == accuracy.at["rare_yes", "value"]
    # MC groups carry no yes/no answer: no answer-split subset appears
    mc = evaluate(*_mc_frame(), "mc", {}, NO_BOOTSTRAP)
    assert not {"rare_no", "non_rare_no", "rare_yes", "non_common_yes"} & set(mc.subset)


def _mc_frame():
    # two groups of 4 rotations; group g1 all right, g2 right only in rotation 0
    rows, predictions = [], []
    for group, right in (("g1", [1, 1, 1, 1]), ("g2", [1, 0, 1, 1])):
        for rotation, ok in enumerate(right):
            qid = f"{group}_{rotation}"
            answer = "ABCD"[rotation]
            rows.append({"question_id": qid, "image_id": group, "answer": answer, "rotation": rotation,
                         "group_id": group, "rare": False, "common": group == "g2"})
            predictions.append({"question_id": qid, "prediction": answer if ok else "unknown"})
    return pd.DataFrame(rows), pd.DataFrame(predictions)


def test_mc_circular_and_plain_accuracy():
    rows = evaluate(*_mc_frame(), "mc", {}, NO_BOOTSTRAP)
    everything = rows[rows.subset == "all"].set_index("metric")
    assert everything.at["circular_accuracy", "value"] == 0.5
    assert everything.at["accuracy", "value"] == 1.0
    assert everything.at["accuracy", "n"] == 2
    common = rows[rows.subset == "common"].set_index("metric")
    assert common.at["circular_accuracy", "value"] == 0.0


def test_consistency_between_runs():
    questions, predictions = _yes_no_frame(n_images=30)
    flipped = predictions.copy()
    flipped.loc[::3, "prediction"] = flipped.loc[::3, "prediction"].map({"yes": "no", "no": "yes"})
    a, b = correctness(questions, predictions, "yn"), correctness(questions, flipped, "yn")
    rows = evaluate_consistency(a, b, {}, BootstrapSettings(resamples=200)).set_index("metric")
    assert rows.at["error_consistency", "value"] == pytest.approx(error_consistency(a.correct, b.correct))
    assert rows.at["observed_consistency", "value"] == pytest.approx(2 / 3)
    same = evaluate_consistency(a, a, {}, NO_BOOTSTRAP).set_index("metric")
    assert same.at["error_consistency", "value"] == pytest.approx(1.0)


def test_unknown_mc_answers_are_wrong_and_counted():
    from verbmirage.evaluation.metrics import mc_group_correctness

    joined = pd.DataFrame({"group_id": ["g1"] * 2 + ["g2"] * 2, "image_id": ["i1"] * 4, "rare": False,
                           "common": False, "rotation": [0, 1, 0, 1], "answer": ["A", "B", "C", "D"],
                           "prediction": ["A", "unknown", "C", "D"]})
    groups = mc_group_correctness(joined).set_index("group_id")
    assert groups.circular_correct.tolist() == [False, True] and groups.plain_correct.tolist() == [True, True]
    assert groups.unknown_rows.tolist() == [1, 0] and groups.rows.tolist() == [2, 2]
    from verbmirage.evaluation.metrics import mc_scores

    assert mc_scores(np.array([2, 1, 2, 4, 1])).tolist() == [0.5, 1.0, 0.25]


def test_one_job_per_run_equals_one_job_per_set(tmp_path):
    """evaluate_run / consistency_run (one job per run or pair) give the rows of the per-set calls."""
    from verbmirage.core.io import write_table
    from verbmirage.benchmark.question_table import QUESTIONS
    from verbmirage.core.schemas import PREDICTIONS
    from verbmirage.evaluation.metrics import consistency_run, correctness, evaluate_consistency, evaluate_run

    settings = BootstrapSettings(resamples=50, seed=2)
    tables, expected, pairs, expected_pairs = [], [], [], []
    for index, qset in enumerate(["yn_obj", "yn_verb"]):
        questions, predictions = _yes_no_frame(seed=index)
        questions = questions.assign(dataset="hico", qset=qset, image=questions.image_id, verb="ride",
                                     object="horse", hoi_id=1, prompt="Is someone riding?", options=None)
        other = _yes_no_frame(seed=index + 5)[1]
        paths = {}
        for name, frame, schema in (("q", questions, QUESTIONS), ("a", predictions, PREDICTIONS),
                                    ("b", other, PREDICTIONS)):
            if schema is PREDICTIONS:
                frame = frame.assign(raw_answer=frame.prediction, parse_rule="greedy:first-token", p_yes=0.5,
                                     yes_margin=None, option_probs=None, confidence=0.9, error=None)
            paths[name] = tmp_path / f"{qset}_{name}.parquet"
            write_table(frame, paths[name], schema)
        tables.append((qset, paths["q"], paths["a"]))
        pairs.append((qset, paths["q"], paths["a"], paths["b"]))
        keys = dict(dataset="hico", qset=qset, condition="clean", model="m", variant="default")
        expected.append(evaluate(questions, predictions, "yn", keys, settings))
        expected_pairs.append(evaluate_consistency(correctness(questions, predictions, "yn"),
                                                   correctness(questions, other, "yn"),
                                                   {**keys, "condition": "clean_vs_noise"}, settings))
    run = evaluate_run(tables, dict(dataset="hico", condition="clean", model="m", variant="default"), settings)
    pd.testing.assert_frame_equal(run, pd.concat(expected, ignore_index=True), check_dtype=False)
    pair = consistency_run(pairs, dict(dataset="hico", condition="clean_vs_noise", model="m", variant="default"),
                           settings)
    pd.testing.assert_frame_equal(pair, pd.concat(expected_pairs, ignore_index=True), check_dtype=False)
