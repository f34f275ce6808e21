"""CPU proxy of a GPU's launch overhead: kernel-like operator calls per scored prompt.

On a GPU a scoring pass at batch 64 spent most of its wall time launching small operations (bench/README.md,
"On a GPU"). Launches are counted here on the CPU: the whole-suite scoring pass (all sets of an image per call,
continuations off; bench/suite_scoring.py (b)) on a random-weight model of LLaVA-1.5-7B's depth (32 language
layers, 24 vision layers, 576 image tokens) made narrow, under ``torch.profiler``; every ATen operator call that
calls no other ATen operator (a leaf: what would be a kernel launch) and is not a view (a view launches
nothing) is counted, divided by the prompts scored. ``--path cuda`` runs the shared-prefix attention as on CUDA
(FlexAttention, here eager), each region that is one fused kernel there counted as one, with CUDA's fewer and
fuller forwards and its decoder layers compiled (models/hf/on_device.py), here by inductor's CPU code generator:
each kernel it generates counts as one launch (``cpp.enable_kernel_profile`` names them to the profiler), each
operator it calls out to (the matrix products) as one. The other paths (:data:`PATHS`) add one lever at a time.

    python bench/launches.py [--images 16] [--batch-size 256] [--top 15] [--path cpu cuda-attention ...]
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_scoring import RandomLlava7B  # noqa: E402
from suite_scoring import all_sets_per_call, hico_suite  # noqa: E402
from verbmirage.models.hf.compiled_layers import compile_decoder_layers  # noqa: E402
from verbmirage.models.hf.on_device import CUDA_FORWARD_COST, fit_to_device  # noqa: E402
from verbmirage.models.hf.shared_prefix import FUSED_REGION, use_kernel  # noqa: E402
from verbmirage.models.tiny import build_tiny_llava  # noqa: E402

#: LLaVA-1.5-7B's depth and image geometry, narrow widths (the count of launches does not depend on widths)
DEEP_NARROW = {"vision_hidden": 32, "vision_layers": 24, "vision_heads": 2, "hidden": 64, "intermediate": 128,
               "layers": 32, "heads": 4}


@functools.cache
def is_view(name: str) -> bool:
    """Whether ATen operator ``name`` (``aten::x``) returns a view of an input (an alias it does not write)."""
    packet = getattr(torch.ops.aten, name.removeprefix("aten::"), None)
    if packet is None:
        return False
    for overload in packet.overloads():
        returns = getattr(packet, overload)._schema.returns
        if returns and returns[0].alias_info is not None and not returns[0].alias_info.is_write:
            return True
    return False


#: ATen operators that allocate or describe tensors without computing anything (no kernel of their own)
FREE = {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::resize_", "aten::_unsafe_view", "aten::result_type",
        "aten::detach_", "aten::as_strided_", "aten::set_", "aten::lift_fresh", "aten::_local_scalar_dense"}


#: the profiler's name of a compiled layer's kernel that inductor generated for the CPU contains this (with
#: ``torch._inductor.config.cpp.enable_kernel_profile``); the kernels' names are counted under it
GENERATED = "cpp_fused"


def _launches(event) -> bool:
    """Whether ``event`` computes something itself: not free, not a view."""
    if GENERATED in event.name:
        return True
    return event.name.startswith("aten::") and event.name not in FREE and not is_view(event.name)


def count_launches(events) -> collections.Counter:
    """Per operator name, the calls among profiler ``events`` that launch a kernel: ATen operators that are not
    views or mere allocations (:data:`FREE`) and call no such operator themselves (the innermost ones). A region
    that runs as one fused kernel on CUDA (``shared_prefix.FUSED_REGION``: FlexAttention, the compiled merge)
    counts as one, whatever it runs here."""

    def inner(event) -> bool:  # whether a descendant launches
        return any(_launches(child) or inner(child) for child in event.cpu_children)

    def fused(event) -> bool:  # inside a fused region
        parent = event.cpu_parent
        while parent is not None:
            if parent.name == FUSED_REGION:
                return True
            parent = parent.cpu_parent
        return False

    counts: collections.Counter = collections.Counter()
    for event in events:
        if event.name == FUSED_REGION and not fused(event):
            counts[FUSED_REGION] += 1
        elif GENERATED in event.name:
            counts[f"inductor::{GENERATED}"] += 1
        elif _launches(event) and not inner(event) and not fused(event):
            counts[event.name] += 1
    return counts


def launches_per_prompt(model, suite, batch_size: int, kernel: str) -> tuple[float, collections.Counter]:
    """(launches per prompt, launches by operator) of one whole-suite scoring pass, the shared-prefix attention
    on ``kernel`` (shared_prefix.KERNELS)."""
    from torch.profiler import ProfilerActivity, profile

    model.forget_prefixes()
    with use_kernel(kernel), profile(activities=[ProfilerActivity.CPU]) as prof:
        all_sets_per_call(model, suite, batch_size)
    counts = count_launches(prof.events())
    return sum(counts.values()) / len(suite), counts


def deep_narrow_model(work: Path, size: dict = DEEP_NARROW, device: str = "cpu", dtype: str = "float32"):
    """The random LLaVA-1.5-7B-geometry model of bench/gpu_scoring.py at ``size``, continuations off."""
    RandomLlava7B.size = size
    processor = build_tiny_llava(work / "processor", image_size=336, patch_size=14)
    model = RandomLlava7B("llava7b_narrow", str(processor), dtype=dtype, device=device, local_files_only=True)
    model.continue_tokens = 0  # the scoring pass
    return model


#: the paths counted, one lever at a time: the CPU's (flash kernel, eager layers); CUDA's attention
#: (FlexAttention, eager here); + CUDA's fewer, fuller forwards; + compiled decoder layers instead; CUDA's whole
#: path (both; ``VERBMIRAGE_COMPILE_LAYERS=0`` leaves its layers eager, as on CUDA)
PATHS = ("cpu", "cuda-attention", "cuda-forwards", "cuda-compiled", "cuda")


def set_up(model, path: str) -> None:
    """``model`` (a fresh one) set up as ``path`` (:data:`PATHS`) runs; compiled layers by inductor's CPU code
    generator, its kernels named to the profiler (:data:`GENERATED`)."""
    import torch._inductor.config

    torch._inductor.config.cpp.enable_kernel_profile = True
    if path == "cuda-forwards":
        model.prefix_cache.BATCH_COST = model.prefix_cache.HEADER_SAVING = CUDA_FORWARD_COST
    elif path == "cuda-compiled":
        compile_decoder_layers(model.model, force=True)
    elif path == "cuda":
        fit_to_device(model, device=torch.device("cuda"))


def kernel_of(path: str) -> str:
    """The shared-prefix attention's kernel (shared_prefix.KERNELS) on ``path``: the CPU's flash kernel on the
    CPU's, FlexAttention (one fused kernel per part on CUDA) on every other."""
    return "cpu_flash" if path == "cpu" else "flex"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--top", type=int, default=15, help="operators to list, most calls first")
    parser.add_argument("--path", choices=PATHS, nargs="+", default=["cpu", "cuda"],
                        help="the paths to count (default: the CPU's and CUDA's); see PATHS")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        suite = hico_suite(args.images, work)
        for path in args.path:
            model = deep_narrow_model(work)
            set_up(model, path)
            kernel = kernel_of(path)
            with use_kernel(kernel):  # warm-up: every shape a compiled layer meets, compiled before counting
                all_sets_per_call(model, suite if "compiled" in path or path == "cuda" else suite[:8],
                                  args.batch_size)
            per_prompt, counts = launches_per_prompt(model, suite, args.batch_size, kernel)
            print(f"{path} path ({kernel}): {len(suite)} prompts on {args.images} images, batch {args.batch_size}: "
                  f"{per_prompt:.1f} launches per prompt ({sum(counts.values())} in all)")
            for name, count in counts.most_common(args.top):
                print(f"  {name:40s} {count:7d}  {count / len(suite):6.2f} per prompt")


if __name__ == "__main__":
    main()
