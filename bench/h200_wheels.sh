#!/usr/bin/env bash
# What bench/h200_check.sh carries to the device machine (which cannot download): transformers and pytest as pinned
# in pyproject.toml, and what pytest imports, for the GPU tests (transformers' other needs, tokenizers,
# huggingface_hub, safetensors, ..., are in the device image in versions it accepts), and the paper config's prompts
# per decoding for the projected run times (bench/projection.py: it needs Snakemake's schema check, installed here,
# not there). Writes .whl/ (ignored: .gitignore).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^ *"transformers==\([^"]*\)".*/\1/p' pyproject.toml)
[ -n "$version" ] || { echo "no transformers pin in pyproject.toml" >&2; exit 1; }
pytest_version=$(sed -n 's/.*"pytest==\([^"]*\)".*/\1/p' pyproject.toml)
[ -n "$pytest_version" ] || { echo "no pytest pin in pyproject.toml" >&2; exit 1; }
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl "transformers==$version" \
    "pytest==$pytest_version" pluggy iniconfig pygments  # pytest -m gpu (pytest imports pygments); the image has none
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
"$PYTHON" bench/projection.py --write .whl/paper_mix.json
ls -la .whl
