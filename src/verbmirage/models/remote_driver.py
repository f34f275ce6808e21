"""The base of a remote-code driver, and the helpers every driver and the worker use.

Stdlib only at import (torch, transformers and PIL are imported inside the functions): this file runs in
the remote-code environments, without the package installed, beside :mod:`remote_worker` (see there).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import sys
from pathlib import Path

DTYPE_NAMES = ("float32", "bfloat16", "float16")


def decoding_tag(num_beams: int = 1, repetition_penalty: float = 1.0) -> str:
    """Name of a deterministic decoding: ``greedy``, ``beam5``, ``beam3-rp1.2``."""
    if int(num_beams) < 1:
        raise ValueError(f"num_beams must be >= 1, got {num_beams}")
    tag = "greedy" if int(num_beams) == 1 else f"beam{int(num_beams)}"
    if float(repetition_penalty) != 1.0:
        tag += f"-rp{float(repetition_penalty):g}"
    return tag


def sampling_tag(num_beams: int, repetition_penalty: float, sampling: dict | None) -> str:
    """:func:`decoding_tag`, or ``sample`` for a sampled answer."""
    return "sample" if (sampling or {}).get("do_sample") else decoding_tag(num_beams, repetition_penalty)


def generation_settings(sampling: dict | None) -> dict:
    """``generate`` keyword arguments of a request's ``sampling`` settings (empty: deterministic decoding),
    seeding torch's generator for a sampled answer (one seed per question: the same draw in any batch)."""
    sampling = dict(sampling or {})
    settings = {"do_sample": False}
    if "length_penalty" in sampling:
        settings["length_penalty"] = float(sampling["length_penalty"])
    if sampling.get("do_sample"):
        import torch

        torch.manual_seed(int(sampling.get("seed", 0)))
        settings = {"do_sample": True, "temperature": float(sampling.get("temperature", 1.0)),
                    "top_k": int(sampling.get("top_k", 0)), "top_p": float(sampling.get("top_p", 1.0))}
    return settings


def decode_or_none(decode, token_id: int):
    """``decode([token_id])``, or None where the tokenizer cannot decode that id alone (Qwen's ``<img>``)."""
    try:
        text = decode([token_id])
    except Exception:  # noqa: BLE001 - checkpoint tokenizers raise ValueError, KeyError, ...
        return None
    return text if isinstance(text, str) else None


def code_hashes(folder: str | Path) -> dict[str, str]:
    """sha256 of the ``*.py`` and ``*.json`` files of a checkpoint's code folder (what really runs)."""
    out = {}
    folder = Path(folder)
    if folder.is_dir():
        for file in sorted(folder.iterdir()):
            if file.is_file() and file.suffix in (".py", ".json", ".tiktoken"):
                out[file.name] = hashlib.sha256(file.read_bytes()).hexdigest()
    return out


def environment() -> dict[str, str]:
    """Versions of the stack a driver runs on (part of the inference fingerprint)."""
    versions = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "tokenizers", "numpy", "torchvision"):
        with contextlib.suppress(Exception):
            versions[name] = importlib.import_module(name).__version__
    return versions


def _transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


def _torch_dtype(name: str):
    import torch

    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype '{name}' is not one of {list(DTYPE_NAMES)}")
    return getattr(torch, name)


def _dtype_kwarg() -> str:
    """``torch_dtype`` works from 4.x to 5.x; ``dtype`` only from 4.56 (the old name is silently ignored)."""
    return "dtype" if _transformers_major() >= 5 else "torch_dtype"


def _open_rgb(image_path: str):
    from PIL import Image

    with Image.open(image_path) as image:
        return image.convert("RGB")


class Driver:
    """One checkpoint's official calling convention. Subclasses set ``tokenizer``, ``model`` and the methods."""

    name = ""

    def __init__(self, path: str, revision: str | None = None, dtype: str = "bfloat16", device: str = "cuda",
                 **options):
        self.path, self.revision, self.options = path, revision, options
        self.dtype_name, self.dtype, self.device = dtype, _torch_dtype(dtype), device
        self.load()

    def load(self) -> None:
        raise NotImplementedError

    @property
    def tokenizer_size(self) -> int:
        return len(self.tokenizer)

    def stop_ids(self) -> list[int]:
        """Token ids that end an answer: the tokenizer's and the generation config's end of sequence."""
        ids = {getattr(self.tokenizer, "eos_token_id", None)}
        configured = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        ids |= set(configured) if isinstance(configured, (list, tuple)) else {configured}
        return sorted(int(token) for token in ids if isinstance(token, int))

    @property
    def vocab_size(self) -> int:
        """Width of the logits row (may exceed the tokenizer: padded output layers)."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    def vocabulary(self) -> list[str | None]:
        decode = self.tokenizer.decode
        size = self.tokenizer_size
        return [decode_or_none(decode, i) if i < size else None for i in range(self.vocab_size)]

    def code_folder(self) -> str | None:
        """The folder of the checkpoint code that really runs (the dynamic-module copy)."""
        module = sys.modules.get(type(self.model).__module__)
        file = getattr(module, "__file__", None)
        return str(Path(file).parent) if file else None

    def prompt_text(self, image_path: str, question: str) -> str:
        raise NotImplementedError

    def logits(self, image_path: str, question: str):
        """1-D float32 CPU logits at the first answer position."""
        raise NotImplementedError

    def generate(self, image_path: str, question: str, max_new_tokens: int, num_beams: int = 1,
                 repetition_penalty: float = 1.0, sampling: dict | None = None) -> tuple[str, str]:
        """(answer text, decoding tag) of the checkpoint's own ``generate``: greedy, beam search (``num_beams``,
        ``sampling['length_penalty']``) or sampling (``sampling``: do_sample, temperature, top_k, top_p, seed)."""
        raise NotImplementedError

    #: Token ids of the last :meth:`generate` (new tokens only), for tests that compare with the logits' argmax.
    last_token_ids: list[int] = []


def check_buffers(model, where: str) -> None:
    """Fail loudly where a buffer was never filled: transformers 5.x builds models on the meta device and does
    not recompute non-persistent buffers that checkpoint code fills in ``__init__`` (they come back as garbage)."""
    import torch

    for name, buffer in model.named_buffers():
        if buffer.is_meta or (buffer.is_floating_point() and not torch.isfinite(buffer).all()):
            raise RuntimeError(f"{where}: buffer {name} was not initialised by this transformers version; "
                               "run the model in its worker env (docs/models.md)")

