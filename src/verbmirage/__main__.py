"""Command line: run pieces of the workflow by hand, outside Snakemake.

``python -m verbmirage predict --questions Q --images DIR --model-name SLUG
--model '{"backend": "prior"}' --output OUT [--shard 0 --shards 4]`` answers
one shard of one question set (same parts, same resume as a workflow job),
which helps to debug one model or one shard. ``predict-suite --questions
A.parquet B.parquet ...`` answers every set on one image shard as the
workflow's ``predict_suite`` rule does (one folder, ``<qset>.parquet`` per set).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from pathlib import Path

from verbmirage.inference import MAX_ERROR_SHARE, run_shard, run_suite


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verbmirage", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    predict = commands.add_parser("predict", help="answer one shard of a question set")
    predict.add_argument("--questions", required=True, help="question set Parquet")
    predict.add_argument("--images", required=True, help="image-condition folder (with manifest.parquet)")
    predict.add_argument("--model-name", required=True, help="the model's slug")
    predict.add_argument("--model", required=True, help="the model's config entry as JSON")
    predict.add_argument("--variant", default="{}", help="the variant's settings as JSON")
    predict.add_argument("--output", required=True, help="shard output Parquet")
    predict.add_argument("--shard", type=int, default=0)
    predict.add_argument("--shards", type=int, default=1)
    predict.add_argument("--train-stats", default=None)
    predict.add_argument("--batch-size", type=int, default=16)
    predict.add_argument("--part-size", type=int, default=512)
    predict.add_argument("--condition", default="null", help="the image condition's settings as JSON")
    predict.add_argument("--max-error-share", type=float, default=MAX_ERROR_SHARE,
                         help="fail when more than this share of questions end as errors")
    suite = commands.add_parser("predict-suite", help="answer every question set on one image shard")
    suite.add_argument("--questions", required=True, nargs="+", help="question set Parquet files (<qset>.parquet)")
    for argument in ("--images", "--model-name", "--model", "--output"):
        suite.add_argument(argument, required=True)
    suite.add_argument("--variant", default="{}")
    suite.add_argument("--shard", type=int, default=0)
    suite.add_argument("--shards", type=int, default=1)
    suite.add_argument("--train-stats", default=None)
    suite.add_argument("--batch-size", type=int, default=16)
    suite.add_argument("--part-size", type=int, default=512)
    suite.add_argument("--condition", default="null")
    suite.add_argument("--max-error-share", type=float, default=MAX_ERROR_SHARE)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "predict-suite":
        counts = run_suite(
            {Path(path).stem: path for path in args.questions}, args.images, args.model_name,
            json.loads(args.model), json.loads(args.variant), args.shard, args.shards, args.output,
            train_stats=args.train_stats, batch_size=args.batch_size, part_size=args.part_size,
            condition_settings=json.loads(args.condition), max_error_share=args.max_error_share,
        )
        print(f"{sum(counts.values())} predictions of {len(counts)} sets written to {args.output}")
        return 0
    frame = run_shard(
        args.questions, args.images, args.model_name, json.loads(args.model), json.loads(args.variant),
        args.shard, args.shards, args.output, train_stats=args.train_stats,
        batch_size=args.batch_size, part_size=args.part_size,
        condition_settings=json.loads(args.condition), max_error_share=args.max_error_share,
    )
    print(f"{len(frame)} predictions written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
