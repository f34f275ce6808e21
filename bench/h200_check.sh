#!/usr/bin/env bash
# The GPU figures in one device run (an H200 lent through the `device` tool), prepared so that a session that
# draws a GPU spends its minutes measuring, not setting up (under 9 minutes in all):
#
#   here, once per checkout:  bash bench/h200_wheels.sh          # transformers as pinned + the paper config's
#                                                                # prompt mix, into .whl (ignored)
#   on the device:            run(command="bash bench/h200_check.sh", carry=[".whl"], timeout_s=540)
#
# The device image's python3 holds torch, pandas, pyarrow, scipy and Pillow; its transformers is older than the
# pin, so the pinned wheel travels in .whl. Prints the GPU and versions, then, on a random-weight model of
# LLaVA-1.5-7B's size in bf16 (bench/gpu_scoring.py): --suite, the whole-suite ratio (target (b) >= 250
# prompts/s), and --decodings, the whole suite as a job answers it, each decoding's prompts/s, cost relative to
# greedy and peak GPU memory, and the projected time of the whole HICO suite and of configs/paper.yaml. Each log
# is also written to $OUT. Then bench/batch_flips.py: the batch this GPU sizes (batch_size: auto) and how many
# answers move between batch 64 and it. Extra arguments go to every run (`--smoke --images 1` checks the script on
# a CPU).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/h200_site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/h200_site${PYTHONPATH:+:$PYTHONPATH}
fi
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
    "$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__,
'| cuda', torch.cuda.is_available())"
} 2>&1 | tee "$OUT/env.txt"
status=0
timeout 200 "$PYTHON" bench/gpu_scoring.py --suite "$@" 2>&1 | tee "$OUT/suite.txt" || status=1
timeout 240 "$PYTHON" bench/gpu_scoring.py --decodings "$@" 2>&1 | tee "$OUT/decodings.txt" || status=1
timeout 120 "$PYTHON" bench/batch_flips.py "$@" 2>&1 | tee "$OUT/batch_flips.txt" || status=1
echo "logs in $OUT"
exit $status
