"""Build every tiny random-weight model (real transformers classes, offline) under a folder.

    python tools/build_tiny_models.py [OUT]        (default OUT: resources/models)

Each family goes to OUT/tiny_<family>/ (the demo's `tiny_model` rule builds the same ones).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from verbmirage.models.registry import TINY_FAMILIES, tiny_builder  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=f"families: {', '.join(TINY_FAMILIES)}")
    parser.add_argument("out", nargs="?", default="resources/models", type=Path, help="the folder to build into")
    args = parser.parse_args(argv)
    for family in TINY_FAMILIES:
        print(f"tiny_{family}: {tiny_builder(family)(args.out / f'tiny_{family}')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
