"""Attention of a suffix batch on its cached image prefixes, read once per image instead of once per row.

A suffix batch scores many prompts on a few cached prefixes (the image, or the image and a shared text
header). The plain path gives every row its own copy of its prefix's keys and values (a cache of B rows, then
a concatenation with the suffix, then GQA's repeat): B times the prefix in memory and traffic, about 0.3 GB
per row for LLaVA-1.5-7B's 600-token prefix. Here each attention layer instead computes

- the rows' queries against their prefix: one attention call per prefix, the rows and the GQA head groups
  folded into the query length, so the prefix's keys are read as they are cached;
- the queries against their own suffix (causal; right padding comes after a row's last real token, so no
  mask beyond causality is needed);

and merges the two by their log-sum-exp, which is exact (flash attention's split of the keys).

Hand-written because transformers has no attention over a shared prefix (its caches hold one row each). On
the CPU both parts run in PyTorch's fused flash-attention kernel, which returns the log-sum-exp; on other
devices in plain matrix products with a float32 softmax (the same values, no fused kernel).
"""

from __future__ import annotations

import contextlib
import contextvars

import torch
from transformers import AttentionInterface, DynamicCache

#: the attention implementation's name in transformers' registry (the language model uses it only inside
#: :func:`shared_prefix_attention`)
NAME = "verbmirage_shared_prefix"

#: (prefix key/value tensors per layer for each prefix, rows of each prefix or None for all rows)
_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("verbmirage_shared_prefix", default=None)


class SuffixOnlyCache(DynamicCache):
    """A cache that keeps nothing: the layers attend to the suffix's own keys and values plus the prefixes."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return key_states, value_states


def _attend(query, key, value, scale: float, mask: torch.Tensor | None, fused: bool | None = None):
    """(output, log-sum-exp over the keys) of one attention; ``mask``: True where a query may see a key.
    ``fused``: PyTorch's CPU flash kernel (default on the CPU) or plain products."""
    if query.device.type == "cpu" if fused is None else fused:  # the kernel takes an additive mask
        additive = None if mask is None else \
            torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill_(~mask, float("-inf"))
        output, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, False, attn_mask=additive, scale=scale)
        return output.float(), lse.float()
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), value.float()), lse


def _attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers attention interface: ``query`` [rows, heads, q, d], ``key``/``value`` the suffix's own
    [rows, kv heads, q, d] (:class:`SuffixOnlyCache`); returns [rows, q, heads, d]."""
    prefixes, groups = _ACTIVE.get()
    rows, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    folded = heads // kv_heads * length  # a kv head's query heads, one after another
    scale = scaling if scaling is not None else dim ** -0.5
    query = query.reshape(rows, kv_heads, folded, dim)
    causal = torch.ones(length, length, dtype=torch.bool, device=query.device).tril().repeat(heads // kv_heads, 1)
    own, own_lse = _attend(query, key, value, scale, causal)
    output = None if groups[0] is None else torch.empty_like(own)  # one prefix: its result is the output
    for prefix, members in zip(prefixes, groups):
        keys, values = prefix[module.layer_idx]
        chosen = query if members is None else query[members]
        count = chosen.shape[0]
        folded_rows = chosen.transpose(0, 1).reshape(1, kv_heads, count * folded, dim)
        seen, seen_lse = _attend(folded_rows, keys, values, scale, None)
        seen = seen.reshape(kv_heads, count, folded, dim).transpose(0, 1)
        seen_lse = seen_lse.reshape(kv_heads, count, folded).transpose(0, 1)
        mine, mine_lse = (own, own_lse) if members is None else (own[members], own_lse[members])
        total = torch.logaddexp(seen_lse, mine_lse)
        merged = seen * torch.exp(seen_lse - total)[..., None] + mine * torch.exp(mine_lse - total)[..., None]
        if members is None:
            output = merged
        else:
            output[members] = merged
    return output.to(value.dtype).reshape(rows, heads, length, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, _attention)


@contextlib.contextmanager
def shared_prefix_attention(text_config, prefixes: list, image_of_row: list[int]):
    """Within the block, the language model (``text_config``: its config object) attends with
    :func:`_attention` to ``prefixes`` (per prefix: (keys, values) per layer, batch 1), row r to
    ``prefixes[image_of_row[r]]``; call it with a :class:`SuffixOnlyCache`."""
    if len(prefixes) == 1:
        groups = [None]
    else:
        index = torch.tensor(image_of_row)
        groups = [torch.nonzero(index == j).flatten() for j in range(len(prefixes))]
    token = _ACTIVE.set((prefixes, groups))
    before = text_config._attn_implementation_internal
    text_config._attn_implementation_internal = NAME  # no mask is built for an unregistered mask type
    try:
        yield
    finally:
        text_config._attn_implementation_internal = before
        _ACTIVE.reset(token)
