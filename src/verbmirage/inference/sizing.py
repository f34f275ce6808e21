"""How many questions a job's forwards (the batch) and model calls hold: the configured ``batch_size``, or, where
it is ``auto`` and the model runs on a GPU, a batch sized from the device's free memory and the model's memory
costs (:class:`~verbmirage.models.memory.MemoryCosts`). docs/models.md, "Batch sizes", tells the whole rule.

- Measured once per job, after the model is loaded, logged, and kept with the job's answers
  (:meth:`~verbmirage.inference.store.PartStore.keep_batching`) and in its tables' provenance (``batching``).
- Reused on a resume: in reduced precision a score depends on what it is batched with, so a job resumed on
  another GPU (other free memory) keeps the sizes its answers were asked with. Where it cannot (the kept batch
  does not fit this device, or the config now names another batch size), the log and the record say so.
- With them the GPU and the kernels its generation chose (the model's ``device_path``: FlexAttention or plain
  products, compiled layers or not): a resume on a GPU that computes otherwise says so too.
- On the CPU, or for a backend that cannot tell its memory costs, ``auto`` is :data:`DEFAULT_BATCH_SIZE`, and
  nothing is recorded: a job answers as it always has.
- Out of memory inside a call still halves that call's batches (the engine's ``with_shrinking_batches``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from verbmirage.models.base import COMPILE_FAILED
from verbmirage.models.memory import MemoryCosts

log = logging.getLogger(__name__)

#: The ``batch_size`` value that asks for a sized batch.
AUTO = "auto"
#: ``auto`` where nothing is sized (a CPU, a backend without memory costs): the batch jobs have always had.
DEFAULT_BATCH_SIZE = 64
#: The largest sized batch (rows per forward).
MAX_BATCH = 1024
#: A sized batch is a multiple of this many rows (a GPU's matrix kernels tile by 8 and more): not a power of two,
#: which would leave up to half of what fits unused (a decoding's call then steps its questions in twice the
#: step forwards)
BATCH_STEP = 8
#: Share of the device's total memory left free by a sized batch (fragmentation, the estimate's errors).
MARGIN = 0.10
#: A device's memory as (free, total) bytes; the free bytes read with the model loaded.
MemoryReading = Callable[[], tuple[int, int]]

GIB = 2**30


class DeviceMemoryError(RuntimeError):
    """Not even one question fits the device's free memory (the message names the model, the batch, the memory)."""


def cuda_memory(device: str) -> MemoryReading | None:
    """The reading of a CUDA device: the driver's free bytes plus what PyTorch's allocator holds unused, and the
    total; None for any other device."""
    import torch  # deferred: only a model on a GPU reads it

    device = torch.device(device)
    if device.type != "cuda":
        return None

    def read() -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device), total

    return read


def rows_per_image(images: list[str]) -> float:
    """Questions per image a call can count on: the 10th percentile over the job's images (at least 1), so that
    a call of images with few questions still fits."""
    if not images:
        return 1.0
    _, counts = np.unique(np.asarray(images, dtype=object), return_counts=True)
    return max(1.0, float(np.percentile(counts, 10)))


