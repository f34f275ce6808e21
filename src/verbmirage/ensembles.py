"""Majority-vote ensembles of several models' answers (paper Table 3)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from verbmirage.io import PREDICTIONS


def majority_vote(members: dict[str, pd.DataFrame], kind: str) -> pd.DataFrame:
    """Plurality vote per question over the members' parsed answers.

    "unknown" answers do not vote. A tie is broken by the members' mean
    probability (P(yes) for YN, per-option probability for MC); a question
    with no vote at all stays "unknown". ``confidence`` is the share of voting
    members that agree with the decision.
    """
    if len(members) < 2:
        raise ValueError(f"an ensemble needs at least two members, got {sorted(members)}")
    ids = None
    for name, frame in members.items():
        if ids is None:
            ids = list(frame.question_id)
        elif set(frame.question_id) != set(ids):
            raise ValueError(f"ensemble member '{name}' answered a different set of questions")
    indexed = {name: frame.set_index("question_id") for name, frame in members.items()}
    rows = []
    for question_id in ids:
        answers = [f.at[question_id, "prediction"] for f in indexed.values()]
        votes = Counter(a for a in answers if a != "unknown")
        if kind == "yn":
            known = [p for p in (f.at[question_id, "p_yes"] for f in indexed.values()) if pd.notna(p)]
            mean_p_yes = float(np.mean(known)) if known else float("nan")
        else:
            options = [f.at[question_id, "option_probs"] for f in indexed.values()]
            options = [np.asarray(o, float) for o in options if o is not None]
            mean_options = np.mean(options, axis=0) if options else None
        if not votes:
            decision = "unknown"
        else:
            top = max(votes.values())
            tied = sorted(a for a, c in votes.items() if c == top)
            if len(tied) == 1:
                decision = tied[0]
            elif kind == "yn":
                decision = "yes" if mean_p_yes >= 0.5 else "no"
            else:
                decision = max(tied, key=lambda letter: mean_options[ord(letter) - ord("A")])
        rows.append(
            {
                "question_id": question_id,
                "raw_answer": " ".join(f"{a}:{c}" for a, c in sorted(votes.items())),
                "prediction": decision,
                "parse_rule": "majority_vote",
                "p_yes": mean_p_yes if kind == "yn" else None,
                "option_probs": None if kind == "yn" or mean_options is None else list(mean_options),
                "confidence": votes[decision] / sum(votes.values()) if votes else None,
                "error": None,
            }
        )
    return pd.DataFrame(rows, columns=PREDICTIONS.names)  # typed columns even with no question (an empty crop)
