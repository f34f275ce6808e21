"""Decodings by name: one row per decoding, from a variant's ``decoding`` value to all that it brings.

A :class:`DecodingRow` carries the decoding's strategy class (``module:Class``, imported when used: the
strategies import torch), its **settings type** (a frozen dataclass whose fields are the variant keys the
decoding reads, each with its default) and its **schema entry** (the JSON schema of each of those keys, which
``schemas/config.schema.yaml`` repeats under ``variants``; ``tests/fast/test_registry.py`` keeps the two equal,
and the schema's ``decoding`` enum equal to :data:`DECODINGS`). :meth:`Variant.from_config
<verbmirage.variants.settings.Variant.from_config>` reads the row: the defaults (5 beams for beam search and
OPERA), which keys a decoding refuses, and the settings a variant's answers depend on.

Adding a decoding is one strategy class (see :mod:`.strategies`) and one row here, with its settings type when
it reads a new key (docs/architecture.md, "Adding things"); the backends' features (``decoding:<name>``) follow
from this table. This module imports nothing heavy: the workflow reads it while planning.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, fields

from verbmirage.core.sources import class_summary

# ---- the settings each decoding reads ------------------------------------------------------------------------


@dataclass(frozen=True)
class GreedySettings:
    """Greedy decoding reads no key of its own (its length is ``inference.continue_tokens``)."""


@dataclass(frozen=True)
class BeamSettings:
    """transformers' beam search: ``num_beams`` rows per question, scores divided by length**length_penalty."""

    num_beams: int = 5
    length_penalty: float = 1.0
    max_new_tokens: int = 10


@dataclass(frozen=True)
class SampleSettings:
    """Multinomial sampling with temperature, top-k (0: none) and top-p; each question seeded by its id."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    max_new_tokens: int = 10


@dataclass(frozen=True)
class OperaSettings:
    """OPERA's over-trust penalty and retrospection (Huang et al. 2024; docs/variants.md, "OPERA").

    ``float16_scores`` and ``full_length_normalisation`` keep two quirks of the
    official code (scores stored in float16; beam scores divided by the whole
    sequence length, prompt included); set them false for the clean version.
    """

    scale_factor: float = 50.0
    threshold: int = 15
    num_attn_candidates: int = 5
    penalty_weights: float = 1.0
    reward_tokens: int = 10
    float16_scores: bool = True
    full_length_normalisation: bool = True


@dataclass(frozen=True)
class OperaDecodingSettings:
    """OPERA: a beam search (``num_beams``, ``max_new_tokens``) with its own block ``opera:``."""

    num_beams: int = 5
    max_new_tokens: int = 10
    opera: OperaSettings = field(default_factory=OperaSettings)


# ---- the JSON schema of those keys (schemas/config.schema.yaml repeats them under variants) --------------------

_BEAMS = {"type": "integer", "minimum": 1}
_NEW_TOKENS = {"type": "integer", "minimum": 1}
_OPERA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "scale_factor": {"type": "number", "exclusiveMinimum": 0},
        "threshold": {"type": "integer", "minimum": 1},
        "num_attn_candidates": {"type": "integer", "minimum": 1},
        "penalty_weights": {"type": "number"},
        "reward_tokens": {"type": "integer", "minimum": 0},
        "float16_scores": {"type": "boolean"},
        "full_length_normalisation": {"type": "boolean"},
    },
}


@dataclass(frozen=True)
class DecodingRow:
    """Everything a decoding brings, in one place."""

    #: ``module:Class`` of its strategy (a :class:`~verbmirage.variants.strategies.Decoding`).
    strategy: str
    #: The variant keys it reads, with their defaults (a frozen dataclass; a field typed with a dataclass is a
    #: block of its own, like ``opera:``).
    settings: type
    #: The JSON schema of each of those keys, as ``schemas/config.schema.yaml`` writes it under ``variants``.
    schema: dict[str, dict] = field(default_factory=dict)
    #: How a run's decoding is named (``parse_rule``, run labels): a format over the variant's fields.
    label: str = "{decoding}"
    #: Whether VCD's contrast (a variant's ``vcd:`` block) may wrap it.
    contrasts: bool = True


#: decoding name -> its row; the order is the schema enum's and the docs'.
DECODINGS: dict[str, DecodingRow] = {
    "greedy": DecodingRow("verbmirage.variants.strategies:Greedy", GreedySettings),
    "beam": DecodingRow(
        "verbmirage.variants.strategies:BeamSearch", BeamSettings,
        {"num_beams": _BEAMS, "length_penalty": {"type": "number"}, "max_new_tokens": _NEW_TOKENS},
        label="beam{num_beams}",
    ),
    "sample": DecodingRow(
        "verbmirage.variants.strategies:Sampling", SampleSettings,
        {"temperature": {"type": "number", "exclusiveMinimum": 0},
         "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
         "top_k": {"type": "integer", "minimum": 0},
         "seed": {"type": "integer"},
         "max_new_tokens": _NEW_TOKENS},
    ),
    "opera": DecodingRow(
        "verbmirage.variants.opera:Opera", OperaDecodingSettings,
        {"num_beams": _BEAMS, "max_new_tokens": _NEW_TOKENS, "opera": _OPERA}, contrasts=False,
    ),
}
#: The strategy that adds VCD's contrast to a decoding (a variant's ``vcd:`` block).
CONTRASTIVE = "verbmirage.variants.vcd:ContrastiveDecoding"


def decoding_row(name: str) -> DecodingRow:
    """The row of decoding ``name``; a ``ValueError`` naming the known ones otherwise."""
    if name not in DECODINGS:
        raise ValueError(f"decoding '{name}' is not one of {list(DECODINGS)}")
    return DECODINGS[name]


def readers(key: str) -> list[str]:
    """The decodings whose settings hold variant key ``key``."""
    return [name for name, row in DECODINGS.items() if key in {f.name for f in fields(row.settings)}]


def _load(target: str) -> type:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def strategy_class(name: str) -> type:
    """The strategy class of decoding ``name``."""
    return _load(decoding_row(name).strategy)


def strategy_summary(name: str) -> str:
    """What decoding ``name`` does, from its strategy class's docstring (nothing imported)."""
    return class_summary(decoding_row(name).strategy)


def decoding_strategy(variant):
    """The strategy a :class:`~verbmirage.variants.settings.Variant` decodes with: its decoding, with VCD's
    contrast on top where it has a ``vcd`` block."""
    strategy = strategy_class(variant.decoding)(variant)
    return strategy if variant.vcd is None else _load(CONTRASTIVE)(strategy)
