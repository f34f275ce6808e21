"""Which Table 5 row (mitigation methods) each of our models and variants stands for, and which paper row it is
compared with (:mod:`verbmirage.evaluation.mitigation_tables` builds the table): read when a run is planned, so
a wrong ``paper_method`` stops it there.
"""

from __future__ import annotations

from collections.abc import Mapping

from verbmirage.evaluation.paper_numbers import PAPER_VARIANT, paper_names_from_config
from verbmirage.models.derived import method_settings
from verbmirage.models.derived.finetune_settings import paper_departures
from verbmirage.models.derived.nullu_settings import official_departures

#: the paper's one Table 5 model
TABLE5_MODEL = "LLaVA-1.5-7B"
#: a variant's paper_name -> its Table 5 row; the paper's baseline "none" is beam search (its default decoding)
TABLE5_VARIANT_METHODS = {PAPER_VARIANT: "none", "VCD": "VCD", "OPERA": "OPERA"}
#: Table 5 rows that are models of their own (``models.<slug>.paper_method``), in the paper's order
TABLE5_MODEL_METHODS = ("REVERIE", "HaloQuest", "Nullu", "Octopus", "Pangea-LoRA (paper's method)")
#: The Table 5 rows the pipeline builds itself: the paper's own method, and Nullu (rule derive_model).
PANGEA_METHOD, NULLU_METHOD = "Pangea-LoRA (paper's method)", "Nullu"


def paper_methods_from_config(config: dict, derived: Mapping[str, dict] | None = None) -> dict[str, str]:
    """Model slug -> its Table 5 row (``models.<slug>.paper_method``); an unknown name is an error naming the key.

    A Pangea fine-tune built here (``derived``: slug -> ``derive`` block; else the entry's own ``derive``) whose
    recipe departs from the paper's (Appendix D: Yes:No about 1:19, "present at the image", 60K + 60K questions
    with four options, its YN prompt, Kinetics-700 and HAKE left out, lr 2e-5, batch 64;
    ``derived/finetune_settings.py`` ``paper_departures``) is named a variant of the paper's method, with the
    departures, and is never paired with the paper's row; so is a Nullu built here whose HalluSpace data or
    settings are not the official Nullu's (LURE's caption pairs, top-k 4, layers 16-31, the mean embedding;
    ``derived/nullu_settings.py`` ``official_departures``): the paper does not say which data its Nullu row
    used, so a Δ against it would compare different HalluSpaces. An adapter you bring is taken at its label.
    """
    methods = {}
    for slug, entry in config["models"].items():
        method = entry.get("paper_method")
        if method is None:
            continue
        if method not in TABLE5_MODEL_METHODS:
            hint = (" (a variant's paper_name, not a model's)" if method in (*TABLE5_VARIANT_METHODS.values(),
                                                                            *TABLE5_VARIANT_METHODS) else "")
            raise ValueError(f"models.{slug}.paper_method: '{method}' is not a model row of the paper's Table 5"
                             f"{hint}; known: {list(TABLE5_MODEL_METHODS)}")
        derive = (derived or {}).get(slug) or entry.get("derive") or {}
        built = {PANGEA_METHOD: ("lora_finetune", "a LoRA fine-tune", paper_departures, "Pangea-LoRA",
                                 "the paper's method"),
                 NULLU_METHOD: ("nullu", "Nullu's projection", official_departures, "Nullu", "the official method")}
        if method in built and derive:
            own, kind, departures_of, name, reference = built[method]
            departures = ([f"built by {derive.get('method')}, not {kind}"] if derive.get("method") != own
                          else departures_of(method_settings(derive), f"models.{slug}.derive"))
            if departures:
                method = f"{name} (variant of {reference}: {'; '.join(departures)})"
        methods[slug] = method
    return methods


def paper_method_pairs(config: dict, methods: Mapping[str, str], derived: Mapping[str, dict] | None = None
                       ) -> dict[str, str]:
    """Model slug -> the paper model its Table 5 row is compared with: LLaVA-1.5-7B where the row is one of the
    paper's methods (not a variant of it) and the model is built on the paper's LLaVA-1.5-7B (a derived model's
    base, or an adapter entry itself, says so with ``paper_name``); other models get the paper's row unpaired.
    The base's paper model comes from the tables' one pairing rule (``paper_names_from_config``)."""
    bases = paper_names_from_config(config, method_rows=True, derived=derived)
    return {slug: TABLE5_MODEL for slug, method in methods.items()
            if method in TABLE5_MODEL_METHODS and bases.get(slug) == TABLE5_MODEL}
