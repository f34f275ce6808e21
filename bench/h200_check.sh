#!/usr/bin/env bash
# Every GPU figure of bench/README.md ("On a GPU") in one device run (an H200 lent through the `device` tool),
# prepared so that a session that draws a GPU spends its minutes measuring, not setting up (at most 360 s of
# steps, each under its own time limit plus what the steps before it left unused, a step that ignores its limit
# killed 10 s after it; every step on CUDA compiles the decoder layers and FlexAttention, the first one cold, the
# others from inductor's on-disk cache; each step's time is printed after it, the engine's first call's, which
# waits for the compiler, in generate.txt):
#
#   here, once per checkout:  bash bench/h200_wheels.sh          # transformers and pytest as pinned, the paper
#                                                                # config's prompt mix and Molmo-7B-D's worker
#                                                                # (its code and wheels), into .whl (ignored)
#   on the device:            run(command="bash bench/h200_check.sh", carry=[".whl"], timeout_s=480)
#
# The device image's python3 holds torch, pandas, pyarrow, scipy and Pillow; its transformers is older than the
# pin, so the pinned wheel travels in .whl. On a random-weight model of LLaVA-1.5-7B's size in bf16
# (bench/gpu_scoring.py) it prints, in order:
#   1. engine vs transformers generate at batch 1, bf16 and float32 (bench/gen_vs_engine.py; generate's layers
#      eager, as the harnesses run them; in float32, an exactness check, the engine's layers eager too: only
#      FlexAttention compiles again for it);
#   2. bench/batch_flips.py: the batch a job sizes from this GPU's free memory (batch_size: auto; docs/models.md,
#      "Batch sizes") and the answers that move between batch 64 and it, on the random and the decisive model;
#   3. --suite: one set per call vs all sets of an image at batch 64, then all sets at the batch step 2 sized
#      (or --sized-batch N) and the decisions that differ between the two, then on half the suite with suffix
#      batches cut at a forward cost of 512 token positions and at the engine's 4096 (VERBMIRAGE_FORWARD_COST);
#   4. the GPU-busy share of a profiled scoring pass and its kernels per prompt (bench/profile_gpu.py);
#   5. --decodings: the whole suite greedily as a job answers it, each decoding's cost relative to greedy (beside
#      its arithmetic relative to greedy's: bench_scoring.Arithmetic) and peak memory, and the projected GPU-hours of the whole HICO suite and of configs/paper.yaml, every GPU model
#      (the remote-code models at the engine's rates and one question at a time at generate's rate of step 1);
#   6. the GPU tests: pytest -m gpu (fused attention against the CPU path, and any other gpu-marked test);
#   7. a remote-code model batched vs one question at a time, through its own code on the GPU in bf16
#      (bench/remote_batching.py on Molmo-7B-D's proxy at real geometry, depth cut: the one remote model whose
#      worker's pins have wheels for the device's Python; bench/README.md, "Remote-code models batched"), on the
#      time the steps before it left unused, when that is at least REMOTE_MINIMUM seconds (running past it is
#      said but does not fail the check).
# On CUDA the engine compiles its language model's decoder layers (models/hf/compiled_layers.py; the first forward
# of each shape waits for the compiler, later steps reuse its cache in /tmp) and runs fewer, fuller forwards
# (models/hf/on_device.py): every step measures that path. `VERBMIRAGE_COMPILE_LAYERS=0 bash bench/h200_check.sh`
# measures the eager layers instead; pytest -m gpu compares the two (tests/models/test_on_device.py).
# Each log is also written to $OUT. `--smoke` runs every step on the CPU with the narrow model and a few prompts
# (float32 on the CPU: the second comparison is left out; CI does: tests/models/test_bench.py); other arguments
# go to gpu_scoring.py's runs.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1
SIZED=
SMOKE=()
ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --sized-batch) SIZED=$2; shift 2 ;;
        --smoke) SMOKE=(--smoke); shift ;;
        *) ARGS+=("$1"); shift ;;
    esac
