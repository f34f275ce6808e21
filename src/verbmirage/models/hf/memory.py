"""The transformers engine's memory per question and per image, from the loaded model's config
(:class:`~verbmirage.models.memory.MemoryCosts`; how a job sizes its batches from them: docs/models.md,
"Batch sizes").

An estimate on the safe side, not a measurement: every term is what the engine may hold at its peak.

- A question's rows (``per_row``), one per beam and per VCD stream: their cache (keys and values of every layer,
  :data:`CACHE_COPIES` times, OPERA once more for the snapshot it rolls back to) over the suffix and the tokens it
  decodes, and over the image prefix too where rows copy it (without prefix reuse, or a family whose steps do not
  read prefixes in place); the scoring row kept as the decoding's opening; one layer's transient over the suffix
  (the MLP's three intermediate tensors, four hidden-size tensors, the attention products over prefix and suffix
  in float32); the suffix's logits (model dtype and a float32 copy); OPERA's attention record (every head, every
  decoded token, over the whole sequence, float32).
- An image of a call (``per_image``), per stream: its prefix's cache, kept while the call's questions run,
  and its prefix's forward: one language-model layer's transient over the prefix and the vision tower (the
  hidden state of every layer, kept by ``output_hidden_states``, and one layer's transient).

Lengths: the prefix is the image tokens the config gives (``image_seq_length``, a Q-Former's query tokens, the
vision tower's patches; :data:`DYNAMIC_IMAGE_TOKENS` for dynamic resolution) plus :data:`HEADER_TOKENS`; the
suffix is :data:`SUFFIX_TOKENS`, a long HICO prompt's rest (question, four MC options, the closing turn).
"""

from __future__ import annotations

from verbmirage.models.memory import (
    CACHE_COPIES,
    DECODING_BUDGET,
    FLOAT32,
    HEADER_TOKENS,
    SUFFIX_TOKENS,
    MemoryCosts,
    layer_transient,
)

#: Image tokens where the config does not fix them (Qwen2-VL's dynamic resolution: a 640 x 480 HICO image is
#: about 400 after merging; this leaves room for larger images).
DYNAMIC_IMAGE_TOKENS = 1024


def image_tokens(config) -> int:
    """The image tokens one image puts into the language model's sequence."""
    for name in ("image_seq_length", "num_query_tokens", "mm_tokens_per_image"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    vision = getattr(config, "vision_config", None)
    size, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    if isinstance(size, int) and isinstance(patch, int) and patch > 0:
        return (size // patch) ** 2
    return DYNAMIC_IMAGE_TOKENS


def _geometry(config) -> dict:
    """Layers, widths, heads and vocabulary of a (text or vision) config, under the names configs use."""

    def first(*names, default=None):
        for name in names:
            value = getattr(config, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return default

    hidden = first("hidden_size", "embed_dim", "d_model", default=0)
    heads = first("num_attention_heads", "num_heads", default=1)
    return {"layers": first("num_hidden_layers", "depth", "num_layers", default=0), "hidden": hidden,
            "heads": heads, "kv_heads": first("num_key_value_heads", default=heads),
            "head_dim": first("head_dim", default=max(1, hidden // heads)),
            "intermediate": first("intermediate_size", "ffn_dim", default=4 * hidden),
            "vocab": first("vocab_size", default=0)}


def _vision_bytes(config, itemsize: int, tokens_in_text: int) -> int:
    """One image through the vision tower: every layer's hidden state (``output_hidden_states``) and one layer's
    transient."""
    vision = getattr(config, "vision_config", None)
    if vision is None:
        return 0
    geometry = _geometry(vision)
    size, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    tokens = ((size // patch) ** 2 + 1 if isinstance(size, int) and isinstance(patch, int) and patch > 0
              else 4 * tokens_in_text)  # dynamic resolution: patches merged 2 x 2 into text tokens
    return ((geometry["layers"] + 1) * tokens * geometry["hidden"] * itemsize
            + layer_transient(geometry, tokens, tokens, itemsize))


def engine_memory_costs(vlm) -> MemoryCosts:
    """:class:`MemoryCosts` of a loaded :class:`~verbmirage.models.hf.engine.TransformersVLM` under its current
    variant (beams, VCD's streams, OPERA's attention record) and ``continue_tokens``."""
    config = vlm.model.config
    text = _geometry(config.get_text_config())
    itemsize = vlm.dtype.itemsize
    strategy = vlm.strategy
    new = strategy.new_tokens(vlm.continue_tokens or 0)
    prefix = image_tokens(config) + HEADER_TOKENS
    suffix = SUFFIX_TOKENS
    whole = prefix + suffix + new
    per_token = 2 * text["layers"] * text["kv_heads"] * text["head_dim"] * itemsize  # keys and values, all layers
    reused = vlm.prefix_reuse
    copies_prefix = not reused or not vlm.prefix_cache.reads_in_place()
    own_tokens = suffix + new + (prefix if copies_prefix else 0)
    forward_tokens = suffix if reused else prefix + suffix  # without reuse a row runs its whole prompt
    # each beam holds its cache (twice at a step's peak; OPERA a third time: the snapshot it rolls back to) and its
    # step's logits; the scoring forward runs once per question and stream, and its row is kept as the opening of
    # the decoding that follows where the strategy keeps openings
    copies = CACHE_COPIES + (1 if strategy.needs_last_attention else 0)
    logits = text["vocab"] * (itemsize + FLOAT32)
    # OPERA: the last layer's attention of every decoded token, every head, per beam
    record = text["heads"] * new * whole * FLOAT32 if strategy.needs_last_attention else 0
    if copies_prefix:
        decoding = strategy.beams * (copies * per_token * own_tokens + logits + record)
    else:  # a question's beams share its prompt's own columns, written in place (room for the new tokens made at
        # the opening); each beam holds only the tokens it decodes, copied when beams move
        decoding = per_token * (suffix + copies * strategy.beams * new) + strategy.beams * (logits + record)
    scoring = layer_transient(text, forward_tokens, whole, itemsize) + suffix * logits
    opening = per_token * (suffix + new) if reused and strategy.keeps_openings(vlm.continue_tokens or 0) else 0
    vision = _vision_bytes(config, itemsize, image_tokens(config))
    if reused:
        image = per_token * prefix + layer_transient(text, prefix, prefix, itemsize) + vision
    else:  # no prefix kept: each row's forward runs its own image
        image, scoring = 0, scoring + vision
    weights = sum(p.numel() * p.element_size() for p in vlm.model.parameters()) + \
        sum(b.numel() * b.element_size() for b in vlm.model.buffers())
    spans = vlm.calls_span_batches()
    plain_greedy = strategy.decides_by_first_token and strategy.streams == 1
    if spans and opening and not strategy.decides_by_first_token:
        # a call of several batches decodes all its kept rows at once: each question holds its opening and its
        # rows for the whole call, a forward's transient only per row of a batch; the steps stack the call's
        # prefixes (one more copy of each image's)
        per_row, per_question = scoring, opening + decoding
        image += per_token * prefix
    else:  # one batch per call, or a decoding of at most a batch at a time (greedy's continuations, VCD greedy)
        per_row, per_question = scoring + opening + decoding, 0
    return MemoryCosts(weights=weights, per_row=strategy.streams * per_row,
                       per_question=strategy.streams * per_question, per_image=image * strategy.streams,
                       call_batches=vlm.CALL_BATCHES if spans else 1, device=str(vlm.device),
                       budget=None if plain_greedy else DECODING_BUDGET)
