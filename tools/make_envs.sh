#!/usr/bin/env bash
# Build the worker environments of the remote-code models: envs/<name>.txt -> .envs/<name>.
#
#   tools/make_envs.sh                     build every envs/remote-*.txt
#   tools/make_envs.sh remote-mplug_owl2   build one (the "remote-" prefix may be left out)
#   tools/make_envs.sh --check [name...]   build nothing; fail, naming each, if an env is not built
#   tools/make_envs.sh --list              the names of the env files
#
# An env file is a pinned pip requirements file; a comment line `# python: 3.11` picks the interpreter
# (python3.11 on PATH, or $PYTHON_3_11). Each env is built once per machine, in a cache keyed by the
# sha256 of what goes into it (interpreter version, requirement lines, this recipe):
#   ${VERBMIRAGE_ENV_CACHE:-$HOME/.cache/verbmirage/envs}/<name>-<hash>
# and .envs/<name> is a symlink to it, so a fresh clone on the same machine (or CI) reuses it, and an
# edited env file gets a new env. torch/torchvision/torchaudio pins are installed once into a shared base
# env (base-<hash>) that the model envs see through a .pth file: several envs on one torch build share
# its gigabytes. The envs have no pip of their own; add a package with
#   python3.11 -m pip --python .envs/<name>/bin/python install ...
# Settings: VERBMIRAGE_ENVS_DIR (default .envs), VERBMIRAGE_ENV_FILES (default envs).
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."

RECIPE=1  # bump when the way envs are built changes: every cached env is then rebuilt
CACHE=${VERBMIRAGE_ENV_CACHE:-$HOME/.cache/verbmirage/envs}
LINKS=${VERBMIRAGE_ENVS_DIR:-.envs}
FILES=${VERBMIRAGE_ENV_FILES:-envs}
BASE_PACKAGES='^(torch|torchvision|torchaudio)([=<>!~ ;[]|$)'

die() { echo "make_envs: $*" >&2; exit 1; }
sha() { if command -v sha256sum >/dev/null; then sha256sum | cut -c1-16; else shasum -a 256 | cut -c1-16; fi; }

env_file() {  # name -> its requirements file
    local name=$1
    for candidate in "$FILES/$name.txt" "$FILES/remote-$name.txt"; do
        if [ -f "$candidate" ]; then echo "$candidate"; return; fi
    done
    die "no env file for '$name': expected $FILES/$name.txt or $FILES/remote-$name.txt (known: $(list_names | tr '\n' ' '))"
}

list_names() {
    local file
    for file in "$FILES"/remote-*.txt; do [ -f "$file" ] && basename "$file" .txt; done
    return 0
}

requirement_lines() {  # the non-comment lines of a requirements file, trimmed
    sed -e 's/[[:space:]]#.*$//' -e 's/^#.*$//' -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' "$1" | grep -v '^$' || true
}

interpreter() {  # env file -> path of the python it asks for
    local file=$1 version var python
    version=$(sed -n 's/^#[[:space:]]*python:[[:space:]]*\([0-9.]*\).*/\1/p' "$file" | head -n1)
    version=${version:-3.11}
    var="PYTHON_${version//./_}"
    python=${!var:-$(command -v "python$version" || true)}
    [ -n "$python" ] || die "$file asks for python $version: put python$version on PATH or set $var"
    "$python" -c "import sys; v = '.'.join(map(str, sys.version_info[:2])); sys.exit(v != '$version')" \
        || die "$file asks for python $version, but $python is $("$python" -V 2>&1)"
    echo "$python"
}

site_packages() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

