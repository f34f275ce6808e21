"""What the Known-Object analysis reads from the config (``analysis.known_object``; paper Fig. 11): its models,
reference, question set, conditions and bootstrap. The run plan imports this; the rankings and mAP are made by
:mod:`verbmirage.analysis.known_object`.
"""

from __future__ import annotations

from dataclasses import dataclass

from verbmirage.models.entries import model_question_sets

#: Question sets whose rows are (image, HOI) pairs with a yes/no answer: a ranking per HOI.
KO_QSETS = ("yn_ko", "yn_obj")


class KnownObjectError(ValueError):
    """A Known-Object setting or input is wrong (the message names the config key or file)."""


@dataclass(frozen=True)
class KnownObjectSettings:
    """Config key ``analysis.known_object`` (defaults in schemas/config.schema.yaml)."""

    models: tuple[str, ...]
    reference_model: str
    qset: str = "yn_ko"
    conditions: tuple[str, ...] = ("clean",)
    bootstrap_resamples: int = 200
    seed: int = 0
    confidence_level: float = 0.95
    figure_metric: str = "map_voc11"
    #: What ranks a model's answers: ``margin`` (P(yes) renormalised over yes + no, as its log-odds) or
    #: ``yes_mass`` (P(Yes) over the whole vocabulary, the paper's "probability of Yes tokens" read literally).
    score: str = "margin"


def known_object_settings(config: dict) -> KnownObjectSettings | None:
    """The checked ``analysis.known_object`` block, or None when it is absent.

    Every model must be a configured model or ensemble, the reference one of
    them, the question set in ``questions.sets`` and asked under every listed
    condition (``conditions.<slug>.qsets``).
    """
    block = (config.get("analysis") or {}).get("known_object")
    if not block:
        return None
    where = "analysis.known_object"
    known = {**config.get("models", {}), **config.get("ensembles", {})}
    models = tuple(block.get("models", ()))
    if not models:
        raise KnownObjectError(f"{where}.models: list at least one model")
    for index, slug in enumerate(models):
        if slug not in known:
            raise KnownObjectError(f"{where}.models[{index}]: '{slug}' is not in models: or ensembles:")
    reference = block.get("reference_model")
    if reference not in models:
        raise KnownObjectError(f"{where}.reference_model: '{reference}' is not one of {where}.models {list(models)}")
    qset = block.get("qset", "yn_ko")
    if qset not in KO_QSETS:
        raise KnownObjectError(f"{where}.qset: '{qset}' is not one of {list(KO_QSETS)}")
    sets = config.get("questions", {}).get("sets", [])
    if qset not in sets:
        raise KnownObjectError(f"{where}.qset: '{qset}' is not in questions.sets {sets}")
    for index, slug in enumerate(models):  # a model that is not asked the set would silently get no AP
        chosen = model_question_sets(config, slug)
        if chosen is not None and qset not in chosen:
            raise KnownObjectError(f"{where}.models[{index}]: '{slug}' is not asked {qset} "
                                   f"(models.{slug}.qsets, or an ensemble member's: {sorted(chosen)})")
    conditions = tuple(block.get("conditions", ("clean",)))
    for index, condition in enumerate(conditions):
        entry = config.get("conditions", {}).get(condition)
        if entry is None:
            raise KnownObjectError(f"{where}.conditions[{index}]: '{condition}' is not a configured condition "
                                   f"{list(config.get('conditions', {}))}")
        if entry.get("qsets") is not None and qset not in entry["qsets"]:
            raise KnownObjectError(f"{where}.conditions[{index}]: condition '{condition}' does not ask {qset} "
                                   f"(conditions.{condition}.qsets: {entry['qsets']})")
    return KnownObjectSettings(
        models=models, reference_model=reference, qset=qset, conditions=conditions,
        bootstrap_resamples=int(block.get("bootstrap_resamples", 200)), seed=int(block.get("seed", 0)),
        confidence_level=float(config.get("metrics", {}).get("confidence_level", 0.95)),
        figure_metric=block.get("figure_metric", "map_voc11"), score=_score_setting(block, where),
    )


#: ``analysis.known_object.score`` values (:attr:`KnownObjectSettings.score`).
SCORES = ("margin", "yes_mass")


def _score_setting(block: dict, where: str) -> str:
    score = block.get("score", "margin")
    if score not in SCORES:
        raise KnownObjectError(f"{where}.score: '{score}' is not one of {list(SCORES)}")
    return score
