"""Metrics (docs/analysis.md), each with n and a bootstrap interval over images.

Every metric here is a function of a few counts summed over images (e.g. true
positives, false positives, ...). So the bootstrap resamples *images* (the
unit of dependence: questions on one image are correlated) by summing their
per-image counts (:func:`resampled_sums`, the draws of scipy's paired ``bootstrap``) for all metrics
of a table at once. The formulas equal scikit-learn's (tests check it); they
are written on counts because the bootstrap evaluates them thousands of times.

Values are fractions in [0, 1]; tables turn them into percent. A metric whose
denominator is 0 (precision of a model that never says yes, recall on
``rare_no``) is NaN, not 0: it is undefined, not bad. F1 is
2tp / (2tp + fp + fn) (scikit-learn's form), so it is 0 rather than NaN when
only one of precision and recall is undefined, and NaN when tp = fp = fn = 0.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from verbmirage.benchmark.conditions import condition_questions
from verbmirage.benchmark.image_tags import TAG_COLUMNS
from verbmirage.benchmark.question_sets import question_kind
from verbmirage.benchmark.question_table import QUESTIONS, question_sample, sample_settings
from verbmirage.core.io import read_provenance, read_table
from verbmirage.core.schemas import PREDICTIONS
from verbmirage.models.base import UNKNOWN

YES_NO_COUNTS = ("tp", "fp", "fn", "tn", "unknown_yes", "unknown_no")
YES_NO_METRICS = (
    "accuracy", "precision", "recall", "f1",
    "precision_no", "recall_no", "f1_no", "yes_ratio", "unknown_ratio",
)
MC_COUNTS = ("groups", "circular_correct", "plain_correct", "rows", "unknown_rows")
MC_METRICS = ("circular_accuracy", "accuracy", "unknown_ratio")  # unknown_ratio: share of asked rotations
CONSISTENCY_COUNTS = ("n", "agree", "correct_a", "correct_b")
CONSISTENCY_METRICS = ("error_consistency", "observed_consistency", "expected_consistency")


@dataclass(frozen=True)
class BootstrapSettings:
    """Config key ``metrics``: resamples (0 = no interval), interval level, seed."""

    resamples: int = 1000
    level: float = 0.95
    seed: int = 0

    @classmethod
    def from_config(cls, metrics: dict) -> "BootstrapSettings":
        """From the config's ``metrics:`` block (``bootstrap_resamples``, ``confidence_level``, ``seed``)."""
        return cls(metrics["bootstrap_resamples"], metrics["confidence_level"], metrics["seed"])


def _ratio(numerator, denominator):
    """numerator / denominator, NaN where the denominator is 0 (the metric is undefined there)."""
    numerator, denominator = np.asarray(numerator, float), np.asarray(denominator, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1), np.nan)


def _f1(true_positive, false_positive, false_negative):
    """Harmonic mean of precision and recall, from counts: defined whenever any of them is non-zero."""
    return _ratio(2 * true_positive, 2 * true_positive + false_positive + false_negative)


def yes_no_scores(counts: np.ndarray) -> np.ndarray:
    """Metrics from summed counts (last axis ordered as ``YES_NO_COUNTS``).

    "unknown" answers count as wrong: a miss for a yes question, never a
    "no" prediction. Precision/recall with no as the positive class too.
    """
    tp, fp, fn, tn, unknown_yes, unknown_no = np.moveaxis(np.asarray(counts, float), -1, 0)
    n = tp + fp + fn + tn + unknown_yes + unknown_no
    precision, recall = _ratio(tp, tp + fp), _ratio(tp, tp + fn + unknown_yes)
    precision_no, recall_no = _ratio(tn, tn + fn), _ratio(tn, tn + fp + unknown_no)
    return np.stack(
        [
            _ratio(tp + tn, n), precision, recall, _f1(tp, fp, fn + unknown_yes),
            precision_no, recall_no, _f1(tn, fn, fp + unknown_no),
            _ratio(tp + fp, n), _ratio(unknown_yes + unknown_no, n),
        ]
    )


