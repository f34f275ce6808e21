"""The prefix cache and the batching of suffixes: how the engine runs many prompts on few images.

Questions on one image share a token prefix (chat header and the image tokens, cut right after the last
image token). It runs once, with the vision tower, and its key/value cache is kept (:class:`Prefix`) and
reused for every question on that image; a text header several prompts share (an MC question before its
options) joins their cached prefix. Only the suffixes run per question, sorted by length and cut into the
batches where padding costs least (:func:`cheapest_cuts`); families whose language model allows it read
their prefixes in place (:mod:`.shared_prefix`) instead of one copy per row.

:class:`PrefixCache` is a collaborator of :class:`~verbmirage.models.hf.engine.TransformersVLM` (its
``prefix_cache``; a family whose forward differs names a subclass in ``prefix_cache_class``). It owns the kept
prefixes, the one cache of it that outlives a call, and reads of the engine only what :class:`PrefixHost` declares.
"""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path
from typing import Any, Protocol

import torch

from verbmirage.models.hf import shared_prefix
from verbmirage.models.hf.inputs import PER_TOKEN_KEYS, PromptInputs, by_image
from verbmirage.models.hf.shared_prefix import cheapest_cuts
from verbmirage.models.hf.tokens import language_attention, padded


@dataclasses.dataclass
class Prefix:
    """One image's prefix in the model: per layer (keys, values) with batch 1, and what else its family needs."""

    tensors: list[tuple[torch.Tensor, torch.Tensor]]
    extra: object = None


