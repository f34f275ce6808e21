"""GPU benchmark (device machine): the engine on a random-weight model of LLaVA-1.5-7B size.

Builds LLaVA-1.5-7B's architecture (CLIP ViT-L/14-336 + a 7B Llama, 32 layers,
hidden 4096) directly on the GPU in bf16 with random weights (nothing to
download), then scores HICO-like yes/no questions (several per image) with
prefix reuse and batching, and prints prompts/s. Target: >= 250 prompts/s on
one H200.

    python bench/gpu_scoring.py [--images 64] [--batch-size 64]
    python bench/gpu_scoring.py --suite [--images 64] [--sized-batch 256]   # all five HICO sets: one set per
                                                        # call vs all sets of an image; (b) at the sized batch
    python bench/gpu_scoring.py --decodings [--images 64] [--decoding-images 16]   # each decoding, projections
    python bench/gpu_scoring.py --smoke --images 2      # on a CPU: checks the script runs

``--suite`` is bench/suite_scoring.py at LLaVA-1.5-7B size: the whole HICO suite (about 225K prompts with 4
MC rotations) must take at most 15 GPU-minutes on one H200, i.e. (b) >= 250 prompts/s.

``--sized-batch`` also times (b) at the batch the device's memory sizes (given here until the workflow's
sizing of batches from free memory can be asked for it) and counts the decisions that differ from batch
``--batch-size``'s (in bf16 a prompt's score depends on what it is batched with); ``--forward-cost N`` times (b)
at that batch on half the suite with its suffix batches cut at a forward cost of N token positions and at the
engine's default (fewer padded positions, more forwards: which pays depends on whether the GPU waits on
launches).

``--decodings`` makes the model decisive (bench/bench_scoring.py, ``make_decisive``: its first answer token
decides, as a trained model's does), times the whole suite greedily as a job answers it (continuations on),
then each decoding of the paper's tables on the YN questions of ``--decoding-images`` images (prompts/s, cost
relative to greedy on the same questions, peak GPU memory), each at the batch its job would use: the variant set
first, then the batch (``--decoding-batch``: sized from the free memory by default, as ``batch_size: auto``
does; until this code, every decoding ran in greedy's calls of four batches as one batch), and projects the whole HICO suite and the paper
config at those rates (bench/projection.py; the config's prompt mix from ``--mix``, which
bench/h200_wheels.sh writes into .whl/). The random weights never end an answer early, so each decoding decodes
all ``--max-new-tokens`` of every answer; ``--ending`` then runs each decoding again with the answers ending
after their yes or no, as a trained model's YN answers do (bench_scoring.make_ending).
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

from bench_scoring import (DECODINGS, Arithmetic, engine_pass, hico_like_questions,  # noqa: E402
                           make_decisive, make_ending)
from projection import projection_lines  # noqa: E402
from suite_scoring import all_sets_per_call, hico_suite, report, score_difference, time_both  # noqa: E402
from verbmirage.inference.sizing import AUTO, choose_batching  # noqa: E402
from verbmirage.variants.settings import Variant  # noqa: E402
from verbmirage.models.hf.families import LlavaVLM  # noqa: E402
from verbmirage.models.tiny import build_tiny_llava  # noqa: E402


# LLaVA-1.5-7B: CLIP ViT-L/14-336 + Llama-2-7B (Vicuna). `--smoke` shrinks the widths to check the script on a CPU.
FULL = {"vision_hidden": 1024, "vision_layers": 24, "vision_heads": 16, "hidden": 4096, "intermediate": 11008,
        "layers": 32, "heads": 32}
SMOKE = {"vision_hidden": 32, "vision_layers": 2, "vision_heads": 2, "hidden": 64, "intermediate": 128,
         "layers": 2, "heads": 4}


class RandomLlava7B(LlavaVLM):
    """LLaVA-1.5-7B geometry and width, random weights built directly on the device."""

    size = FULL

    def _load_model(self, path, load, attn_implementation):
        from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

        size, tokenizer_size = self.size, len(self.processor.tokenizer)
        vision = CLIPVisionConfig(hidden_size=size["vision_hidden"], intermediate_size=4 * size["vision_hidden"],
                                  num_hidden_layers=size["vision_layers"], num_attention_heads=size["vision_heads"],
                                  image_size=336, patch_size=14, projection_dim=768)
        text = LlamaConfig(vocab_size=max(32064, tokenizer_size), hidden_size=size["hidden"],
                           intermediate_size=size["intermediate"], num_hidden_layers=size["layers"],
                           num_attention_heads=size["heads"], num_key_value_heads=size["heads"],
                           max_position_embeddings=4096, pad_token_id=self.processor.tokenizer.pad_token_id)
        config = LlavaConfig(vision_config=vision, text_config=text,
                             image_token_index=self.processor.tokenizer.convert_tokens_to_ids("<image>"),
                             image_seq_length=576, vision_feature_layer=-2)
        with torch.device(self.device):
            model = LlavaForConditionalGeneration(config).to(self.dtype)
        return model


def decodings(model, work: Path, args, dtype: str, parameters: float, synchronize) -> None:
    """The whole suite greedily (a job's way: all sets of an image per call, continuations on), each decoding
    on the YN questions, and the projected run times at those rates."""
    import json

    make_decisive(model)
    cuda = torch.cuda.is_available() and next(model.model.parameters()).is_cuda
    suite = hico_suite(args.images, work)[: args.max_prompts]
    print(f"{parameters:.2f}B parameters, {dtype}, decisive (output layer biased to yes/no)")
    all_sets_per_call(model, suite[:8], args.batch_size)  # warm-up
    synchronize()
    start = time.perf_counter()
    all_sets_per_call(model, suite, args.batch_size)
    synchronize()
    suite_rate = len(suite) / (time.perf_counter() - start)
    print(f"whole suite, greedy ({len(suite)} prompts of 5 sets on {args.images} images): {suite_rate:8.1f} prompts/s")
    questions = hico_like_questions(args.decoding_images, work / "yn")[: args.max_prompts]
    print(f"decodings ({len(questions)} YN questions, {args.max_new_tokens} new tokens per decoded answer; "
          f"each at the batch {'its job sizes' if args.decoding_batch == AUTO else args.decoding_batch}, "
          "set after its variant as a job does):")
    mix = json.loads(args.mix.read_text()) if args.mix.is_file() else None

    def project(seconds: dict[str, float]) -> None:  # the projection at each decoding's cost over greedy
        costs = {slug: seconds[slug] / seconds["greedy"] for slug in seconds}
        for line in projection_lines(suite_rate, costs, mix, args.generate_rate):
            print(line)

    project(decoding_passes(model, questions, args, synchronize, cuda))
    if cuda:
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB (the last decoding's)")
    if args.ending:
        make_ending(model)
        print("decodings again, the answers ending after their yes or no as a trained model's do "
              "(bench_scoring.make_ending):")
        seconds = decoding_passes(model, questions, args, synchronize, cuda)
        print("the projection again at these costs (answers ending as a trained model's):")
        project(seconds)


def decoding_passes(model, questions, args, synchronize, cuda: bool) -> dict[str, float]:
    """Each decoding's pass over ``questions`` at the batch its job would use, printed with its cost and its
    arithmetic over greedy's and its peak memory; returns each decoding's seconds."""
    seconds, positions = {}, {}  # each decoding's time, and its arithmetic (bench_scoring.Arithmetic)
    for slug, entry in DECODINGS.items():
        settings = {**entry, "max_new_tokens": args.max_new_tokens} if entry.get("decoding") else entry
        model.use_variant(Variant.from_config(settings))
        batching = choose_batching(model, args.decoding_batch, None, [str(q.image) for q in questions])
        model.score_yes_no(questions[:2])  # warm-up
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        with Arithmetic(model) as arithmetic:
            _, seconds[slug] = engine_pass(model, questions, batching.per_call, synchronize)
        positions[slug] = arithmetic.total
        memory = f"{torch.cuda.max_memory_allocated() / 2**30:6.1f} GiB peak" if cuda else ""
        print(f"  {slug:11s} batch {batching.batch_size:4d} (calls of {batching.per_call:4d})  "
              f"{len(questions) / seconds[slug]:8.1f} prompts/s  {seconds[slug] / seconds['greedy']:6.2f}x greedy  "
              f"arithmetic {positions[slug] / positions['greedy']:5.2f}x  {memory}")
    return seconds


def timed_suite(model, suite, batch_size: int, synchronize) -> tuple[dict, float, float]:
    """(b) at ``batch_size``: (results, prompts/s, token positions per prompt: bench_scoring.Arithmetic)."""
    with Arithmetic(model) as arithmetic:
        synchronize()
        start = time.perf_counter()
        results = all_sets_per_call(model, suite, batch_size)
        synchronize()
    return results, len(suite) / (time.perf_counter() - start), arithmetic.total / len(suite)


def sized_batch(model, suite, batch_size: int, reference: dict, reference_batch: int, synchronize) -> None:
    """(b) at ``batch_size`` (the device-sized batch): prompts/s, positions per prompt, and the decisions that
    differ from ``reference`` (the same pass at ``reference_batch``)."""
    results, rate, positions = timed_suite(model, suite, batch_size, synchronize)
    flipped = sum(results[key].prediction != reference[key].prediction for key in reference)
    print(f"(b) at the sized batch {batch_size}:  {rate:8.2f} prompts/s ({model.use_batch_size(batch_size)} questions "
          f"per call; {positions:.1f} positions per prompt, forward cost {model.prefix_cache.BATCH_COST}); "
          f"decisions differing from batch {reference_batch}: {flipped} of {len(reference)}; "
          f"max |score difference| {score_difference(reference, results):.2e}")


def forward_costs(model, suite, batch_size: int, cost: int, synchronize) -> None:
    """(b) at ``batch_size`` on the first half of ``suite``, its suffix batches cut at a forward cost of ``cost``
    token positions and at the engine's own (on CUDA models/hf/on_device.py's CUDA_FORWARD_COST;
    ``VERBMIRAGE_FORWARD_COST`` sets it for a job): prompts/s and positions per prompt of each, the new cost
    warmed up first (untimed, on a few prompts) and timed first, and the decisions that differ between them."""
    cache, half = model.prefix_cache, suite[: max(1, len(suite) // 2)]
    default = cache.BATCH_COST
    passes = {}
    for value in (cost, default):
        cache.BATCH_COST = cache.HEADER_SAVING = value
        try:
            all_sets_per_call(model, half[:16], batch_size)  # new shapes compile here, not while timed
            passes[value] = timed_suite(model, half, batch_size, synchronize)
        finally:
            cache.BATCH_COST = cache.HEADER_SAVING = default
    flipped = sum(passes[cost][0][key].prediction != passes[default][0][key].prediction for key in passes[default][0])
    for value in (default, cost):
        _, rate, positions = passes[value]
        print(f"(b) at batch {batch_size}, forward cost {value:5d}: {rate:8.2f} prompts/s ({positions:.1f} positions "
              f"per prompt; {len(half)} prompts)")
    print(f"decisions differing between forward costs {default} and {cost}: {flipped} of {len(half)}")


def _batch_size(value: str) -> int | str:
    return value if value == AUTO else int(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--smoke", action="store_true", help="narrow model on the CPU: checks the script, not speed")
    parser.add_argument("--suite", action="store_true", help="all HICO sets: one set per call vs all sets of an image")
    parser.add_argument("--decodings", action="store_true", help="each decoding's cost and the projected run times")
    parser.add_argument("--decoding-images", type=int, default=16, help="images whose YN questions each decoding answers")
    parser.add_argument("--max-new-tokens", type=int, default=8, help="tokens each decoding decodes per answer")
    parser.add_argument("--decoding-batch", type=_batch_size, default=AUTO,
                        help="each decoding's batch: 'auto' (default) sizes it from the device's free memory as its "
                        "job does (64 on the CPU), or a number")
    parser.add_argument("--max-prompts", type=int, default=None,
                        help="--suite/--decodings: at most this many of the suite's prompts and of the YN questions "
                             "(the smoke check)")
    parser.add_argument("--sized-batch", type=int, default=256,
                        help="--suite: (b) also at this batch (the size the device's memory gives; 0: not timed)")
    parser.add_argument("--forward-cost", type=int, default=None,
                        help="--suite: (b) at the sized batch on half the suite, its suffix batches cut at this "
                             "forward cost (token positions; VERBMIRAGE_FORWARD_COST) and at the engine's")
    parser.add_argument("--generate-rate", type=float, default=None,
                        help="--decodings: prompts/s of generate at batch 1 (bench/gen_vs_engine.py), to project the "
                             "remote-code models one question at a time")
    parser.add_argument("--ending", action="store_true",
                        help="--decodings: then each decoding again with the answers ending after their yes or no, "
                             "as a trained model's do (bench_scoring.make_ending)")
    parser.add_argument("--mix", type=Path, default=Path(__file__).resolve().parents[1] / ".whl" / "paper_mix.json",
                        help="the paper config's prompts per decoding (bench/projection.py --write)")
    args = parser.parse_args()
    device, dtype = ("cpu", "float32") if args.smoke else ("cuda", "bfloat16")
    RandomLlava7B.size = SMOKE if args.smoke else FULL
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        processor_dir = build_tiny_llava(work / "processor", image_size=336, patch_size=14)
        model = RandomLlava7B("llava7b_random", str(processor_dir), dtype=dtype, device=device,
                              local_files_only=True)
        parameters = sum(p.numel() for p in model.model.parameters()) / 1e9
        if args.decodings:
            decodings(model, work, args, dtype, parameters, synchronize)
            return
        if args.suite:
            model.continue_tokens = 0  # the scoring pass (see bench/suite_scoring.py)
            suite = hico_suite(args.images, work)[: args.max_prompts]
            print(f"{parameters:.2f}B parameters, {dtype}")
            model.score_yes_no([q for s, q in suite if s == "yn_obj"][:2])  # warm-up
            timing = time_both(model, suite, args.batch_size, synchronize)
            report(len(suite), args.images, timing, args.batch_size, model.use_batch_size(args.batch_size))
            if args.sized_batch and args.sized_batch != args.batch_size:
                sized_batch(model, suite, args.sized_batch, timing.results, args.batch_size, synchronize)
            if args.forward_cost is not None:
                forward_costs(model, suite, args.sized_batch or args.batch_size, args.forward_cost, synchronize)
            if device == "cuda":
                print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
            return
        questions = hico_like_questions(args.images, work)
        print(f"{parameters:.2f}B parameters, {len(questions)} questions on {args.images} images")
        per_call = model.use_batch_size(args.batch_size)  # as the workflow's jobs size their calls
        model.score_yes_no(questions[:per_call])  # warm-up
        synchronize()
        model.forget_prefixes()
        start = time.perf_counter()
        for i in range(0, len(questions), per_call):
            model.score_yes_no(questions[i : i + per_call])
        synchronize()
        seconds = time.perf_counter() - start
    memory = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    print(f"engine, {dtype}, prefix reuse: {len(questions) / seconds:.1f} prompts/s (peak memory {memory:.1f} GiB)")


if __name__ == "__main__":
    main()