def mc_scores(counts: np.ndarray) -> np.ndarray:
    groups, circular, plain, rows, unknown = np.moveaxis(np.asarray(counts, float), -1, 0)
    return np.stack([_ratio(circular, groups), _ratio(plain, groups), _ratio(unknown, rows)])


def consistency_scores(counts: np.ndarray) -> np.ndarray:
    """Error consistency of Geirhos et al. (2020): kappa = (c_obs - c_exp) / (1 - c_exp)."""
    n, agree, correct_a, correct_b = np.moveaxis(np.asarray(counts, float), -1, 0)
    p_a, p_b = _ratio(correct_a, n), _ratio(correct_b, n)
    observed = _ratio(agree, n)
    expected = p_a * p_b + (1 - p_a) * (1 - p_b)
    # Undefined (NaN) when both runs are always right or always wrong: c_exp = 1.
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa = np.where(expected < 1, (observed - expected) / (1 - expected), np.nan)
    return np.stack([kappa, observed, expected])


def error_consistency(correct_a, correct_b) -> float:
    """Kappa of two correctness vectors on the same questions."""
    a, b = np.asarray(correct_a, bool), np.asarray(correct_b, bool)
    counts = np.array([len(a), (a == b).sum(), a.sum(), b.sum()])
    return float(consistency_scores(counts)[0])


def yes_no_count_columns(answer: pd.Series, prediction: pd.Series) -> pd.DataFrame:
    """Per-question indicator columns (``YES_NO_COUNTS``) from truth and prediction."""
    truth_yes = answer.eq("yes").to_numpy()
    said_yes, said_no = prediction.eq("yes").to_numpy(), prediction.eq("no").to_numpy()
    unknown = ~(said_yes | said_no)
    return pd.DataFrame(
        {
            "tp": truth_yes & said_yes,
            "fp": ~truth_yes & said_yes,
            "fn": truth_yes & said_no,
            "tn": ~truth_yes & said_no,
            "unknown_yes": truth_yes & unknown,
            "unknown_no": ~truth_yes & unknown,
        },
        index=answer.index,
    ).astype(int)