done
if [ ${#SMOKE[@]} -gt 0 ]; then  # the narrow model on the CPU, tiny sizes: checks every step runs
    GEN=(--smoke --images 1 --engine-images 1 --max-prompts 4) PROFILE=(--smoke --images 1 --max-prompts 8)
    FLIPS=(--smoke --images 1) SUITE=(--images 1 --max-prompts 12) DECODE=(--images 1 --decoding-images 1 --max-new-tokens 2 --max-prompts 6)
else
    GEN=(--images 2 --engine-images 16) PROFILE=(--images 16) FLIPS=(--images 16) SUITE=(--images 32)
    DECODE=(--images 32 --decoding-images 8)
fi
if compgen -G ".whl/*.whl" > /dev/null; then  # a folder of this run's own (not \$OUT: it would travel back)
    site=$(mktemp -d)
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl || exit 1
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi
# Triton builds its kernels' launcher with $CC (a program's name on PATH or its path), else gcc or clang:
# printed as the program that runs, "none" where none is found
if [ -n "${CC:-}" ]; then
    compiler=$(command -v -- "$CC" 2>/dev/null || true)  # Triton runs $CC as one program name
else
    compiler=$(command -v gcc clang 2>/dev/null | head -n 1)
fi
uncompiled=
if [ -z "$compiler" ] && [ ${#SMOKE[@]} -eq 0 ]; then  # then nothing compiles: say so, and try no compilation
    uncompiled="without one nothing compiles: the benchmarks run the decoder layers eagerly and attend in plain \
products (VERBMIRAGE_COMPILE_LAYERS=0 VERBMIRAGE_FLEX_ATTENTION=0); the GPU tests of the compiled path fail"
    export VERBMIRAGE_COMPILE_LAYERS=0 VERBMIRAGE_FLEX_ATTENTION=0
fi
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
    "$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__,
'| cuda', torch.cuda.is_available())"
    echo "C compiler for Triton: ${compiler:-none${CC:+ (CC=$CC not found)}}${uncompiled:+; $uncompiled}"
} 2>&1 | tee "$OUT/env.txt"
status=0
scheduled=0  # the seconds the steps so far may have taken, each its limit
steps_start=$SECONDS
step() {  # step NAME SECONDS COMMAND...: run it under its limit plus what the steps before it left unused (a cold
    # compilation takes longer than one from the cache), its log in $OUT/NAME.txt; a failure does not stop the rest
    local name=$1 limit=$2 started=$SECONDS
    shift 2
    scheduled=$((scheduled + limit))
    local left=$((scheduled - (SECONDS - steps_start)))
    [ "$left" -gt "$limit" ] || left=$limit
    [ "$left" -gt 0 ] || left=1  # timeout 0 would mean no limit
    echo "== $name (at most $left s)"
    # a command that ignores SIGTERM at its limit gets SIGKILL 10 s later: timeout then exits 137, not 124
    timeout -k 10 "$left" "$@" 2>&1 | tee "$OUT/$name.txt"
    local code=${PIPESTATUS[0]}
    ran_past=
    if [ "$code" -eq 124 ] || { [ "$code" -eq 137 ] && [ $((SECONDS - started)) -ge "$left" ]; }; then
        status=1 ran_past=1
        echo "== $name ran past $left s"
    elif [ "$code" -ne 0 ]; then
        status=1
        echo "== $name failed (exit status $code)"
    fi
    echo "== $name took $((SECONDS - started)) s"
}
step generate 110 "$PYTHON" bench/gen_vs_engine.py "${GEN[@]}" --dtype bfloat16
[ ${#SMOKE[@]} -gt 0 ] || step generate_float32 40 env VERBMIRAGE_COMPILE_LAYERS=0 "$PYTHON" bench/gen_vs_engine.py \
    "${GEN[@]}" --dtype float32
step flips 35 "$PYTHON" bench/batch_flips.py "${FLIPS[@]}"
[ -n "$SIZED" ] || SIZED=$(sed -n 's/^.*sized: batch \([0-9]*\),.*$/\1/p' "$OUT/flips.txt" | head -n 1)
step suite 55 "$PYTHON" bench/gpu_scoring.py --suite "${SMOKE[@]}" "${SUITE[@]}" --sized-batch "${SIZED:-256}" \
    --forward-cost 512 "${ARGS[@]}"
step profile 25 "$PYTHON" bench/profile_gpu.py "${PROFILE[@]}"
rate=$(sed -n 's/^generate rate: \([0-9.]*\) prompts\/s$/\1/p' "$OUT/generate.txt")
step decodings 65 "$PYTHON" bench/gpu_scoring.py --decodings "${SMOKE[@]}" "${DECODE[@]}" \
    ${rate:+--generate-rate "$rate"} "${ARGS[@]}"
gpu_tests=$(grep -rl "pytest.mark.gpu" tests --include="test_*.py" | sort)
step gpu_tests 30 env PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m pytest -m gpu -q -p no:cacheprovider \
    $gpu_tests
# 7. Molmo-7B-D's worker: its code and wheels from .whl (bench/h200_wheels.sh), installed beside the image's torch
# into a folder of their own, and an env whose python puts that folder first (remote_batching.py runs a worker env's
# bin/python); on the CPU (--smoke) the worker env tools/make_envs.sh built
REMOTE_MINIMUM=${REMOTE_MINIMUM:-75}
unused() { echo $((scheduled - (SECONDS - steps_start))); }  # the seconds the steps so far left unused
if [ ${#SMOKE[@]} -gt 0 ]; then
    if [ -x "${VERBMIRAGE_ENVS_DIR:-.envs}/remote-molmo/bin/python" ] &&
        [ -d "${VERBMIRAGE_REMOTE_CODE:-../shared/remote_code}/molmo_7b_d" ]; then
        step remote 60 "$PYTHON" bench/remote_batching.py --smoke --models molmo
    else
        echo "== remote skipped: Molmo-7B-D's worker env or code is absent (tools/make_envs.sh; ../shared/remote_code)"
    fi
elif [ ! -d .whl/remote-molmo ] || [ ! -d .whl/remote_code/molmo_7b_d ]; then
    echo "== remote skipped: Molmo-7B-D's worker was not carried (bash bench/h200_wheels.sh puts it in .whl)"
elif [ "$(unused)" -lt "$REMOTE_MINIMUM" ]; then
    echo "== remote skipped: $(unused) s left of the steps' $scheduled s, fewer than the $REMOTE_MINIMUM it needs"
else
    workers=$(mktemp -d)
    python=$workers/remote-molmo/bin/python
    mkdir -p "$workers/remote-molmo/bin"
    printf '#!/bin/sh\nPYTHONPATH=%q exec %q "$@"\n' "$workers/site" "$(command -v "$PYTHON")" > "$python"
    chmod +x "$python"
    # the main modules the worker imports, each with its version and place: one the image lacks fails here, by name
    if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$workers/site" \
        .whl/remote-molmo/*.whl && "$python" -c 'import importlib, sys
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    print(name, getattr(module, "__version__", "?"), module.__file__)' torch torchvision transformers tokenizers \
        huggingface_hub accelerate einops requests numpy PIL 2>&1 | tee "$OUT/remote_env.txt"; then
        if [ "$(unused)" -lt "$REMOTE_MINIMUM" ]; then
            echo "== remote skipped: after the install $(unused) s were left of the steps' $scheduled s, fewer than" \
                "the $REMOTE_MINIMUM it needs"
        else
            # opportune: running past the time left is said, and does not fail the check
            before=$status
            step remote 0 env VERBMIRAGE_ENVS_DIR="$workers" VERBMIRAGE_REMOTE_CODE="$PWD/.whl/remote_code" \
                "$PYTHON" bench/remote_batching.py --models molmo --device cuda --dtype bfloat16
            [ -z "$ran_past" ] || status=$before
        fi
    else
        status=1
        echo "== remote failed: Molmo-7B-D's worker did not install (pip's message above) or import (remote_env.txt)"
    fi
fi
echo "logs in $OUT"
exit $status
