"""The run plan's records (a run, a pair of conditions, a group of runs, a calibration run), the small helpers
its parts share, and what its collaborators read of it (:class:`PlanFacts`; :mod:`verbmirage.workflow.plan`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from verbmirage.analysis.figure_layout import companion_paths

if TYPE_CHECKING:
    from verbmirage.workflow.paths import Paths
    from verbmirage.workflow.plan_data import DataInputs

#: Variant entry keys that plan or label a run without changing any answer: kept out of the inference params
#: and fingerprint.
LABEL_KEYS = ("qsets", "paper_name", "paper_method")

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


class PlanFacts(Protocol):
    """What the plan's collaborators (the calibration, the figures, each analysis) may read of the plan:
    :class:`~verbmirage.workflow.plan.Plan` is one. The plan builds each with itself and the other collaborators
    it reads; a collaborator reads, never sets (the data and the builds take only the facts they read).
    ``tests/fast/test_plan.py`` checks that a collaborator reads nothing this does not name."""

    config: dict
    paths: Paths
    datasets: list[str]
    dataset_qsets: dict[str, list[str]]
    conditions: list[str]
    box_conditions: list[str]
    models: list[str]
    variants: list[str]
    ensembles: dict[str, list[str]]
    model_variants: dict[str, list[str]]
    consistency_pairs: list[tuple[str, str]]

    @property
    def data(self) -> DataInputs: ...
    @property
    def scored(self) -> list[Run]: ...
    @property
    def consistency(self) -> list[PairRun]: ...
    @property
    def stand_ins(self) -> dict[str, str]: ...
    @property
    def token_models(self) -> list[str]: ...
    @property
    def variant_paper_names(self) -> dict[str, str]: ...
    def variants_under(self, model: str, condition: str, dataset: str = "hico") -> list[str]: ...
    def condition_qsets(self, dataset: str, condition: str) -> list[str]: ...
    def dataset_conditions(self, dataset: str) -> list[str]: ...
    def asks(self, dataset: str, condition: str, qset: str, model: str, variant: str | None = None) -> bool: ...
    def questions(self, dataset: str, qsets) -> list[str]: ...
    def partial_images(self, dataset: str, condition: str) -> str | list: ...
