"""What a loaded model needs of its device's memory, in bytes: the figures a job sizes its batches from
(:mod:`verbmirage.inference.sizing`; docs/models.md, "Batch sizes").

A backend that can say it returns :class:`MemoryCosts` from
:meth:`~verbmirage.models.base.VisionLanguageModel.memory_costs` (the transformers engine:
:mod:`verbmirage.models.hf.memory`); the others return None and keep the configured batch size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class MemoryCosts:
    """A model's memory, as the batch sizing reads it.

    ``per_row``: one question in a forward, with everything it holds there (its cache, for every beam and every
    VCD stream; the transient of one layer's forward over it; its logits; OPERA's attention record).
    ``per_image``: one image of a call (its prefix's cache, per stream, kept for the call's questions; the
    transient of the prefix's forward, vision tower included). ``call_batches``: how many batches' worth of
    questions one call holds (the engine's ``use_batch_size``). ``weights``: the parameters and buffers on the
    device (read with them loaded, the free memory already lacks them: recorded, and named when nothing fits).
    ``budget``: the most bytes the model may hold on its device at once, weights included, however much is free
    (decodings: :data:`verbmirage.models.hf.memory.DECODING_BUDGET`); None: the free memory alone bounds it.
    """

    weights: int
    per_row: int
    per_image: int
    call_batches: int = 1
    device: str = "cpu"
    budget: int | None = None

    def record(self) -> dict:
        """The figures as plain values (a job's provenance and log)."""
        return asdict(self)
