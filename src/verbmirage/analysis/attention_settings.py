"""What the attention analysis reads from the config (``analysis.attention``; paper Figs. 7, 8, 13, 14): its
models and which one each figure shows. The run plan imports this; the measures are in
:mod:`verbmirage.analysis.attention`.
"""

from __future__ import annotations

from verbmirage.models.registry import backends_of_kind

#: Backends whose language model this analysis can hook (the transformers engine's: a decoder stack).
ATTENTION_BACKENDS = backends_of_kind("transformers")


class AttentionError(ValueError):
    """A question, config entry or model that the attention analysis cannot handle (the message names it)."""


def attention_models(config: dict) -> dict[str, dict]:
    """Slug -> model entry of every model in ``analysis.attention.models``.

    A slug names a ``models:`` entry (its predictions are never read) or an
    ``analysis.attention.extra_models`` entry (a model analysed only here).
    """
    settings = config.get("analysis", {}).get("attention") or {}
    extra = settings.get("extra_models", {})
    entries = {}
    for index, slug in enumerate(settings.get("models", [])):
        where = f"analysis.attention.models[{index}]"
        if slug in extra and slug in config["models"]:
            raise AttentionError(f"{where}: '{slug}' is both in models: and in analysis.attention.extra_models")
        entry = extra.get(slug) or config["models"].get(slug)
        if entry is None:
            raise AttentionError(f"{where}: '{slug}' is neither in models: nor in analysis.attention.extra_models")
        if entry.get("backend") not in ATTENTION_BACKENDS:
            raise AttentionError(f"{where}: '{slug}' has backend '{entry.get('backend')}'; attention needs a "
                                 f"transformers backend ({', '.join(sorted(ATTENTION_BACKENDS))})")
        entries[slug] = entry
    for slug in extra:
        if slug not in entries:
            raise AttentionError(f"analysis.attention.extra_models.{slug}: not listed in analysis.attention.models")
    for figure, slug in (settings.get("figures") or {}).items():
        if slug not in entries:
            raise AttentionError(f"analysis.attention.figures.{figure}: '{slug}' is not one of the attention "
                                 f"models {list(entries)}")
    for index, condition in enumerate(settings.get("conditions", [])):
        if "conditions" in config and condition not in config["conditions"]:
            raise AttentionError(f"analysis.attention.conditions[{index}]: '{condition}' is not a configured "
                                 f"condition {list(config['conditions'])}")
    for index, qset in enumerate(settings.get("qsets", [])):
        if "questions" in config and qset not in config["questions"].get("sets", [qset]):
            raise AttentionError(f"analysis.attention.qsets[{index}]: '{qset}' is not in questions.sets")
    return entries


def figure_models(models: list[str], backends: dict[str, str], chosen: dict | None = None) -> dict[int, str | None]:
    """Which model each figure shows: ``chosen`` (config ``figures``) first, else the paper's roles.

    Figs. 7, 8, 13 show the first LLaVA model (else the first model); Fig. 14 the first
    InstructBLIP model (else the first model not already shown, else the first).
    """
    chosen = {int(str(k).removeprefix("fig")): v for k, v in (chosen or {}).items()}
    llava = next((m for m in models if backends.get(m) == "llava"), models[0] if models else None)
    blip = next((m for m in models if backends.get(m) == "instructblip"), None)
    if blip is None:
        blip = next((m for m in models if m != llava), llava)
    roles = {7: llava, 8: llava, 13: llava, 14: blip}
    roles.update({k: v for k, v in chosen.items() if k in roles})
    return roles
