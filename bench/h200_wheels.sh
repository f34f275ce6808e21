#!/usr/bin/env bash
# What bench/h200_check.sh carries to the device machine (which cannot download): transformers and pytest as pinned
# in pyproject.toml, and what pytest imports at the versions this checkout's .venv holds, for the GPU tests
# (transformers' other needs, tokenizers, huggingface_hub, safetensors, ..., are in the device image in versions it
# accepts), and the paper config's prompts per decoding for the projected run times (bench/projection.py: it needs
# Snakemake's schema check, installed here, not there). Writes .whl/ (ignored: .gitignore).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
pin() {  # pin NAME: NAME==VERSION as pyproject.toml pins it, else as $PYTHON (this checkout's .venv) has it
    local version
    version=$(sed -n "s/.*\"$1==\([^\"]*\)\".*/\1/p" pyproject.toml | head -n 1)
    [ -n "$version" ] || version=$("$PYTHON" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' \
        "$1" 2>/dev/null) || { echo "$1: no pin in pyproject.toml, and $PYTHON has none (tools/setup.sh)" >&2; exit 1; }
    echo "$1==$version"
}
# pytest -m gpu needs pytest and what it imports (pygments too); the image has none of them, nor perhaps packaging
wheels=()
for name in transformers pytest pluggy iniconfig pygments packaging; do
    wheels+=("$(pin "$name")")
done
# into a folder of its own first: a failed download leaves the wheels there were; then these replace them all
# (h200_check.sh installs every wheel in .whl: none of an earlier version stays)
fresh=$(mktemp -d)
trap 'rm -rf "$fresh"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d "$fresh" "${wheels[@]}"
mkdir -p .whl
rm -f .whl/*.whl
mv "$fresh"/*.whl .whl/
"$PYTHON" bench/projection.py --write .whl/paper_mix.json
ls -la .whl
