"""What the VCD divergence analysis reads from the config (``analysis.vcd_divergence``): its question sets,
conditions and bins, and every (model, VCD variant, condition, set) run it reads with the plain run it compares.
The run plan imports this; the statistics are made by :mod:`verbmirage.analysis.vcd_divergence`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from verbmirage.core.errors import ConfigError
from verbmirage.variants.settings import Variant, model_variant_entry

DEFAULT_QSETS = ("yn_obj", "yn_verb", "mc_obj", "mc_verb")


@dataclass(frozen=True)
class VCDDivergenceSettings:
    """Config ``analysis.vcd_divergence`` (every key optional; the analysis runs whenever a VCD variant does)."""

    qsets: tuple[str, ...] = DEFAULT_QSETS
    conditions: tuple[str, ...] = ("clean",)
    bins: int = 30
    #: VCD variant -> the plain variant its flips are counted against (default: found from the settings).
    pairs: dict[str, str] = field(default_factory=dict)


def vcd_divergence_settings(config: dict) -> VCDDivergenceSettings:
    """The checked ``analysis.vcd_divergence`` block (defaults when absent); errors name the key."""
    block = (config.get("analysis") or {}).get("vcd_divergence") or {}
    # The analysis runs without its block, so the default condition must exist: clean, else the first one.
    default_conditions = ("clean",) if "clean" in config["conditions"] else tuple(config["conditions"])[:1]
    settings = VCDDivergenceSettings(
        qsets=tuple(block.get("qsets", DEFAULT_QSETS)),  # a set not asked is left out (divergence_runs)
        conditions=tuple(block.get("conditions") or default_conditions),
        bins=int(block.get("bins", 30)),
        pairs=dict(block.get("pairs") or {}),
    )
    where = "analysis.vcd_divergence"
    unknown = sorted(set(settings.conditions) - set(config["conditions"]))
    if unknown:
        raise ConfigError(f"{where}.conditions: {unknown} are not in conditions: (known: {sorted(config['conditions'])})")
    if settings.bins < 1:
        raise ConfigError(f"{where}.bins: {settings.bins} is not a positive number of bins")
    variants = _variants(config)
    for vcd, plain in settings.pairs.items():
        if vcd not in variants or variants[vcd].vcd is None:
            raise ConfigError(f"{where}.pairs: '{vcd}' is not a VCD variant (VCD variants: {vcd_variants(config)})")
        if plain not in variants or variants[plain].vcd is not None:
            raise ConfigError(f"{where}.pairs.{vcd}: '{plain}' is not a configured variant without vcd "
                              f"(variants: {sorted(variants)})")
    return settings


def _variants(config: dict) -> dict[str, Variant]:
    return {slug: Variant.from_config(entry, f"variants.{slug}") for slug, entry in config["variants"].items()}


def vcd_variants(config: dict) -> list[str]:
    """The configured variants that decode with VCD, in config order."""
    return [slug for slug, variant in _variants(config).items() if variant.vcd is not None]


def plain_counterparts(config: dict, pairs: dict[str, str] | None = None) -> dict[str, str | None]:
    """VCD variant -> its plain counterpart: ``pairs`` where given, else the first configured variant whose
    settings equal the VCD variant's without ``vcd`` (``paper_name`` aside); None when there is none."""
    variants = _variants(config)
    out = {}
    for slug in vcd_variants(config):
        if pairs and slug in pairs:
            out[slug] = pairs[slug]
            continue
        wanted = {**variants[slug].settings(), "vcd": None}
        out[slug] = next((other for other, variant in variants.items() if variant.settings() == wanted), None)
    return out


def divergence_runs(
    config: dict,
    model_variants: dict[str, list[str]],
    asks: Callable[[str, str, str], bool],
    settings: VCDDivergenceSettings,
) -> list[dict]:
    """Every (model, VCD variant, condition, set) the analysis reads, with the plain run it compares.

    ``model_variants``: model -> the variants it runs (the workflow's plan); ``asks(condition, qset,
    model)``: whether the run asks that set. Each run: ``model, variant, condition, qset, plain_variant``
    (None without flips), ``plain_note`` (why there are none, else "") and ``beta`` (the plausibility cut the
    model runs the variant with). Empty: nothing to plan.
    """
    counterparts = plain_counterparts(config, settings.pairs)
    runs = []
    for model, variants in model_variants.items():
        for variant in [v for v in variants if v in counterparts]:
            plain = counterparts[variant]
            if plain is None:
                note = f"no configured variant equals '{variant}' without vcd (analysis.vcd_divergence.pairs)"
            elif plain not in variants:
                note = f"{model} does not run the plain counterpart '{plain}'"
            else:
                note = ""
            beta = Variant.from_config(model_variant_entry(config, model, variant)).vcd.beta
            for condition in settings.conditions:
                for qset in settings.qsets:
                    if asks(condition, qset, model):
                        runs.append({"model": model, "variant": variant, "condition": condition, "qset": qset,
                                     "plain_variant": plain if not note else None, "plain_note": note,
                                     "beta": beta})
    return runs
