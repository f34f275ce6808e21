"""The engine's steppers: rows of cached decoding state that the decoding strategies advance token by token
(the :class:`~verbmirage.variants.search.Stepper` and :class:`~verbmirage.variants.search.AttentionStepper`
protocols). Each holds ``vlm``, the engine (``TransformersVLM``), whose forwards it calls.

- :class:`PrefixStepper`: rows on cached image prefixes (prompts of any lengths in one batch);
- :class:`FullStepper`: rows from whole prompts (no shared prefix: InstructBLIP);
- :class:`AttendingStepper`: either of them, also reading the last layer's attention row of each fed token
  (OPERA).
"""

from __future__ import annotations

import torch


class PrefixStepper:
    """Rows decoding on a cached image prefix: the prompts' own tokens first, then one token per step.

    Prompts of different lengths share one batch: each is left-padded inside the suffix region (the
    padding masked out) and keeps its own position ids, so a row decodes as it would alone.
    """

    def __init__(self, vlm, cache, prefix_length: int, suffixes: list[torch.Tensor], extra=None):
        self.vlm, self.cache, self.extra, rows = vlm, cache, extra, len(suffixes)
        device = vlm.device
        lengths = torch.tensor([len(row) for row in suffixes], device=device)
        width = int(lengths.max())
        pad = vlm.tokenizer.pad_token_id or 0
        input_ids = torch.full((rows, width), pad, dtype=torch.long, device=device)
        for r, row in enumerate(suffixes):
            input_ids[r, width - len(row):] = row
        columns = torch.arange(width, device=device)
        real = columns[None] >= (width - lengths)[:, None]
        self.mask = torch.cat([torch.ones((rows, prefix_length), dtype=torch.long, device=device), real.long()], 1)
        self.length = prefix_length + width  # cache slots filled
        #: where the decoded tokens' keys start, and each row's own prompt length (OPERA's columns)
        self.prompt_columns, self.prompt_lengths = self.length, (prefix_length + lengths).tolist()
        #: the position id of each row's next token (its prefix plus its own suffix, padding not counted)
        self.next_position = prefix_length + lengths
        positions = (prefix_length + columns[None] - (width - lengths)[:, None]).clamp(min=prefix_length)
        slots = torch.arange(prefix_length, self.length, device=device)
        self.first = vlm._suffix_forward(input_ids, self.mask, self.cache, slots, positions, extra,
                                         keep=1)[:, -1].float()

    @classmethod
    def joined(cls, picks: list[tuple["PrefixStepper", int]]) -> "PrefixStepper":
        """One stepper over rows of several, in the order of ``picks`` ((stepper, row) each; a row may be picked
        twice): their caches side by side, right-padded to the longest with the padding masked out, so that rows
        of different prefix and prompt lengths decode in one batch. A step attends to every unmasked key
        whatever its column (a cached key carries the position it was computed at; each row keeps its own next
        position)."""
        sample, rows = picks[0][0], len(picks)
        length = max(stepper.length for stepper, _ in picks)
        sources: dict[int, tuple[PrefixStepper, list[int], list[int]]] = {}  # stepper -> (it, its rows, where)
        for position, (stepper, row) in enumerate(picks):
            entry = sources.setdefault(id(stepper), (stepper, [], []))
            entry[1].append(row)
            entry[2].append(position)
        blank = lambda like: like.new_zeros((rows, *like.shape[1:-2], length, like.shape[-1]))  # noqa: E731
        data = [(blank(layer.keys), blank(layer.values)) for layer in sample.cache.layers]
        other = object.__new__(cls)
        other.vlm, other.extra, other.length = sample.vlm, None, length
        other.mask = sample.mask.new_zeros((rows, length))
        other.next_position = sample.next_position.new_empty(rows)
        other.first = sample.first.new_empty((rows, *sample.first.shape[1:]))
        other.prompt_lengths = [0] * rows
        other.prompt_columns = None  # the rows' prompts end at different columns (OPERA does not join)
        for stepper, members, positions in sources.values():
            take = torch.tensor(members, device=stepper.mask.device)
            put = torch.tensor(positions, device=stepper.mask.device)
            for (keys, values), layer in zip(data, stepper.cache.layers):
                keys[put, ..., : stepper.length, :] = layer.keys.index_select(0, take)
                values[put, ..., : stepper.length, :] = layer.values.index_select(0, take)
            other.mask[put, : stepper.length] = stepper.mask[take]
            other.next_position[put] = stepper.next_position[take]
            other.first[put] = stepper.first[take.to(stepper.first.device)]
            for member, position in zip(members, positions):
                other.prompt_lengths[position] = stepper.prompt_lengths[member]
        other.cache = sample.vlm._cache_of(data)
        return other

    def subset(self, rows: list[int]) -> "PrefixStepper":
        """A new stepper on ``rows`` of this one (copies of their cache rows; this one is unchanged)."""
        index = torch.tensor(rows, device=self.vlm.device)
        other = object.__new__(PrefixStepper)
        other.vlm, other.extra, other.length, other.prompt_columns = self.vlm, self.extra, self.length, \
            self.prompt_columns
        other.cache = self.vlm._cache_of([(layer.keys.index_select(0, index), layer.values.index_select(0, index))
                                          for layer in self.cache.layers])
        other.mask, other.next_position, other.first = self.mask[index], self.next_position[index], self.first[index]
        other.prompt_lengths = [self.prompt_lengths[row] for row in rows]
        return other

    def repeat(self, times: int) -> None:
        """Each row ``times`` times in a row (beams of one question), cache included."""
        if times == 1:
            return
        rows = torch.arange(len(self.prompt_lengths), device=self.vlm.device).repeat_interleave(times)
        self.reorder(rows)
        self.first = self.first[rows]
        self.prompt_lengths = [length for length in self.prompt_lengths for _ in range(times)]

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        device = self.vlm.device
        slots = torch.tensor([self.length], device=device)
        self.length += 1
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        positions = self.next_position[:, None]
        self.next_position = self.next_position + 1
        logits = self.vlm._suffix_forward(tokens.to(device)[:, None], self.mask, self.cache, slots, positions,
                                          self.extra)
        return logits[:, -1].float()

    def reorder(self, rows: torch.Tensor) -> None:
        rows = rows.to(self.vlm.device)
        self.cache.reorder_cache(rows)
        self.mask, self.next_position = self.mask[rows], self.next_position[rows]

    def undo(self) -> None:
        """Forget the last fed token (OPERA's candidate probes)."""
        self.length -= 1
        self.mask, self.next_position = self.mask[:, :-1], self.next_position - 1
        self.cache.crop(-1)  # transformers 5.x: a negative count removes that many tokens