def resampled_sums(per_image: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """Column sums of ``per_image`` over ``resamples`` bootstrap resamples of its rows: [resamples, columns].

    The draws are scipy.stats.bootstrap's for paired data (same generator calls, same batches), so the
    intervals equal scipy's; but a resample's sums are its row counts times ``per_image``, where scipy
    gathers every resampled column first (4/5 of a metric job's time, bench/README.md). Hand-written for that
    reason: no library sums a resample through counts.
    """
    rows = len(per_image)
    batch = max(1, min(resamples, 2_000_000 // max(1, per_image.size)))  # scipy's batch for our call
    rng = np.random.default_rng(seed)
    sums = []
    for start in range(0, resamples, batch):
        size = min(batch, resamples - start)
        drawn = rng.integers(0, rows, (size, rows)) + rows * np.arange(size)[:, None]
        counts = np.bincount(drawn.ravel(), minlength=size * rows).reshape(size, rows)
        sums.append(counts @ per_image)
    return np.concatenate(sums)


def score_with_interval(
    per_image: np.ndarray, score: Callable[[np.ndarray], np.ndarray], settings: BootstrapSettings
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Point values and a percentile bootstrap interval over images (rows of ``per_image``)."""
    per_image = np.asarray(per_image, float)
    value = score(per_image.sum(axis=0))
    nan = np.full_like(value, np.nan)
    if settings.resamples <= 0 or len(per_image) < 2:
        return value, nan, nan
    distribution = score(resampled_sums(per_image, settings.resamples, settings.seed))
    # scipy's percentile interval, but over the resamples where the metric is defined: a resample of a
    # small subset may draw no image with a yes answer (recall undefined), which would make the
    # whole interval NaN. Equal to scipy's interval when every resample is defined.
    tail = 100 * (1 - settings.level) / 2
    if not np.isnan(distribution).any():  # the same values; nanpercentile loops over the metrics in Python
        low, high = np.percentile(distribution, [tail, 100 - tail], axis=-1)
        return value, low, high
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN: the metric itself is undefined
        low, high = np.nanpercentile(distribution, [tail, 100 - tail], axis=-1)
    return value, low, high


def _per_image(frame: pd.DataFrame, columns) -> np.ndarray:
    return frame.groupby("image_id", sort=True)[list(columns)].sum().to_numpy()


def _image_sums(codes: np.ndarray, values: np.ndarray, images: int) -> np.ndarray:
    """Row sums of ``values`` per image (``codes``: each row's image in sorted image-id order, of ``images``),
    images without a row left out: :func:`_per_image` on a subset, without grouping the table again."""
    present = np.bincount(codes, minlength=images) > 0
    return np.stack([np.bincount(codes, weights=values[:, j], minlength=images)[present]
                     for j in range(values.shape[1])], axis=1)


def join_predictions(questions: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    """Questions with their prediction; a question without one counts as "unknown"."""
    extra = set(predictions.question_id) - set(questions.question_id)
    if extra:
        raise ValueError(f"{len(extra)} predictions answer no known question, e.g. {sorted(extra)[:3]}")
    joined = questions.merge(predictions[["question_id", "prediction"]], on="question_id", how="left")
    joined["prediction"] = joined["prediction"].fillna("unknown")
    return joined


def mc_group_correctness(joined: pd.DataFrame) -> pd.DataFrame:
    """One row per MC group: circular (all rotations right) and plain (rotation 0) correctness."""
    correct = joined.prediction.eq(joined.answer)  # unknown (and unanswered) counts as wrong
    joined = joined.assign(correct=correct, plain=correct & joined.rotation.eq(0),
                           unknown=joined.prediction.eq(UNKNOWN))
    groups = joined.groupby("group_id", sort=True).agg(
        image_id=("image_id", "first"),
        rare=("rare", "first"),
        common=("common", "first"),
        circular_correct=("correct", "all"),
        plain_correct=("plain", "any"),
        rows=("correct", "size"),
        unknown_rows=("unknown", "sum"),
        **{tag: (tag, "first") for tag in TAG_COLUMNS if tag in joined},
    )
    return groups.reset_index()


def attach_tags(frame: pd.DataFrame, tags: pd.DataFrame, where: str = "image tags") -> pd.DataFrame:
    """``frame`` with the per-image tag columns (``image_tags.parquet``) joined on ``image_id``.

    A question on an image the tags do not know is an error: its subsets would be silently wrong.
    """
    missing = [tag for tag in ("image_id", *TAG_COLUMNS) if tag not in tags]
    if missing:
        raise ValueError(f"{where}: missing columns {missing}")
    unknown = sorted(set(frame.image_id) - set(tags.image_id))
    if unknown:
        raise ValueError(f"{where}: no row for {len(unknown)} question images, e.g. {unknown[:3]}")
    table = tags[["image_id", *TAG_COLUMNS]].drop_duplicates("image_id")
    return frame.drop(columns=[t for t in TAG_COLUMNS if t in frame]).merge(
        table.astype({tag: bool for tag in TAG_COLUMNS}), on="image_id", how="left", validate="many_to_one"
    )


def _answer_is(frame: pd.DataFrame, answer: str) -> pd.Series:
    """Questions whose correct answer is ``answer``; none for MC groups (they carry no yes/no answer)."""
    return frame.get("answer", pd.Series("", index=frame.index)).eq(answer)


SUBSETS: dict[str, Callable[[pd.DataFrame], pd.Series]] = {
    "all": lambda f: pd.Series(True, index=f.index),
    "rare": lambda f: f.rare.astype(bool),
    "common": lambda f: f.common.astype(bool),
    # Paper Fig. 3: questions whose correct answer is No, by rare / common verb.
    "rare_no": lambda f: f.rare.astype(bool) & _answer_is(f, "no"),
    "common_no": lambda f: f.common.astype(bool) & _answer_is(f, "no"),
    # The complements the paper's figures compare against.
    "non_rare": lambda f: ~f.rare.astype(bool),
    "non_common": lambda f: ~f.common.astype(bool),
    # Fig. 3's other bar, among the same answer-No questions.
    "non_rare_no": lambda f: ~f.rare.astype(bool) & _answer_is(f, "no"),
    "non_common_no": lambda f: ~f.common.astype(bool) & _answer_is(f, "no"),
    # The yes side ("refuse existent rare verbs"): accuracy here is the recall of that subset.
    "rare_yes": lambda f: f.rare.astype(bool) & _answer_is(f, "yes"),
    "non_rare_yes": lambda f: ~f.rare.astype(bool) & _answer_is(f, "yes"),
    "common_yes": lambda f: f.common.astype(bool) & _answer_is(f, "yes"),
    "non_common_yes": lambda f: ~f.common.astype(bool) & _answer_is(f, "yes"),
}

# Image subsets from HICO-DET boxes (verbmirage.benchmark.image_tags): only when tags are given (datasets.hico.det_root).
TAG_SUBSETS: dict[str, Callable[[pd.DataFrame], pd.Series]] = {
    **{tag: (lambda f, tag=tag: f[tag].astype(bool)) for tag in ("ambiguous", "amb_size", "amb_crowd",
                                                                 "amb_occlusion", "amb_invisible")},
    "unambiguous": lambda f: ~f.ambiguous.astype(bool),
    "single_instance": lambda f: f.single_instance.astype(bool),
}


def _rows(keys: dict, subset: str, names, value, low, high, n) -> list[dict]:
    return [
        {**keys, "subset": subset, "metric": name, "value": float(v), "ci_low": float(lo),
         "ci_high": float(hi), "n": int(n)}
        for name, v, lo, hi in zip(names, value, low, high)
    ]


def evaluate(
    questions: pd.DataFrame,
    predictions: pd.DataFrame,
    kind: str,
    keys: dict,
    settings: BootstrapSettings,
    tags: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Long-format metric rows of one prediction table, for every non-empty subset.

    With ``tags`` (``image_tags.parquet``) the image subsets of ``TAG_SUBSETS`` are added.
    """
    joined = join_predictions(questions, predictions)
    subsets = SUBSETS
    if tags is not None:
        joined = attach_tags(joined, tags)
        subsets = {**SUBSETS, **TAG_SUBSETS}
    if kind == "yn":
        units = pd.concat([joined, yes_no_count_columns(joined.answer, joined.prediction)], axis=1)
        columns, names, score = YES_NO_COUNTS, YES_NO_METRICS, yes_no_scores
    else:
        units = mc_group_correctness(joined)
        units["groups"] = 1
        columns, names, score = MC_COUNTS, MC_METRICS, mc_scores
        units[["circular_correct", "plain_correct"]] = units[["circular_correct", "plain_correct"]].astype(int)
    codes, images = pd.factorize(units.image_id, sort=True)
    values = units[list(columns)].to_numpy(float)
    rows = []
    for subset, select in subsets.items():
        chosen = select(units).to_numpy(bool)
        if not chosen.any():
            continue
        per_image = _image_sums(codes[chosen], values[chosen], len(images))
        value, low, high = score_with_interval(per_image, score, settings)
        rows += _rows(keys, subset, names, value, low, high, int(chosen.sum()))
    # no question at all (a crop condition on a dataset without single-instance images): no rows, same columns
    return pd.DataFrame(rows, columns=[*keys, "subset", "metric", "value", "ci_low", "ci_high", "n"])


def correctness(questions: pd.DataFrame, predictions: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Per unit (question for YN, group for MC): ``unit``, ``image_id``, ``correct``."""
    joined = join_predictions(questions, predictions)
    if kind == "yn":
        return pd.DataFrame(
            {"unit": joined.question_id, "image_id": joined.image_id, "correct": joined.prediction.eq(joined.answer)}
        )
    groups = mc_group_correctness(joined)
    return pd.DataFrame({"unit": groups.group_id, "image_id": groups.image_id, "correct": groups.circular_correct})


def evaluate_consistency(
    correct_a: pd.DataFrame, correct_b: pd.DataFrame, keys: dict, settings: BootstrapSettings
) -> pd.DataFrame:
    """Error consistency between two runs on the same questions (inner join on the unit)."""
    both = correct_a.merge(correct_b[["unit", "correct"]], on="unit", suffixes=("_a", "_b"))
    if both.empty:
        raise ValueError("the two runs share no question")
    both["n"] = 1
    both["agree"] = (both.correct_a == both.correct_b).astype(int)
    both["correct_a"] = both.correct_a.astype(int)
    both["correct_b"] = both.correct_b.astype(int)
    value, low, high = score_with_interval(_per_image(both, CONSISTENCY_COUNTS), consistency_scores, settings)
    return pd.DataFrame(_rows(keys, "all", CONSISTENCY_METRICS, value, low, high, len(both)))


# ---- one job per run: every question set of a (dataset, condition, model, variant) -----------------------
def evaluate_run(
    tables: Sequence[tuple[str, str | Path, str | Path]],
    keys: dict,
    settings: BootstrapSettings,
    tags: pd.DataFrame | None = None,
    images_dir: str | Path | None = None,
) -> pd.DataFrame:
    """Metric rows of one run (``keys``: dataset, condition, model, variant) over its question sets.

    ``tables``: (qset, question table, prediction table) per set. ``images_dir``: the folder of a partial
    condition (crop): only the questions on its images count. One job per run instead of one per set
    keeps the paper-scale plan small (docs/models.md, "Sharding and resume").
    """

    parts = []
    for qset, questions_path, predictions_path in tables:
        questions = questions_answered_by(read_table(questions_path, QUESTIONS), predictions_path)
        if images_dir:
            questions = condition_questions(questions, images_dir)
        set_keys = {"dataset": keys["dataset"], "qset": qset, **{k: v for k, v in keys.items() if k != "dataset"}}
        parts.append(evaluate(questions, read_table(predictions_path, PREDICTIONS), question_kind(qset), set_keys,
                              settings, tags=tags))
    parts = [part for part in parts if len(part)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=[
        "dataset", "qset", *[k for k in keys if k != "dataset"], "subset", "metric", "value", "ci_low", "ci_high",
        "n"])


def questions_answered_by(questions: pd.DataFrame, predictions_path: str | Path) -> pd.DataFrame:
    """The questions a prediction table answers: all of them, or the fixed sample its model was asked
    (``sample_questions``, recorded in the table's provenance), so that no unasked question counts as wrong."""

    sample = sample_settings(read_provenance(predictions_path).get("model"))
    return questions if sample is None else question_sample(questions, *sample).reset_index(drop=True)


def consistency_run(
    tables: Sequence[tuple[str, str | Path, str | Path, str | Path]],
    keys: dict,
    settings: BootstrapSettings,
    images_dirs: Sequence[str | Path] = (),
) -> pd.DataFrame:
    """Error-consistency rows of one model between two conditions (``keys['condition']`` = ``a_vs_b``), per set.

    ``tables``: (qset, question table, reference predictions, other predictions). ``images_dirs``: the
    folders of the partial conditions of the pair: only the questions on their images are compared.
    """

    parts = []
    for qset, questions_path, reference_path, other_path in tables:
        questions = questions_answered_by(read_table(questions_path, QUESTIONS), reference_path)
        for folder in images_dirs:
            questions = condition_questions(questions, folder)
        if images_dirs and questions.empty:  # a crop without single-instance questions: nothing to compare
            continue
        asked = set(questions.question_id)
        # the full-image run also answered questions a crop does not ask: leave those out
        runs = [read_table(path, PREDICTIONS) for path in (reference_path, other_path)]
        runs = [frame[frame.question_id.isin(asked)] if images_dirs else frame for frame in runs]
        kind = question_kind(qset)
        set_keys = {"dataset": keys["dataset"], "qset": qset, **{k: v for k, v in keys.items() if k != "dataset"}}
        parts.append(evaluate_consistency(correctness(questions, runs[0], kind), correctness(questions, runs[1], kind),
                                          set_keys, settings))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=[
        "dataset", "qset", *[k for k in keys if k != "dataset"], "subset", "metric", "value", "ci_low", "ci_high",
        "n"])
