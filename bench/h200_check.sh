#!/usr/bin/env bash
# Issue 8's GPU figures in one device run (an H200 lent through the `device` tool), prepared so that a session
# that draws a GPU spends its 15 minutes measuring, not setting up:
#
#   here, once per checkout:  bash bench/h200_wheels.sh          # transformers as pinned, into .whl (ignored)
#   on the device:            run(command="bash bench/h200_check.sh", carry=[".whl"], timeout_s=540)
#
# The device image's python3 holds torch, pandas, pyarrow, scipy and Pillow; its transformers is older than the
# pin, so the pinned wheel travels in .whl. Prints the GPU and versions, then bench/gpu_scoring.py --suite (the
# whole-suite ratio at LLaVA-1.5-7B size, bf16; target (b) >= 250 prompts/s) and the plain engine rate; each log
# is also written to $OUT. Extra arguments go to both runs (`--smoke --images 1` checks the script on a CPU).
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
timeout 330 "$PYTHON" bench/gpu_scoring.py --suite "$@" 2>&1 | tee "$OUT/suite.txt" || status=1
timeout 150 "$PYTHON" bench/gpu_scoring.py "$@" 2>&1 | tee "$OUT/engine.txt" || status=1
echo "logs in $OUT"
exit $status