class FullStepper:
    """Rows decoding from whole prompts (no shared prefix: InstructBLIP's Q-Former reads the question)."""

    def __init__(self, vlm, encoded: dict):
        self.vlm = vlm
        output = vlm.model(**encoded, use_cache=True)
        inner = output.get("language_model_outputs") or output  # InstructBLIP keeps the cache one level down
        self.cache = inner.get("cache") or inner.get("past_key_values")
        self.mask = encoded["attention_mask"]
        self.prompt_columns, self.prompt_lengths = self.mask.shape[1], self.mask.sum(dim=1).tolist()
        self.first = output.logits[:, -1].float()

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        return self.vlm._step_forward(tokens.to(self.vlm.device)[:, None], self.mask, self.cache)[:, -1].float()

    def reorder(self, rows: torch.Tensor) -> None:
        self.cache.reorder_cache(rows.to(self.vlm.device))
        self.mask = self.mask[rows.to(self.mask.device)]

    def undo(self) -> None:
        self.mask = self.mask[:, :-1]
        self.cache.crop(-1)


class AttendingStepper:
    """A stepper that also reads the last layer's attention row of each fed token (OPERA)."""

    def __init__(self, vlm, inner, first: torch.Tensor):
        self.vlm, self.inner, self.first = vlm, inner, first

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.inner.advance(tokens)
        self.attention = self.vlm._last_attention
        return logits

    def probe(self, candidates: torch.Tensor) -> torch.Tensor:
        rows = []
        for column in range(candidates.shape[1]):
            self.inner.advance(candidates[:, column])
            rows.append(self.vlm._last_attention)
            self.inner.undo()
        return torch.stack(rows, dim=1)

    def reorder(self, rows: torch.Tensor) -> None:
        self.inner.reorder(rows)
