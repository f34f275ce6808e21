"""The question sets by name: each one's kind ("yn": yes/no, "mc": multiple choice) and what it asks.

HICO's sets are built by :mod:`verbmirage.benchmark.questions` (``BUILDERS``, one per set here), CharadesEgo's
by :mod:`verbmirage.benchmark.charades_questions`; training questions (a fine-tune's) are written under the same
schema but never asked as a benchmark set. The run plan and the config checks read the names here without
loading a builder.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The multiple-choice question's first line; its options follow, one per line (``A. riding a horse``).
MC_STEM = "Which of the following actions is present in the image?"


@dataclass(frozen=True)
class QuestionSet:
    """A HICO question set: its kind ("yn" or "mc") and what it asks (one line)."""

    kind: str
    description: str = ""


#: HICO's question sets (paper Appendix A; docs/questions.md).
QUESTION_SETS: dict[str, QuestionSet] = {
    "yn_obj": QuestionSet("yn", "Is someone <verb>ing a/an <object>? (the object named; Table 1)"),
    "yn_verb": QuestionSet("yn", "Is someone <verb>ing something? (the verb alone; Table 1)"),
    "mc_obj": QuestionSet("mc", "which action is present: four <verb>ing <object> options"),
    "mc_verb": QuestionSet("mc", "which action is present: four verb options, no object"),
    "obj_exist": QuestionSet("yn", "Is there a/an <object> in the image? (Fig. 4b's control)"),
    "yn_ko": QuestionSet("yn", "Known Object: every labelled HOI of a present object (Fig. 11's mAP)"),
}
#: CharadesEgo's question sets (paper: Egocentric and Exocentric Images; Appendix A) -> their kind.
CHARADES_QUESTION_SETS = {"yn_exo": "yn", "yn_ego": "yn", "mc_exo": "mc", "mc_ego": "mc"}
#: Training questions (fine-tuning data such as Pangea's, derived/pangea.py, or any converted set): never
#: asked as a benchmark set, but written and read under the same schema.
TRAINING_QUESTION_SETS = {"train_yn": "yn", "train_mc": "mc"}


def question_kind(qset: str) -> str:
    """"yn" or "mc" for a registered question set (HICO's or CharadesEgo's)."""
    if qset in QUESTION_SETS:
        return QUESTION_SETS[qset].kind
    if qset in CHARADES_QUESTION_SETS:
        return CHARADES_QUESTION_SETS[qset]
    if qset in TRAINING_QUESTION_SETS:
        return TRAINING_QUESTION_SETS[qset]
    raise KeyError(f"unknown question set '{qset}'; known: "
                   f"{sorted(QUESTION_SETS) + sorted(CHARADES_QUESTION_SETS) + sorted(TRAINING_QUESTION_SETS)}")


def calibration_qsets(dataset: str, qsets) -> list[str]:
    """The sets among ``qsets`` that get a threshold: HICO's YN sets (CharadesEgo has no calibration set)."""
    return [q for q in qsets if dataset == "hico" and q in QUESTION_SETS and QUESTION_SETS[q].kind == "yn"]
