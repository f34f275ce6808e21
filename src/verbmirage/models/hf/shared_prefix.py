"""Attention of suffix batches and decoding steps on their cached image prefixes, read in place instead of
copied per row.

A suffix batch scores many prompts on a few cached prefixes (the image, or the image and a shared text
header). The plain path gives every row its own copy of its prefix's keys and values (a cache of B rows, then
a concatenation with the suffix, then GQA's repeat): B times the prefix in memory and traffic, about 0.3 GB
per row for LLaVA-1.5-7B's 600-token prefix. Here each attention layer instead computes

- the rows' queries against their prefix: one attention call per prefix (or per block of prefixes of one
  length), the rows and the GQA head groups folded into the query length, so the prefix's keys are read as
  they are cached;
- the queries against their own suffix (causal; right padding comes after a row's last real token, so no
  mask beyond causality is needed);

and merges the two by their log-sum-exp, which is exact (flash attention's split of the keys).

Decoding steps work the same way (:class:`RowCache`): a row's own keys and values (its prompt's suffix, then
its decoded tokens) sit in buffers written in place, and a mask of each row's own columns hides the padding
between a row's suffix and its decoded tokens; only those few columns per row are copied when beams move.
OPERA's last-layer attention rows come from the same computation (:class:`AttentionRecord`).

Prefixes of one length are attended to in one call per layer where that costs less than padding their rows
(:func:`cheapest_cuts`, which also cuts the suffix batches of ``prefix_cache.py``).

Hand-written because transformers has no attention over a shared prefix (its caches hold one row each). Each
part runs in a kernel that returns the log-sum-exp (:data:`KERNELS`, chosen by device: :func:`kernel_for`): on
the CPU PyTorch's fused flash-attention kernel (the reference: its results are what the demo records); on CUDA
FlexAttention compiled to one fused kernel per part, in the model's dtype with float32 accumulation, the rows'
own columns under a block mask built once per forward and the merge compiled to one kernel (on GPUs of compute
capability 8.0 or more, unless ``VERBMIRAGE_FLEX_ATTENTION=0`` or its compiled code failed in this process:
:data:`FLEX_PART`); elsewhere plain matrix products with a float32 softmax (the same values, no fused kernel).
Compiled with the decoder layers' settings (``compiled_layers.compiler_settings``), the mask's sizes passed as
tensors and the output laid out alike in every forward: once warmed up, calls of other sizes compile nothing new.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import warnings

import numpy as np
import torch
from transformers import AttentionInterface, DynamicCache

from verbmirage.models.hf.compiled_layers import (Part, calling, compiler_settings, cuda_capability, failed,
                                                  switched_off)

#: the attention implementation's name in transformers' registry (the language model uses it only inside
#: :func:`shared_prefix_attention`)
NAME = "verbmirage_shared_prefix"

#: the block's :class:`_Active` (set by :func:`shared_prefix_attention`)
_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("verbmirage_shared_prefix", default=None)

#: The kernels that attend a part (:func:`_attend`): ``cpu_flash``, PyTorch's CPU flash-attention kernel with an
#: additive mask; ``flex``, FlexAttention (compiled on CUDA, eager and unfused elsewhere) with a block mask;
#: ``plain``, matrix products and a float32 softmax.
KERNELS = ("cpu_flash", "flex", "plain")

#: a kernel chosen for every device within :func:`use_kernel` (None: by device, :func:`kernel_for`)
_KERNEL: contextvars.ContextVar = contextvars.ContextVar("verbmirage_shared_prefix_kernel", default=None)
#: whether FlexAttention and the merge run compiled on every device, not only on CUDA (:func:`use_kernel`)
_COMPILED: contextvars.ContextVar = contextvars.ContextVar("verbmirage_shared_prefix_compiled", default=False)

#: the profiler's name of a region that runs as one fused kernel on CUDA (bench/launches.py counts it as one)
FUSED_REGION = "verbmirage::fused"


#: the smallest head dimension compiled FlexAttention takes (smaller ones, tiny test models, attend plainly)
FLEX_MIN_DIM = 16
#: the least CUDA compute capability FlexAttention runs on (Ampere: A100, A6000, RTX 30xx; V100 and T4 attend
#: plainly, in float32 products)
FLEX_MIN_CAPABILITY = (8, 0)
#: the environment switch: ``0`` (or ``false``, ``no``, ``off``) attends plainly on CUDA too
FLEX_ENV = "VERBMIRAGE_FLEX_ATTENTION"
#: the name of compiled FlexAttention and the merge in the job's log, and of their failure
#: (``compiled_layers.note_failure``): where they fail to compile, CUDA attends in plain products from then on
FLEX_PART = Part("FlexAttention over the shared prefixes", "the attention runs in plain products from now on in "
                 "this process")


def kernel_for(device: torch.device, dim: int = FLEX_MIN_DIM, chosen: bool = False) -> str:
    """The kernel of :data:`KERNELS` that attends on ``device`` with heads of ``dim`` (or the one
    :func:`use_kernel` set): on CUDA FlexAttention where :func:`flex_off` finds no reason not to, else plain
    products; on the
    CPU its flash kernel. ``chosen``: the kernel chosen for the device, a failure of compiled FlexAttention in
    this process aside (what a job's record names; the failure is named beside it)."""
    forced = _KERNEL.get()
    if forced is not None:
        return forced
    if device.type == "cuda":
        return "plain" if flex_off(device, dim, chosen) else "flex"
    return "cpu_flash" if device.type == "cpu" else "plain"


def flex_off(device: torch.device, dim: int = FLEX_MIN_DIM, chosen: bool = False) -> str | None:
    """Why FlexAttention does not attend on the CUDA ``device`` with heads of ``dim``, in words for the job's log;
    None where it does: heads of at least :data:`FLEX_MIN_DIM`, :data:`FLEX_ENV` not saying no, its compiled code
    not failed in this process (:data:`FLEX_PART`; not asked where ``chosen``), and a compute capability of at
    least :data:`FLEX_MIN_CAPABILITY` (FlexAttention's fused kernels are Triton's, written for Ampere and later)."""
    if dim < FLEX_MIN_DIM:
        return f"heads of {dim}: FlexAttention takes {FLEX_MIN_DIM} or more"
    if switched_off(FLEX_ENV):
        return f"{FLEX_ENV} says no"
    if not chosen and failed(FLEX_PART):
        return "compiled FlexAttention failed earlier in this process"
    if cuda_capability(device) < FLEX_MIN_CAPABILITY:
        found, least = (".".join(map(str, version)) for version in (cuda_capability(device), FLEX_MIN_CAPABILITY))
        return f"FlexAttention needs compute capability {least}; this GPU has {found}"
    return None


@contextlib.contextmanager
def use_kernel(kernel: str, compiled: bool = False):
    """Within the block, every device attends with ``kernel`` (:data:`KERNELS`): the tests compare them on one
    device, and bench/launches.py counts the CUDA path's operations on the CPU. ``compiled``: FlexAttention and
    the merge compiled on every device as on CUDA (the tests count CUDA's compilations on the CPU; inductor's CPU
    code takes no FlexAttention that returns its log-sum-exp, a CPU backend such as ``aot_eager`` does)."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown attention kernel {kernel!r}; one of {', '.join(KERNELS)}")
    token, compiled_token = _KERNEL.set(kernel), _COMPILED.set(compiled)
    try:
        yield
    finally:
        _KERNEL.reset(token)
        _COMPILED.reset(compiled_token)


@dataclasses.dataclass
class _Block:
    """Prefixes of one length that a layer attends to in one call, and the rows that read them (``rows``: a
    slice where they follow each other, else indices, in the order the call returns them). With several
    prefixes, prefix g's rows are ``index[g]``, padded with repeats of its first row, and ``picked`` are the
    positions of the real ones in the flattened ``index``."""

    prefixes: list
    rows: slice | torch.Tensor
    index: torch.Tensor | None = None
    picked: torch.Tensor | None = None

    def padded_rows(self, query: torch.Tensor) -> torch.Tensor:
        """``query``'s rows [rows, ...] as ``index`` lays them out: [prefixes, padded rows, ...]."""
        return query[self.index.flatten()].reshape(*self.index.shape, *query.shape[1:])

    def real_rows(self, padded: torch.Tensor) -> torch.Tensor:
        """[prefixes, padded rows, ...] back to the real rows, in the order of ``rows``: [rows, ...]."""
        return padded.reshape(-1, *padded.shape[2:]).index_select(0, self.picked)


@dataclasses.dataclass
class _Active:
    """What the layers attend to inside :func:`shared_prefix_attention`."""

    blocks: list  # the prefixes the rows read, by length (:class:`_Block`)
    own_mask: torch.Tensor | None  # see shared_prefix_attention
    record: "AttentionRecord | None"
    #: each block's prefixes stacked per layer: (layer, prefix ids) -> (keys, values) [prefixes, kv, length, d]
    stacked: dict
    #: the masks of the rows' own columns, built by the first layer and the same in every layer
    masks: dict = dataclasses.field(default_factory=dict)

    def stacked_prefixes(self, block: _Block, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = (layer, tuple(id(prefix) for prefix in block.prefixes))
        if key not in self.stacked:
            self.stacked[key] = (_stacked([prefix[layer][0] for prefix in block.prefixes]),
                                 _stacked([prefix[layer][1] for prefix in block.prefixes]))
        return self.stacked[key]

    def masks_for(self, length: int, columns: int, group: int, kernel: str, dtype, device) -> tuple:
        """(:func:`_own_mask`, the form ``kernel`` takes it in: additive for ``cpu_flash``, a block mask for
        ``flex``; each None where not needed), built once per forward and read by every layer."""
        key = (length, columns, group, kernel, dtype)
        if key not in self.masks:
            mask = None
            if kernel != "flex" or self.record is not None:
                mask = _own_mask(length, columns, group, self.own_mask, device)
            prepared = None
            if kernel == "cpu_flash":
                prepared = _additive(mask, dtype)
            elif kernel == "flex":
                prepared = _own_block_mask(length, columns, group, self.own_mask, device)
            self.masks[key] = (mask, prepared)
        return self.masks[key]


def _stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``tensors`` (batch 1 each) concatenated: a view where they lie at even steps in one storage (rows of one
    prefix or header forward's cache, in order, every k-th: no copy, no launch), else a copy."""
    first = tensors[0]
    start, storage = first.storage_offset(), first.untyped_storage().data_ptr()
    step = tensors[1].storage_offset() - start if len(tensors) > 1 else first.stride(0)
    if step > 0 and step % first.stride(0) == 0 and all(
            tensor.untyped_storage().data_ptr() == storage and tensor.stride() == first.stride()
            and tensor.storage_offset() == start + j * step for j, tensor in enumerate(tensors)):
        return first.as_strided((len(tensors), *first.shape[1:]), (step, *first.stride()[1:]), start)
    return torch.cat(tensors)


class AttentionRecord:
    """Asks layer ``layer`` for its attention weights as eager attention returns them, max over heads: after the
    forward, ``weights`` [rows, queries, prefix + own columns] (the prefix's columns first, then the row's own;
    one prefix length among the rows). OPERA reads the last layer's."""

    def __init__(self, layer: int):
        self.layer, self.weights = layer, None


def cheapest_cuts(lengths: list[int], batch_cost: int, max_rows: int | None = None) -> list[int]:
    """Where to cut rows sorted by length (ascending) into batches so that the token positions computed, each
    batch's rows times its longest row plus ``batch_cost`` per batch (its fixed cost, in positions), are
    fewest, no batch holding more than ``max_rows`` rows. Dynamic programming over the cut points, one numpy
    step per row (no library partitions a sorted sequence by this cost)."""
    n = len(lengths)
    if n < 2:
        return []
    longest = np.asarray(lengths, dtype=np.int64)
    best = np.zeros(n + 1, dtype=np.int64)  # best[j]: the cheapest cost of rows[:j]
    start_of = np.zeros(n + 1, dtype=np.int64)  # where the last batch of that cheapest rows[:j] starts
    for stop in range(1, n + 1):
        first = 0 if max_rows is None else max(0, stop - max_rows)
        starts = np.arange(first, stop)
        costs = best[first:stop] + (stop - starts) * longest[stop - 1] + batch_cost
        start_of[stop] = first + int(np.argmin(costs))
        best[stop] = costs[start_of[stop] - first]
    cuts, stop = [], n
    while stop > 0:
        stop = int(start_of[stop])
        cuts.append(stop)
    return sorted(cuts)[1:]  # without 0


class SuffixOnlyCache(DynamicCache):
    """A cache that keeps nothing: the layers attend to the suffix's own keys and values plus the prefixes."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return key_states, value_states


class RowCache(DynamicCache):
    """The rows' own keys and values after their prefixes, in buffers [rows, kv heads, capacity, head dim] per
    layer that a forward writes in place from column ``start``; a layer then attends to columns ``[0, start +
    fed tokens)`` of its buffers (and to the prefixes). The buffers belong to the caller, which makes room
    before a forward (``steppers.InPlaceStepper``)."""

    def __init__(self, config, keys: list[torch.Tensor], values: list[torch.Tensor], start: int):
        super().__init__(config=config)
        self.buffer_keys, self.buffer_values, self.start = keys, values, start

    @torch.compiler.disable  # its start moves every step: a compiled layer would compile again each step
    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        stop = self.start + key_states.shape[-2]
        keys, values = self.buffer_keys[layer_idx], self.buffer_values[layer_idx]
        keys[:, :, self.start : stop] = key_states
        values[:, :, self.start : stop] = value_states
        return keys[:, :, :stop], values[:, :, :stop]


def _additive(mask: torch.Tensor | None, dtype) -> torch.Tensor | None:
    """``mask`` (True: seen) as the fused kernel takes it: 0 where seen, -inf elsewhere."""
    return None if mask is None else torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, float("-inf"))


def _attend(query, key, value, scale: float, mask: torch.Tensor | None, kernel: str | None = None,
            prepared=None):
    """(output, log-sum-exp over the keys, float32) of one attention; ``mask``: True where a query may see a key,
    None: every key (``prepared``: the form ``kernel`` takes it in, :meth:`_Active.masks_for`, when already
    built). ``kernel``: one of :data:`KERNELS` (default: :func:`kernel_for` the query's device). The ``flex``
    kernel returns its output in the model's dtype (the merge casts it)."""
    kernel = kernel_for(query.device) if kernel is None else kernel
    if kernel == "flex":
        if mask is not None and prepared is None:
            raise ValueError("the flex kernel takes its mask as a block mask (_own_block_mask)")
        return _flex(query, key, value, scale, prepared)
    if kernel == "cpu_flash":  # the kernel takes an additive mask
        additive = _additive(mask, query.dtype) if prepared is None else prepared
        output, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, False, attn_mask=additive, scale=scale)
        return output.float(), lse.float()
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), value.float()), lse


@functools.cache
def _compiled_flex():
    """FlexAttention compiled (one fused kernel per call; shapes dynamic, so that batches of other sizes reuse
    the compiled kernel instead of compiling again)."""
    from torch.nn.attention.flex_attention import flex_attention

    compiler_settings()
    return torch.compile(flex_attention, dynamic=True)


def _runs_compiled(device: torch.device) -> bool:
    """Whether FlexAttention and the merge run compiled on ``device``: on CUDA (or anywhere within
    :func:`use_kernel` ``(compiled=True)``), unless their compiled code failed in this process."""
    return (device.type == "cuda" or _COMPILED.get()) and not failed(FLEX_PART)


def _flex(query, key, value, scale: float, block_mask):
    """FlexAttention of ``query`` on ``key``/``value`` (same batch and heads) under ``block_mask`` (None: every
    key): (output in the query's dtype, its log-sum-exp in float32). Compiled on CUDA; elsewhere eager (the
    same arithmetic unfused: the tests check it on the CPU)."""
    from torch.nn.attention import flex_attention as flex

    with torch.profiler.record_function(FUSED_REGION), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "flex_attention called without torch.compile", UserWarning)
        if hasattr(flex, "AuxRequest"):  # torch >= 2.9
            options = {"return_aux": flex.AuxRequest(lse=True)}
        else:
            options = {"return_lse": True}
        output, aux = _compiled_where_it_runs(_compiled_flex, flex.flex_attention, query, key, value,
                                              block_mask=block_mask, scale=scale, **options)
    return output, (aux if isinstance(aux, torch.Tensor) else aux.lse).float()  # return_lse's, or return_aux's


