"""What a loaded model needs of its device's memory, in bytes: the figures a job sizes its batches from
(:mod:`verbmirage.inference.sizing`; docs/models.md, "Batch sizes").

A backend that can say it returns :class:`MemoryCosts` from
:meth:`~verbmirage.models.base.VisionLanguageModel.memory_costs` (the transformers engine:
:mod:`verbmirage.models.hf.memory`; the remote-code checkpoints: :func:`remote_memory_costs`); the others
return None and keep the configured batch size. Estimates on the safe side, not measurements: every term is
what the model may hold at its peak.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: Tokens of a prompt's suffix, rounded up: the longest HICO prompts (MC, four options, the chat template's
#: closing turn) hold about 80.
SUFFIX_TOKENS = 96
#: Chat header and system prompt before the image tokens.
HEADER_TOKENS = 64
FLOAT32 = 4
#: Copies of a decoding row's cache at a step's peak: the grown (beam search: reordered) cache is written beside
#: the old one. With it, the scoring row kept as the decoding's opening and OPERA's rollback snapshot, the estimate
#: is at or above every peak an H200 measured at batch 64 (bench/README.md, "Batches sized for the device").
CACHE_COPIES = 2
#: The most a decoding (any variant but plain greedy: beams, sampling, OPERA, VCD) may hold on its device, weights
#: included, when ``batch_size: auto`` sizes its batch: its sized batch stops here however much memory is free
#: (docs/models.md, "Batch sizes"). A decoding's steps gain little from batches past this (its launches, not its
#: arithmetic, bound it), and a decoding job then leaves most of a large GPU to others.
DECODING_BUDGET = 40 * 2**30


@dataclass(frozen=True)
class MemoryCosts:
    """A model's memory, as the batch sizing reads it.

    ``per_row``: one question in a forward, with everything it holds there (its cache, for every beam and every
    VCD stream; the transient of one layer's forward over it; its logits; OPERA's attention record).
    ``per_question``: what each question of a call holds for the whole call beyond that (a decoding whose call of
    several batches decodes all its questions together: their kept openings and decoding rows; then ``per_row``
    is a forward's transient alone).
    ``per_image``: one image of a call (its prefix's cache, per stream, kept for the call's questions; the
    transient of the prefix's forward, vision tower included). ``call_batches``: how many batches' worth of
    questions one call holds (the engine's ``use_batch_size``). ``weights``: the parameters and buffers on the
    device (read with them loaded, the free memory already lacks them: recorded, and named when nothing fits).
    ``budget``: the most bytes the model may hold on its device at once, weights included, however much is free
    (decodings: :data:`DECODING_BUDGET`); None: the free memory alone bounds it.
    """

    weights: int
    per_row: int
    per_image: int
    per_question: int = 0
    call_batches: int = 1
    device: str = "cpu"
    budget: int | None = None

    def call_bytes(self, batch: int, per_image_rows: float = 1.0) -> float:
        """What a call of ``batch``-row forwards holds beyond the weights: ``call_batches`` batches' worth of
        questions, on about that many over ``per_image_rows`` images and one more where an image is cut."""
        return (batch * self.per_row + self.call_batches * batch * (self.per_question + self.per_image / per_image_rows)
                + self.per_image)

    def record(self) -> dict:
        """The figures as plain values (a job's provenance and log)."""
        return asdict(self)


def layer_transient(geometry: dict, tokens: int, attended: int, itemsize: int) -> int:
    """One layer's forward over ``tokens`` positions attending to ``attended``: the MLP's three intermediate
    tensors, four hidden-size tensors, and the attention products in float32."""
    return (tokens * (3 * geometry["intermediate"] + 4 * geometry["hidden"]) * itemsize
            + geometry["heads"] * tokens * attended * FLOAT32)


def remote_memory_costs(geometry: dict, device: str, beams: int = 1, new_tokens: int = 8) -> MemoryCosts:
    """:class:`MemoryCosts` of a remote-code checkpoint from what its driver reports (``Driver.memory_geometry``:
    the language model's geometry, one image's tokens in it and through the vision tower, the weights, the
    dtype's width), decoding ``new_tokens`` with ``beams`` beams.

    The drivers run an image's prefix once and each question's suffix on a view of its cache, but the checkpoint's
    own forward returns each row's cache over the whole prompt (prefix copied), and its ``generate`` runs each
    question's whole prompt per beam. So a question holds, at the larger of its two passes, either its scoring
    forward (a cache over the whole prompt, one layer's transient, the suffix's logits) or its decoding, per beam
    (``generate`` repeats the prompt for each before its first forward): :data:`CACHE_COPIES` caches over the
    prompt and the new tokens, one layer's transient and the first step's logits over the whole prompt (older
    checkpoint code computes every position's). An image holds its prefix's cache and forward and
    its vision tower (every layer's hidden state, one layer's transient). One call is one batch. No
    :data:`DECODING_BUDGET`: a question's beams each run its whole prompt here, so within 40 GiB a 7B checkpoint's
    beam search would batch only 1-8 questions; the free memory alone bounds it.
    """
    itemsize, vocab = geometry["itemsize"], geometry["vocab"]
    per_token = 2 * geometry["layers"] * geometry["kv_heads"] * geometry["head_dim"] * itemsize
    prefix, suffix = geometry["image_tokens"] + HEADER_TOKENS, SUFFIX_TOKENS
    prompt = prefix + suffix
    logits = vocab * (itemsize + FLOAT32)
    scoring = per_token * prompt + layer_transient(geometry, suffix, prompt, itemsize) + suffix * logits
    decoding = beams * (CACHE_COPIES * per_token * (prompt + new_tokens)
                        + layer_transient(geometry, prompt, prompt, itemsize) + prompt * logits)
    vision = {"hidden": geometry["vision_hidden"], "heads": 1, "intermediate": 4 * geometry["vision_hidden"]}
    tower = ((geometry["vision_layers"] + 1) * geometry["vision_tokens"] * geometry["vision_hidden"] * itemsize
             + layer_transient(vision, geometry["vision_tokens"], geometry["vision_tokens"], itemsize))
    image = per_token * prefix + layer_transient(geometry, prefix, prefix, itemsize) + tower
    return MemoryCosts(weights=geometry["weights"], per_row=max(scoring, decoding), per_image=image,
                       call_batches=1, device=device)
