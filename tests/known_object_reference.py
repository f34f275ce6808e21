"""An independent Known-Object AP: a plain loop per HOI in exact fractions, the way HICO's MATLAB code reads.

Shared by the unit tests and the demo-run test: the package's vectorised AP must equal this.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pandas as pd


def row_score(yes_margin, p_yes) -> float:
    """yes_margin, else logit(p_yes) (±inf at 1 and 0), else -inf (no answer)."""
    if yes_margin is not None and not pd.isna(yes_margin):
        return float(yes_margin)
    if p_yes is None or pd.isna(p_yes):
        return -math.inf
    if p_yes >= 1.0:
        return math.inf
    if p_yes <= 0.0:
        return -math.inf
    return math.log(p_yes) - math.log1p(-p_yes)


def ranking_ap(scores: list[float], positives: list[bool]) -> tuple[float, float]:
    """(non-interpolated AP, VOC 11-point AP) of one ranking; ties keep the given order (a stable sort)."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    labels = [positives[i] for i in order]
    n_pos = sum(labels)
    if n_pos == 0:
        return math.nan, math.nan
    tp = fp = 0
    precision, recall = [], []
    for label in labels:
        tp, fp = tp + label, fp + (not label)
        precision.append(Fraction(tp, tp + fp))
        recall.append(Fraction(tp, n_pos))
    ap = sum(p for p, label in zip(precision, labels) if label) / n_pos
    ap11 = sum(max([p for p, r in zip(precision, recall) if r >= Fraction(k, 10)], default=Fraction(0))
               for k in range(11)) / 11
    return float(ap), float(ap11)


def reference_ap_table(questions: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    """hoi_id, n, n_pos, ap, ap_voc11 per HOI of ``questions``, from ``predictions`` (io.PREDICTIONS rows)."""
    answers = {row.question_id: (row.yes_margin, row.p_yes) for row in predictions.itertuples()}
    rows = []
    for hoi, group in questions.groupby("hoi_id", sort=True):
        scores = [row_score(*answers.get(qid, (None, None))) for qid in group.question_id]
        positives = [answer == "yes" for answer in group.answer]
        ap, ap11 = ranking_ap(scores, positives)
        rows.append({"hoi_id": int(hoi), "n": len(group), "n_pos": sum(positives), "ap": ap, "ap_voc11": ap11})
    return pd.DataFrame(rows)
