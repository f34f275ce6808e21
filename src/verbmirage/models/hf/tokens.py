"""Token tables of a transformers checkpoint: which ids spell yes, no and each option letter, the decoder layers,
the dtypes, and loading helpers.

A light module (torch only, no transformers at import): the remote-code adapters (``models/remote.py``), CLIP
(``models/clip.py``) and the tiny-model builders (``models/tiny.py``) import it instead of the engine.
"""

from __future__ import annotations

import torch

from verbmirage.models.base import YES
from verbmirage.models.parsing import letter_token, yes_no_token

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_OPTIONS = 26


def padded(rows: list[torch.Tensor], pad: int, device, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows of different lengths as one batch [rows, longest], padded with ``pad`` after each row (before
    it, ``left``), and their lengths [rows], both on ``device``."""
    # laid out where the rows are (the tokenizer's: the host) and moved in one copy, not written row by row on
    # the device (a launch per row on a GPU)
    input_ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad,
                                                padding_side="left" if left else "right")
    return input_ids.to(device), torch.tensor([len(row) for row in rows], device=device)


def images_only_processor(processor_class):
    """``processor_class`` without its video processor.

    Qwen-VL processors build a video processor that needs torchvision; for
    image questions it is never used, so where torchvision is missing (CPU
    test machines) the processor is assembled without it.
    """

    class ImagesOnly(processor_class):
        @classmethod
        def get_attributes(cls):
            return [name for name in processor_class.get_attributes() if name != "video_processor"]

    ImagesOnly.__name__ = ImagesOnly.__qualname__ = processor_class.__name__
    return ImagesOnly


def decode_or_none(tokenizer, token_id: int) -> str | None:
    """``tokenizer.decode([token_id])``, or None where that raises (Qwen's lone ``<img>``, ids past its table)."""
    try:
        return tokenizer.decode([token_id])
    except Exception:  # noqa: BLE001 - checkpoint tokenizers raise ValueError, KeyError, ...
        return None


def answer_token_ids(vocabulary, where: str) -> tuple[list[int], list[int], list[list[int]]]:
    """Ids of the tokens that spell yes, no and each option letter, from the decoded vocabulary.

    ``vocabulary[i]`` is the text of token ``i``, or None where it cannot be
    decoded (skipped). A token counts only as a whole word: ``" Yes"``,
    ``"no."``, but not ``"ności"`` or ``"Yesterday"`` (S4).
    """
    yes, no, letters = [], [], [[] for _ in range(MAX_OPTIONS)]
    for token_id, text in enumerate(vocabulary):
        if not text or not text.strip():
            continue
        word = yes_no_token(text)
        if word is not None:
            (yes if word == YES else no).append(token_id)
        letter = letter_token(text, MAX_OPTIONS)
        if letter is not None and text.strip() == letter:
            letters[ord(letter) - ord("A")].append(token_id)
    if not yes or not no:
        raise ValueError(f"{where}: the tokenizer has no token for 'yes' or 'no'")
    return yes, no, letters


def decoder_layers(model) -> list:
    """The language model's decoder layers (each with ``self_attn``): OPERA and the attention analysis read
    their attention."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no language-model decoder layers found")
    return list(layers)


def use_eager_language_model(model) -> None:
    """Eager attention in the language model only (its weights are returned); the vision tower keeps its
    implementation."""
    use_language_attention(model, "eager")


def language_attention(model) -> str:
    """The attention implementation the language model runs (``sdpa``, ``eager``, ...)."""
    return model.config.get_text_config()._attn_implementation


def use_language_attention(model, implementation: str) -> None:
    """``implementation`` in the language model only; the vision tower keeps its own."""
    config = model.config
    if "text_config" in getattr(config, "sub_configs", {}):
        model.set_attn_implementation({"text_config": implementation})
    else:
        model.set_attn_implementation(implementation)


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()

