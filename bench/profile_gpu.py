"""Where a scoring call's time goes on a GPU: the whole-suite scoring pass (all sets of an image per call,
continuations off; bench/suite_scoring.py (b)) on the random-weight LLaVA-1.5-7B-size model of
bench/gpu_scoring.py, once under ``torch.profiler``: the share of the wall time the GPU is busy (the sum of
its kernels' time over the pass's wall time, profiler on), the kernels launched per prompt and the operators
that take the most GPU time.

    python bench/profile_gpu.py [--images 16] [--batch-size 64] [--smoke]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_scoring import FULL, SMOKE, RandomLlava7B  # noqa: E402
from suite_scoring import all_sets_per_call, hico_suite  # noqa: E402
from verbmirage.models.tiny import build_tiny_llava  # noqa: E402


def profiled_pass(model, suite, batch_size: int, cuda: bool):
    """(wall seconds, the profiler's operator averages) of one whole-suite pass, prefixes forgotten first."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    model.forget_prefixes()
    synchronize()
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        all_sets_per_call(model, suite, batch_size)
        synchronize()
    return time.perf_counter() - start, prof


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-prompts", type=int, default=None, help="at most this many of the suite's prompts")
    parser.add_argument("--smoke", action="store_true", help="narrow model on the CPU: checks the script, not speed")
    args = parser.parse_args()
    cuda = not args.smoke
    device, dtype = ("cuda", "bfloat16") if cuda else ("cpu", "float32")
    RandomLlava7B.size = FULL if cuda else SMOKE
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        processor = build_tiny_llava(work / "processor", image_size=336, patch_size=14)
        model = RandomLlava7B("llava7b_random", str(processor), dtype=dtype, device=device, local_files_only=True)
        model.continue_tokens = 0
        suite = hico_suite(args.images, work)[: args.max_prompts]
        all_sets_per_call(model, suite, args.batch_size)  # warm-up (and the compiled kernels' shapes)
        wall, prof = profiled_pass(model, suite, args.batch_size, cuda)
    averages = prof.key_averages()
    kernels = [event for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(event.device_time for event in kernels) / 1e6
    print(f"profiled pass ({len(suite)} prompts, {args.images} images, batch {args.batch_size}): wall {wall:.2f} s "
          f"(profiler on), GPU kernel time {busy:.2f} s -> GPU busy {busy / wall:.0%}; "
          f"{len(kernels) / len(suite):.1f} kernels per prompt")
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(averages.table(sort_by=key, row_limit=15, max_name_column_width=60))


if __name__ == "__main__":
    main()
