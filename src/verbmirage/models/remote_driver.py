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


def attempt(call, *args, **kwargs):
    """``call``'s answer, or its exception (one item of a batch; the others keep theirs)."""
    try:
        return call(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - the item's failure, reported in its place
        return error


def common_prefix(rows: list[list[int]]) -> int:
    """Length of the longest prefix all ``rows`` share."""
    shortest = min(len(row) for row in rows)
    for i in range(shortest):
        if any(row[i] != rows[0][i] for row in rows[1:]):
            return i
    return shortest


def expand_cache(past, size: int):
    """A batch-1 key/value cache of plain tuples (batch first) seen as ``size`` rows, without copying."""
    return tuple(tuple(t.expand(size, *t.shape[1:]) for t in layer) for layer in past)


def pad_rows(rows: list[list[int]], value: int, left: bool = False):
    """(LongTensor of ``rows`` padded with ``value`` to the longest, 0/1 attention mask, lengths)."""
    import torch

    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), int(value), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, span] = torch.tensor(row, dtype=torch.long)
        mask[i, span] = 1
    return ids, mask, torch.tensor([len(row) for row in rows])


def trim_after_end(tokens: list[int], ends) -> list[int]:
    """New tokens up to and including the first end token (a batch row goes on with padding after it)."""
    cut = next((i for i, token in enumerate(tokens) if token in ends), None)
    return tokens if cut is None else tokens[: cut + 1]


#: What a forward costs beyond its rows, in token positions (where :func:`length_batches` cuts).
FORWARD_COST = 64


