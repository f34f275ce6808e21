"""What the object-reliance analysis reads from the config (``analysis.object_reliance``; paper Fig. 15,
Tables 6 and 7): its models, condition, variant, figure model and thresholds. The run plan imports this; the
analysis itself is :mod:`verbmirage.analysis.object_reliance`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from verbmirage.models.entries import model_question_sets, model_variant_list
from verbmirage.models.registry import backends_of_kind

RELIANCE_QSETS = ("yn_obj", "yn_verb", "mc_obj", "mc_verb")
BASELINE_BACKENDS = backends_of_kind("baseline")


class RelianceError(ValueError):
    """Bad settings or inputs of the object-reliance analysis; the message names the key, file or row."""


@dataclass(frozen=True)
class RelianceSettings:
    """Config ``analysis.object_reliance`` thresholds (defaults: docs/analysis.md; [U] = ours, not the paper's).

    ``metric``: the YN per-object score, accuracy or recall (yes questions only) [U]; MC always uses
    circular accuracy. ``tau_obj``: S1/S2 keep Δ > tau_obj. ``tau_verb``: W keeps |Δ| ≥ tau_verb [U].
    ``direction``: abs, pos (Δ ≥ τ) or neg (−Δ ≥ τ) [U]. ``answers``: the YN questions whose yes-ratio
    counts, by ground truth (all, yes, no) [U]. ``min_questions``: per set, for an object or verb to count.
    """

    metric: str = "accuracy"
    tau_obj: float = 0.0
    tau_verb: float = 0.05
    direction: str = "abs"
    answers: str = "all"
    min_questions: int = 10

    CHOICES = {"metric": ("accuracy", "recall"), "direction": ("abs", "pos", "neg"), "answers": ("all", "yes", "no")}

    def __post_init__(self):
        for key, allowed in self.CHOICES.items():
            if getattr(self, key) not in allowed:
                raise RelianceError(f"analysis.object_reliance.{key}: {getattr(self, key)!r} is not one of {allowed}")
        if not isinstance(self.min_questions, int) or self.min_questions < 1:
            raise RelianceError(f"analysis.object_reliance.min_questions: {self.min_questions!r} must be an "
                                "integer >= 1")
        for key in ("tau_obj", "tau_verb"):
            if not math.isfinite(float(getattr(self, key))):
                raise RelianceError(f"analysis.object_reliance.{key}: {getattr(self, key)!r} must be a finite number")

    @classmethod
    def from_config(cls, settings: Mapping) -> "RelianceSettings":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in settings.items() if k in names})


def reliance_plan(config: dict) -> dict | None:
    """The checked ``analysis.object_reliance`` block with its defaults resolved; None when it is absent.

    ``models`` defaults to every ``models:`` entry that answers all four sets and runs ``variant``
    (ensembles may be listed); a listed model that does not is an error. ``figure_model`` (Fig. 15)
    to the first mPLUG-Owl2 model (the paper's), else the first model that is not a baseline, else the first.
    """
    block = (config.get("analysis") or {}).get("object_reliance")
    if block is None:
        return None
    where = "analysis.object_reliance"
    known = list(config.get("models", {})) + list(config.get("ensembles", {}) or {})
    variant = block.get("variant", "default")
    if variant not in config.get("variants", {variant: None}):
        raise RelianceError(f"{where}.variant: '{variant}' is not a configured variant {list(config['variants'])}")

    def skipped_sets(slug: str) -> list[str]:  # models.<slug>.qsets: a model that skips a set cannot be compared
        chosen = model_question_sets(config, slug)
        return [q for q in RELIANCE_QSETS if chosen is not None and q not in chosen]

    def runs_variant(slug: str) -> bool:
        return "variants" not in config or variant in model_variant_list(config, slug)

    listed = block.get("models")
    models = list(listed or [slug for slug in config.get("models", {})
                             if not skipped_sets(slug) and runs_variant(slug)])
    for index, slug in enumerate(models):
        if slug not in known:
            raise RelianceError(f"{where}.models[{index}]: '{slug}' is neither in models: nor in ensembles:")
        if skipped_sets(slug):
            raise RelianceError(f"{where}.models[{index}]: '{slug}' does not answer {skipped_sets(slug)} "
                                f"(models.{slug}.qsets, or an ensemble member's); the analysis compares all four")
        if not runs_variant(slug):
            raise RelianceError(f"{where}.models[{index}]: '{slug}' does not run variant '{variant}' "
                                f"({where}.variant; it runs {model_variant_list(config, slug)})")
    if not models:
        raise RelianceError(f"{where}.models: no model to analyse" + (
            "" if listed else f" (none answers all of {list(RELIANCE_QSETS)} and runs variant '{variant}')"))
    condition = block.get("condition", "clean")
    if condition not in config.get("conditions", {condition: None}):
        raise RelianceError(f"{where}.condition: '{condition}' is not a configured condition "
                            f"{list(config.get('conditions', {}))}")
    asked = config.get("questions", {}).get("sets", list(RELIANCE_QSETS))
    missing = [q for q in RELIANCE_QSETS if q not in asked]
    if missing:
        raise RelianceError(f"{where}: needs the question sets {missing} in questions.sets")
    under = (config.get("conditions", {}).get(condition) or {}).get("qsets")
    missing = [q for q in RELIANCE_QSETS if under is not None and q not in under]
    if missing:
        raise RelianceError(f"{where}.condition: '{condition}' does not ask {missing} (conditions.{condition}.qsets)")
    backends = {slug: entry.get("backend") for slug, entry in config.get("models", {}).items()}
    figure_model = block.get("figure_model") or default_figure_model(models, backends)
    if figure_model not in models:
        raise RelianceError(f"{where}.figure_model: '{figure_model}' is not one of the analysed models {models}")
    settings = RelianceSettings.from_config(block)
    return {"models": models, "condition": condition, "variant": variant, "figure_model": figure_model,
            "settings": settings}


def default_figure_model(models: Sequence[str], backends: Mapping[str, str]) -> str:
    """Fig. 15's model: the paper's mPLUG-Owl2, else the first real (non-baseline) model, else the first."""
    for wanted in (lambda m: backends.get(m) == "mplug_owl2",
                   lambda m: m in backends and backends[m] not in BASELINE_BACKENDS):
        found = next((m for m in models if wanted(m)), None)
        if found:
            return found
    return models[0]