def _own_block_mask(length: int, columns: int, group: int, valid: torch.Tensor | None, device):
    """:func:`_own_mask` as FlexAttention's block mask over the folded queries (query f is position
    ``f % length``): causal alone (``valid`` None, one mask for every row), causal and ``valid`` [rows,
    columns], or ``valid`` [rows, length, columns] as given."""
    from torch.nn.attention.flex_attention import create_block_mask

    # the sizes as tensors, not Python numbers: compiled FlexAttention then takes them as inputs instead of
    # compiling anew for each suffix length
    length_t = torch.tensor(length, device=device)
    offset = torch.tensor(columns - length, device=device)  # the queries are the last ``length`` columns

    if valid is None:
        def seen(batch, head, query, key):
            return key <= query % length_t + offset
    elif valid.dim() == 2:
        def seen(batch, head, query, key):
            return valid[batch, key] & (key <= query % length_t + offset)
    else:
        def seen(batch, head, query, key):
            return valid[batch, query % length_t, key]
    rows = None if valid is None else valid.shape[0]
    return create_block_mask(seen, rows, None, group * length, columns, device=device)


def _merge(seen, seen_lse, own, own_lse, rows: torch.Tensor | None, picked: torch.Tensor | None):
    """One block's attention over its rows' prefixes and over their own columns, merged by the log-sum-exps:
    exactly the attention over both (flash attention's split of the keys), float32 [block rows, ...].

    ``seen``/``seen_lse``: the block's prefix attention, its rows in order, or (``picked``: the real rows'
    positions, :class:`_Block`) laid out [prefixes, padded rows, ...]; ``own``/``own_lse``: the rows' own
    attention, the block's rows ``rows`` of them (indices; None: all)."""
    if picked is not None:
        seen = seen.reshape(-1, *seen.shape[2:]).index_select(0, picked)
        seen_lse = seen_lse.reshape(-1, *seen_lse.shape[2:]).index_select(0, picked)
    if rows is not None:
        own, own_lse = own[rows], own_lse[rows]
    seen, own = seen.float(), own.float()
    total = torch.logaddexp(seen_lse, own_lse)
    return seen * torch.exp(seen_lse - total)[..., None] + own * torch.exp(own_lse - total)[..., None]


