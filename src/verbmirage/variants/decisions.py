"""Calibrated decisions on a model's scores: beyond the paper, training-free (docs/variants.md, "Calibrated decisions").

A variant with ``decision: {method: ...}`` (:class:`~verbmirage.variants.settings.DecisionSettings`) keeps the model's
scores and replaces its yes/no (or letter) decision:

- ``threshold``: predict yes iff ``yes_margin >= cut``, where the cut maximises ``metric`` (accuracy, or F1
  with yes as positive) on a calibration set: the benchmark's YN protocol on ``calibration_images`` seeded
  *training* images (:func:`build_calibration_set`, never a test image). One cut per (model, variant,
  condition, YN question set), fitted by :func:`calibrate` in a job of its own (``results/calibration/``).
  MC rows, and YN sets without a calibration set (CharadesEgo), keep the plain decision.
- ``content_free`` (contextual calibration, Zhao et al. 2021): the same prompt is scored on content-free
  images (a grey ``blank`` and the ``mean`` of training images, :func:`write_content_free_images`); their
  probability vectors are averaged, p_cf, and the answer's probabilities are divided by p_cf and
  renormalised (W = diag(p_cf)^-1). For YN that is exactly ``margin - margin_cf``. Computed once per
  distinct prompt per job.

The calibrated rows keep ``raw_answer`` (the model's text) and ``confidence`` (its answer token's
probability); ``p_yes``/``yes_margin``/``option_probs`` become the calibrated scores and ``parse_rule`` is
``calibrated:threshold`` or ``calibrated:content_free``. ``yes_margin`` is ``logsumexp(yes) - logsumexp(no)``
where the backend has logits, else ``logit(p_yes)`` (:func:`margin_of`).

Inference applies a rule through :func:`decision_model`, a wrapper around the loaded model, so every backend
that returns scores (transformers, remote-code adapters, the API) calibrates the same way.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from verbmirage.core.paths import atomic_path

log = logging.getLogger(__name__)

THRESHOLD_RULE = "calibrated:threshold"
CONTENT_FREE_RULE = "calibrated:content_free"
METRICS = ("accuracy", "f1")


# ---- scores ------------------------------------------------------------------------------------------------
def sigmoid(x: float) -> float:
    """1 / (1 + exp(-x)) without overflow; NaN stays NaN."""
    if math.isnan(x):
        return math.nan
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def logit(p: float) -> float:
    """log(p / (1 - p)): +-inf at 1 and 0, NaN outside [0, 1] or for NaN."""
    if p is None or not 0.0 <= p <= 1.0:
        return math.nan
    if p == 0.0:
        return -math.inf
    if p == 1.0:
        return math.inf
    return math.log(p) - math.log1p(-p)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def mean_probability_margin(margins: Sequence[float]) -> float:
    """The yes-vs-no log-odds of the *averaged* probability vectors (p_i = sigmoid(m_i)), computed in log space.

    Averaging probabilities, not margins, is what the reference code of contextual calibration does.
    """
    m = np.asarray(margins, dtype=np.float64)
    log_yes = -_softplus(-m)  # log sigmoid(m)
    log_no = -_softplus(m)  # log (1 - sigmoid(m))
    return float(np.logaddexp.reduce(log_yes) - np.logaddexp.reduce(log_no))


# ---- threshold ---------------------------------------------------------------------------------------------
def candidate_cuts(margins: np.ndarray) -> np.ndarray:
    """Every cut that gives distinct predictions (``yes iff margin >= cut``), ascending: the distinct defined
    margins, then the next float above the largest (all "no" here, yet a finite shift that keeps the
    calibrated scores ranked: a higher margin elsewhere still says yes)."""
    margins = np.asarray(margins, dtype=np.float64)
    defined = margins[~np.isnan(margins)]
    above = np.nextafter(defined.max(), np.inf) if len(defined) else np.inf
    return np.unique(np.append(defined, above))


def metric_at_cuts(margins: np.ndarray, is_yes: np.ndarray, cuts: np.ndarray, metric: str) -> np.ndarray:
    """``metric`` of the predictions ``margin >= cut`` for each cut (rows with NaN margins left out), vectorised.

    Counts by binary search over the sorted margins of each class, so a fit costs O(n log n).
    """
    if metric not in METRICS:
        raise ValueError(f"decision.metric: '{metric}' is not one of {list(METRICS)}")
    margins, is_yes = np.asarray(margins, dtype=np.float64), np.asarray(is_yes, dtype=bool)
    defined = ~np.isnan(margins)
    positives, negatives = np.sort(margins[defined & is_yes]), np.sort(margins[defined & ~is_yes])
    cuts = np.asarray(cuts, dtype=np.float64)
    tp = len(positives) - np.searchsorted(positives, cuts, side="left")
    fp = len(negatives) - np.searchsorted(negatives, cuts, side="left")
    fn, tn = len(positives) - tp, len(negatives) - fp
    if metric == "accuracy":
        total = len(positives) + len(negatives)
        return (tp + tn) / total if total else np.full(len(cuts), np.nan)
    denominator = 2 * tp + fp + fn
    return np.where(denominator > 0, 2 * tp / np.maximum(denominator, 1), 0.0)


@dataclass(frozen=True)
class ThresholdFit:
    """A fitted cut and what it achieves on its calibration set (written to the cuts file)."""

    cut: float
    metric: str
    metric_at_cut: float
    #: The plain score-based decision (P(yes) >= 0.5, i.e. margin >= 0) on the same questions.
    metric_at_zero: float
    n: int
    n_yes: int
    #: Calibration rows without a score (errors, a backend without yes/no mass): left out of the fit.
    undefined: int


def fit_threshold(margins, answers, metric: str = "accuracy") -> ThresholdFit:
    """The cut on ``margins`` maximising ``metric`` against ``answers`` ("yes"/"no"); ties -> the smallest cut."""
    margins = np.asarray(margins, dtype=np.float64)
    answers = np.asarray(answers)
    if not np.isin(answers, ["yes", "no"]).all():
        raise ValueError(f"calibration answers must be 'yes' or 'no', got {sorted(set(answers) - {'yes', 'no'})}")
    is_yes = answers == "yes"
    defined = ~np.isnan(margins)
    if not defined.any():
        raise ValueError("no calibration question has a score (every margin is undefined): cannot fit a cut")
    cuts = candidate_cuts(margins)
    scores = metric_at_cuts(margins, is_yes, cuts, metric)
    best = int(np.argmax(scores))  # the first maximum of the ascending cuts: the smallest cut
    return ThresholdFit(
        cut=float(cuts[best]),
        metric=metric,
        metric_at_cut=float(scores[best]),
        metric_at_zero=float(metric_at_cuts(margins, is_yes, np.array([0.0]), metric)[0]),
        n=int(defined.sum()),
        n_yes=int((is_yes & defined).sum()),
        undefined=int((~defined).sum()),
    )


def _encode(value: float):
    """JSON has no infinity: an infinite cut (only where a margin is infinite) is written as "inf" / "-inf"."""
    return value if math.isfinite(value) else repr(value)


def write_cuts(path: str | Path, fits: Mapping[str, ThresholdFit], about: dict) -> None:
    document = {**about, "cuts": {q: {**asdict(fit), "cut": _encode(fit.cut),
                                      "p_yes_cut": sigmoid(fit.cut) if not math.isnan(fit.cut) else None}
                                  for q, fit in fits.items()}}
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(document, indent=1, sort_keys=True))


def read_cuts(path: str | Path) -> dict[str, float]:
    """Question set -> cut, from a cuts file (:func:`write_cuts`); a malformed file is an error naming it."""
    try:
        document = json.loads(Path(path).read_text())
        return {qset: float(entry["cut"]) for qset, entry in document["cuts"].items()}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a cuts file of a threshold calibration ({type(error).__name__}: {error})") \
            from None
