"""Benchmark: the scoring engine vs Hugging Face ``generate`` at batch 1.

(a) is the default path of lmms-eval and VLMEvalKit: one question at a time,
``generate`` a short answer (``--new-tokens``, 5 by default) and read the
first token's scores; (b) is our engine (prefix reuse + length-sorted
batches). Both score the same questions on the same random-weight model with
LLaVA-1.5 geometry (336 px, patch 14 -> 576 image tokens; narrow layers so it
runs on a CPU), several questions per image as in HICO. Prints prompts/s of
both, their ratio, and the largest P(yes) difference between the two paths.

    python bench/bench_scoring.py [--images 12] [--device cpu] [--dtype float32]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from verbmirage.data.demo import DemoSizes, write_demo_hico  # noqa: E402
from verbmirage.data.hico import load_hico  # noqa: E402
from verbmirage.models import Question, create_model  # noqa: E402
from verbmirage.benchmark.questions import QuestionSettings, build_question_set  # noqa: E402
from verbmirage.models.tiny import build_tiny_llava  # noqa: E402


def hico_like_questions(n_images: int, work: Path) -> list[Question]:
    """yn_obj + yn_verb questions of the first ``n_images`` demo images (~10 per image, as in HICO)."""
    write_demo_hico(work / "hico", work / "det", DemoSizes(train=50, test=n_images * 2))
    anno = load_hico(work / "hico")
    questions = []
    for qset in ("yn_obj", "yn_verb"):
        table = build_question_set(anno, qset, QuestionSettings())
        questions += [row for row in table.itertuples()]
    images = sorted({row.image for row in questions})[:n_images]
    rng = np.random.default_rng(0)
    paths = {}
    for image in images:
        path = work / f"{Path(image).stem}.png"
        Image.fromarray(rng.integers(0, 255, (336, 448, 3), dtype=np.uint8)).save(path)
        paths[image] = path
    chosen = [row for row in questions if row.image in paths]
    chosen.sort(key=lambda row: row.image)
    return [Question(row.question_id, row.prompt, image=paths[row.image]) for row in chosen]


def generate_batch1(model, questions: list[Question], new_tokens: int) -> list[float]:
    """The harness path: one question at a time, generate, P(yes) from the first generated token's scores."""
    p_yes = []
    for question in questions:
        encoded = model.encode([model.render(question, False)], [model.open_image(question.image)])
        with torch.inference_mode():
            output = model.model.generate(
                **encoded, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                output_scores=True, return_dict_in_generate=True,
            )
        probs = torch.softmax(output.scores[0][0].float(), dim=-1).cpu()
        yes, no = probs[model._yes_ids].sum(), probs[model._no_ids].sum()
        p_yes.append(float(yes / (yes + no)))
    return p_yes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=12)
    parser.add_argument("--new-tokens", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        path = build_tiny_llava(work / "llava336", image_size=336, patch_size=14, hidden_size=128, layers=4)
        model = create_model(
            "bench", {"backend": "llava", "path": str(path), "device": args.device, "dtype": args.dtype,
                      "local_files_only": True},
        )
        questions = hico_like_questions(args.images, work)
        print(f"{len(questions)} questions on {args.images} images "
              f"({len(questions) / args.images:.1f} per image), 576 image tokens, device {args.device}")
        model.score_yes_no(questions[:2])  # warm-up

        start = time.perf_counter()
        reference = generate_batch1(model, questions, args.new_tokens)
        generate_seconds = time.perf_counter() - start

        model.forget_prefixes()
        start = time.perf_counter()
        results = []
        for i in range(0, len(questions), args.batch_size):
            results += model.score_yes_no(questions[i : i + args.batch_size])
        engine_seconds = time.perf_counter() - start

    generate_rate, engine_rate = len(questions) / generate_seconds, len(questions) / engine_seconds
    difference = max(abs(r.p_yes - p) for r, p in zip(results, reference))
    print(f"generate, batch 1, {args.new_tokens} new tokens: {generate_rate:8.2f} prompts/s")
    print(f"engine (prefix reuse, batched):        {engine_rate:8.2f} prompts/s")
    print(f"ratio engine / generate:               {engine_rate / generate_rate:8.2f}x")
    print(f"max |P(yes) difference|:               {difference:.2e}")


if __name__ == "__main__":
    main()