@functools.cache
def _compiled_merge():
    """:func:`_merge` compiled: its gathers and eight elementwise operations in one kernel (on CUDA)."""
    compiler_settings()
    return torch.compile(_merge, dynamic=True)


def _merged(kernel: str, *args):
    """:func:`_merge` of ``args``, compiled where the attention is (``flex`` on CUDA; eager elsewhere, marked as
    the one kernel it is there)."""
    if kernel != "flex":
        return _merge(*args)
    with torch.profiler.record_function(FUSED_REGION):  # one kernel on CUDA
        return _compiled_where_it_runs(_compiled_merge, _merge, *args)


def _compiled_where_it_runs(compiled, eager, first: torch.Tensor, *args, **kwargs):
    """``eager(first, *args, **kwargs)``, run by ``compiled()`` (its compiled code) where :func:`_runs_compiled`
    says so for ``first``'s device; where that fails, this call runs eagerly (a pure function: the same values)
    and the attention in plain products from then on (``compiled_layers.calling``)."""
    if _runs_compiled(first.device):
        return calling(FLEX_PART, compiled(), eager, first, *args, **kwargs)
    return eager(first, *args, **kwargs)


def _own_mask(length: int, columns: int, group: int, valid: torch.Tensor | None, device) -> torch.Tensor:
    """Which of a row's own ``columns`` keys each of its ``length`` queries (the last columns) may see, for the
    queries folded ``group`` heads to a kv head: [group * length, columns] (causal alone, ``valid`` None) or
    [rows, 1, group * length, columns]: causal and ``valid`` [rows, columns] (the row's real columns), or
    ``valid`` [rows, length, columns] as given."""
    if valid is not None and valid.dim() == 3:
        return valid.repeat(1, group, 1)[:, None]
    causal = torch.ones(length, columns, dtype=torch.bool, device=device).tril(columns - length)
    if valid is None:
        return causal.repeat(group, 1)
    return (valid[:, None, :] & causal[None]).repeat(1, group, 1)[:, None]


