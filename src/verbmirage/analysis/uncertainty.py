"""Token uncertainty (paper Eq. 2, Figs. 9 and 12): how sure a model is of its answer, correct vs hallucinated.

u is the prediction table's ``confidence`` column: the probability of the answer token at the first
answer position (the decoded first token: under greedy decoding the top token of the whole vocabulary). It is
read, never recomputed, so a
change of its definition in the scoring code reaches every table here unchanged.

- The unit is one question row (an MC rotation is one forward pass, so one row).
- Groups: YN rows by the *predicted* answer (``pred_yes``, ``pred_no``; the paper's Fig. 9 text, plus
  ``pred_other`` for an answer that is neither, always hallucinated: ours), MC rows all together
  (``mc``). YN sets are pooled into one label (``yn_obj+yn_verb``) when ``pool_yn`` is set.
- Only a token probability is a confidence here. The blind baselines' ``confidence`` is their own
  prior and CLIP's a similarity score, an ensemble's a vote share
  (:data:`~verbmirage.analysis.uncertainty_settings.NO_TOKEN_PROBABILITY_BACKENDS`): those models are skipped
  (:func:`~verbmirage.analysis.uncertainty_settings.token_probability_models`) and named in the figures.
- Rows with an ``error`` (or no finite confidence) are dropped from the distributions and counted
  (metric ``n_dropped``).

Outputs: density histograms on shared bins (``io.UNCERTAINTY_HIST``) and long metric rows
(``io.METRICS``): ``conf_mean`` (image-bootstrap interval) and ``conf_median`` per
``<group>:correct|hallucinated``, and, beyond the paper, ``conf_auroc`` per group: the AUROC of u
as a score for correctness (the Mann-Whitney U statistic over n_correct x n_hallucinated).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from verbmirage.analysis.uncertainty_settings import UncertaintySettings
from verbmirage.benchmark.question_sets import question_kind
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.io import read_table
from verbmirage.core.schemas import PREDICTIONS
from verbmirage.evaluation.metrics import BootstrapSettings, score_with_interval

log = logging.getLogger(__name__)

GROUPS = ("pred_yes", "pred_no", "pred_other", "mc")
YN_GROUPS = {"yes": "pred_yes", "no": "pred_no"}
OUTCOMES = {True: "correct", False: "hallucinated"}
# Values a float32 softmax may overshoot [0, 1] by; anything further out is a broken table.
TOLERANCE = 1e-6


def bin_edges(bins: int) -> np.ndarray:
    """``bins`` equal bins on [0, 1], shared by every series (the last bin holds u = 1)."""
    return np.linspace(0.0, 1.0, bins + 1)


def read_runs(runs: Iterable[Mapping], keys: Sequence[str],
              where: bool = False) -> list[tuple[dict, pd.DataFrame, object]]:
    """The tables of a plan's analysis runs (``Plan.uncertainty.runs``, ``Plan.fov.runs``), as
    :func:`uncertainty_tables` and :func:`~verbmirage.analysis.fov.fov_tables` take them: per run, the ``keys``
    of its dict (with ``where: True`` also ``where``, its predictions' file, named in errors), its question table
    (each file read once) and its prediction table, or ``{condition: table}`` where it names one per condition."""
    questions: dict[str, pd.DataFrame] = {}
    tables = []
    for run in runs:
        if run["questions"] not in questions:
            questions[run["questions"]] = read_table(run["questions"], QUESTIONS)
        named = {k: run[k] for k in keys} | ({"where": run["predictions"]} if where else {})
        predictions = run["predictions"]
        tables.append((named, questions[run["questions"]],
                       {c: read_table(path, PREDICTIONS) for c, path in predictions.items()}
                       if isinstance(predictions, Mapping) else read_table(predictions, PREDICTIONS)))
    return tables


def confidence_rows(questions: pd.DataFrame, predictions: pd.DataFrame, where: str = "predictions") -> pd.DataFrame:
    """One row per answered question row: ``qset, question_id, image_id, group_id, rotation, answer,
    prediction, correct, confidence, group, usable``.

    ``usable`` rows enter the distributions: no error and a finite confidence. ``confidence`` is null
    where the row is not usable. A YN answer other than yes or no is in group ``pred_other``.
    """
    duplicated = predictions.question_id[predictions.question_id.duplicated()]
    if len(duplicated):
        raise ValueError(f"{where}: question_id {duplicated.iloc[0]!r} answered twice")
    extra = set(predictions.question_id) - set(questions.question_id)
    if extra:
        raise ValueError(f"{where}: {len(extra)} predictions answer no known question, e.g. {sorted(extra)[:3]}")
    columns = ["qset", "question_id", "image_id", "group_id", "rotation", "answer", "rare", "common"]
    rows = questions[columns].merge(
        predictions[["question_id", "prediction", "confidence", "error"]],
        on="question_id", how="inner", validate="one_to_one",
    )
    confidence = pd.to_numeric(rows.confidence, errors="coerce").astype(float)
    kind = rows.qset.map(question_kind)
    group = np.where(kind.eq("mc"), "mc", rows.prediction.map(YN_GROUPS).fillna("pred_other"))
    usable = rows.error.isna() & np.isfinite(confidence)
    outside = usable & ((confidence < -TOLERANCE) | (confidence > 1 + TOLERANCE))
    if outside.any():
        row = int(np.flatnonzero(outside.to_numpy())[0])
        raise ValueError(f"{where}: question {rows.question_id.iloc[row]!r}: confidence "
                         f"{confidence.iloc[row]!r} is not a probability")
    return rows.assign(
        correct=rows.prediction.eq(rows.answer) & rows.error.isna(),
        confidence=confidence.clip(0.0, 1.0).where(usable),
        group=group,
        usable=usable,
    )


def histogram_rows(rows: pd.DataFrame, keys: dict, edges: np.ndarray) -> list[dict]:
    """Histogram rows (``io.UNCERTAINTY_HIST``) of the usable rows, per group and correctness.

    ``density`` integrates to 1 over each non-empty series (matplotlib's ``density=True``).
    """
    out = []
    usable = rows[rows.usable]
    for group in GROUPS:
        for correct in (True, False):
            values = usable.confidence[(usable.group == group) & (usable.correct == correct)].to_numpy(float)
            if not len(values):
                continue
            counts, _ = np.histogram(values, bins=edges)
            density = counts / (len(values) * np.diff(edges))
            out += [
                {**keys, "group": group, "correct": correct, "bin_left": float(left), "bin_right": float(right),
                 "count": int(count), "density": float(dens)}
                for left, right, count, dens in zip(edges[:-1], edges[1:], counts, density)
            ]
    return out


def auroc(scores_correct, scores_hallucinated) -> float:
    """AUROC of u as a score for correctness: P(u_correct > u_hallucinated) + P(tie) / 2; NaN if a side is empty."""
    correct, wrong = np.asarray(scores_correct, float), np.asarray(scores_hallucinated, float)
    if not len(correct) or not len(wrong):
        return float("nan")
    import scipy.stats  # deferred on purpose: planning a run imports this module, scipy.stats costs a second

    return float(scipy.stats.mannwhitneyu(correct, wrong).statistic / (len(correct) * len(wrong)))


def mean_from_sums(counts: np.ndarray) -> np.ndarray:
    """Mean from summed (sum of u, rows); a bootstrap replicate always has rows."""
    return np.stack([counts[..., 0] / counts[..., 1]])


def _metric(keys: dict, subset: str, metric: str, value, low=np.nan, high=np.nan, n: int = 0) -> dict:
    return {**keys, "subset": subset, "metric": metric, "value": float(value), "ci_low": float(low),
            "ci_high": float(high), "n": int(n)}


def metric_rows(rows: pd.DataFrame, keys: dict, bootstrap: BootstrapSettings) -> list[dict]:
    """``conf_mean`` (image-bootstrap interval), ``conf_median`` per group and outcome; ``conf_auroc`` per
    group; ``n_dropped`` (rows not in any distribution) under subset ``all``."""
    keys = {"dataset": "hico", **keys}
    out = [_metric(keys, "all", "n_dropped", int((~rows.usable).sum()), n=len(rows))]
    usable = rows[rows.usable]
    for group in GROUPS:
        in_group = usable[usable.group == group]
        if in_group.empty:
            continue
        for correct, outcome in OUTCOMES.items():
            part = in_group[in_group.correct == correct]
            if part.empty:
                continue
            per_image = part.groupby("image_id", sort=True).confidence.agg(["sum", "count"]).to_numpy(float)
            value, low, high = score_with_interval(per_image, mean_from_sums, bootstrap)
            subset = f"{group}:{outcome}"
            out.append(_metric(keys, subset, "conf_mean", value[0], low[0], high[0], len(part)))
            out.append(_metric(keys, subset, "conf_median", part.confidence.median(), n=len(part)))
        score = auroc(in_group.confidence[in_group.correct], in_group.confidence[~in_group.correct])
        out.append(_metric(keys, group, "conf_auroc", score, n=len(in_group)))
    return out


def pooled_label(qset: str, yn_sets: Iterable[str], pool_yn: bool) -> str:
    """The ``qset`` value a set is reported under: the YN sets joined by ``+`` when pooled, else itself."""
    yn_sets = list(yn_sets)
    if pool_yn and qset in yn_sets:
        return "+".join(yn_sets)
    return qset


def uncertainty_tables(
    runs: Iterable[tuple[dict, pd.DataFrame, pd.DataFrame]],
    settings: UncertaintySettings,
    bootstrap: BootstrapSettings,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Histogram rows and metric rows from ``(keys, questions, predictions)`` runs of token-probability models.

    ``keys`` holds ``model, variant, condition, qset`` (and optionally ``where``, the file named in errors).
    Runs of one model, variant and condition whose sets are pooled are concatenated first.
    """
    runs = list(runs)
    yn_sets = [q for q in dict.fromkeys(k["qset"] for k, _, _ in runs) if question_kind(q) == "yn"]
    series: dict[tuple, list[pd.DataFrame]] = {}
    for keys, questions, predictions in runs:
        rows = confidence_rows(questions, predictions, keys.get("where", "predictions"))
        label = pooled_label(keys["qset"], yn_sets, settings.pool_yn)
        series.setdefault((keys["model"], keys["variant"], keys["condition"], label), []).append(rows)
    edges = bin_edges(settings.bins)
    hist, metrics = [], []
    for (model, variant, condition, qset), parts in series.items():
        rows = pd.concat(parts, ignore_index=True)
        keys = {"model": model, "variant": variant, "condition": condition, "qset": qset}
        dropped = int((~rows.usable).sum())
        if dropped:
            log.info("uncertainty: %s %s %s %s: %d of %d rows dropped (error or no confidence)",
                     model, variant, condition, qset, dropped, len(rows))
        hist += histogram_rows(rows, keys, edges)
        metrics += metric_rows(rows, keys, bootstrap)
    hist_columns = ["model", "variant", "condition", "qset", "group", "correct", "bin_left", "bin_right", "count",
                    "density"]
    metric_columns = ["dataset", "qset", "condition", "model", "variant", "subset", "metric", "value", "ci_low",
                      "ci_high", "n"]
    return pd.DataFrame(hist, columns=hist_columns), pd.DataFrame(metrics, columns=metric_columns)
