"""How many answers move between batch 64 and the batch a GPU job sizes for itself (docs/models.md, "Batch
sizes").

In reduced precision a prompt's score depends on what it is batched with, so a job that sizes its batch from the
GPU's free memory (``batch_size: auto``) may answer some questions otherwise than at the old fixed 64. This
scores the whole HICO suite as a job does (all sets of an image per call; bench/suite_scoring.py's questions on
``--images`` images, the scoring pass only) on the random-weight model of LLaVA-1.5-7B's size
(bench/gpu_scoring.py) in bf16, as built and made decisive (bench/bench_scoring.py, ``make_decisive``), at
batch 64 and at the batch :func:`verbmirage.inference.sizing.choose_batching` sizes from this GPU's own memory
reading, and prints for each model:

- the sized batch and call size, the memory read and the estimate's terms, the estimated peak of a call beside
  the peak measured at the sized batch (how safe the estimate is);
- prompts/s at 64 and at the sized batch;
- answers that differ (the ``prediction`` each gives: first answer token, as a job stores it) and score
  decisions that differ (YN: P(yes) >= 0.5; MC: the most probable option), YN and MC apart, of all prompts;
- the largest difference of P(yes) or an option's probability.

    python bench/batch_flips.py [--images 64] [--batch-size 64]
    python bench/batch_flips.py --smoke --images 2   # on a CPU: narrow float32 model, a fake GPU reading
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scoring import make_decisive  # noqa: E402
from gpu_scoring import FULL, SMOKE, RandomLlava7B  # noqa: E402
from suite_scoring import all_sets_per_call, hico_suite, score_difference  # noqa: E402
from verbmirage.inference.sizing import AUTO, GIB, choose_batching  # noqa: E402
from verbmirage.models.tiny import build_tiny_llava  # noqa: E402

#: The smoke run's stand-in for a GPU's reading (free, total): the CPU has none to read.
SMOKE_READING = (2**30, 2 * 2**30)


def decision(result) -> object:
    """The score's decision: yes where P(yes) >= 0.5 (YN), else the most probable option (MC)."""
    if hasattr(result, "option_probs"):
        return int(np.argmax(result.option_probs))
    return result.p_yes >= 0.5


def timed_pass(model, suite, batch_size: int, synchronize) -> tuple[dict, float]:
    synchronize()
    start = time.perf_counter()
    results = all_sets_per_call(model, suite, batch_size)
    synchronize()
    return results, len(suite) / (time.perf_counter() - start)


def compare(name: str, model, suite, reference: int, sized: int, synchronize, cuda: bool) -> None:
    kinds = {question.question_id: "MC" if question.options else "YN" for _, question in suite}
    all_sets_per_call(model, suite[:8], reference)  # warm-up
    at_reference, reference_rate = timed_pass(model, suite, reference, synchronize)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    at_sized, sized_rate = timed_pass(model, suite, sized, synchronize)
    peak = f"; peak GPU memory at the sized batch {torch.cuda.max_memory_allocated() / GIB:.1f} GiB" if cuda else ""
    answers = [qid for qid in at_reference if at_reference[qid].prediction != at_sized[qid].prediction]
    decisions = [qid for qid in at_reference if decision(at_reference[qid]) != decision(at_sized[qid])]
    total = {kind: sum(1 for k in kinds.values() if k == kind) for kind in ("YN", "MC")}

    def count(ids: list) -> str:
        by_kind = ", ".join(f"{kind} {sum(1 for q in ids if kinds[q] == kind)} of {total[kind]}" for kind in total)
        return f"{len(ids)} of {len(suite)} ({100 * len(ids) / len(suite):.2f}%; {by_kind})"

    print(f"{name}: batch {reference} {reference_rate:8.1f} prompts/s, batch {sized} {sized_rate:8.1f} prompts/s{peak}")
    print(f"  answers that differ (prediction):        {count(answers)}")
    print(f"  score decisions that differ:             {count(decisions)}")
    print(f"  max |score difference|:                  {score_difference(at_reference, at_sized):.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64, help="the fixed batch to compare with")
    parser.add_argument("--smoke", action="store_true", help="narrow model on the CPU: checks the script, not speed")
    args, _ = parser.parse_known_args()  # bench/h200_check.sh passes every benchmark the same arguments
    device, dtype = ("cpu", "float32") if args.smoke else ("cuda", "bfloat16")
    RandomLlava7B.size = SMOKE if args.smoke else FULL
    cuda = device == "cuda"
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        processor_dir = build_tiny_llava(work / "processor", image_size=336, patch_size=14)
        model = RandomLlava7B("llava7b_random", str(processor_dir), dtype=dtype, device=device,
                              local_files_only=True)
        model.continue_tokens = 0  # the scoring pass: its answers are what the batch moves
        suite = hico_suite(args.images, work)
        images = [str(question.image) for _, question in suite]
        batching = choose_batching(model, AUTO, None, images, None if cuda else (lambda: SMOKE_READING))
        measured = batching.record["measured"]
        estimate = measured["weights"] + batching.batch_size * measured["per_row"] + \
            (measured["call_batches"] * batching.batch_size / measured["rows_per_image"] + 1) * measured["per_image"]
        print(f"{sum(p.numel() for p in model.model.parameters()) / 1e9:.2f}B parameters, {dtype}; "
              f"{len(suite)} prompts of 5 sets on {args.images} images")
        print(f"sized: batch {batching.batch_size}, {batching.per_call} questions per call "
              f"({measured['free_bytes'] / GIB:.1f} GiB free of {measured['total_bytes'] / GIB:.1f} GiB"
              f"{' (a fake reading)' if not cuda else ''}, weights {measured['weights'] / GIB:.2f} GiB, "
              f"{measured['per_row'] / 2**20:.2f} MiB per question, {measured['per_image'] / 2**20:.2f} MiB per image, "
              f"{measured['rows_per_image']:.1f} questions per image; estimated peak {estimate / GIB:.2f} GiB)")
        for name, decisive in (("random (as built)", False), ("decisive", True)):
            make_decisive(model, decisive=decisive)
            compare(name, model, suite, args.batch_size, batching.batch_size, synchronize, cuda)


if __name__ == "__main__":
    main()
