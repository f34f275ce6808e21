#!/usr/bin/env python3
"""Compare the artifact trees of two finished runs: every file under ``results/`` and ``resources/``.

Files are compared byte for byte (links by target), except each inference shard's resume fingerprint
(``fingerprint.json``: it names weight files by modification time and the code that answered), the report's
page of the run's facts (``run_facts.html``: the run's folders, the pipeline's commit) and the content cache of
the data's files (``resources/cache/``: keyed by where the data lies). Use it to check
that a change of the code leaves every table and figure as it was, or that two machines agree::

    .venv/bin/python tools/compare_runs.py RUN_A RUN_B

Prints one line per file that differs, is missing from RUN_B or is extra in it, then a summary; exit status 0
when the trees are identical.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kill_anywhere  # noqa: E402  (tools/ is not a package)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("first", type=Path, help="a finished run's working directory (the reference)")
    parser.add_argument("second", type=Path, help="another finished run's working directory")
    args = parser.parse_args(argv)
    for folder in (args.first, args.second):
        if not folder.is_dir():
            parser.error(f"{folder}: not a folder")
    reference, other = kill_anywhere.tree(args.first), kill_anywhere.tree(args.second)
    differences = kill_anywhere.compare(reference, other)
    for line in differences:
        print(line)
    tables = sum(name.endswith(".parquet") for name in reference)
    print(f"{len(reference)} files ({tables} Parquet tables) in {args.first}, {len(other)} in {args.second}: "
          + ("identical" if not differences else f"{len(differences)} differences"))
    return 0 if not differences else 1


if __name__ == "__main__":
    sys.exit(main())
