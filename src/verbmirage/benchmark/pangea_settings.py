"""How Pangea becomes training questions (``derive.<slug>.pangea`` of a ``lora_finetune`` entry; paper Appendix D):
the settings and how they depart from the paper's. Read when a run is planned; the questions are built by
:mod:`verbmirage.benchmark.pangea_training`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

from verbmirage.benchmark.question_sets import MC_STEM

#: The paper's YN prompt for Pangea (Appendix D); ``{action}`` is the asked label.
PAPER_YN_PROMPT = "Does this image show a person's activity: {action}?"
#: The paper's training mix (Appendix D): YN questions about 1:19 Yes:No, and its MC stem ("present at").
PAPER_NEGATIVES_PER_POSITIVE = 19
PAPER_MC_STEM = "Which of the following actions is present at the image?"
#: The sources Appendix D leaves out (Kinetics-700: too large a share; HAKE: HICO's domain).
PAPER_EXCLUDED_SOURCES = ("Kinetics-700", "HAKE")


@dataclass(frozen=True)
class TrainingQuestionSettings:
    """How Pangea becomes training questions (``derive.<slug>.pangea`` of a ``lora_finetune`` entry)."""

    mc_questions: int = 60_000
    yn_questions: int = 60_000
    #: YN: Yes:No = 1:k over the YN questions. 2 is our benchmark's 1:2; the paper's Pangea set used 19.
    negatives_per_positive: int = 2
    mc_options: int = 4
    seed: int = 0
    #: Case-insensitive glob patterns of dataset_name left out: the paper's Kinetics-700 and HAKE, and
    #: (ours: leakage) every HICO-derived source, since the benchmark asks HICO's test images.
    exclude_sources: tuple[str, ...] = ("kinetics*", "hake*", "hico*")
    yn_prompt: str = PAPER_YN_PROMPT
    mc_stem: str = MC_STEM

    def __post_init__(self):
        if self.mc_questions < 0 or self.yn_questions < 0:
            raise ValueError("pangea: mc_questions and yn_questions must be >= 0")
        if self.negatives_per_positive < 1 or self.mc_options < 2:
            raise ValueError("pangea: negatives_per_positive must be >= 1 and mc_options >= 2")
        if "{action}" not in self.yn_prompt:
            raise ValueError("pangea.yn_prompt: the prompt must contain {action}")

    def departures_from_paper(self) -> list[str]:
        """How these settings differ from the paper's Appendix D (empty: the paper's method as published)."""
        departures = []
        if self.negatives_per_positive != PAPER_NEGATIVES_PER_POSITIVE:
            departures.append(f"Yes:No 1:{self.negatives_per_positive}, the paper's 1:{PAPER_NEGATIVES_PER_POSITIVE}")
        if self.mc_stem != PAPER_MC_STEM:
            departures.append("another MC stem")
        if (self.mc_questions, self.yn_questions) != (60_000, 60_000):
            departures.append(f"{self.mc_questions} MC + {self.yn_questions} YN questions, the paper's 60K + 60K")
        if self.mc_options != 4:
            departures.append(f"{self.mc_options} MC options, the paper's 4")
        if self.yn_prompt != PAPER_YN_PROMPT:
            departures.append("another YN prompt")
        kept = [source for source in PAPER_EXCLUDED_SOURCES if excluded_by(source, self.exclude_sources) is None]
        if kept:  # (HICO-derived sources left out or not: ours, the paper is silent)
            departures.append(f"{' and '.join(kept)} not left out")
        return departures

    @classmethod
    def from_config(cls, entry: dict | None) -> "TrainingQuestionSettings":
        entry = dict(entry or {})
        unknown = sorted(set(entry) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"pangea: unknown setting(s) {unknown}; known: {sorted(cls.__dataclass_fields__)}")
        if "exclude_sources" in entry:
            entry["exclude_sources"] = tuple(entry["exclude_sources"])
        return cls(**entry)


def excluded_by(source: str, patterns: Iterable[str]) -> str | None:
    """The first pattern that excludes ``source`` (case-insensitive glob), or None."""
    return next((p for p in patterns if fnmatch.fnmatchcase(source.lower(), p.lower())), None)
