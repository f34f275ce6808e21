"""Majority-vote ensembles of several models' answers (paper Table 3).

The paper says "majority vote" and nothing about ties; the tie rule is ours
(docs/analysis.md, "Ensembles").
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from verbmirage.core.schemas import PREDICTIONS
from verbmirage.models.base import UNKNOWN


def graded(parse_rule) -> bool:
    """Whether a row's probabilities are a score the model gave (logits, log-probs, a baseline's own value).

    A parsed text (``text:...``) only carries the 0/1 of its own answer, which is its vote again, not a
    confidence; an error row carries none.
    """
    rule = "" if parse_rule is None or pd.isna(parse_rule) else str(parse_rule)
    return not (rule.startswith("text:") or rule == "error")


def _member_rows(name: str, frame: pd.DataFrame) -> dict:
    """One member's rows by question id, with the columns the vote reads (absent ones filled)."""
    repeated = frame.question_id[frame.question_id.duplicated()]
    if len(repeated):
        raise ValueError(f"ensemble member '{name}' answers question '{repeated.iloc[0]}' more than once")
    columns = {"error": None, "parse_rule": None, "p_yes": np.nan, "option_probs": None}
    frame = frame.assign(**{k: v for k, v in columns.items() if k not in frame})
    chosen = frame[["question_id", "prediction", "error", "parse_rule", "p_yes", "option_probs"]]
    return dict(zip(frame.question_id, chosen.itertuples(index=False)))


def _valid(row) -> bool:
    """A vote: an answer other than "unknown" from a row without error (a failed member does not vote)."""
    return row.prediction != UNKNOWN and (row.error is None or pd.isna(row.error))


def _mean_probabilities(rows: list, kind: str):
    """Mean P(yes) (YN) or option probabilities (MC) over graded rows with finite values; None if none."""
    if kind == "yn":
        values = [float(r.p_yes) for r in rows if graded(r.parse_rule) and pd.notna(r.p_yes) and np.isfinite(r.p_yes)]
        return float(np.mean(values)) if values else None
    vectors = [np.asarray(r.option_probs, float) for r in rows if graded(r.parse_rule) and r.option_probs is not None]
    vectors = [v for v in vectors if len(v) and np.isfinite(v).all()]
    if not vectors or len({len(v) for v in vectors}) > 1:
        return None
    return np.mean(vectors, axis=0)


def _break_tie(tied: list[str], mean, kind: str) -> str:
    """The tied answer the mean probability ranks strictly first, else "unknown"."""
    if mean is None:
        return UNKNOWN
    if kind == "yn":
        return "yes" if mean > 0.5 else "no" if mean < 0.5 else UNKNOWN
    scores = {letter: mean[ord(letter) - ord("A")] for letter in tied if ord(letter) - ord("A") < len(mean)}
    if len(scores) < len(tied):
        return UNKNOWN
    best = max(scores.values())
    leaders = [letter for letter, score in scores.items() if score == best]
    return leaders[0] if len(leaders) == 1 else UNKNOWN


def majority_vote(members: dict[str, pd.DataFrame], kind: str) -> pd.DataFrame:
    """Plurality vote per question over the members that gave a valid answer.

    Valid: a row without ``error`` whose prediction is not "unknown"; only
    valid members vote, and a question without any valid vote is "unknown".
    Tie rule: a tie between the top answers is "unknown" unless the mean
    probability over the valid members whose probabilities are graded (see
    :func:`graded`: text-parsed 0/1 values take no part) ranks one tied
    answer strictly first (YN: mean P(yes) > 0.5 yes, < 0.5 no; MC: the tied
    letter with the highest mean option probability). The row's ``p_yes`` /
    ``option_probs`` is that mean (empty without a graded member);
    ``confidence`` is the share of valid votes that agree with the decision
    (empty for "unknown"). ``parse_rule`` says how the row was decided:
    ``majority_vote``, ``majority_vote:tie-probability``,
    ``majority_vote:tie-unknown`` or ``majority_vote:no-vote``.
    """
    if len(members) < 2:
        raise ValueError(f"an ensemble needs at least two members, got {sorted(members)}")
    ids = None
    for name, frame in members.items():
        if ids is None:
            ids = list(frame.question_id)
        elif set(frame.question_id) != set(ids):
            raise ValueError(f"ensemble member '{name}' answered a different set of questions")
    indexed = [_member_rows(name, frame) for name, frame in members.items()]
    rows = []
    for question_id in ids:
        valid = [row for row in (frame[question_id] for frame in indexed) if _valid(row)]
        votes = Counter(row.prediction for row in valid)
        mean = _mean_probabilities(valid, kind)
        if not votes:
            decision, rule = UNKNOWN, "majority_vote:no-vote"
        else:
            top = max(votes.values())
            tied = sorted(answer for answer, count in votes.items() if count == top)
            if len(tied) == 1:
                decision, rule = tied[0], "majority_vote"
            else:
                decision = _break_tie(tied, mean, kind)
                rule = "majority_vote:tie-unknown" if decision == UNKNOWN else "majority_vote:tie-probability"
        rows.append(
            {
                "question_id": question_id,
                "raw_answer": " ".join(f"{a}:{c}" for a, c in sorted(votes.items())),
                "prediction": decision,
                "parse_rule": rule,
                "p_yes": (np.nan if mean is None else mean) if kind == "yn" else None,
                "option_probs": None if kind == "yn" or mean is None else list(mean),
                "confidence": votes[decision] / sum(votes.values()) if decision != UNKNOWN else None,
                "error": None,
            }
        )
    return pd.DataFrame(rows, columns=PREDICTIONS.names)  # typed columns even with no question (an empty crop)
