#!/usr/bin/env bash
# What bench/h200_check.sh carries to the device machine (which cannot download): transformers and pytest as pinned
# in pyproject.toml, and what pytest imports at the versions this checkout's .venv holds, for the GPU tests
# (transformers' other needs, tokenizers, huggingface_hub, safetensors, ..., are in the device image in versions it
# accepts), the paper config's prompts per decoding for the projected run times (bench/projection.py: it needs
# Snakemake's schema check, installed here, not there), and Molmo-7B-D's worker for the check's remote-code step: its
# code and its env's pins (envs/remote-molmo.txt) but torch, numpy, Pillow and safetensors, which the image's serve,
# torchvision at the release built for the image's torch (REMOTE_TORCHVISION), psutil and requests with its own.
# The other remote models' workers cannot travel: Qwen-VL-Chat's and mPLUG-Owl2's pin tokenizers 0.13.3 and
# MiniCPM's sentencepiece 0.1.99, which have no wheel for the device's Python 3.12. Writes .whl/ (ignored).
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
download() {  # download FOLDER REQUIREMENT...: wheels for the device image's Python (DEVICE_PYTHON, 3.12)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${DEVICE_PYTHON:-3.12}" \
        --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d "$@"
}
download "$fresh" "${wheels[@]}"
# torchvision 0.26.0 is the release for torch 2.11.0, the device image's; its PyPI wheel links CUDA 13, as that torch
remote=("torchvision==${REMOTE_TORCHVISION:-0.26.0}")
for name in transformers tokenizers accelerate einops huggingface_hub; do
    remote+=("$(grep -m 1 "^$name==" envs/remote-molmo.txt)") || { echo "envs/remote-molmo.txt pins no $name" >&2; exit 1; }
done
# and what they import that the image need not hold, at this checkout's versions (each serves any Python 3):
# psutil (accelerate), requests and its own (transformers 4.x and huggingface_hub 0.x; the image's 5.x stack uses
# httpx)
for name in psutil requests urllib3 idna certifi charset_normalizer; do
    remote+=("$(pin "$name")")
done
code=${VERBMIRAGE_REMOTE_CODE:-../shared/remote_code}/molmo_7b_d
if [ -d "$code" ]; then
    download "$fresh/remote-molmo" "${remote[@]}"
    mkdir -p "$fresh/remote_code"
    cp -r --no-preserve=mode "$code" "$fresh/remote_code/"  # the shared copy is read-only
else
    echo "$code is absent (the checkpoint's code; VERBMIRAGE_REMOTE_CODE): the check's remote-code step will skip" >&2
fi
mkdir -p .whl
rm -rf .whl/*.whl .whl/remote-molmo .whl/remote_code
mv "$fresh"/* .whl/
"$PYTHON" bench/projection.py --write .whl/paper_mix.json
ls -la .whl
[ ! -d .whl/remote-molmo ] || ls -la .whl/remote-molmo
du -sh .whl  # carry takes at most 64 MiB
