#!/usr/bin/env bash
# Create .venv (Python 3.11+) with the pinned dependencies and the package.
# Idempotent: a stamp file skips the install when pyproject.toml is unchanged.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.verbmirage-installed"
# pip's own configuration (find-links, index URLs, constraints: `pip config list`, files and PIP_* variables) as uv
# options, so that uv installs from where pip would.
uv_options() {
    "$VENV/bin/python" - <<'PY'
import shlex, subprocess, sys
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
options = {"find-links": "--find-links", "index-url": "--index-url", "extra-index-url": "--extra-index-url",
           "constraint": "--constraint"}
seen = []
for line in listed.splitlines():
    key, _, value = line.partition("=")
    name = key.rpartition(".")[2]
    for item in (shlex.split(value)[0].split() if name in options and value else []):
        if (name, item) not in seen:
            seen.append((name, item))
            print(options[name], item, sep="\n")
PY
}
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    # torch is pinned to 2.13.0 in pyproject.toml: a CPU wheel where one is available locally.
    # uv installs the same versions as pip in a third of the time (10 s against 30 s here); where uv cannot be
    # installed or fails, pip does it. unsafe-best-match: every index is searched for the best version, as pip does.
    # Byte-compiling: neither compiles at install (pip with --no-compile; uv by default), as pip would on one core
    # for every file. Instead, tools/warm_bytecode.py imports what the pipeline and its tests use with bytecode
    # writing on (two processes at once): needed because with PYTHONDONTWRITEBYTECODE=1 (set on our machines)
    # nothing would ever write the .pyc files and every process would compile torch and transformers again
    # (10 s -> 23 s); about 3,500 files instead of all 16,000.
    if ! { "$VENV/bin/python" -m pip install --quiet uv 2>/dev/null && mapfile -t options < <(uv_options) \
        && "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" --index-strategy unsafe-best-match \
            "${options[@]}" -e ".[test]"; }; then
        echo "setup: uv did not install the dependencies; pip does" >&2
        "$VENV/bin/python" -m pip install --quiet --upgrade pip
        "$VENV/bin/python" -m pip install --quiet --no-compile -e ".[test]"
    fi
    env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" tools/warm_bytecode.py torch &
    env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" tools/warm_bytecode.py rest
    wait $!
    touch "$stamp"
fi
# The package's own modules at every call (they change; compileall skips the current ones): Snakemake and each
# job import them, and PYTHONDONTWRITEBYTECODE would have them compiled again in every process (docs/models.md).
"$VENV/bin/python" -m compileall -q -j 0 src > /dev/null || true