def sized_batch(costs: MemoryCosts, free: int, total: int, per_image_rows: float = 1.0, name: str = "model",
                margin: float = MARGIN, cap: int = MAX_BATCH) -> int:
    """The largest batch (a multiple of :data:`BATCH_STEP`, or below it a power of two; at most ``cap``) whose
    call fits ``free`` bytes less ``margin`` of ``total``, and the costs' ``budget`` (weights included) less
    ``margin`` of it where they set one (decodings), though never below one question where the free memory holds
    one.

    A call's bytes (:meth:`~verbmirage.models.memory.MemoryCosts.call_bytes`) must fit.
    :class:`DeviceMemoryError` where not even one question does.
    """
    budget = free - margin * total
    unit = costs.call_bytes(1, per_image_rows) - costs.per_image  # what one more row of a batch adds to a call
    rows = math.floor((budget - costs.per_image) / unit) if unit > 0 else cap
    if costs.budget is not None and rows >= 1 and unit > 0:
        within = (1 - margin) * costs.budget - costs.weights - costs.per_image
        rows = min(rows, max(1, math.floor(within / unit)))
    if rows < 1:
        raise DeviceMemoryError(
            f"{name}: not even a batch of 1 fits on {costs.device}: one question needs "
            f"{(costs.per_row + costs.per_question + costs.per_image) / GIB:.2f} GiB, {budget / GIB:.2f} GiB are usable "
            f"({free / GIB:.2f} GiB free of {total / GIB:.2f} GiB, {margin:.0%} kept free; the weights hold "
            f"{costs.weights / GIB:.2f} GiB). Run it on a GPU with more free memory, or in a smaller dtype")
    return min(cap, rows - rows % BATCH_STEP if rows >= BATCH_STEP else 1 << (rows.bit_length() - 1))


@dataclass(frozen=True)
class Batching:
    """A job's batch (rows per forward) and call size (questions per model call), how they were chosen, and
    whether they are kept with its answers (``record``: None where nothing was sized, as on the CPU)."""

    batch_size: int
    per_call: int
    record: dict | None = None


def choose_batching(model, batch_size: int | str, kept: dict | None, images: list[str],
                    memory: MemoryReading | None = None) -> Batching:
    """The batch and call sizes of a job of ``model`` (loaded, its variant set) over questions on ``images``.

    ``batch_size``: the config's (a number wins; ``auto``: sized). ``kept``: the record kept with the job's
    answers by an earlier run, if any (reused unless it does not fit). ``memory``: the device's reading (default:
    the model's CUDA device; none on the CPU). Sets the model's batch (``use_batch_size``).
    """
    costs = model.memory_costs()
    reading = memory or (cuda_memory(costs.device) if costs is not None else None)
    measured, sized = None, None
    if reading is not None and costs is not None:
        free, total = reading()
        measured = {"free_bytes": int(free), "total_bytes": int(total), **costs.record(),
                    "rows_per_image": rows_per_image(images)}
        sized = (sized_batch if batch_size == AUTO else _sized_or_none)(costs, free, total,
                                                                          measured["rows_per_image"], model.name)
        measured["sized_batch"] = sized
    if batch_size != AUTO:
        chosen, source = batch_size, "config"
        if sized is not None and batch_size > sized:
            log.warning("%s: the config's batch_size %d is above the %d this device's memory fits (%s); out of "
                        "memory will halve it", model.name, batch_size, sized, _memory_words(measured))
    elif kept is not None and (sized is None or kept["batch_size"] <= sized):
        chosen, source = kept["batch_size"], kept.get("source", "sized")
    elif sized is not None:
        chosen, source = sized, "sized"
    else:
        chosen, source = DEFAULT_BATCH_SIZE, "default"
        if costs is None:
            log.info("%s: batch_size auto is %d: backend '%s' gives no memory costs to size a batch from",
                     model.name, chosen, model.backend)
    per_call = model.use_batch_size(chosen)
    path = model.device_path()
    moved = _moved(kept, path)
    if kept is not None and (kept["batch_size"], kept["per_call"]) == (chosen, per_call):
        log.info("%s: batch %d, %d questions per call, as kept with the job's answers%s", model.name, chosen,
                 per_call, f"; here {_memory_words(measured)}" if measured else "")
        if moved is None:
            return Batching(chosen, per_call, kept)
        log.warning("%s: %s", model.name, moved)
        note = "; ".join(words for words in (kept.get("note"), moved) if words)  # an earlier batch's note stays
        return Batching(chosen, per_call, {**kept, "device": path, "note": note})
    if measured is None and kept is None:  # the CPU: nothing sized, nothing to keep, as jobs always ran
        return Batching(chosen, per_call)
    record = {"batch_size": chosen, "per_call": per_call, "source": source}
    if measured is not None:
        record["measured"] = measured
    if path is not None:
        record["device"] = path
    if kept is not None:
        why = (f"the config's batch_size is now {batch_size}" if batch_size != AUTO
               else f"a call at that batch now holds {per_call} questions" if chosen == kept["batch_size"]
               else f"it does not fit this device (sized {sized})")
        record["note"] = (f"the answers kept from an earlier run were asked at batch {kept['batch_size']} "
                          f"({kept['per_call']} per call), not reused because {why}; the rest at batch {chosen} "
                          f"({per_call} per call): scores may differ with the batch in reduced precision"
                          + (f"; {moved}" if moved else ""))
        log.warning("%s: %s", model.name, record["note"])
    else:
        log.info("%s: batch %d (%s), %d questions per call; %s", model.name, chosen, source, per_call,
                 _memory_words(measured))
    return Batching(chosen, per_call, record)


