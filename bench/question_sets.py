"""Benchmark: the five HICO question sets from a full ``anno.mat`` (the paper's test split).

Times reading ``anno.mat``, each set built on its own (``build_question_set``, as one workflow job builds
one set), and the five sets built together (``build_question_sets``: the label sets of every image read
once), in one process and split over ``--workers`` forked processes (default: one per CPU, as the workflow's
question job does); the target is at most 10 s for loading plus the five sets on 2 CPU cores. ``--baseline`` also
builds the sets with the slow, obvious builder the tests use as oracle (tests/question_reference.py: one
pass per set, label sets read again per set, one dict per row, ids through json.dumps), prints the speed-up
against it and checks the tables are equal.

    python bench/question_sets.py ../shared/data/hico_20150920 [--baseline]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))

import pandas as pd  # noqa: E402

from verbmirage.data.hico import load_hico  # noqa: E402
from verbmirage.benchmark.questions import (  # noqa: E402
    QuestionSettings,
    build_question_set,
    build_question_sets,
    image_shares,
)

HICO_SETS = ("yn_obj", "yn_verb", "mc_obj", "mc_verb", "obj_exist")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="the hico_20150920 folder (with anno.mat)")
    parser.add_argument("--baseline", action="store_true", help="also time the reference builder (slow)")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                        help="processes for the split build (default: the CPUs this process may use)")
    args = parser.parse_args()
    settings = QuestionSettings()

    start = time.perf_counter()
    anno = load_hico(args.root)
    load = time.perf_counter() - start
    print(f"load anno.mat: {load:.2f} s ({len(anno.images['test'])} test images)")
    for qset in HICO_SETS:
        start = time.perf_counter()
        rows = len(build_question_set(anno, qset, settings))
        print(f"  {qset:10s} alone: {time.perf_counter() - start:6.2f} s  {rows:6d} rows")
    start = time.perf_counter()
    tables = build_question_sets(anno, HICO_SETS, settings)
    together = time.perf_counter() - start
    print(f"five sets together, one process: {together:.2f} s (load + sets: {load + together:.2f} s)")
    start = time.perf_counter()
    split = build_question_sets(anno, HICO_SETS, settings, workers=args.workers)
    shared = time.perf_counter() - start
    for qset in HICO_SETS:
        pd.testing.assert_frame_equal(split[qset], tables[qset], check_exact=True)
    used = len(image_shares(list(range(len(anno.images["test"]))), args.workers))  # processes building the sets
    print(f"five sets together, {used} worker(s): {shared:.2f} s (tables equal; ratio {together / shared:.2f}x)")
    print(f"total (load + five sets on {used} worker(s)): {load + shared:.2f} s (target <= 10 s)")

    if args.baseline:
        from question_reference import reference_question_set

        start = time.perf_counter()
        for qset in HICO_SETS:
            pd.testing.assert_frame_equal(tables[qset], reference_question_set(anno, qset), check_exact=True)
        reference = time.perf_counter() - start
        print(f"reference builder, five sets: {reference:.2f} s (tables equal)")
        print(f"speed-up (reference / together): {reference / together:.1f}x")


if __name__ == "__main__":
    main()
