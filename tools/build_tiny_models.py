"""Build every tiny random-weight model (real transformers classes, offline) under OUT.

    python tools/build_tiny_models.py resources/models
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from verbmirage.tiny import BUILDERS  # noqa: E402

if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "resources/models")
    for family, build in BUILDERS.items():
        print(f"tiny_{family}: {build(out / f'tiny_{family}')}")