def _attention_weights(query, key, mask, active: _Active, layer: int, scale: float, heads: int,
                       dtype: torch.dtype) -> torch.Tensor:
    """Eager attention's weights of the folded ``query`` [rows, kv heads, group * q, d] over each row's prefix
    and its own ``key`` columns (``mask``: :func:`_own_mask`), max over heads: [rows, q, prefix + own columns].
    A float32 softmax rounded to the model's ``dtype``, as eager attention returns it."""
    rows, kv_heads, folded, _ = query.shape
    lengths = {block.prefixes[0][layer][0].shape[-2] for block in active.blocks}
    if len(lengths) != 1:
        raise ValueError(f"attention weights need one prefix length per batch, not {sorted(lengths)}")
    own = (torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale).masked_fill(~mask, float("-inf"))
    seen = own.new_empty((rows, kv_heads, folded, lengths.pop()))
    for block in active.blocks:  # each row's scores over its prefix's keys, as _attention reads them
        if block.index is None:
            scores = torch.matmul(query[block.rows].float(), block.prefixes[0][layer][0].float().transpose(-1, -2))
        else:
            keys = active.stacked_prefixes(block, layer)[0]  # [prefixes, kv heads, length, d]
            chosen = block.padded_rows(query)  # [prefixes, padded rows, kv heads, folded, d]
            scores = block.real_rows(torch.matmul(chosen.float(), keys[:, None].float().transpose(-1, -2)))
        seen[block.rows] = scores * scale
    weights = torch.softmax(torch.cat([seen, own], dim=-1), dim=-1).to(dtype).float()
    return weights.reshape(rows, heads, folded * kv_heads // heads, -1).amax(dim=1)


def _attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers attention interface: ``query`` [rows, heads, q, d], ``key``/``value`` the rows' own
    [rows, kv heads, columns, d] (the suffix's, :class:`SuffixOnlyCache`, or a :class:`RowCache`'s, whose last
    q columns are the queries'); returns [rows, q, heads, d]."""
    active = _ACTIVE.get()
    rows, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    folded = heads // kv_heads * length  # a kv head's query heads, one after another
    scale = scaling if scaling is not None else dim ** -0.5
    query = query.reshape(rows, kv_heads, folded, dim)
    kernel = kernel_for(query.device, dim)
    mask, prepared = active.masks_for(length, key.shape[-2], heads // kv_heads, kernel, query.dtype, query.device)
    if active.record is not None and active.record.layer == module.layer_idx:
        active.record.weights = _attention_weights(query, key, mask, active, module.layer_idx, scale, heads,
                                                   value.dtype)
    own, own_lse = _attend(query, key, value, scale, mask, kernel, prepared)
    output = None
    for block in active.blocks:
        if block.index is None:  # one prefix: its rows fold into its query length
            keys, values = block.prefixes[0][module.layer_idx]
            chosen = query[block.rows]
            count = chosen.shape[0]
            seen, seen_lse = _attend(chosen.transpose(0, 1).reshape(1, kv_heads, count * folded, dim), keys, values,
                                     scale, None, kernel)
            seen = seen.reshape(kv_heads, count, folded, dim).transpose(0, 1)
            seen_lse = seen_lse.reshape(kv_heads, count, folded).transpose(0, 1)
        else:  # one call for the block's prefixes, each with its rows folded into its query length
            keys, values = active.stacked_prefixes(block, module.layer_idx)
            count, width = block.index.shape
            chosen = block.padded_rows(query)  # [prefixes, padded rows, kv heads, folded, d]
            seen, seen_lse = _attend(chosen.transpose(1, 2).reshape(count, kv_heads, width * folded, dim), keys,
                                     values, scale, None, kernel)
            seen = seen.reshape(count, kv_heads, width, folded, dim).transpose(1, 2)  # [prefixes, padded rows, ...]
            seen_lse = seen_lse.reshape(count, kv_heads, width, folded).transpose(1, 2)
        if isinstance(block.rows, slice):  # a view of those rows
            merged = _merged(kernel, seen, seen_lse, own[block.rows], own_lse[block.rows], None, block.picked)
        else:
            merged = _merged(kernel, seen, seen_lse, own, own_lse, block.rows, block.picked)
        merged = merged.reshape(-1, heads, length, dim).transpose(1, 2)  # as transformers takes it (a view)
        if output is None:  # laid out alike in every forward (a compiled layer's graph takes it with its strides)
            output = value.new_empty((rows, length, heads, dim))
        if isinstance(block.rows, slice) and block.rows == slice(None):  # every row, one prefix: the output
            return output.copy_(merged), None  # one copy
        if isinstance(block.rows, slice):
            output[block.rows] = merged  # its rows, cast and laid out in one copy
        else:  # indexed writes take the output's dtype
            output[block.rows] = merged.to(value.dtype)
    return output, None


# outside the graphs of compiled decoder layers (compiled_layers.py): a Python loop over the prefixes
AttentionInterface.register(NAME, torch.compiler.disable(_attention))


def _as_slice(rows: list[int], device) -> slice | torch.Tensor:
    """Row indices as a slice where each follows the one before (a view, not a copy, of those rows), else as
    indices on ``device``."""
    consecutive = rows == list(range(rows[0], rows[0] + len(rows)))
    return slice(rows[0], rows[0] + len(rows)) if consecutive else torch.tensor(rows, device=device)


#: A block's fixed cost (one more attention call per layer), in multiply-adds of one query against one key
#: vector: prefixes of one length are cut into blocks where padding their smaller groups costs more than another
#: call (:func:`cheapest_cuts`). On 2 CPU cores, 2**17 put the demo's tiny LLaVA (16 image tokens, ~12 images a
#: batch) in one block per length and kept the bench's 577-token prefixes apart where their row counts differ
#: (one call per prefix was 3-10% faster there than one padded block).
BLOCK_CALL_COST = 2**17


def _blocks(members: list[tuple[list, list[int]]], in_storage_order: bool = False,
            one_per_length: bool = False) -> list[_Block]:
    """``members`` ((prefix, its rows) each) as blocks (:class:`_Block`) of one prefix length each, cut where
    padding costs least (:data:`BLOCK_CALL_COST`), their indices on the prefixes' device. ``in_storage_order``:
    a block's prefixes in the order they lie in memory, so that those of one forward stack as a view
    (:func:`_stacked`; the CPU path keeps the order of its reference results). ``one_per_length``: one block
    per prefix length, however many rows it pads (FlexAttention on CUDA: a block is one more launch of each of
    its two kernels per layer, while a padded row costs the GPU little; a batch's padding is at most its
    prefixes times their most rows)."""
    by_length: dict[int, list] = {}
    for prefix, rows in members:
        by_length.setdefault(prefix[0][0].shape[-2], []).append((prefix, rows))
    blocks = []
    for group in by_length.values():
        group.sort(key=lambda member: len(member[1]))
        _, kv_heads, length, dim = group[0][0][0][0].shape
        cuts = [] if one_per_length else cheapest_cuts([len(rows) for _, rows in group],
                                                          max(1, BLOCK_CALL_COST // (kv_heads * length * dim)))
        for start, stop in zip([0] + cuts, cuts + [len(group)]):
            chosen = group[start:stop]
            if in_storage_order:
                chosen = sorted(chosen, key=lambda member: (member[0][0][0].untyped_storage().data_ptr(),
                                                            member[0][0][0].storage_offset()))
            blocks.append(_block(chosen))
    return blocks


def _block(group: list[tuple[list, list[int]]]) -> _Block:
    device = group[0][0][0][0].device
    if len(group) == 1:
        return _Block([group[0][0]], _as_slice(group[0][1], device))
    width = max(len(rows) for _, rows in group)
    index = torch.tensor([rows + rows[:1] * (width - len(rows)) for _, rows in group], device=device)
    picked = [g * width + j for g, (_, rows) in enumerate(group) for j in range(len(rows))]
    rows = [row for _, members in group for row in members]
    return _Block([prefix for prefix, _ in group], _as_slice(rows, device), index, torch.tensor(picked, device=device))


@contextlib.contextmanager
def shared_prefix_attention(text_config, prefixes: list, image_of_row: list[int], valid: torch.Tensor | None = None,
                            record: AttentionRecord | None = None, stacked: dict | None = None):
    """Within the block, the language model (``text_config``: its config object) attends with
    :func:`_attention` to ``prefixes`` (per prefix: (keys, values) per layer, batch 1), row r to
    ``prefixes[image_of_row[r]]``; call it with a :class:`SuffixOnlyCache` or a :class:`RowCache`. ``valid``:
    which of the cache's own columns a row's queries see: [rows, columns] its real keys (causal added), or
    [rows, queries, columns] exactly (None: every column before a query). ``record``: a layer's weights.

    Prefixes of one length are attended to in one call per layer, stacked (a copy); ``stacked``: a dict that
    keeps those stacks across forwards over the same prefixes (a stepper's steps), else they last one forward."""
    if len(set(image_of_row)) == 1:
        blocks = [_Block([prefixes[image_of_row[0]]], slice(None))]
    else:
        rows_of: dict[int, list[int]] = {}
        for row, j in enumerate(image_of_row):
            rows_of.setdefault(j, []).append(row)
        keys = prefixes[image_of_row[0]][0][0]
        kernel = kernel_for(keys.device, keys.shape[-1])
        blocks = _blocks([(prefixes[j], rows) for j, rows in sorted(rows_of.items())],  # unread prefixes skipped
                         kernel != "cpu_flash", kernel == "flex")
    token = _ACTIVE.set(_Active(blocks, valid, record, {} if stacked is None else stacked))
    before = text_config._attn_implementation_internal
    text_config._attn_implementation_internal = NAME  # no mask is built for an unregistered mask type
    try:
        yield
    finally:
        text_config._attn_implementation_internal = before
        _ACTIVE.reset(token)
