#!/usr/bin/env python
"""Smoke test of the remote-code models with their real weights, against stored goldens.

    .venv/bin/python tools/remote_smoke.py --config configs/paper.yaml --images DIR \
        [--goldens goldens/remote_smoke.json] [--models mplug_owl2,molmo_7b_d] [--update]

Runs every remote-code model entry of the config (or those named) on the first
``--count`` images of DIR: one yes/no and one multiple-choice question per
image, scored from logits, and a short decoded answer. The first run of a model
stores its answers, P(yes), option probabilities and fingerprint (revision,
checkpoint code, worker env versions) as goldens; later runs compare with them
and print every difference, with what changed in the fingerprint. Run it
again after any change of a worker env or a revision; ``--update`` stores the
new answers once you accept them. Exit status: 0 when everything matches or was
stored, 1 on a difference or a failure. Run it where the models run (a GPU
node: the entries' ``device``, e.g. in an ``srun`` or ``sbatch`` job).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from verbmirage.workflow.config import check_yaml_file  # noqa: E402
from verbmirage.models.smoke import DEFAULT_MAX_NEW_TOKENS, DEFAULT_TOLERANCE, run_smoke  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="config with the model entries (e.g. configs/paper.yaml)")
    parser.add_argument("--images", required=True, help="folder of images (the first --count by name are used)")
    parser.add_argument("--goldens", default="goldens/remote_smoke.json", help="goldens file (JSON)")
    parser.add_argument("--models", default="", help="comma-separated model slugs (default: every remote model)")
    parser.add_argument("--update", action="store_true", help="store this run's answers as the new goldens")
    parser.add_argument("--count", type=int, default=4, help="number of images (default 4)")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help=f"largest accepted change of a probability (default {DEFAULT_TOLERANCE})")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    args = parser.parse_args(argv)
    config = check_yaml_file(args.config)
    only = [slug.strip() for slug in args.models.split(",") if slug.strip()] or None

    def log(message):
        print(message, file=sys.stderr, flush=True)

    try:
        reports = run_smoke(config, args.images, args.goldens, update=args.update, only=only, count=args.count,
                            tolerance=args.tolerance, max_new_tokens=args.max_new_tokens, log=log)
    except (FileNotFoundError, ValueError) as error:
        print(f"remote_smoke: {error}", file=sys.stderr)
        return 2
    for report in reports:
        print(report.render(args.goldens))
    return 0 if all(report.ok for report in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
