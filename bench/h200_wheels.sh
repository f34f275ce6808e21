#!/usr/bin/env bash
# What bench/h200_check.sh carries to the device machine (which cannot download): transformers as pinned in
# pyproject.toml, pytest for the GPU tests (its other needs, tokenizers, huggingface_hub, safetensors, ..., are in the device image in
# versions it accepts), and the paper config's prompts per decoding for the projected run times
# (bench/projection.py: it needs Snakemake's schema check, installed here, not there). Writes .whl/ and ignores
# it in this checkout (.git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^ *"transformers==\([^"]*\)".*/\1/p' pyproject.toml)
[ -n "$version" ] || { echo "no transformers pin in pyproject.toml" >&2; exit 1; }
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl "transformers==$version" \
    pytest pluggy iniconfig  # the GPU tests (pytest -m gpu); the device image has no pytest
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
"$PYTHON" bench/projection.py --write .whl/paper_mix.json
ls -la .whl
