"""A Nullu entry's ``derive`` block: its settings, their check and how they depart from the official Nullu.
Read when a run is planned (:mod:`verbmirage.models.derived`); the edit itself is
:mod:`verbmirage.models.derived.nullu`.
"""

from __future__ import annotations

from dataclasses import dataclass

#: LURE's (and Nullu's) prompt for both captions of a pair.
CAPTION_PROMPT = "Please describe this image in detail."
PAIR_STYLES = ("caption", "yn")
EMBEDDINGS = ("mean", "last", "answer_mean")


@dataclass(frozen=True)
class NulluSettings:
    """``models.<slug>.derive`` of a Nullu entry (defaults as in the schema; see docs/models.md)."""

    pairs: int = 5000
    pairs_file: str = ""
    image_root: str = ""
    pair_style: str = "caption"
    prompt: str = CAPTION_PROMPT
    seed: int = 0
    top_k: int = 4
    layers: str | tuple[int, ...] = "upper_half"
    embedding: str = "mean"
    batch_size: int = 8

    @classmethod
    def from_config(cls, settings: dict, where: str = "derive") -> "NulluSettings":
        """Settings from a ``derive`` block without method and base; an unknown or ill-typed key names itself."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ValueError(f"{where}: unknown Nullu setting(s) {unknown}; known: {sorted(known)}")
        values = dict(settings)
        if isinstance(values.get("layers"), list):
            values["layers"] = tuple(values["layers"])
        chosen = cls(**values)
        for key in ("pairs", "batch_size"):
            value = getattr(chosen, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}.{key}: {value!r} is not an integer >= 1")
        if isinstance(chosen.top_k, bool) or not isinstance(chosen.top_k, int) or chosen.top_k < 0:
            raise ValueError(f"{where}.top_k: {chosen.top_k!r} is not an integer >= 0")
        if chosen.pair_style not in PAIR_STYLES:
            raise ValueError(f"{where}.pair_style: {chosen.pair_style!r} is not one of {list(PAIR_STYLES)}")
        if chosen.embedding not in EMBEDDINGS:
            raise ValueError(f"{where}.embedding: {chosen.embedding!r} is not one of {list(EMBEDDINGS)}")
        if chosen.layers != "upper_half" and not (
            isinstance(chosen.layers, tuple) and chosen.layers
            and all(isinstance(layer, int) and not isinstance(layer, bool) and layer >= 0 for layer in chosen.layers)
        ):
            raise ValueError(f"{where}.layers: {chosen.layers!r} is neither upper_half nor a list of layer indices")
        if chosen.pairs_file and not chosen.image_root:
            raise ValueError(f"{where}.image_root: pairs_file is set; name the folder its `image` names are under")
        return chosen


def check_settings(settings: dict, where: str) -> None:
    """Config-time check (verbmirage.models.derived.check_derived)."""
    NulluSettings.from_config(settings, where)


#: The official Nullu's settings (its README: top-k 4, layers 16-31 of LLaVA-1.5's 32, the mean embedding,
#: LURE's captions after LURE's prompt).
OFFICIAL = NulluSettings()


def official_departures(settings: dict, where: str = "derive") -> list[str]:
    """How a ``nullu`` block (without method and base) departs from the official Nullu, one short phrase each;
    empty where it is the official recipe. The official Nullu computes its HalluSpace from LURE's caption pairs
    (the paper does not say which data its Nullu row used): our default pairs from HICO's training labels are
    a departure, a LURE-format file (``pairs_file``) is taken as LURE's. Table 5 names a departing model a
    variant of Nullu and compares it with no paper row."""
    made = NulluSettings.from_config(settings, where)
    found = [] if made.pairs_file else ["HalluSpace from HICO training pairs, the official one from LURE's captions"]
    if made.pairs_file and made.prompt != OFFICIAL.prompt:
        found.append(f"prompt {made.prompt!r}, LURE's {OFFICIAL.prompt!r}")
    if made.top_k != OFFICIAL.top_k:
        found.append(f"top_k {made.top_k}, the official {OFFICIAL.top_k}")
    if made.layers != OFFICIAL.layers:
        found.append(f"layers {list(made.layers)}, the official upper half (16-31 of 32)")
    if made.embedding != OFFICIAL.embedding:
        found.append(f"embedding {made.embedding}, the official {OFFICIAL.embedding}")
    return found
