"""Benchmark: the whole HICO question suite, one set per call vs all sets of an image in one call.

The demo's five HICO question sets (yn_obj, yn_verb, mc_obj, mc_verb, obj_exist; MC in every rotation) on
the first ``--images`` demo images, scored by a random-weight model with LLaVA-1.5 geometry (336 px,
patch 14 -> 576 image tokens; narrow layers so it runs on a CPU):

(a) one set per call, as the workflow's per-set jobs did: each set scored on its own, image-sorted
    batches, so every image's prefix is computed once per set;
(b) all sets of an image in one call (``inference.score_questions``, image-major batches), as the
    ``predict_suite`` job does: each image's prefix once for all sets.

Prints prompts/s of both (each its best run), ``suite ratio`` (b over a: the median of ``--repeats`` pairs
of runs, back to back), the largest score difference between the paths and the process's peak memory, for
each ``--batch-size``: the config's ``batch_size`` (rows per forward), default 64 as ``configs/paper.yaml``
gives LLaVA-1.5-7B. Both paths size their calls as the workflow does (``use_batch_size``: a greedy
LLaVA call holds 4 batches' worth of questions). The ratio grows with the call: a bigger call of (b) holds
more images, whose prefixes then run in fewer, fuller forwards and whose suffixes are cut into fuller
batches, while (a) still computes each image's prefix once per set it is in.
``--continue-tokens`` 0 (default) times the scoring pass only: decoding past an undecided first token is the
same work in both paths.

    python bench/suite_scoring.py [--images 12] [--batch-size 64 [256 ...]] [--device cpu] [--repeats 5]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from verbmirage.data.demo import DemoSizes, write_demo_hico  # noqa: E402
from verbmirage.data.hico import load_hico  # noqa: E402
from verbmirage.inference.runs import suite_order  # noqa: E402
from verbmirage.models.base import score_questions
from verbmirage.models import Question, create_model  # noqa: E402
from verbmirage.benchmark.questions import QuestionSettings, build_question_set  # noqa: E402
from verbmirage.benchmark.question_sets import question_kind  # noqa: E402
from verbmirage.models.tiny import build_tiny_llava  # noqa: E402

HICO_SETS = ("yn_obj", "yn_verb", "mc_obj", "mc_verb", "obj_exist")


def hico_suite(n_images: int, work: Path) -> list[tuple[str, Question]]:
    """(qset, question) of every HICO set on the first ``n_images`` demo images, image-major."""
    import pandas as pd

    write_demo_hico(work / "hico", work / "det", DemoSizes(train=50, test=max(40, n_images * 2)))
    anno = load_hico(work / "hico")
    table = pd.concat([build_question_set(anno, qset, QuestionSettings()) for qset in HICO_SETS],
                      ignore_index=True)
    images = sorted(set(table.image))[:n_images]
    rng = np.random.default_rng(0)
    paths = {}
    for image in images:
        paths[image] = work / f"{Path(image).stem}.png"
        Image.fromarray(rng.integers(0, 255, (336, 448, 3), dtype=np.uint8)).save(paths[image])
    table = suite_order(table[table.image.isin(paths)])
    return [(row.qset, Question(row.question_id, row.prompt, image=paths[row.image],
                                options=tuple(row.options) if row.options is not None else ()))
            for row in table.itertuples()]


def one_set_per_call(model, suite: list[tuple[str, Question]], batch_size: int) -> dict:
    """(a) Each set on its own (a fresh job each: no prefix carried over), image-sorted calls."""
    results = {}
    per_call = model.use_batch_size(batch_size)  # as inference.predict sizes its calls
    for qset in HICO_SETS:
        questions = [q for s, q in suite if s == qset]
        score = model.score_multiple_choice if question_kind(qset) == "mc" else model.score_yes_no
        model.forget_prefixes()
        for start in range(0, len(questions), per_call):
            chunk = questions[start : start + per_call]
            results.update(zip([q.question_id for q in chunk], score(chunk)))
    return results


def all_sets_per_call(model, suite: list[tuple[str, Question]], batch_size: int) -> dict:
    """(b) Image-major calls mixing every set: each image's prefix once."""
    results = {}
    per_call = model.use_batch_size(batch_size)  # as inference.predict_suite sizes its calls
    model.forget_prefixes()
    for start in range(0, len(suite), per_call):
        chunk = suite[start : start + per_call]
        questions = [q for _, q in chunk]
        flags = [question_kind(s) == "mc" for s, _ in chunk]
        results.update(zip([q.question_id for q in questions], score_questions(model, questions, flags)))
    return results


