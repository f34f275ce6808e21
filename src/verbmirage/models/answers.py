"""From the first answer position's scores to result rows: one rule for every backend that has logits.

The transformers engine (``models/hf``) and the remote-code adapters (``models/remote.py``) both read a
question's answer at its first answer position and hand these functions the same per-question numbers:

- YN: the probability mass of the yes and of the no spellings (P(yes) = yes / (yes + no), computed in the
  arrays' own dtype: float32 for the engine's softmax, float64 for the worker's log-probabilities),
  ``yes_margin`` (logsumexp(yes logits) - logsumexp(no logits), float64; None where not finite) and
  ``yes_mass`` (the yes share of the whole vocabulary);
- MC: the probability mass of each option letter, renormalised over the question's options;
- both: the answer's ``confidence`` (the probability of its first token, paper Eq. 2) and its texts, (the
  first token's text, the decoded answer or None), which the parsers decide with
  (:func:`~verbmirage.models.parsing.decide_yes_no`, :func:`~verbmirage.models.parsing.decide_choice`).

How those numbers come out of the logits is the backend's (the engine has the whole vocabulary, the worker
sends the asked tokens' logits and their normaliser); what a row holds and how it is decided is here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from verbmirage.models.base import MultipleChoiceResult, YesNoResult
from verbmirage.models.parsing import decide_choice, decide_yes_no

#: Per question: (its first answer token's text, its decoded answer or None).
Texts = tuple[str, "str | None"]


def yes_no_results(yes: np.ndarray, no: np.ndarray, margins: Sequence[float | None], masses: Sequence[float],
                   confidences: Sequence[float], texts: Sequence[Texts], errors: Sequence[str | None], label: str,
                   columns: Sequence[dict] | None = None) -> list[YesNoResult]:
    """One :class:`YesNoResult` per question; a question with an error gets a failed row.

    ``yes``/``no``: the yes and no spellings' probability mass (P(yes) is their ratio in this dtype; NaN where
    both are 0); ``margins``: ``yes_margin`` (a non-finite one becomes None); ``masses``: ``yes_mass``;
    ``label``: the decoding's name for ``parse_rule``; ``columns``: extra fields per question (VCD's).
    """
    yes, no = np.asarray(yes), np.asarray(no)
    with np.errstate(divide="ignore", invalid="ignore"):
        total = yes + no
        p_yes = np.where(total > 0, yes / total, np.nan).tolist()
    results = []
    for i, error in enumerate(errors):
        if error is not None:
            results.append(YesNoResult.failed(error))
            continue
        prediction, raw, rule = decide_yes_no(*texts[i], label)
        margin = margins[i] if margins[i] is not None and math.isfinite(margins[i]) else None
        results.append(YesNoResult(p_yes[i], prediction, raw, confidences[i], rule, yes_margin=margin,
                                   yes_mass=masses[i], **(columns[i] if columns is not None else {})))
    return results


def choice_results(option_masses: Sequence[Sequence[float]], confidences: Sequence[float], texts: Sequence[Texts],
                   errors: Sequence[str | None], options: Sequence[Sequence[str]], label: str,
                   columns: Sequence[dict] | None = None) -> list[MultipleChoiceResult]:
    """One :class:`MultipleChoiceResult` per question; a question with an error gets a failed row.

    ``option_masses``: per question the probability mass of each option letter's tokens (at least as many as
    it has options), renormalised over its options (NaN where they hold none); ``options``: each question's
    options.
    """
    results = []
    for i, error in enumerate(errors):
        n = len(options[i])
        if error is not None:
            results.append(MultipleChoiceResult.failed(n, error))
            continue
        mass = np.array(option_masses[i][:n], dtype=np.float64)
        option_probs = tuple(float(x) for x in mass / mass.sum()) if mass.sum() > 0 else (math.nan,) * n
        letter, raw, rule = decide_choice(*texts[i], options[i], label)
        results.append(MultipleChoiceResult(option_probs, letter, raw, confidences[i], rule,
                                            **(columns[i] if columns is not None else {})))
    return results