def _moved(kept: dict | None, path: dict | None) -> str | None:
    """What differs between the device the kept answers were computed on (its record's ``device``) and
    ``path`` (this one's), as a note; None where nothing differs or either is unknown."""
    changed = _changes((kept or {}).get("device"), path)
    return changed and (f"the answers kept from an earlier run were computed on another device ({changed}): "
                        "scores may differ from theirs within reduced precision")


def _changes(before: dict | None, path: dict | None) -> str | None:
    """The keys whose values differ between two device paths (a run's ``COMPILE_FAILED`` aside: paths that differ
    only there compute alike where nothing fails), as words; None where none or either is unknown."""
    if before is None or path is None:
        return None
    keys = sorted(key for key in {*before, *path} if key != COMPILE_FAILED and before.get(key) != path.get(key))
    return ", ".join(f"{key} {before.get(key)} -> {path.get(key)}" for key in keys) or None


def with_compile_failures(batching: Batching, model, answers_before: bool) -> Batching:
    """``batching`` as kept with the answers about to be stored: where compiled code failed during the job
    (``COMPILE_FAILED`` in ``model``'s :meth:`device_path`; it runs otherwise from then on) and its record does not
    name that failure yet, the record names it, and where ``answers_before`` (answers were stored before it, by
    this run or an earlier one) its note says that those before and after it may differ. The same ``batching``
    where nothing new failed."""
    record, path = batching.record, model.device_path()
    if record is None or path is None or record.get("device") is None:
        return batching
    kept = record["device"].get(COMPILE_FAILED, [])
    failed = sorted({*kept, *path.get(COMPILE_FAILED, [])})
    if failed == sorted(kept):
        return batching
    record = {**record, "device": {**record["device"], COMPILE_FAILED: failed}}
    if answers_before:
        note = (f"compiled code failed during the run that answered these questions ({', '.join(failed)}) after "
                "some of them were stored: scores may differ within reduced precision between those before and after")
        log.warning("%s: %s", model.name, note)
        record["note"] = "; ".join(words for words in (record.get("note"), note) if words)
    return Batching(batching.batch_size, batching.per_call, record)


def _sized_or_none(costs, free, total, per_image_rows, name) -> int | None:
    """The sized batch where one question fits, else None (an explicit batch size is the config's to answer for)."""
    try:
        return sized_batch(costs, free, total, per_image_rows, name)
    except DeviceMemoryError:
        return None


def _memory_words(measured: dict) -> str:
    return (f"{measured['free_bytes'] / GIB:.1f} GiB free of {measured['total_bytes'] / GIB:.1f} GiB on "
            f"{measured['device']}, weights {measured['weights'] / GIB:.2f} GiB, "
            f"{(measured['per_row'] + measured['per_question']) / 2**20:.1f} MiB per question, "
            f"{measured['per_image'] / 2**20:.1f} MiB per image")
