#!/usr/bin/env bash
# The wheels bench/h200_check.sh carries to the device machine (which cannot download): transformers as pinned in
# pyproject.toml. Its other needs (tokenizers, huggingface_hub, safetensors, ...) are in the device image in
# versions it accepts. Writes .whl/ and ignores it in this checkout (.git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^ *"transformers==\([^"]*\)".*/\1/p' pyproject.toml)
[ -n "$version" ] || { echo "no transformers pin in pyproject.toml" >&2; exit 1; }
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl "transformers==$version"
ls -la .whl
