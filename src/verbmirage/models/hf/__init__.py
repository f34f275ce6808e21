"""Hugging Face transformers backends: the engine (:class:`TransformersVLM`) and its model families.

Modules by concern:

- :mod:`.tokens`: token tables (yes/no/option-letter ids, decoder layers, dtypes); light, shared with the
  other backends;
- :mod:`.scoring`: :class:`LogitsVLM`, answers from the first answer position's logits;
- :mod:`.inputs`: prompts (chat frames) and processor inputs (the engine's ``inputs``);
- :mod:`.prefix_cache` and :mod:`.shared_prefix`: cached image prefixes and suffix batches (``prefix_cache``);
- :mod:`.steppers` and :mod:`.decode`: the rows the decoding strategies (``verbmirage.variants``) advance
  (``decoder``);
- :mod:`.engine`: :class:`TransformersVLM`, prompts -> logits -> steppers, holding the three collaborators above;
- :mod:`.families`: :class:`LlavaVLM`, :class:`InstructBlipVLM`, :class:`QwenVLM`.

Names below are imported on first use, so that importing :mod:`.tokens` does not load the engine.
"""

from __future__ import annotations

import importlib

_FACE = {
    "TransformersVLM": "engine",
    "LlavaVLM": "families",
    "InstructBlipVLM": "families",
    "QwenVLM": "families",
    "LogitsVLM": "scoring",
    "DTYPES": "tokens",
    "MAX_OPTIONS": "tokens",
    "answer_token_ids": "tokens",
    "decoder_layers": "tokens",
    "use_eager_language_model": "tokens",
    "images_only_processor": "tokens",
}
__all__ = sorted(_FACE)


def __getattr__(name: str):
    if name not in _FACE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_FACE[name]}"), name)
