"""Nullu (Ziwei-Zheng/Nullu): project the MLP weights of the upper layers off the "HalluSpace".

The official algorithm (notes/mitigations.md section 4; ``utils/halluedit.py``, ``model/LLaVA.py``):

1. Pairs of a truthful and a hallucinated answer to the same image and prompt (LURE's captions there; here by
   default HICO *training* labels: a positive HOI against a label -1 verb of the same object in the same
   image, :func:`hico_pairs`; or a LURE-format jsonl, :func:`lure_pairs`).
2. One teacher-forced forward per sample with ``output_hidden_states``; ``hidden_states[l + 1]`` is the
   output of decoder layer ``l``; a sample's embedding is the mean over all positions (official), the last
   token, or the mean over the answer tokens (ours, a flagged deviation: the mean over all positions mixes
   answers of different lengths with the shared ~600-token prefix).
3. Per edited layer, D = (truthful - hallucinated) / 2 (pairs x hidden); its top-k right singular vectors V_k
   span the HalluSpace; P = V_k^T V_k.
4. ``mlp.down_proj.weight`` W of those layers becomes (I - P) W, so no MLP output has a component along the
   HalluSpace. Ours in float32, cast back to the model's dtype (official: P cast to fp16 first). The whole
   model is saved (``save_pretrained``) with the processor files and ``nullu.json``.

torch and transformers are imported inside the functions: the config check imports this module.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

#: LURE's (and Nullu's) prompt for both captions of a pair.
CAPTION_PROMPT = "Please describe this image in detail."
PAIR_STYLES = ("caption", "yn")
EMBEDDINGS = ("mean", "last", "answer_mean")
#: The record written beside the edited weights.
RECORD = "nullu.json"
#: D counts as zero (refused) when its largest singular value is below this share of the embeddings' scale.
ZERO_DIFFERENCE = 1e-6


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
            and all(isinstance(l, int) and not isinstance(l, bool) and l >= 0 for l in chosen.layers)
        ):
            raise ValueError(f"{where}.layers: {chosen.layers!r} is neither upper_half nor a list of layer indices")
        if chosen.pairs_file and not chosen.image_root:
            raise ValueError(f"{where}.image_root: pairs_file is set; name the folder its `image` names are under")
        return chosen


def check_settings(settings: dict, where: str) -> None:
    """Config-time check (verbmirage.derived.check_derived)."""
    NulluSettings.from_config(settings, where)