class Rows:
    """The tokenized prompts of one engine call: per row its cached prefix (the image, or the image
    and a text header the row shares with others: :meth:`PrefixCache._text_headers`), prefix length and
    suffix (None: no shared prefix, then its whole token length), and those prefixes.

    Opened for several streams (VCD: the clean and the noised images), the rows are the call's items once per
    stream, stream after stream: row ``s * items + i`` is item ``i`` on stream ``streams[s]``
    (:meth:`item`, :meth:`noised`)."""

    def __init__(self, n: int, streams: tuple[bool, ...] = (False,)):
        self.items, self.streams = n, streams
        n *= len(streams)
        self.prefix_key: list = [None] * n
        self.prefix_length = [0] * n
        self.suffix: list[torch.Tensor | None] = [None] * n
        self.length = [0] * n
        self.on_prefix: list[int] = []
        self.fallback: list[int] = []
        self.prefixes: dict[tuple, Prefix] = {}

    def item(self, row: int) -> int:
        """The call's item that ``row`` holds."""
        return row % self.items

    def noised(self, row: int) -> bool:
        """Whether ``row`` is on its image's noised stream (VCD)."""
        return self.streams[row // self.items]

    def add(self, row: int, prefix_key: tuple, prefix_length: int, suffix: torch.Tensor) -> None:
        self.prefix_key[row], self.prefix_length[row], self.suffix[row] = prefix_key, prefix_length, suffix
        self.on_prefix.append(row)

    def batches(self, batch_cost: int, cross_images: bool, max_rows: int | None = None) -> list[list[int]]:
        """Rows on a prefix in suffix batches: one prefix (or, ``cross_images``, one prefix length) per batch,
        each group sorted by suffix length and cut where the padded work is least (:func:`cheapest_cuts`),
        at most ``max_rows`` rows each."""
        groups: dict = {}
        for row in self.on_prefix:
            groups.setdefault(self.prefix_length[row] if cross_images else self.prefix_key[row], []).append(row)
        batches: list[list[int]] = []
        for rows in groups.values():
            rows = sorted(rows, key=lambda r: len(self.suffix[r]))
            cuts = cheapest_cuts([len(self.suffix[r]) for r in rows], batch_cost, max_rows)
            batches += [rows[start:stop] for start, stop in zip([0] + cuts, cuts + [len(rows)])]
        return batches

    def prefixes_of(self, rows: list[int]) -> tuple[list[Prefix], list[int]]:
        """The distinct prefixes of ``rows`` and the index of each row's prefix among them."""
        keys = list(dict.fromkeys(self.prefix_key[row] for row in rows))
        position = {key: j for j, key in enumerate(keys)}
        return [self.prefixes[key] for key in keys], [position[self.prefix_key[row]] for row in rows]



class PrefixHost(Protocol):
    """What :class:`PrefixCache` needs of its engine (:class:`~verbmirage.models.hf.engine.TransformersVLM`)."""

    model: Any
    tokenizer: Any
    device: torch.device
    strategy: Any
    inputs: PromptInputs
    prefix_reuse: bool
    cross_image_batches: bool
    shared_prefix_attention: bool
    batch_rows: int | None
    PREFIX_SLOTS: int
    cache_argument: str

    def image_token_id(self) -> int | None: ...
    def noised_inputs(self, encoded: dict, image_path) -> dict: ...


class PrefixCache:
    """The engine's kept image prefixes and its suffix batches (the engine's ``prefix_cache``).

    ``_prefixes``: the kept prefixes, oldest first: (image, prefix ids[, VCD noise]) -> :class:`Prefix`, at most
    the engine's ``PREFIX_SLOTS`` and only those of the current call's images (:meth:`keep_only`). A cache: dropping
    it (:meth:`clear`) changes no result.
    """

    def __init__(self, engine: PrefixHost):
        self.engine = engine
        self._prefixes: collections.OrderedDict[tuple, Prefix] = collections.OrderedDict()

    def clear(self) -> None:
        """Drop every kept prefix."""
        self._prefixes.clear()

    def keep_only(self, images: set[Path]) -> None:
        """Drop the kept prefixes of images other than ``images`` (a new call's)."""
        for key in [key for key in self._prefixes if key[0] not in images]:
            del self._prefixes[key]

    #: A suffix batch's fixed cost in token positions: suffix batches are cut where padding costs more than one
    #: more forward (:func:`cheapest_cuts`), so YN and MC prompts of an image (short and long suffixes) do not
    #: pad each other much. Measured on the CPU (bench/suite_scoring.py's model and the demo's tiny LLaVA),
    #: 256-2000 were as fast as or faster than 32; on a GPU a forward's launch overhead makes it larger still.
    BATCH_COST = 256

    def suffix_batches(self, opened: Rows) -> list[list[int]]:
        """The suffix batches of ``opened``'s rows on a prefix (:meth:`Rows.batches`), at most the engine's
        ``batch_rows`` questions' worth of rows each (times the streams: the memory estimate counts a question's
        rows on every stream in its batch)."""
        rows = self.engine.batch_rows
        return opened.batches(self.BATCH_COST, self.engine.cross_image_batches,
                              rows and rows * len(opened.streams))

    def open_rows(self, items: list[tuple], noised: bool | tuple[bool, ...]) -> Rows:
        """Tokenize ``items`` per image and find (computing what is missing) each image's prefix; ``noised``:
        on VCD's noised images, or a tuple of streams (the rows once per stream: :class:`Rows`), whose missing
        prefixes then run together."""
        streams = noised if isinstance(noised, tuple) else (noised,)
        rows = Rows(len(items), streams)
        needed, headers = [], {}
        inputs = self.engine.inputs
        inputs.text_ids([text for *_, text in items])  # every new prompt of the call in one tokenizer call
        for indices in by_image(items).values():
            image_path, image, _ = items[indices[0]]
            encoded = inputs.encode_shared_image([items[i][2] for i in indices], image)
            prefix_length = self._shared_prefix_length(encoded)
            lengths = encoded["attention_mask"].sum(dim=1).tolist()
            if prefix_length:  # the image inside a shared prefix: its prompts' own tokens, their text headers
                prefix_ids = encoded["input_ids"][0][:prefix_length]
                suffixes = [encoded["input_ids"][r, prefix_length : int(lengths[r])] for r in range(len(indices))]
                shared = self._text_headers(suffixes)
            for s, stream in enumerate(streams):
                at = [s * len(items) + i for i in indices]  # the rows of these items on this stream
                if prefix_length == 0:  # the image is not inside a shared prefix
                    rows.fallback += at
                    for r, row in enumerate(at):
                        rows.length[row] = int(lengths[r])
                    continue
                image_key = self._prefix_key(image_path, prefix_ids, stream)
                needed.append((image_path, prefix_ids, encoded, stream))
                for r, header in enumerate(shared):
                    key = image_key
                    if header:
                        key = self._prefix_key(image_path, torch.cat([prefix_ids, suffixes[r][:header]]), stream)
                        headers.setdefault(key, (image_key, suffixes[r][:header]))
                    rows.add(at[r], key, prefix_length + header, suffixes[r][header:])
        rows.prefixes = self._prefix_caches(needed)
        rows.prefixes.update(self._header_prefixes(headers, rows.prefixes))  # image prefix + shared text header
        return rows

    #: A text header (the first suffix tokens several prompts of an image share, e.g. an MC question before its
    #: options) becomes part of their cached prefix when it saves at least this many token positions.
    HEADER_SAVING = 32
    #: ... and is at least this long: shorter shared starts are not worth a forward of their own.
    HEADER_LENGTH = 4

    def _text_headers(self, suffixes: list[torch.Tensor]) -> list[int]:
        """Per suffix, how many of its first tokens it shares as a header with the others that start the same
        way (0: none), each keeping at least one token of its own.

        Prompts group by their first :attr:`HEADER_LENGTH` tokens; a group's header is its longest common
        start. One forward of the header on the image prefix then replaces running it once per prompt.
        """
        groups: dict[tuple, list[int]] = {}
        for r, suffix in enumerate(suffixes):
            if len(suffix) > self.HEADER_LENGTH:
                groups.setdefault(tuple(suffix[: self.HEADER_LENGTH].tolist()), []).append(r)
        headers = [0] * len(suffixes)
        for members in groups.values():
            if len(members) < 2:
                continue
            length = self._common_prefix_length([suffixes[r] for r in members])
            if length >= self.HEADER_LENGTH and (len(members) - 1) * length >= self.HEADER_SAVING:
                for r in members:
                    headers[r] = length
        return headers

    def _header_prefixes(self, headers: dict[tuple, tuple[tuple, torch.Tensor]],
                         image_prefixes: dict[tuple, Prefix]) -> dict[tuple, Prefix]:
        """The cached prefix of each image followed by a text header (``headers``: key -> (the image prefix's
        key, header tokens)), kept like image prefixes: one forward of each header on its image's prefix, the
        images with the same header and prefix length (the engine's :attr:`~.engine.TransformersVLM.
        cross_image_batches`) in one batch."""
        found, groups, device = {}, {}, self.engine.device
        for key, (image_key, header) in headers.items():
            found[key] = self._kept_prefix(key)
            if found[key] is None:
                image = image_prefixes[image_key]
                group = (tuple(header.tolist()), image.tensors[0][0].shape[-2]) if self.engine.cross_image_batches \
                    else key
                groups.setdefault(group, []).append((key, image, header))
        for group in groups.values():
            images, header, rows = [image for _, image, _ in group], group[0][2], len(group)
            start = images[0].tensors[0][0].shape[-2]
            cache = self.cache_of([(torch.cat([image.tensors[layer][0] for image in images]),
                                    torch.cat([image.tensors[layer][1] for image in images]))
                                   for layer in range(len(images[0].tensors))])
            slots = torch.arange(start, start + len(header), device=device)
            mask = torch.ones((rows, start + len(header)), dtype=torch.long, device=device)
            self.suffix_forward(header[None].expand(rows, -1).to(device), mask, cache, slots,
                                extra=images[0].extra, keep=1)
            computed = {key: Prefix([(layer.keys[j : j + 1], layer.values[j : j + 1]) for layer in cache.layers],
                                    image.extra) for j, (key, image, _) in enumerate(group)}
            self._keep_prefixes(computed)
            found.update(computed)
        return found

    def _kept_prefix(self, key: tuple) -> Prefix | None:
        """A kept prefix (now the most recently used), or None."""
        if key not in self._prefixes:
            return None
        self._prefixes.move_to_end(key)
        return self._prefixes[key]

    def _keep_prefixes(self, new: dict[tuple, Prefix]) -> None:
        """Keep ``new`` prefixes, dropping the least recently used beyond the engine's
        :attr:`~.engine.TransformersVLM.PREFIX_SLOTS`."""
        self._prefixes.update(new)
        while len(self._prefixes) > self.engine.PREFIX_SLOTS:
            self._prefixes.popitem(last=False)

    def _prefix_key(self, image_path, prefix_ids: torch.Tensor, noised: bool) -> tuple:
        key = (image_path, tuple(prefix_ids.tolist()))
        return key + self.engine.strategy.noise_key if noised else key

    def _prefix_caches(self, needed: list[tuple]) -> dict[tuple, Prefix]:
        """Key/value tensors of each image's prefix (``needed``: (image path, prefix ids, encoding, noised)) by
        :meth:`_prefix_key`, computed once per image and kept (the engine's
        :attr:`~.engine.TransformersVLM.PREFIX_SLOTS`); images with one prefix run as one batch (clean and VCD's
        noised ones together; a noised prefix is kept apart from the clean one).
        """
        found, missing = {}, []
        for image_path, prefix_ids, encoded, noised in needed:
            key = self._prefix_key(image_path, prefix_ids, noised)
            found[key] = self._kept_prefix(key)
            if found[key] is None:
                missing.append((key, image_path, prefix_ids, encoded, noised))
        groups: dict[tuple, list[tuple]] = {}
        for entry in missing:  # one forward per group of images with the same prefix tokens
            group_key = entry[0][1] if self.engine.cross_image_batches else entry[0]
            groups.setdefault(group_key, []).append(entry)
        for group in groups.values():
            # the noise of the one image the prefix pass reads (the same draw as on all its rows)
            inputs = [self.engine.noised_inputs(self._prefix_inputs(prefix_ids, encoded), image_path) if noised
                      else self._prefix_inputs(prefix_ids, encoded)
                      for _, image_path, prefix_ids, encoded, noised in group]
            batch = inputs[0] if len(inputs) == 1 else {key: torch.cat([one[key] for one in inputs])
                                                        for key in inputs[0]}
            output = self.engine.model(**batch, use_cache=True, logits_to_keep=1)  # the prefix's logits are not used
            cache = output.get("cache") or output.get("past_key_values")
            extra = self._prefix_extra()
            computed = {key: Prefix([(layer.keys[j : j + 1], layer.values[j : j + 1]) for layer in cache.layers],
                                     extra) for j, (key, *_) in enumerate(group)}
            found.update(computed)
            self._keep_prefixes(computed)
        return found

    def _prefix_extra(self):
        """What a family needs besides the key/value tensors to continue after its prefix (Qwen: rope delta)."""
        return None

    def _prefix_inputs(self, prefix_ids: torch.Tensor, encoded) -> dict:
        """Model inputs of the prefix pass: its tokens plus the image tensors of one row."""
        inputs = {"input_ids": prefix_ids[None], "attention_mask": torch.ones_like(prefix_ids)[None]}
        for key, value in encoded.items():
            if key not in PER_TOKEN_KEYS:
                inputs[key] = value[:1]
        return inputs

    def _common_prefix_length(self, ids: list[torch.Tensor]) -> int:
        shortest = min(len(row) for row in ids)
        stacked = torch.stack([row[:shortest] for row in ids])
        same = (stacked == stacked[0]).all(dim=0)
        mismatch = torch.nonzero(~same)
        length = int(mismatch[0]) if len(mismatch) else shortest
        return min(length, shortest - 1)  # every question keeps at least one token of its own

    def _last_image_token(self, ids: torch.Tensor) -> int:
        positions = torch.nonzero(ids == self.engine.image_token_id())
        return int(positions[-1]) if len(positions) else -1

    def _shared_prefix_length(self, encoded) -> int:
        """Length of the image prefix every row of ``encoded`` starts with (0: none, or no prefix reuse)."""
        if not self.engine.prefix_reuse:
            return 0
        lengths = encoded["attention_mask"].sum(dim=1).tolist()
        ids = [encoded["input_ids"][i, : int(n)] for i, n in enumerate(lengths)]
        prefix_length = self._last_image_token(ids[0]) + 1
        return prefix_length if prefix_length > 0 and self._common_prefix_length(ids) >= prefix_length else 0

    def rows_cache(self, prefixes: list[Prefix], image_of_row: list[int]):
        """A cache holding each row's image prefix (a view when every row has one image)."""
        rows = len(image_of_row)
        if len(prefixes) == 1:
            data = [(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in prefixes[0].tensors]
        else:
            index = torch.tensor(image_of_row, device=self.engine.device)
            data = [(torch.cat([p.tensors[layer][0] for p in prefixes]).index_select(0, index),
                     torch.cat([p.tensors[layer][1] for p in prefixes]).index_select(0, index))
                    for layer in range(len(prefixes[0].tensors))]
        return self.cache_of(data)

    def cache_of(self, data: list[tuple[torch.Tensor, torch.Tensor]]):
        """A transformers cache holding (keys, values) per layer."""
        from transformers import DynamicCache

        return DynamicCache(ddp_cache_data=data, config=self.engine.model.config)

    #: Language models whose attention layers go through transformers' attention interface, so that
    #: ``shared_prefix.py`` can stand in for it.
    SHARED_PREFIX_MODELS = ("llama", "mistral", "qwen2")

    def reads_in_place(self) -> bool:
        """Whether suffix batches and decoding steps read their prefixes in place (``shared_prefix.py``) instead
        of one copy per row: with prefix reuse, on a family and language model it serves. Not with eager
        attention: the analyses that switch to it read its attention weights."""
        engine = self.engine
        text = engine.model.config.get_text_config()
        return engine.prefix_reuse and engine.shared_prefix_attention and text.model_type in self.SHARED_PREFIX_MODELS \
            and language_attention(engine.model) == "sdpa"

    def suffix_batch(self, opened: Rows, batch: list[int]) -> torch.Tensor:
        """Logits at the last token of each suffix of ``batch`` (right-padded, on its image's prefix)."""
        suffixes = [opened.suffix[i] for i in batch]
        prefix_length = opened.prefix_length[batch[0]]
        prefixes, image_of_row = opened.prefixes_of(batch)
        input_ids, lengths = padded(suffixes, self.engine.tokenizer.pad_token_id or 0, self.engine.device)
        width = input_ids.shape[1]
        slots = torch.arange(prefix_length, prefix_length + width, device=self.engine.device)
        last = (lengths - 1)[:, None]  # the only logits kept
        if self.reads_in_place():  # causal attention alone: a row's padding comes after its last token
            text = self.engine.model.config.get_text_config()
            with shared_prefix.shared_prefix_attention(text, [p.tensors for p in prefixes], image_of_row):
                logits = self.suffix_forward(input_ids, None, shared_prefix.SuffixOnlyCache(config=text), slots,
                                             extra=prefixes[0].extra, keep=last)
        else:
            mask = torch.zeros((len(batch), prefix_length + width), dtype=torch.long, device=self.engine.device)
            mask[:, :prefix_length] = 1
            for r, row in enumerate(suffixes):
                mask[r, prefix_length : prefix_length + len(row)] = 1
            logits = self.suffix_forward(input_ids, mask, self.rows_cache(prefixes, image_of_row), slots,
                                         extra=prefixes[0].extra, keep=last)
        return logits[:, 0].float().cpu()

    def suffix_forward(self, input_ids, attention_mask, cache, slots, positions=None, extra=None,
                       keep: int | torch.Tensor = 0) -> torch.Tensor:
        """Logits of tokens fed after the cached prefix. ``slots``: their cache indices [width];
        ``positions``: each row's position ids [rows, width] where rows are left-padded (default: the slots);
        ``extra``: the prefix's :meth:`_prefix_extra`; ``keep``: transformers' ``logits_to_keep`` (0: every
        position; n: the last n; [rows, k] indices: those of each row), so the vocabulary projection runs only
        where logits are read."""
        position_ids = slots[None].expand(input_ids.shape[0], -1) if positions is None else positions
        return self.engine.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache_position=slots,
            use_cache=True, logits_to_keep=keep, **{self.engine.cache_argument: cache},
        ).logits
