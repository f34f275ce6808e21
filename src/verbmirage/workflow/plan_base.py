"""The run plan's records (a run, a pair of conditions, a group of runs, a calibration run) and the small
helpers its parts share (:mod:`verbmirage.workflow.plan`)."""

from __future__ import annotations

from dataclasses import dataclass

from verbmirage.analysis.figure_layout import companion_paths

#: Variant entry keys that plan or label a run without changing any answer: kept out of the inference params
#: and fingerprint.
LABEL_KEYS = ("qsets", "paper_name", "paper_method")
#: Pangea's pickles a fine-tune reads (Label2Node: optional, not an input).
PANGEA_FILE_KEYS = ("samples", "topology", "node_index")


def alternatives(names) -> str:
    """A regex matching exactly one of ``names`` (config slugs are [a-z0-9_]); one that matches nothing for
    none."""
    return "|".join(sorted(names, key=len, reverse=True)) or "(?!)"


def figure_prints(*pngs: str) -> list[str]:
    """The PDF and SVG each figure is saved as beside its PNG (for papers), declared as the rule's outputs."""
    return [str(path) for png in pngs for path in companion_paths(png)]



@dataclass(frozen=True)
class Run:
    """One run: ``model`` (or an ensemble) with ``variant`` under ``condition`` on ``dataset``, asking ``qsets``
    (config order). One metric job each; one inference job per image shard for a model."""

    dataset: str
    condition: str
    model: str
    variant: str
    qsets: tuple[str, ...]


@dataclass(frozen=True)
class PairRun:
    """One error-consistency job: a model's run under two conditions (Table 2), on the sets both ask."""

    dataset: str
    reference: str
    other: str
    model: str
    variant: str
    qsets: tuple[str, ...]


@dataclass(frozen=True)
class Group:
    """The models (or ensembles) that ask the same ``qsets`` under ``condition`` with ``variant``: one merge (or
    vote) rule writes their per-set prediction tables (a rule's outputs cannot depend on its wildcards)."""

    dataset: str
    condition: str
    qsets: list[str]
    models: list[str]
    variant: str


@dataclass(frozen=True)
class CalibrationRun:
    """A threshold run with a calibration set: one ``calibrate_decision`` job, one cuts file."""

    dataset: str
    condition: str
    model: str
    variant: str
