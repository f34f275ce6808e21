#!/usr/bin/env bash
# Run the test suite tier by tier (installs first if needed). Extra arguments go to pytest.
#   tools/test.sh              the fast tier first, stopping there on a failure; then the models and workflow
#                              tiers together, with the cluster tier (one SLURM run, mostly waiting) beside them
#   tools/test.sh -m fast      one pytest call of that selection (any -m, e.g. -m "models or workflow")
# A test's tier is its folder, tests/<tier>/, but for the few tests/tiers.py names (README, "Tests"); each tier
# is selected by its marker. Each tier's time is printed.
# Tests run on VERBMIRAGE_TEST_WORKERS pytest-xdist workers (default: one per CPU, at most 4; 0 = serial,
# needed for pytest's -s or --pdb). tests/conftest.py keeps each file, and the shared demo run, on one worker.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
workers=${VERBMIRAGE_TEST_WORKERS:-$(python3 -c 'import os; print(min(4, len(os.sched_getaffinity(0))))')}

# One math thread per test process: the xdist workers (and the jobs they start) already fill the cores, and more
# threads than cores only contend (torch, BLAS). A value you export is kept.
if [ "$workers" != 0 ]; then
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
    export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
fi

run_pytest() {  # run_pytest WORKERS ARGS...
    local n=$1
    shift
    if [ "$n" = 0 ]; then
        .venv/bin/python -m pytest "$@"
    else
        .venv/bin/python -m pytest -n "$n" --dist loadgroup --no-loadscope-reorder "$@"
    fi
}

tier() {  # tier SELECTION WORKERS ARGS...: one pytest call, timed; a tier with no test selected is no failure
    local selection=$1 n=$2 started=$SECONDS status=0
    shift 2
    run_pytest "$n" -m "$selection" "$@" || status=$?
    [ "$status" = 5 ] && status=0
    echo "tests: tier '$selection' took $((SECONDS - started)) s (exit status $status)"
    return "$status"
}

# An interrupt or SIGTERM stops what this script started, by pid, and nothing else (not the caller's process
# group). Every pytest call runs in the background and the script waits for it, so the trap runs at once
# (bash runs a trap only after a foreground command ends); a background job ignores Ctrl-C, so the trap stops it.
stop_started() {
    local pid
    for pid in $(pgrep -P $$); do
        pkill -TERM -P "$pid" 2>/dev/null || true  # the pytest that a tier's subshell started
        kill -TERM "$pid" 2>/dev/null || true
    done
}
trap 'trap - INT TERM; stop_started; exit 130' INT TERM

waited() {  # waited COMMAND...: run it in the background, wait for it, return its status
    "$@" &
    local pid=$! status=0
    wait "$pid" || status=$?
    return "$status"
}

for arg in "$@"; do
    case $arg in -m|-m?*) status=0; waited run_pytest "$workers" "$@" || status=$?; exit "$status" ;; esac
done

# Without arguments each tier collects only its own folders (tests/tiers.py lifts only tests of tests/models, to
# the workflow tier, and never lowers one), so no pytest call imports every test module first.
fast_tests=() cluster_tests=() middle_tests=()
if [ $# = 0 ]; then
    fast_tests=(tests/fast) cluster_tests=(tests/cluster) middle_tests=(tests/models tests/workflow)
fi
waited tier fast "$workers" "${fast_tests[@]}" "$@"
status=0
if [ "$workers" = 0 ]; then
    waited tier "models or workflow" 0 "${middle_tests[@]}" "$@" || status=$?
    waited tier cluster 0 "${cluster_tests[@]}" "$@" || status=$?
    exit "$status"
fi
# The cluster tier waits on SLURM most of its time: it runs in its own pytest process beside the others, and
# its output follows theirs.
cluster_log=$(mktemp)
trap 'rm -f "$cluster_log"' EXIT
tier cluster 0 "${cluster_tests[@]}" "$@" > "$cluster_log" 2>&1 &
cluster=$!
waited tier "models or workflow" "$workers" "${middle_tests[@]}" "$@" || status=$?
wait "$cluster" || status=$?
cat "$cluster_log"
exit "$status"