# Build a venv at $dir from the requirement lines in $requirements, unless it is already complete.
# The stamp file is written last: a half-built env (killed build) has none and is rebuilt.
build_venv() {
    local dir=$1 python=$2 requirements=$3 base=${4:-}
    exec 9>"$dir.lock"
    if command -v flock >/dev/null; then flock 9; fi  # two builds of one env (parallel CI jobs) take turns
    if [ -f "$dir/.verbmirage-env" ]; then
        echo "make_envs: reusing $dir"
        exec 9>&-
        return
    fi
    rm -rf "$dir"
    echo "make_envs: building $dir"
    # Without pip of its own (ensurepip costs ~10 s a venv): the creating interpreter's pip installs into it.
    "$python" -m venv --without-pip "$dir"
    if [ -n "$base" ]; then
        site_packages "$base" > "$(site_packages "$dir")/_verbmirage_base.pth"
    fi
    if [ -s "$requirements" ]; then
        local pip=("$python" -m pip --python "$dir/bin/python")
        if ! "${pip[@]}" --version >/dev/null 2>&1; then  # pip < 22.3 has no --python
            "$dir/bin/python" -m ensurepip --default-pip >/dev/null
            pip=("$dir/bin/python" -m pip)
        fi
        "${pip[@]}" install --quiet --disable-pip-version-check -r "$requirements" \
            || die "pip could not install the requirements of $current_file into $dir (its message is above)"
    fi
    { echo "recipe $RECIPE"; cat "$requirements"; } > "$dir/.verbmirage-env"
    exec 9>&-
}

make_env() {
    local name file python version lines base_lines base_key base="" key target
    file=$(env_file "$1")
    current_file=$file
    name=$(basename "$file" .txt)
    python=$(interpreter "$file")
    version=$("$python" -c 'import sys; print(sys.version.split()[0])')
    mkdir -p "$CACHE" "$LINKS"
    lines="$work/requirements.txt"
    requirement_lines "$file" > "$lines"
    # pip options (--find-links, --index-url ...) apply to both halves
    base_lines="$work/base.txt"
    { grep -E '^-' "$lines" || true; grep -E "$BASE_PACKAGES" "$lines" || true; } > "$base_lines"
    if grep -qE "$BASE_PACKAGES" "$lines"; then
        base_key=$({ echo "recipe $RECIPE python $version"; sort "$base_lines"; } | sha)
        base="$CACHE/base-$base_key"
        build_venv "$base" "$python" "$base_lines"
    fi
    key=$({ echo "recipe $RECIPE python $version base ${base##*/}"; cat "$lines"; } | sha)
    target="$CACHE/$name-$key"
    build_venv "$target" "$python" "$lines" "$base"
    if [ -L "$LINKS/$name" ] || [ ! -e "$LINKS/$name" ]; then
        ln -sfn "$target" "$LINKS/$name"
    else
        die "$LINKS/$name exists and is not a link made by this script; move it away"
    fi
    echo "make_envs: $name -> $target"
}

check_env() {  # fail with the command that builds it when an env is missing or stale
    local name file
    file=$(env_file "$1") || return 1
    name=$(basename "$file" .txt)
    if [ ! -x "$LINKS/$name/bin/python" ]; then
        echo "make_envs: env '$name' is not built ($LINKS/$name/bin/python missing): run tools/make_envs.sh $name" >&2
        return 1
    fi
    if [ ! -f "$LINKS/$name/.verbmirage-env" ]; then  # e.g. made with conda from envs/<name>.yaml
        echo "make_envs: $name ok, not built by this script: its pins are not checked ($LINKS/$name)"
        return 0
    fi
    if ! diff -q <(requirement_lines "$file") <(tail -n +2 "$LINKS/$name/.verbmirage-env") >/dev/null; then
        echo "make_envs: env '$name' is stale ($file changed since it was built): run tools/make_envs.sh $name" >&2
        return 1
    fi
    echo "make_envs: $name ok ($(readlink -f "$LINKS/$name"))"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mode=build
case "${1:-}" in
    --check) mode=check; shift ;;
    --list) list_names; exit 0 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) die "unknown option '$1' (see --help)" ;;
esac
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    mapfile -t names < <(list_names)
fi
status=0
for name in "${names[@]}"; do
    if [ "$mode" = check ]; then
        check_env "$name" || status=1
    else
        make_env "$name"
    fi
done
exit $status