def score_difference(a: dict, b: dict) -> float:
    """Largest difference of P(yes) or an option probability between the two paths."""
    largest = 0.0
    for question_id, first in a.items():
        second = b[question_id]
        x = first.option_probs if hasattr(first, "option_probs") else (first.p_yes,)
        y = second.option_probs if hasattr(second, "option_probs") else (second.p_yes,)
        largest = max(largest, float(np.max(np.abs(np.subtract(x, y)))))
    return largest


def peak_memory_mib() -> float:
    """Peak resident memory of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class Timing:
    """prompts/s of (a) and (b), each the best of its runs, and the suite ratio: the median over the runs of
    (a)'s time over (b)'s in the same pair of runs. This machine's speed drifts by +-20% within a minute, so
    the best (a) and the best (b) may come from different moments; a pair run back to back does not."""

    per_set: float
    together: float
    ratios: list[float]
    difference: float
    results: dict  # (b)'s results of the last run, by question id

    @property
    def ratio(self) -> float:
        return float(np.median(self.ratios))


def time_both(model, suite, batch_size: int, synchronize=lambda: None, repeats: int = 1) -> Timing:
    """``repeats`` pairs of runs of (a) and (b), back to back, in alternating order (a drift in speed then
    favours neither), and the largest score difference between the paths."""
    per_set_seconds, together_seconds, ratios = [], [], []
    for repeat in range(repeats):
        seconds = {}
        for name in (("a", "b") if repeat % 2 == 0 else ("b", "a")):
            synchronize()
            start = time.perf_counter()
            if name == "a":
                per_set = one_set_per_call(model, suite, batch_size)
            else:
                together = all_sets_per_call(model, suite, batch_size)
            synchronize()
            seconds[name] = time.perf_counter() - start
        per_set_seconds.append(seconds["a"])
        together_seconds.append(seconds["b"])
        ratios.append(seconds["a"] / seconds["b"])
    return Timing(len(suite) / min(per_set_seconds), len(suite) / min(together_seconds), ratios,
                  score_difference(per_set, together), together)


def report(n_prompts: int, n_images: int, timing: Timing, batch_size: int | None = None,
           per_call: int | None = None) -> None:
    calls = "" if batch_size is None else f", batch {batch_size}, {per_call or batch_size} questions per call"
    print(f"{n_prompts} prompts of {len(HICO_SETS)} sets on {n_images} images ({n_prompts / n_images:.1f} per image"
          f"{calls})")
    print(f"(a) one set per call:          {timing.per_set:8.2f} prompts/s")
    print(f"(b) all sets of an image:      {timing.together:8.2f} prompts/s")
    print(f"suite ratio (b / a):           {timing.ratio:8.2f}x (median of {len(timing.ratios)} back-to-back pairs: "
          + ", ".join(f"{ratio:.2f}" for ratio in sorted(timing.ratios)) + ")")
    print(f"max |score difference|:        {timing.difference:.2e}")
    print(f"peak memory:                   {peak_memory_mib():8.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=12)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[64],
                        help="the config's batch_size (both paths); several values: one report each")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--continue-tokens", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5,
                        help="pairs of runs of (a) and (b); rates: the best run, ratio: the median pair")
    parser.add_argument("--hidden-size", type=int, default=128, help="width of the vision tower and language model")
    parser.add_argument("--layers", type=int, default=4, help="layers of the vision tower and language model")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        path = build_tiny_llava(work / "llava336", image_size=336, patch_size=14, hidden_size=args.hidden_size,
                                layers=args.layers)
        model = create_model("bench", {"backend": "llava", "path": str(path), "device": args.device,
                                       "dtype": args.dtype, "local_files_only": True})
        model.continue_tokens = args.continue_tokens
        suite = hico_suite(args.images, work)
        model.score_yes_no([q for s, q in suite if s == "yn_obj"][:2])  # warm-up
        for size in args.batch_size:  # each report as soon as its size is timed
            timing = time_both(model, suite, size, repeats=args.repeats)
            report(len(suite), args.images, timing, size, model.use_batch_size(size))


if __name__ == "__main__":
    main()
