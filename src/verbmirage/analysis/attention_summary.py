"""Correct against hallucinated answers in the attention table: the numbers behind Figs. 7, 8, 13 and 14.

The paper shows these comparisons as densities only. Per (question set, condition,
model, layer, measure) and per group of the paper's figures (YN by ground-truth
answer, MC as one group) this table gives the mean and median of the correct
and of the hallucinated rows, their difference (hallucinated minus correct) with
an image-bootstrap interval, and the AUROC of the measure as a score for
"hallucinated". All of it is ours: the paper states the direction of the
differences, not their size.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from sklearn.metrics import roc_auc_score

from verbmirage.benchmark.question_sets import question_kind
from verbmirage.core.schemas import ATTENTION_SUMMARY
from verbmirage.evaluation.metrics import BootstrapSettings, score_with_interval

MEASURES = ("visual_share", "verb_share", "key_area_share", "key_area_raw", "key_area_lift")
KEYS = ("dataset", "qset", "condition", "model", "layer")


def figure_group(qset: str, answer: str) -> str:
    """The panel of the paper's attention figures a row belongs to: YN by ground truth, MC as a whole."""
    return "mc" if question_kind(qset) == "mc" else f"answer_{answer}"


def _difference(counts: np.ndarray) -> np.ndarray:
    """Mean of the hallucinated minus mean of the correct rows, from summed [sum_h, n_h, sum_c, n_c]."""
    counts = np.asarray(counts, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.stack([counts[..., 0] / counts[..., 1] - counts[..., 2] / counts[..., 3]])


def bootstrap_difference(values, hallucinated, images, resamples: int, confidence: float, seed: int):
    """Mean of the hallucinated minus mean of the correct rows, with a percentile interval over resampled
    images (the metrics' image bootstrap: both means come from the same draw of images)."""

    values, hallucinated = np.asarray(values, float), np.asarray(hallucinated, bool)
    frame = pd.DataFrame({"image_id": list(images), "sum_h": values * hallucinated, "n_h": hallucinated,
                          "sum_c": values * ~hallucinated, "n_c": ~hallucinated})
    per_image = frame.groupby("image_id", sort=True)[["sum_h", "n_h", "sum_c", "n_c"]].sum().to_numpy()
    value, low, high = score_with_interval(per_image, _difference, BootstrapSettings(resamples, confidence, seed))
    return float(value[0]), float(low[0]), float(high[0])


def _comparison_rows(part: pd.DataFrame, measure: str, resamples: int, confidence: float, seed: int) -> list[dict]:
    valid = part[part[measure].notna()]
    hallucinated = ~valid.correct.astype(bool)
    values = valid[measure].astype(float)
    rows = []
    for label, chosen in (("correct", ~hallucinated), ("hallucinated", hallucinated)):
        chosen_values = values[chosen]
        n = int(chosen.sum())
        rows.append((f"mean_{label}", chosen_values.mean() if n else math.nan, math.nan, math.nan, n))
        rows.append((f"median_{label}", chosen_values.median() if n else math.nan, math.nan, math.nan, n))
    both = hallucinated.any() and (~hallucinated).any()
    if both:
        point, low, high = bootstrap_difference(values, hallucinated, valid.image_id, resamples, confidence, seed)
        auroc = float(roc_auc_score(hallucinated, values))
    else:
        point = low = high = auroc = math.nan
    rows.append(("delta_mean", point, low, high, len(valid)))
    rows.append(("auroc_hallucinated", auroc, math.nan, math.nan, len(valid)))
    return [{"measure": measure, "statistic": s, "value": float(v), "ci_low": float(lo), "ci_high": float(hi),
             "n": int(n)} for s, v, lo, hi, n in rows]


def summarize_attention(table: pd.DataFrame, resamples: int = 1000, confidence: float = 0.95,
                        seed: int = 0) -> pd.DataFrame:
    """The ``io.ATTENTION_SUMMARY`` rows of an ``io.ATTENTION`` table (measures all NaN in a group: left out)."""

    if table.empty:
        return pd.DataFrame(columns=ATTENTION_SUMMARY.names)
    table = table.assign(group=[figure_group(q, a) for q, a in zip(table.qset, table.answer)])
    records = []
    for keys, part in table.groupby([*KEYS, "group"], sort=True):
        for measure in MEASURES:
            if part[measure].notna().any():
                records += [{**dict(zip([*KEYS, "group"], keys)), **row}
                            for row in _comparison_rows(part, measure, resamples, confidence, seed)]
    return pd.DataFrame(records, columns=ATTENTION_SUMMARY.names)
