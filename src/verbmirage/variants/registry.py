"""Decoding strategies by name: a variant's ``decoding`` value -> its strategy class (imported when used).

Adding a decoding is one strategy class (see :mod:`.strategies`) and one line in :data:`DECODINGS` (and its
name in the config schema's ``decoding`` enum, which a test keeps equal to this table); the variant's
settings (:mod:`.settings`) and the backends' features (``decoding:<name>``) follow from this table. This module imports nothing heavy: the workflow reads the names while planning.
"""

from __future__ import annotations

import importlib

from verbmirage.core.sources import class_summary

#: decoding name -> ``module:Class`` of its strategy.
DECODINGS: dict[str, str] = {
    "greedy": "verbmirage.variants.strategies:Greedy",
    "beam": "verbmirage.variants.strategies:BeamSearch",
    "sample": "verbmirage.variants.strategies:Sampling",
    "opera": "verbmirage.variants.opera:Opera",
}
#: The strategy that adds VCD's contrast to a decoding (a variant's ``vcd:`` block).
CONTRASTIVE = "verbmirage.variants.vcd:ContrastiveDecoding"


def _load(target: str) -> type:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def strategy_class(name: str) -> type:
    """The strategy class of decoding ``name``."""
    if name not in DECODINGS:
        raise ValueError(f"decoding '{name}' is not one of {list(DECODINGS)}")
    return _load(DECODINGS[name])


def strategy_summary(name: str) -> str:
    """What decoding ``name`` does, from its strategy class's docstring (nothing imported)."""
    return class_summary(DECODINGS[name])


def decoding_strategy(variant):
    """The strategy a :class:`~verbmirage.variants.settings.Variant` decodes with: its decoding, with VCD's
    contrast on top where it has a ``vcd`` block."""
    strategy = strategy_class(variant.decoding)(variant)
    return strategy if variant.vcd is None else _load(CONTRASTIVE)(strategy)
