"""The engine's steppers: rows of cached decoding state that the decoding strategies advance token by token
(the :class:`~verbmirage.variants.search.Stepper` and :class:`~verbmirage.variants.search.AttentionStepper`
protocols). Each holds ``vlm``, the engine (``TransformersVLM``), and reads of it only what :class:`StepperHost`
declares: the forwards after a cached prefix are its ``prefix_cache``'s.

- :class:`InPlaceStepper`: rows on cached image prefixes read in place (:mod:`.shared_prefix`; LLaVA with
  sdpa attention): each row holds only its own tokens;
- :class:`PrefixStepper`: rows on cached image prefixes, each row with its own copy of its prefix (prompts of any
  lengths in one batch; the families and attention kernels :mod:`.shared_prefix` does not serve, OPERA's eager
  attention among them);
- :class:`FullStepper`: rows from whole prompts (no shared prefix: InstructBLIP);
- :class:`AttendingStepper`: either of them, also reading the last layer's attention row of each fed token
  (OPERA).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from transformers import DynamicCache

from verbmirage.models.hf import shared_prefix
from verbmirage.models.hf.last_attention import LastAttention
from verbmirage.models.hf.prefix_cache import PrefixCache
from verbmirage.models.hf.tokens import padded


class StepperHost(Protocol):
    """What the steppers need of their engine (:class:`~verbmirage.models.hf.engine.TransformersVLM`)."""

    name: str
    model: Any
    tokenizer: Any
    device: torch.device
    prefix_cache: PrefixCache  # the forwards after a cached prefix (suffix_forward) and its caches (cache_of)
    last_attention: LastAttention  # the row the eager hook kept (AttendingStepper)

    def step_state(self) -> torch.Tensor | None: ...

    def step_forward(self, input_ids, attention_mask, cache, state=None) -> torch.Tensor: ...


class InPlaceStepper:
    """Rows decoding on cached image prefixes that every step reads in place (:mod:`.shared_prefix`).

    A prefix's keys and values stay as cached (batch 1), however many rows or beams read it; each row holds only
    its own keys and values (its prompt's suffix, then its decoded tokens) in buffers a step writes in place
    (:class:`~.shared_prefix.RowCache`). A step therefore copies no prefix and concatenates nothing, and beams
    moving copy only the rows' own columns. The suffixes are right-padded as in the scoring pass, so the
    opening's logits are that pass's; ``valid`` marks each row's real columns (the padding between its suffix
    and its decoded tokens stays hidden), and each row keeps its own position ids.

    ``prefixes``: the rows' distinct prefixes, ``image_of_row`` each row's index among them, ``prefix_lengths``
    each row's prefix length (rows may differ: an image's prefix, or it with a shared text header);
    ``reserve``: decoded tokens to make room for (more grow the buffers).

    With :attr:`records_attention` (OPERA) it is also an attending stepper (the
    :class:`~verbmirage.variants.search.AttentionStepper` protocol): the last layer's attention row of each fed
    token, max over heads, over the prefix's columns and then the row's own (``attention``), and :meth:`probe`
    feeds a row's candidate tokens side by side in one forward, each seeing only the row's keys and itself.
    """

    #: Whether a forward keeps the last layer's attention weights (:meth:`probe`, ``attention``; OPERA).
    records_attention = False
    #: Whether :meth:`probe`'s forward also feeds the candidates: the next :meth:`advance` then takes each row's
    #: chosen candidate's logits, keys, values and attention row from it instead of running a forward of its own
    #: (OPERA in one forward per step; on CUDA only, ``on_device.fit_to_device``: on the CPU the side-by-side
    #: forward's logits differ from a lone token's in their last bits, and the CPU's answers stay as they were).
    probe_feeds = False
    #: With :attr:`probe_feeds`: the last probe's (candidates, logits, own keys and values, attention rows) and
    #: the rows a :meth:`reorder` took since (None: none).
    _probed: tuple | None = None
    _probed_rows: torch.Tensor | None = None

    def __init__(self, vlm: StepperHost, prefixes: list, image_of_row: list[int], prefix_lengths: list[int],
                 suffixes: list[torch.Tensor], reserve: int = 8):
        device, rows = vlm.device, len(suffixes)
        self.vlm, self.prefixes, self.image_of_row, self.extra = vlm, list(prefixes), list(image_of_row), \
            prefixes[0].extra
        self.text = vlm.model.config.get_text_config()
        input_ids, lengths = padded(suffixes, vlm.tokenizer.pad_token_id or 0, device)
        width = input_ids.shape[1]
        self.used, capacity = 0, width + max(1, reserve)
        keys = prefixes[0].tensors[0][0]
        #: every layer's own keys and values in one buffer [2 (keys, values), layers, rows, kv heads, capacity,
        #: head dim]: moving rows (beams) or growing is one operation for all layers, not one per layer and tensor
        self._store = keys.new_zeros((2, len(prefixes[0].tensors), rows, keys.shape[1], capacity, keys.shape[-1]))
        #: rows come in groups of this many (a question's beams, :meth:`repeat`) that share their first ``_fixed``
        #: own columns (their prompt's): ``_store`` then holds one row per group and only those columns, and
        #: ``_beams`` [2, layers, rows, kv heads, capacity - _fixed, head dim] each row's columns after them
        self._group, self._fixed, self._beams = 1, 0, None
        columns = torch.arange(capacity, device=device)
        self.valid = columns[None] < lengths[:, None]
        starts = torch.tensor(prefix_lengths, device=device)
        positions = starts[:, None] + torch.arange(width, device=device)[None]
        last = (lengths - 1)[:, None]  # each row's logits at its own last token (causal: padding comes after it)
        #: the prefixes stacked per layer for the steps (one copy of the call's prefixes, built on the first step;
        #: None: the opening's last one forward, as a kept opening that is never decoded holds none)
        self._stacked: dict | None = None
        self.first = self._forward(input_ids, positions, last, mask=None)[:, 0].float()
        self._stacked = {}
        self.next_position = starts + lengths
        #: each row's prompt length, and the column of the attention rows where the decoded tokens' keys start
        #: (the prefix's and the rows' own columns before them: one prefix length, or None)
        self.prompt_lengths = self.next_position.tolist()
        self.prompt_columns = prefix_lengths[0] + width if len(set(prefix_lengths)) == 1 else None

    @property
    def keys(self) -> list[torch.Tensor]:
        """Each layer's own keys [rows, kv heads, capacity, head dim] (views of the one buffer)."""
        return [self._store[0, layer] for layer in range(self._store.shape[1])]  # (unbind's views refuse writes)

    @property
    def values(self) -> list[torch.Tensor]:
        return [self._store[1, layer] for layer in range(self._store.shape[1])]

    def _forward(self, input_ids, positions, keep, mask: torch.Tensor | None) -> torch.Tensor:
        """Logits of ``input_ids`` fed at the next columns of the rows' buffers; ``mask``: which own columns the
        queries see (:func:`~.shared_prefix.shared_prefix_attention`'s ``valid``; None: causality alone, as in
        the opening). With :attr:`records_attention`, the last layer's weights go to ``self._weights``."""
        width = input_ids.shape[1]
        self._make_room(self.used + width)
        if self._beams is not None:
            cache = _SharedPromptCache(self.text, self._store, self._beams, self._group, self.used - self._fixed)
        else:
            cache = shared_prefix.RowCache(self.text, self.keys, self.values, self.used)
        slots = torch.arange(self.used, self.used + width, device=input_ids.device)
        record = shared_prefix.AttentionRecord(self._store.shape[1] - 1) if self.records_attention else None
        with shared_prefix.shared_prefix_attention(self.text, [p.tensors for p in self.prefixes], self.image_of_row,
                                                   mask, record, self._stacked):
            logits = self.vlm.prefix_cache.suffix_forward(input_ids, None, cache, slots, positions, self.extra,
                                                          keep=keep)
        self.used += width
        self._weights = record and record.weights
        return logits

    def _make_room(self, columns: int) -> None:
        capacity = self.valid.shape[1]
        if columns <= capacity:
            return
        grown = max(columns, 2 * capacity)
        if self._beams is None:
            store = self._store.new_zeros((*self._store.shape[:-2], grown, self._store.shape[-1]))
            store[..., : self.used, :] = self._store[..., : self.used, :]
            self._store = store
        else:
            beams = self._beams.new_zeros((*self._beams.shape[:-2], grown - self._fixed, self._beams.shape[-1]))
            beams[..., : self.used - self._fixed, :] = self._beams[..., : self.used - self._fixed, :]
            self._beams = beams
        valid = self.valid.new_zeros((self.valid.shape[0], grown))
        valid[:, :capacity] = self.valid
        self.valid = valid

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        device = self.vlm.device
        probed = self._fed_by_probe(tokens)
        if probed is not None:
            return probed
        self._make_room(self.used + 1)
        self.valid[:, self.used] = True
        positions = self.next_position[:, None]
        self.next_position = self.next_position + 1
        logits = self._forward(tokens.to(device)[:, None], positions, 0, self.valid[:, : self.used + 1])
        if self.records_attention:
            self.attention = self._weights[:, -1]
        return logits[:, -1].float()

    def probe(self, candidates: torch.Tensor) -> torch.Tensor:
        """[rows, C] candidate tokens -> [rows, C, keys + 1]: each candidate's last-layer attention row as if it
        alone were fed next (its key last). One forward: the candidates sit side by side at the row's next
        position, each seeing the row's real columns and its own; their columns are then free again."""
        rows, count = candidates.shape
        device = self.vlm.device
        self._make_room(self.used + count)
        seen = self.valid[:, None, : self.used].expand(-1, count, -1)
        itself = torch.eye(count, dtype=torch.bool, device=device)[None].expand(rows, -1, -1)
        positions = self.next_position[:, None].expand(-1, count)
        before = self.used
        logits = self._forward(candidates.to(device), positions, 0 if self.probe_feeds else 1,
                               torch.cat([seen, itself], dim=-1))
        self.used = before
        keys = self._weights.shape[-1] - count  # the prefix's columns and the row's own before the candidates
        attention = torch.cat([self._weights[..., :keys],
                               self._weights[..., keys:].diagonal(dim1=1, dim2=2)[..., None]], dim=-1)
        if self.probe_feeds:
            own, start = self._own_columns()
            self._probed = (candidates.to(device), logits, own[..., before - start : before - start + count, :].clone(),
                            attention)
            self._probed_rows = None
        return attention

    def _own_columns(self) -> tuple[torch.Tensor, int]:
        """The buffer holding each row's own columns from the current one on, and its first column's index."""
        return (self._store, 0) if self._beams is None else (self._beams, self._fixed)

    def _fed_by_probe(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """:meth:`advance` from the last probe (:attr:`probe_feeds`): each row's token is one of its row's
        candidates (the rows a :meth:`reorder` took since), whose logits, keys, values and attention row that
        forward computed at this position, seeing what a forward of the token would see. None (a forward is
        needed) without a probe, or where a row's token was not among its candidates."""
        probed, self._probed = self._probed, None
        if probed is None:
            return None
        candidates, logits, keys_values, attention = probed
        device = candidates.device
        source = torch.arange(len(candidates), device=device) if self._probed_rows is None else \
            self._probed_rows.to(device)  # rows may have left since (questions whose answers ended)
        if len(source) != len(tokens):
            return None
        match = candidates[source] == tokens.to(device)[:, None]
        if not bool(match.any(dim=-1).all()):
            return None
        pick = match.int().argmax(dim=-1)
        self._make_room(self.used + 1)
        own, start = self._own_columns()
        chosen = keys_values[:, :, source]  # [2, layers, rows, kv heads, candidates, head dim]
        index = pick.view(1, 1, -1, 1, 1, 1).expand(*chosen.shape[:4], 1, chosen.shape[-1])
        own[..., self.used - start, :] = chosen.gather(4, index).squeeze(4)
        self.valid[:, self.used] = True
        self.next_position = self.next_position + 1
        self.used += 1
        self.attention = attention[source, pick]
        return logits[source, pick].float()

    def _take(self, rows: torch.Tensor) -> None:
        """Keep ``rows`` (indices, repeats allowed) in this order, dropping the rest."""
        rows = rows.to(self.vlm.device)
        self._ungroup()
        self._store = self._store.index_select(2, rows)
        self._take_row_state(rows)

    def _take_groups(self, groups: torch.Tensor, rows: torch.Tensor) -> None:
        """:meth:`_take` of ``rows`` that keep :meth:`repeat`'s groups whole (new group g's rows all come from
        old group ``groups[g]``: questions leaving, the others' beams moving within them): the groups' shared
        columns stay shared, and each beam's own come along."""
        device = self.vlm.device
        self._store = self._store.index_select(2, groups.to(device))
        self._beams = self._beams.index_select(2, rows.to(device))
        self._take_row_state(rows.to(device))

    def _take_row_state(self, rows: torch.Tensor) -> None:
        """The per-row state of ``rows`` (on the device), in their order."""
        self.valid, self.next_position = self.valid[rows], self.next_position[rows]
        chosen, before = rows.tolist(), len(self.image_of_row)
        read = set(self.image_of_row)
        self.image_of_row = [self.image_of_row[row] for row in chosen]
        self.prompt_lengths = [self.prompt_lengths[row] for row in chosen]
        if self._stacked and (len(chosen) < before or set(self.image_of_row) != read):
            self._stacked = {}  # rows left: the blocks of prefixes the next forward reads may be cut anew

    def reorder(self, rows: torch.Tensor) -> None:
        """A decoding step's rows (beams moving): the opening's logits (``first``) no longer match them. Beams
        that move within their question (:meth:`repeat`'s groups) copy only their decoded columns, in place:
        their prompt's columns, mask and positions are the group's."""
        self.first = None
        if self._probed is not None:
            self._probed_rows = rows if self._probed_rows is None else self._probed_rows[rows]
        group = self._group
        if group > 1 and len(rows) % group == 0:
            sources = (rows.cpu() // group).view(-1, group)
            if len(rows) == len(self.image_of_row) and torch.equal(
                    sources, torch.arange(len(rows)).view(-1, group) // group):
                decoded = self._beams[..., : self.used - self._fixed, :]
                decoded.copy_(decoded.index_select(2, rows.to(self._beams.device)))
                return
            if bool((sources == sources[:, :1]).all()):
                self._take_groups(sources[:, 0], rows)
                return
        self._take(rows)

    def repeat(self, times: int) -> None:
        """Each row ``times`` times in a row (beams of one question), sharing its columns so far."""
        self._grouped(times)

    def _grouped(self, times: int) -> None:
        """Each row becomes ``times`` rows in a row (a question's beams) that share its own columns so far: they
        stay one row of ``_store``, and each beam gets room for the columns after them (``_beams``)."""
        if times == 1:
            return
        self._ungroup()
        rows = torch.arange(len(self.image_of_row), device=self.vlm.device).repeat_interleave(times)
        shape = self._store.shape
        self._beams = self._store.new_zeros((*shape[:2], shape[2] * times, shape[3], shape[4] - self.used,
                                             shape[5]))
        self._store = self._store[..., : self.used, :]
        self._group, self._fixed = times, self.used
        self.valid, self.next_position = self.valid[rows], self.next_position[rows]
        self.image_of_row = [row for row in self.image_of_row for _ in range(times)]
        self.prompt_lengths = [length for length in self.prompt_lengths for _ in range(times)]
        if self.first is not None:
            self.first = self.first[rows.to(self.first.device)]

    def _ungroup(self) -> None:
        """Every row with all its own columns in ``_store`` again (rows leaving their groups)."""
        if self._beams is None:
            return
        shared = self._store.repeat_interleave(self._group, dim=2)
        self._store = torch.cat([shared, self._beams], dim=-2)
        self._group, self._fixed, self._beams = 1, 0, None

    def subset(self, rows: list[int], times: int = 1) -> "InPlaceStepper":
        """A new stepper on ``rows`` of this one (copies of their own columns; this one is unchanged); ``times``:
        ``rows`` holds each row that many times in a row (its beams, as :meth:`repeat` makes them)."""
        other = object.__new__(InPlaceStepper)
        other.__dict__.update(self.__dict__)
        other._stacked = {}  # its own: a subset may read fewer prefixes, and the parent's copies can go with it
        index = torch.tensor(rows[::times], device=self.vlm.device)
        other._take(index)
        other.first = self.first[index.to(self.first.device)]
        other._grouped(times)
        return other

    def stepped_with(self, other) -> "InPlaceStepper | None":
        """One stepper over this one's rows and then ``other``'s (VCD's clean and noised streams of the same
        prompts), so that a step feeds both in one forward; None where ``other`` reads no prefix in place."""
        if not isinstance(other, InPlaceStepper):
            return None
        rows = range(len(self.image_of_row))
        return InPlaceStepper.joined([(self, row) for row in rows] + [(other, row) for row in rows])

    def prefix_width(self) -> int | None:
        """The length of the prefixes its rows read (an attention row's columns before the row's own), or None
        where they differ."""
        widths = {self.prefixes[j].tensors[0][0].shape[-2] for j in set(self.image_of_row)}
        return widths.pop() if len(widths) == 1 else None

    @classmethod
    def joined(cls, picks: list[tuple["InPlaceStepper", int]], times: int = 1) -> "InPlaceStepper":
        """One stepper over rows of several, in the order of ``picks`` ((stepper, row) each): their prefixes
        together, their own columns side by side (right-padded to the widest, the padding not valid), so that
        rows of different prefixes and prompt lengths decode in one batch. ``times``: as :meth:`subset`'s.
        Where the rows read prefixes of one length, their decoded tokens' keys start at one column of the
        attention rows (``prompt_columns``, OPERA's), else at different ones (None)."""
        picks = picks[::times]
        sample, rows = picks[0][0], len(picks)
        steppers = list({id(stepper): stepper for stepper, _ in picks}.values())
        for stepper in steppers:
            stepper._ungroup()
        prefixes = list({id(prefix): prefix for stepper in steppers for prefix in stepper.prefixes}.values())
        where = {id(prefix): j for j, prefix in enumerate(prefixes)}
        used = max(stepper.used for stepper in steppers)
        capacity = max(used + stepper._store.shape[-2] - stepper.used for stepper in steppers)
        other = object.__new__(cls)
        other.vlm, other.text, other.extra, other.prefixes, other.used = sample.vlm, sample.text, sample.extra, \
            prefixes, used
        shape = sample._store.shape
        other._store = sample._store.new_zeros((*shape[:2], rows, shape[3], capacity, shape[-1]))
        other._group, other._fixed, other._beams = 1, 0, None
        other.valid = sample.valid.new_zeros((rows, capacity))
        other.next_position = sample.next_position.new_empty(rows)
        other.first = sample.first.new_empty((rows, *sample.first.shape[1:]))
        other.image_of_row, other.prompt_lengths = [0] * rows, [0] * rows
        other._stacked = {}
        for stepper in steppers:
            members = [(position, row) for position, (source, row) in enumerate(picks) if source is stepper]
            put = torch.tensor([position for position, _ in members], device=sample.valid.device)
            take = torch.tensor([row for _, row in members], device=sample.valid.device)
            width = stepper.used
            other._store[:, :, put, :, :width] = stepper._store[:, :, take, :, :width]
            other.valid[put, :width] = stepper.valid[take, :width]
            other.next_position[put] = stepper.next_position[take]
            other.first[put] = stepper.first[take.to(stepper.first.device)]
            for position, row in members:
                other.image_of_row[position] = where[id(stepper.prefixes[stepper.image_of_row[row]])]
                other.prompt_lengths[position] = stepper.prompt_lengths[row]
        # each row's own columns start at column 0 of its buffer, its decoded tokens at the joined ``used``: after
        # one prefix length (an attention row holds the prefix's columns, then the row's own), one column for all
        width = other.prefix_width()
        other.prompt_columns = None if width is None else width + used
        other._grouped(times)
        return other


class _SharedPromptCache(DynamicCache):
    """The own keys and values of rows in groups (a question's beams) that share their prompt's columns
    (``prompt`` [2, layers, groups, kv heads, prompt columns, head dim]), each row's later columns in ``beams``
    [2, layers, rows, kv heads, capacity, head dim], written from column ``start``; a layer attends to the group's
    prompt columns and then the row's own, joined for that layer alone (the rows never hold copies of their
    prompt). The counterpart of :class:`~.shared_prefix.RowCache` for :class:`InPlaceStepper`'s groups."""

    def __init__(self, config, prompt: torch.Tensor, beams: torch.Tensor, group: int, start: int):
        super().__init__(config=config)
        self.prompt, self.beams, self.group, self.start = prompt, beams, group, start

    @torch.compiler.disable  # traced, a compiled layer would compile once per layer index and step (RowCache)
    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        stop = self.start + key_states.shape[-2]
        beams = self.beams[:, layer_idx]
        beams[0, :, :, self.start : stop] = key_states
        beams[1, :, :, self.start : stop] = value_states
        groups = self.prompt.shape[2]
        shared = self.prompt[:, layer_idx, :, None].expand(-1, -1, self.group, -1, -1, -1)
        own = beams[:, :, :, :stop].unflatten(1, (groups, self.group))
        both = torch.cat([shared, own], dim=-2).flatten(1, 2)
        return both[0], both[1]


class PrefixStepper:
    """Rows decoding on a cached image prefix: the prompts' own tokens first, then one token per step.

    Prompts of different lengths share one batch: each is left-padded inside the suffix region (the
    padding masked out) and keeps its own position ids, so a row decodes as it would alone.
    """

    def __init__(self, vlm: StepperHost, cache, prefix_length: int, suffixes: list[torch.Tensor], extra=None):
        self.vlm, self.cache, self.extra, rows = vlm, cache, extra, len(suffixes)
        device = vlm.device
        input_ids, lengths = padded(suffixes, vlm.tokenizer.pad_token_id or 0, device, left=True)
        width = input_ids.shape[1]
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
        self.first = vlm.prefix_cache.suffix_forward(input_ids, self.mask, self.cache, slots, positions, extra,
                                                     keep=1)[:, -1].float()

    @classmethod
    def joined(cls, picks: list[tuple["PrefixStepper", int]], times: int = 1) -> "PrefixStepper":
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
        other.cache = sample.vlm.prefix_cache.cache_of(data)
        return other

    def subset(self, rows: list[int], times: int = 1) -> "PrefixStepper":
        """A new stepper on ``rows`` of this one (copies of their cache rows; this one is unchanged). ``times``:
        how often ``rows`` repeats each row (its beams; each holds its own copy)."""
        index = torch.tensor(rows, device=self.vlm.device)
        other = object.__new__(PrefixStepper)
        other.vlm, other.extra, other.length, other.prompt_columns = self.vlm, self.extra, self.length, \
            self.prompt_columns
        other.cache = self.vlm.prefix_cache.cache_of([(layer.keys.index_select(0, index),
                                                       layer.values.index_select(0, index))
                                                      for layer in self.cache.layers])
        other.mask, other.next_position, other.first = self.mask[index], self.next_position[index], self.first[index]
        other.prompt_lengths = [self.prompt_lengths[row] for row in rows]
        return other

    def repeat(self, times: int) -> None:
        """Each row ``times`` times in a row (beams of one question), cache included."""
        if times == 1:
            return
        rows = torch.arange(len(self.prompt_lengths), device=self.vlm.device).repeat_interleave(times)
        first = self.first[rows]
        self.reorder(rows)  # the rows' prompt lengths too
        self.first = first

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        device = self.vlm.device
        slots = torch.tensor([self.length], device=device)
        self.length += 1
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        positions = self.next_position[:, None]
        self.next_position = self.next_position + 1
        logits = self.vlm.prefix_cache.suffix_forward(tokens.to(device)[:, None], self.mask, self.cache, slots,
                                                      positions, self.extra)
        return logits[:, -1].float()

    def reorder(self, rows: torch.Tensor) -> None:
        """A decoding step's rows (beams moving): the opening's logits (``first``) no longer match them."""
        rows = rows.to(self.vlm.device)
        self.cache.reorder_cache(rows)
        self.mask, self.next_position, self.first = self.mask[rows], self.next_position[rows], None
        self.prompt_lengths = [self.prompt_lengths[row] for row in rows.tolist()]

    def undo(self) -> None:
        """Forget the last fed token (OPERA's candidate probes)."""
        self.length -= 1
        self.mask, self.next_position = self.mask[:, :-1], self.next_position - 1
        self.cache.crop(-1)  # transformers 5.x: a negative count removes that many tokens


class FullStepper:
    """Rows decoding from whole prompts (no shared prefix: InstructBLIP's Q-Former reads the question)."""

    def __init__(self, vlm: StepperHost, encoded: dict):
        self.vlm = vlm
        output = vlm.model(**encoded, use_cache=True)
        inner = output.get("language_model_outputs") or output  # InstructBLIP keeps the cache one level down
        self.cache = inner.get("cache") or inner.get("past_key_values")
        self.mask = encoded["attention_mask"]
        self.prompt_columns, self.prompt_lengths = self.mask.shape[1], self.mask.sum(dim=1).tolist()
        self.first = output.logits[:, -1].float()
        #: what the family's later steps read per row (Qwen's rope deltas), moving with the rows
        self.state = vlm.step_state()

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        return self.vlm.step_forward(tokens.to(self.vlm.device)[:, None], self.mask, self.cache,
                                     self.state)[:, -1].float()

    def reorder(self, rows: torch.Tensor) -> None:
        self.cache.reorder_cache(rows.to(self.vlm.device))
        self.mask = self.mask[rows.to(self.mask.device)]
        if self.state is not None:
            self.state = self.state[rows.to(self.state.device)]
        self.prompt_lengths = [self.prompt_lengths[row] for row in rows.tolist()]

    def repeat(self, times: int) -> None:
        """Each row ``times`` times in a row (beams of one question), cache included."""
        rows = torch.arange(len(self.prompt_lengths)).repeat_interleave(times)
        self.reorder(rows)  # the rows' prompt lengths and state too
        self.first = self.first[rows.to(self.first.device)]

    def undo(self) -> None:
        self.mask = self.mask[:, :-1]
        self.cache.crop(-1)


class AttendingStepper:
    """A stepper that also reads the last layer's attention row of each fed token (OPERA)."""

    def __init__(self, vlm: StepperHost, inner, first: torch.Tensor):
        self.vlm, self.inner, self.first = vlm, inner, first

    @property
    def prompt_columns(self):
        """Where the decoded tokens' keys start in the attention rows (the inner stepper's)."""
        return self.inner.prompt_columns

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.inner.advance(tokens)
        self.attention = self._kept_row()
        return logits

    def probe(self, candidates: torch.Tensor) -> torch.Tensor:
        rows = []
        for column in range(candidates.shape[1]):
            self.inner.advance(candidates[:, column])
            rows.append(self._kept_row())
            self.inner.undo()
        return torch.stack(rows, dim=1)

    def _kept_row(self) -> torch.Tensor:
        """The attention row the engine's hook kept from the forward just run (its ``last_attention``; each
        forward sets it, None where the layer returned no weights)."""
        row = self.vlm.last_attention.row
        if row is None:
            raise RuntimeError(f"models.{self.vlm.name}: the last layer returned no attention weights (OPERA needs "
                               "eager attention in the language model)")
        return row

    def reorder(self, rows: torch.Tensor) -> None:
        self.inner.reorder(rows)
