"""CPU proxy of each decoding's GPU cost and memory relative to greedy.

On a GPU a decoding's time is mostly its launches (one per operator), and its memory its caches; neither shows
on a CPU's clock. So this script counts them: on a random-weight model of LLaVA-1.5-7B's depth (32 language
layers, 24 vision layers, 576 image tokens) made narrow so that it runs on a CPU, each decoding of the paper's
tables answers the YN questions of ``--images`` images as a job does (the variant first, then its calls of
``--batch-size``; the model decisive, as in bench/gpu_scoring.py), and the script prints per decoding

- **ops/prompt**: operator calls per question, counted with ``torch.profiler``: the ``aten::`` operators that
  call no other ``aten::`` operator (the kernel-like leaves), views not counted (they launch nothing);
- **positions/prompt**: the arithmetic, per question: the language model's token positions computed (rows
  times columns of each forward, padding included) and the images the vision tower encodes (counted as
  :data:`VISION_POSITIONS` positions each): what a GPU computing at its peak pays for (:class:`Arithmetic`),
  where ops/prompt is what a GPU waiting on its launches pays for;
- **peak**: the most bytes of tensors alive at once during the pass (the profiler's allocation events; the
  weights, allocated before, not counted);

each also relative to greedy. The targets are the GPU's (docs/models.md, "Speed"): beam-5, sampling, VCD sampling
and VCD beam-5 at most 2x greedy, OPERA at most 3x. The narrow model's caches are smaller against its logits
than a 7B model's (hidden 256: 64 KiB of keys and values per token over 32 layers, 512 KiB in the 7B's bf16),
so the memory ratios here understate what copies of caches cost on the GPU.

Two regimes:

- **job** (the default): each decoding sizes its calls as a job does (its variant first, then
  ``use_batch_size``), on the questions of ``--images`` images: with few images, one call of one batch;
- **gpu** (``--regime gpu``): the device check's (bench/gpu_scoring.py ``--decodings`` in bench/h200_check.sh):
  the YN questions of 16 images, each decoding as its job sizes it, its variant first and then
  ``use_batch_size(64)`` (on LLaVA, whose rows read their prefixes in place, every decoding's calls hold four
  batches, 256 questions, and decode them together). It is slower: ``--layers`` makes the model shallower (the vision tower in proportion,
  24 of 32), which barely moves the ratios, each forward costing about as many operators per layer whatever
  the depth (run two depths to see it).

Two paths (``--path``):

- **cpu** (the default): the engine as it runs on the CPU (eager decoder layers, the CPU's flash kernel for the
  shared-prefix attention, its cuts of suffix batches, OPERA in two forwards per step), operators counted as
  above;
- **cuda**: the engine set up as it runs on CUDA, exactly as bench/launches.py sets up CUDA's path
  (``fit_to_device``: fewer, fuller forwards, decoder layers compiled, here by inductor's CPU code generator,
  OPERA in one forward per step; FlexAttention for the shared-prefix attention), and counted as launches.py
  counts launches (its ``count_launches``: each region that is one fused kernel on CUDA as one, each kernel
  inductor generates as one, allocations and views not), so that the two scripts' figures mean the same.
  With compiled layers each decoding runs its pass once uncounted first, so that every shape its layers meet
  is compiled before the count (``VERBMIRAGE_COMPILE_LAYERS=0`` keeps them eager, as on CUDA).

The random weights never end an answer early, so every decoding decodes all ``--max-new-tokens`` of every
answer; a trained model's YN answer ends after its yes or no ("Yes", then the end token). ``--ending`` makes the
model answer so (bench_scoring.make_ending): a decoding then stops stepping once its answers have ended, as on
a trained model.

    python bench/decoding_proxy.py [--images 4] [--batch-size 64] [--max-new-tokens 8]
    python bench/decoding_proxy.py --regime gpu --layers 4   # the device check's call, 4 + 3 layers
    python bench/decoding_proxy.py --regime gpu --layers 4 --only opera --opera-one-forward  # CUDA's OPERA step
    python bench/decoding_proxy.py --regime gpu --layers 4 --path cuda   # CUDA's path, counted as launches.py does
    python bench/decoding_proxy.py --regime gpu --layers 1 --ending   # arithmetic as a trained model answers
    python bench/decoding_proxy.py --smoke [--path cuda]   # 1 image, 1 layer: checks the script (CI)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scoring import (DECODINGS, Arithmetic, engine_pass, hico_like_questions,  # noqa: E402
                           make_decisive, make_ending)
from gpu_scoring import RandomLlava7B  # noqa: E402
from launches import count_launches, kernel_of, set_up  # noqa: E402
from verbmirage.models.hf.compiled_layers import compiles_layers  # noqa: E402
from verbmirage.models.hf.shared_prefix import use_kernel  # noqa: E402
from verbmirage.models.tiny import build_tiny_llava  # noqa: E402
from verbmirage.variants.settings import Variant  # noqa: E402

#: LLaVA-1.5-7B's depth and image geometry, narrow widths (head size 128 as in the 7B).
NARROW = {"vision_hidden": 64, "vision_layers": 24, "vision_heads": 2, "hidden": 256, "intermediate": 512,
          "layers": 32, "heads": 2}
SMOKE = {**NARROW, "vision_layers": 1, "layers": 1}
#: Each decoding's target over greedy on the GPU.
TARGETS = {"beam5": 2.0, "sample": 2.0, "vcd_sample": 2.0, "vcd_beam5": 2.0, "opera": 3.0}

#: aten operators that only make views (no kernel, no memory).
VIEWS = frozenset({
    "view", "_unsafe_view", "reshape", "expand", "expand_as", "as_strided", "slice", "select", "transpose", "t",
    "permute", "unsqueeze", "squeeze", "alias", "detach", "narrow", "split", "split_with_sizes", "chunk", "unbind",
    "diagonal", "view_as", "unflatten", "flatten", "lift_fresh", "_reshape_alias", "movedim", "numpy_T", "unfold",
    "contiguous", "to", "_to_copy_view", "real", "imag", "_conj", "resolve_conj", "resolve_neg", "result_type",
    "empty_like", "empty", "empty_strided", "is_nonzero", "item", "_local_scalar_dense", "size", "stride",
    "dim", "numel", "is_floating_point", "_has_compatible_shallow_copy_type",
})


def leaf_operators(prof) -> Counter:
    """``aten::`` events of ``prof`` that contain no other ``aten::`` event and make more than a view, by name."""
    count = Counter()
    for event in prof.events():
        if not event.name.startswith("aten::") or event.name[6:] in VIEWS:
            continue
        if not any(child.name.startswith("aten::") for child in event.cpu_children):
            count[event.name[6:]] += 1
    return count


def peak_bytes(prof) -> int:
    """The largest sum of live allocations over the profiled span (allocation events in time order)."""
    changes = sorted((event.start_ns(), event.nbytes()) for event in prof.profiler.kineto_results.events()
                     if event.name() == "[memory]")
    live = peak = 0
    for _, change in changes:
        live += change
        peak = max(peak, live)
    return peak


def launches(prof) -> Counter:
    """bench/launches.py's count of the kernels ``prof``'s events launch on CUDA's path, by operator name (the
    ``aten::`` prefix dropped, as :func:`leaf_operators` names them)."""
    return Counter({name.removeprefix("aten::"): n for name, n in count_launches(prof.events()).items()})


def measure(model, questions, entry: dict, batch_size: int, max_new_tokens: int, path: str = "cpu",
            compiled: bool = False) -> tuple[Counter, int, int, float]:
    """(operator calls by name, peak live bytes, questions per call, positions computed: the language model's
    and :data:`VISION_POSITIONS` per encoded image) of one pass over ``questions`` with the variant ``entry``,
    its calls sized as a job sizes them: the variant first, then ``use_batch_size``; on ``path`` (``cpu``:
    :func:`leaf_operators`; ``cuda``: :func:`launches`), ``compiled`` layers after one whole uncounted pass that
    compiles every shape the pass meets."""
    settings = {**entry, "max_new_tokens": max_new_tokens} if entry.get("decoding") else entry
    model.use_variant(Variant.from_config(settings))
    per_call = model.use_batch_size(batch_size)
    with use_kernel(kernel_of(path)):
        if compiled:
            engine_pass(model, questions, per_call, lambda: None)
        else:
            model.score_yes_no(questions[:2])  # warm-up
        with Arithmetic(model) as arithmetic, profile(activities=[ProfilerActivity.CPU],
                                                      profile_memory=True) as prof:
            engine_pass(model, questions, per_call, lambda: None)
    return (leaf_operators(prof) if path == "cpu" else launches(prof)), peak_bytes(prof), per_call, arithmetic.total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regime", choices=("job", "gpu"), default="job",
                        help="job: --images images' questions (default 4); gpu: the device check's 16 images' "
                             "(the module's docstring); both size each decoding's calls as a job does")
    parser.add_argument("--images", type=int, default=None, help="images whose YN questions are asked "
                        "(default: 4; 16 with --regime gpu)")
    parser.add_argument("--layers", type=int, default=32, help="language layers (the vision tower's: 3/4 of them, "
                        "at least 1); LLaVA-1.5-7B: 32")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=8, help="tokens each decoding decodes per answer")
    parser.add_argument("--only", nargs="*", default=None, help="these decodings only (greedy is always run)")
    parser.add_argument("--breakdown", type=int, default=0, metavar="N",
                        help="also print the N operators each decoding calls most often beyond greedy (per prompt)")
    parser.add_argument("--opera-one-forward", action="store_true",
                        help="OPERA's step in one forward, as on CUDA (models/hf/on_device.py; the CPU runs two)")
    parser.add_argument("--path", choices=("cpu", "cuda"), default="cpu",
                        help="the engine as on the CPU (default) or as on CUDA, counted as bench/launches.py "
                             "counts launches (the module's docstring)")
    parser.add_argument("--ending", action="store_true",
                        help="answers end after their yes or no token, as an answer-trained model's do "
                             "(bench_scoring.make_ending; the random weights' answers never end early)")
    parser.add_argument("--smoke", action="store_true", help="1 image, 1 layer, 2 new tokens: checks the script runs")
    args = parser.parse_args()
    torch.manual_seed(0)
    RandomLlava7B.size = SMOKE if args.smoke else {
        **NARROW, "layers": args.layers, "vision_layers": max(1, args.layers * NARROW["vision_layers"] // 32)}
    images = 1 if args.smoke else args.images or (16 if args.regime == "gpu" else 4)
    if args.smoke:
        args.max_new_tokens = 2
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        processor_dir = build_tiny_llava(work / "processor", image_size=336, patch_size=14)
        model = RandomLlava7B("llava7b_narrow", str(processor_dir), dtype="float32", device="cpu",
                              local_files_only=True)
        make_decisive(model)
        if args.ending:
            make_ending(model)
        if args.path == "cuda":
            set_up(model, "cuda")  # as bench/launches.py counts CUDA's path (OPERA in one forward per step)
        if args.opera_one_forward:
            model.opera_one_forward = True  # CUDA's choice, made on the CPU as bench/launches.py makes CUDA's path
        questions = hico_like_questions(images, work / "yn")
        size = RandomLlava7B.size
        compiled = args.path == "cuda" and compiles_layers(torch.device("cuda"))
        print(f"{args.path} path (decoder layers {'compiled' if compiled else 'eager'}, OPERA in "
              f"{'one forward' if model.opera_one_forward else 'two forwards'} per step): "
              f"{size['layers']} language layers (hidden {size['hidden']}), {size['vision_layers']} vision layers, "
              f"576 image tokens; {len(questions)} YN questions on {images} images, batch {args.batch_size}, "
              f"calls sized per decoding (its variant first, then its batch), {args.max_new_tokens} new tokens "
              f"per decoded answer{', answers ending after their yes or no' if args.ending else ''}")
        figures, counts = {}, {}
        for slug, entry in DECODINGS.items():
            if args.only is not None and slug != "greedy" and slug not in args.only:
                continue
            operators, peak, per_call, positions = measure(model, questions, entry, args.batch_size,
                                                           args.max_new_tokens, args.path, compiled)
            counts[slug] = operators
            figures[slug] = (operators.total() / len(questions), peak, positions / len(questions))
            ops, base_peak = figures[slug][0], figures["greedy"][1]
            arithmetic = figures[slug][2]
            target = f"(target <= {TARGETS[slug]:g}x)" if slug in TARGETS else ""
            print(f"  {slug:11s} {ops:9.1f} ops/prompt {ops / figures['greedy'][0]:6.2f}x greedy   "
                  f"{arithmetic:7.1f} positions/prompt {arithmetic / figures['greedy'][2]:5.2f}x   "
                  f"peak {peak / 2**20:8.1f} MiB {peak / base_peak:6.2f}x greedy  calls of {per_call:4d}  {target}",
                  flush=True)
            if args.breakdown and slug != "greedy":
                beyond = (operators - counts["greedy"]).most_common(args.breakdown)
                print("      beyond greedy: " + ", ".join(f"{name} {n / len(questions):.1f}" for name, n in beyond))


if __name__ == "__main__":
    main()
