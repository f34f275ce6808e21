"""The engine vs transformers ``generate`` at batch 1 (the lmms-eval / VLMEvalKit default path, 5 new tokens) on
one device, same random-weight LLaVA-1.5-7B-size model (bench/gpu_scoring.py), same questions: prompts/s of
each, their ratio (on the same questions and on more images, where prefixes are shared across more
questions), the largest |P(yes)| difference and the decisions that agree; a random and a decisive model
(bench/bench_scoring.py's ``make_decisive``). The last line gives generate's rate for bench/projection.py.

    python bench/gen_vs_engine.py [--images 2] [--engine-images 16] [--dtype bfloat16|float32] [--smoke]
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

from bench_scoring import engine_pass, generate_batch1, hico_like_questions, make_decisive  # noqa: E402
from gpu_scoring import FULL, SMOKE, RandomLlava7B  # noqa: E402
from verbmirage.models.tiny import build_tiny_llava  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2, help="images whose questions both paths answer")
    parser.add_argument("--engine-images", type=int, default=16, help="images of the engine's larger pass")
    parser.add_argument("--max-prompts", type=int, default=None, help="at most this many questions in each pass")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16", help="float32: the paths must agree within 1e-4")
    parser.add_argument("--smoke", action="store_true", help="narrow model on the CPU: checks the script, not speed")
    args = parser.parse_args()
    cuda = not args.smoke
    device, dtype = ("cuda", args.dtype) if cuda else ("cpu", "float32")
    RandomLlava7B.size = FULL if cuda else SMOKE
    if cuda:  # exact float32 products: no TF32 in the vision tower's convolution or anywhere else
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    rates = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        processor = build_tiny_llava(work / "processor", image_size=336, patch_size=14)
        model = RandomLlava7B("llava7b_random", str(processor), dtype=dtype, device=device, local_files_only=True)
        for regime in ("random", "decisive"):
            if regime == "decisive":
                make_decisive(model)
            questions = hico_like_questions(args.images, work / regime)[: args.max_prompts]
            # the engine's warm-up: the first question of each of the first two images, so that its several-image
            # path (the images' prefixes stacked, the merge over them) compiles here on CUDA, not in a timed pass
            # (dynamic shapes: larger batches reuse it); this first call's time is the compiler's wait
            firsts = {}
            for question in questions:
                firsts.setdefault(question.image, question)
            start = time.perf_counter()
            model.score_yes_no(list(firsts.values())[:2])
            synchronize()
            print(f"{dtype} {regime}: the engine's first call {time.perf_counter() - start:.1f} s", flush=True)
            generate_batch1(model, questions[:2], 5)  # generate's warm-up
            synchronize()
            start = time.perf_counter()
            reference = generate_batch1(model, questions, 5)
            synchronize()
            generate = len(questions) / (time.perf_counter() - start)
            rates.append(generate)
            per_call = model.use_batch_size(args.batch_size)
            results, seconds = engine_pass(model, questions, per_call, synchronize)
            more = hico_like_questions(args.engine_images, work / f"{regime}_more")[: args.max_prompts]
            _, seconds_more = engine_pass(model, more, per_call, synchronize)
            difference = max(abs(result.p_yes - p_yes) for result, p_yes in zip(results, reference))
            agree = sum((result.p_yes >= 0.5) == (p_yes >= 0.5) for result, p_yes in zip(results, reference))
            same, larger = len(questions) / seconds, len(more) / seconds_more
            print(f"{dtype} {regime}: generate b1 {generate:.2f} prompts/s ({len(questions)} q) | engine same q "
                  f"{same:.1f} | engine {len(more)} q on {args.engine_images} img {larger:.1f} prompts/s | ratio "
                  f"{larger / generate:.1f}x (same-q {same / generate:.1f}x) | max|dP(yes)| {difference:.2e} | "
                  f"decisions agree {agree}/{len(questions)}", flush=True)
    if cuda:
        print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    print(f"generate rate: {min(rates):.3f} prompts/s")


if __name__ == "__main__":
    main()
