"""What a model entry of the config runs: its question sets and its variants (for an ensemble, what every
member runs). Read by the run plan and by the analyses that pick their inputs (config.yaml, ``models``; docs/models.md).
"""

from __future__ import annotations

from verbmirage.models.derived import effective_entry
from verbmirage.models.registry import variant_features
from verbmirage.variants.settings import model_variants


def model_question_sets(config: dict, model: str) -> set[str] | None:
    """The question sets ``model`` answers (``models.<slug>.qsets``; None: every set asked); for an ensemble,
    those every member answers."""
    ensembles = config.get("ensembles") or {}
    if model in ensembles:
        chosen = [sets for sets in (model_question_sets(config, m) for m in ensembles[model]) if sets is not None]
        return set.intersection(*chosen) if chosen else None
    sets = config["models"][model].get("qsets")
    return None if sets is None else set(sets)


def model_variant_list(config: dict, model: str) -> list[str]:
    """The variants ``model`` runs (:func:`verbmirage.variants.settings.model_variants`: its ``variants:`` list, else
    those its backend can run); for an ensemble, those every member runs."""
    ensembles = config.get("ensembles") or {}
    if model in ensembles:
        runs = [model_variant_list(config, member) for member in ensembles[model]]
        return [v for v in config["variants"] if all(v in run for run in runs)]
    backend = effective_entry(config, model)["backend"]  # a derived entry runs on its base's backend
    return model_variants(config, model, variant_features(backend))


def stand_in(config: dict, model: str) -> str | None:
    """Why ``model``'s rows are not a model's result (``models.<slug>.stand_in``: random weights, an oracle), or
    None. A derived model is a stand-in when its base is; an ensemble when a member is."""
    ensembles = config.get("ensembles") or {}
    if model in ensembles:
        members = [m for m in ensembles[model] if stand_in(config, m)]
        return f"members {members} are stand-ins" if members else None
    entry = config["models"][model]
    if "stand_in" in entry:
        return entry["stand_in"]
    return stand_in(config, entry["derive"]["base"]) if "derive" in entry else None


def stand_ins(config: dict) -> dict[str, str]:
    """Every model and ensemble of the config that is a stand-in, with why (:func:`stand_in`)."""
    names = [*config["models"], *(config.get("ensembles") or {})]
    return {name: reason for name in names if (reason := stand_in(config, name))}
