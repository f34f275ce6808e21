"""Benchmark: each mitigation variant's prompts/s beside the default's on the CPU proxy model.

The demo's HICO question sets on the first ``--images`` demo images, scored by the random-weight model
with LLaVA-1.5 geometry (336 px, patch 14 -> 576 image tokens; narrow layers so it runs on a CPU), once
per variant of the demo config (greedy default, beam5, sampling, sampling+VCD, VCD+beam, OPERA, prompt suffix).
Prints prompts/s of each and its ratio to the default measured in the same run (beam search and
sampling decode every answer, VCD runs a second, noised stream: ratios below 1 are the price).

    python bench/variant_decoding.py [--images 4] [--batch-size 64] [--max-new-tokens 4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from suite_scoring import all_sets_per_call, hico_suite  # noqa: E402

from verbmirage.models import create_model  # noqa: E402
from verbmirage.models.tiny import build_tiny_llava  # noqa: E402
from verbmirage.variants.settings import PAPER_PROMPT_SUFFIX, Variant  # noqa: E402


def variants(max_new_tokens: int) -> dict[str, Variant]:
    """The demo's variants (config.yaml), with ``max_new_tokens`` per decoded answer."""
    entries = {
        "default": {},
        "beam5": {"decoding": "beam", "num_beams": 5},
        "sample": {"decoding": "sample"},
        "sample_vcd": {"decoding": "sample", "vcd": {}},
        "vcd_beam": {"decoding": "beam", "vcd": {}},
        "opera": {"decoding": "opera", "num_beams": 2, "opera": {"num_attn_candidates": 2}},  # the demo's settings
        "verb_prompt": {"prompt_suffix": PAPER_PROMPT_SUFFIX},
    }
    return {slug: Variant.from_config({**entry, "max_new_tokens": max_new_tokens} if entry.get("decoding") else entry)
            for slug, entry in entries.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        path = build_tiny_llava(work / "llava336", image_size=336, patch_size=14, hidden_size=128, layers=4)
        model = create_model("bench", {"backend": "llava", "path": str(path), "device": args.device,
                                       "local_files_only": True})
        model.continue_tokens = args.max_new_tokens
        suite = hico_suite(args.images, work)
        all_sets_per_call(model, suite[:8], args.batch_size)  # warm-up
        rates = {}
        for slug, variant in variants(args.max_new_tokens).items():
            model.use_variant(variant)
            model.forget_prefixes()
            start = time.perf_counter()
            all_sets_per_call(model, suite, args.batch_size)
            rates[slug] = len(suite) / (time.perf_counter() - start)
    print(f"{len(suite)} prompts (5 HICO sets) on {args.images} images, {args.max_new_tokens} new tokens per answer")
    for slug, rate in rates.items():
        print(f"{slug:12s} {rate:8.2f} prompts/s   {rate / rates['default']:5.2f}x default")


if __name__ == "__main__":
    main()