def length_batches(lengths: list[int], size: int | None) -> list[list[int]]:
    """Indices of rows of these ``lengths`` in batches of at most ``size``: sorted by length and cut where the
    padding saved outweighs another forward (least sum of rows x longest row + :data:`FORWARD_COST` per batch)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    cap = max(1, int(size or len(order) or 1))
    best, cut = [0] + [None] * len(order), [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        for start in range(max(0, end - cap), end):
            cost = best[start] + (end - start) * lengths[order[end - 1]] + FORWARD_COST
            if best[end] is None or cost < best[end]:
                best[end], cut[end] = cost, start
    batches, end = [], len(order)
    while end:
        batches.append(order[cut[end] : end])
        end = cut[end]
    return batches[::-1]


def chunks(items: list, size: int | None):
    """``items`` in slices of at most ``size`` (all at once when ``size`` is None)."""
    size = max(1, int(size or len(items) or 1))
    return [items[i : i + size] for i in range(0, len(items), size)]


def by_key(keys: list) -> list[tuple[object, list[int]]]:
    """(key, indices) groups of ``keys``, in first-seen order."""
    groups: dict = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return list(groups.items())


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

    # ---- memory --------------------------------------------------------------------------------------
    def memory_geometry(self) -> dict | None:
        """What a job sizes its batches from (``verbmirage.models.memory.remote_memory_costs``): the language
        model's layers, widths, heads and vocabulary, what one image puts into it and through the vision tower
        (:meth:`image_geometry`), the weights' bytes and the dtype's width; None where the driver cannot say
        (its job keeps the configured batch size)."""
        image = self.image_geometry()
        if image is None:
            return None
        config = self.model.config
        config = getattr(config, "text_config", None) or config

        def first(*names, default=0):
            for name in names:
                value = getattr(config, name, None)
                if isinstance(value, int) and value > 0:
                    return value
            return default

        hidden = first("hidden_size", "d_model")
        heads = first("num_attention_heads", "n_heads", default=1)
        tensors = [*self.model.parameters(), *self.model.buffers()]
        return {"layers": first("num_hidden_layers", "n_layers"), "hidden": hidden, "heads": heads,
                "kv_heads": first("num_key_value_heads", default=heads),
                "head_dim": first("head_dim", "kv_channels", default=max(1, hidden // heads)),
                "intermediate": first("intermediate_size", default=4 * hidden),
                "vocab": int(self.vocab_size), "itemsize": int(self.dtype.itemsize),  # the activations' dtype
                "weights": int(sum(t.numel() * t.element_size() for t in tensors)), **image}

    def image_geometry(self) -> dict | None:
        """The most one image costs: ``image_tokens`` in the language model's sequence, ``vision_tokens``
        through the vision tower (every crop or slice), its ``vision_layers`` and ``vision_hidden``; None: not
        known (a driver of your own that does not say)."""
        return None

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

    # ---- batches -------------------------------------------------------------------------------------
    # A driver that defines the four hooks below scores the questions of one image together: the prompt ids
    # of each question (``batch_inputs``), one forward over the ids all of them share, image included, kept
    # as a key/value cache (``prefix_cache``), then the questions' own tokens as right-padded rows on that
    # cache (``suffix_logits``). Padding after a row's last token is never seen by it (causal attention), so
    # each row's logits are those of its question alone. Without the hooks, one question per forward.
    batch_inputs = prefix_cache = suffix_logits = image_end = None

    def logits_batch(self, items: list[tuple[str, str]], batch_size: int | None = None) -> list:
        """Logits rows (as :meth:`logits`) of ``items`` ((image, question) pairs), or the exception of an item
        that failed; at most ``batch_size`` questions per forward. ``self.forwards`` counts what ran."""
        rows: list = [None] * len(items)
        for image, indices in by_key([image for image, _ in items]):
            questions = [items[i][1] for i in indices]
            try:
                answered = self._image_logits(image, questions, batch_size)
            except Exception as error:  # noqa: BLE001 - retried one by one so that the error names its question
                print(f"{self.name}: batch on {image} failed ({type(error).__name__}: {error}); one by one",
                      file=sys.stderr)
                self.forwards["single"] += len(questions)
                answered = [attempt(self.logits, image, question) for question in questions]
            for i, row in zip(indices, answered):
                rows[i] = row
        return rows

    @property
    def forwards(self) -> dict:
        """How the questions were run: ``prefix`` forwards (one per image group), ``suffix`` forwards (batches
        on a prefix cache), ``single`` forwards (one question each)."""
        if "_forwards" not in vars(self):
            self._forwards = {"prefix": 0, "suffix": 0, "single": 0}
        return self._forwards

    def _image_logits(self, image: str, questions: list[str], batch_size: int | None) -> list:
        if self.batch_inputs is None:
            self.forwards["single"] += len(questions)
            return [self.logits(image, question) for question in questions]
        import torch

        ids, state = self.batch_inputs(image, questions)
        cut = min(common_prefix(ids), min(len(row) for row in ids) - 1)  # every row keeps a token of its own
        if cut < self.image_end(ids[0], state):
            raise ValueError(f"the prompts share {cut} tokens, fewer than the image prefix")
        suffixes = [row[cut:] for row in ids]
        rows: list = [None] * len(suffixes)
        with torch.inference_mode():
            past = self.prefix_cache(ids[0][:cut], state)
            self.forwards["prefix"] += 1
            for batch in length_batches([len(row) for row in suffixes], batch_size):
                for i, row in zip(batch, self.suffix_logits([suffixes[i] for i in batch], past).float().cpu()):
                    rows[i] = row
                self.forwards["suffix"] += 1
        return rows

    def generate_batch(self, items: list[tuple[str, str]], max_new_tokens: int, num_beams: int = 1,
                       repetition_penalty: float = 1.0, sampling: list[dict] | None = None,
                       batch_size: int | None = None) -> list:
        """(text, tag, new token ids) of each (image, question) item, or the item's exception: the checkpoint's
        own ``generate`` on batches of at most ``batch_size`` where :meth:`decode_batch` is defined, else (and
        always when sampling: each question draws with its own seed) one question at a time."""
        sampling = sampling or [{}] * len(items)
        if self.decode_batch is None or any(settings.get("do_sample") for settings in sampling) or len(items) < 2:
            return self._generate_each(items, max_new_tokens, num_beams, repetition_penalty, sampling)
        tag = sampling_tag(num_beams, repetition_penalty, sampling[0])
        out: list = [None] * len(items)
        for _, indices in by_key([self.decode_group(image, question) for image, question in items]):
            for chunk in chunks(indices, batch_size):
                try:
                    answers = [(text, tag, tokens) for text, tokens in self.decode_batch(
                        [items[i] for i in chunk], int(max_new_tokens), int(num_beams), float(repetition_penalty),
                        sampling[chunk[0]])]
                    self.forwards["suffix"] += 1
                except Exception as error:  # noqa: BLE001 - retried one by one so that the error names its question
                    print(f"{self.name}: batched decoding failed ({type(error).__name__}: {error}); one by one",
                          file=sys.stderr)
                    answers = self._generate_each([items[i] for i in chunk], max_new_tokens, num_beams,
                                                  repetition_penalty, [sampling[i] for i in chunk])
                for i, answer in zip(chunk, answers):
                    out[i] = answer
        return out

    def _generate_each(self, items, max_new_tokens, num_beams, repetition_penalty, sampling) -> list:
        out = []
        for (image, question), settings in zip(items, sampling):
            result = attempt(self.generate, image, question, max_new_tokens, num_beams=num_beams,
                               repetition_penalty=repetition_penalty, sampling=settings)
            out.append(result if isinstance(result, Exception) else (*result, list(self.last_token_ids)))
            self.forwards["single"] += 1
        return out

    #: ``decode_batch(items, max_new_tokens, num_beams, repetition_penalty, sampling)`` -> [(text, new token
    #: ids)]: one call of the checkpoint's ``generate`` on items of one :meth:`decode_group`; None: no batches.
    decode_batch = None

    def decode_group(self, image: str, question: str):
        """Items that can share a ``generate`` call have the same group (by default: all)."""
        return None


def check_buffers(model, where: str) -> None:
    """Fail loudly where a buffer was never filled: transformers 5.x builds models on the meta device and does
    not recompute non-persistent buffers that checkpoint code fills in ``__init__`` (they come back as garbage)."""
    import torch

    for name, buffer in model.named_buffers():
        if buffer.is_meta or (buffer.is_floating_point() and not torch.isfinite(buffer).all()):
            raise RuntimeError(f"{where}: buffer {name} was not initialised by this transformers version; "
                               "run the model in its worker env (docs/models.md)")

