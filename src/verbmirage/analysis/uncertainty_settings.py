"""What the token-uncertainty analysis reads from the config (``analysis.uncertainty``; paper Figs. 9, 12): its
models, question sets, conditions and bins. The run plan imports this; the tables are made by
:mod:`verbmirage.analysis.uncertainty`.
"""

from __future__ import annotations

from dataclasses import dataclass

from verbmirage.core.errors import ConfigError
from verbmirage.models.registry import BACKENDS

# Backends whose ``confidence`` is not the probability of an answer token (their rows' ``token_probabilities``):
# the blind baselines' own prior, CLIP's similarity score. Every other backend (transformers, remote code, API
# log-probs) has one.
NO_TOKEN_PROBABILITY_BACKENDS = frozenset(name for name, row in BACKENDS.items() if not row.token_probabilities)
DEFAULT_QSETS = ("yn_obj", "yn_verb", "mc_obj", "mc_verb")


@dataclass(frozen=True)
class UncertaintySettings:
    """Config ``analysis.uncertainty`` (defaults: the notes' proposal)."""

    models: tuple[str, ...] = ()  # empty: every configured model (those without token probabilities skipped)
    qsets: tuple[str, ...] = DEFAULT_QSETS
    conditions: tuple[str, ...] = ("clean",)
    pool_yn: bool = True
    bins: int = 20
    figures: tuple[tuple[int, str], ...] = ()  # (9 or 12, model): the model a figure shows instead of its role's


def uncertainty_settings(config: dict) -> UncertaintySettings | None:
    """The checked ``analysis.uncertainty`` block, or None when the analysis is off (key absent)."""
    block = (config.get("analysis") or {}).get("uncertainty")
    if block is None:
        return None
    settings = UncertaintySettings(
        models=tuple(block.get("models") or ()),
        qsets=tuple(block.get("qsets", DEFAULT_QSETS)),
        conditions=tuple(block.get("conditions", ("clean",))),
        pool_yn=bool(block.get("pool_yn", True)),
        bins=int(block.get("bins", 20)),
        figures=tuple((int(figure.removeprefix("fig")), model) for figure, model in (block.get("figures") or {}).items()),
    )
    unknown = sorted(set(settings.models) - set(config["models"]))
    if unknown:
        raise ConfigError(f"analysis.uncertainty.models: {unknown} are not in models: "
                          f"(known: {sorted(config['models'])})")
    unknown = sorted(set(settings.conditions) - set(config["conditions"]))
    if unknown:
        raise ConfigError(f"analysis.uncertainty.conditions: {unknown} are not in conditions: "
                          f"(known: {sorted(config['conditions'])})")
    unknown = sorted(set(settings.qsets) - set(config["questions"]["sets"]))
    if unknown:
        raise ConfigError(f"analysis.uncertainty.qsets: {unknown} are not in questions.sets")
    for number, model in settings.figures:
        if model not in config["models"] or (settings.models and model not in settings.models):
            raise ConfigError(f"analysis.uncertainty.figures.fig{number}: '{model}' is not among the analysis's "
                              f"models ({list(settings.models) or sorted(config['models'])})")
        if config["models"][model].get("backend") in NO_TOKEN_PROBABILITY_BACKENDS:
            raise ConfigError(f"analysis.uncertainty.figures.fig{number}: '{model}' has no token probability to draw")
    if settings.bins < 1:
        raise ConfigError(f"analysis.uncertainty.bins: {settings.bins} is not a positive number of bins")
    return settings


def token_probability_models(models: dict[str, dict]) -> list[str]:
    """The slugs (in order) whose predictions' ``confidence`` is an answer token's probability."""
    return [slug for slug, entry in models.items() if entry["backend"] not in NO_TOKEN_PROBABILITY_BACKENDS]
