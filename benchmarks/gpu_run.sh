#!/usr/bin/env bash
# The GPU measurements behind reports/, one stage per call of at most ten minutes, from the installed package:
#
#   bash benchmarks/gpu_run.sh timeline OUT   # one GPU: a calibration, the known answers (validate --planted),
#                                             # flash decode and ag-gemm profiled at world 1 with both clocks
#
# Installs the carried wheels (.wheels: cupti-python, pyelftools) to /tmp/site when they are there, and the
# project offline. Every command has its own time limit and writes its result as soon as it ends; a short
# table comes last.
set -u
stage=${1:?stage: timeline}
OUT=${2:-${OUT:-gpu-out}}
mkdir -p "$OUT"
if ls .wheels/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "install failed"; exit 1; }
export PYTHONUNBUFFERED=1
GPU=$(python3 -c "import torch; n=torch.cuda.get_device_name(0).upper(); print(next((k.lower() for k in ('H100','H200','A100','B200') if k in n), 'gpu'))")
HW="$OUT/$GPU-x1-calibrated.json"

if [ "$stage" = timeline ]; then
    python3 - <<'PY' 2>&1 | tail -12
from taxes.cupti import Recorder, available
print("cupti:", available() or "usable")
import torch
x = torch.zeros(1, device="cuda")
r = Recorder().start()
for _ in range(5):
    with r.call("add"):
        x.add_(1)
torch.cuda.synchronize()
acts, launches, host = r.stop()
print("activities", len(acts), list(acts["name"][:2]), "launches", launches["name"].value_counts().to_dict(), "host", len(host))
print("first kernel - launch return (us):", float(acts["start_us"].iloc[0] - launches["end_us"].iloc[0]) if len(acts) and len(launches) else None)
PY
    timeout 120 taxes calibrate --gpus 1 --quick -o "$HW" 2>&1 | tail -4
    [ -f "$HW" ] || HW=h100-sxm
    timeout 200 taxes validate --planted --gpus 1 --iters 30 --clock cupti -o "$OUT/known_answer-$GPU-x1.json" 2>&1 | tail -9
    for S in 131072 32768; do
        timeout 150 taxes profile flash-decode --gpus 1 --shape B=1,S=$S --iters 30 --rounds 3 --clock both \
            --hardware "$HW" -o "$OUT/flash_decode-$GPU-x1-B1-S$S.json" --force --timeout-s 140 --format md 2>&1 \
            | grep -E "^\| (E2E|measurement|kernel-launch|host-bound|speed|correct)|rror|wrote"
    done
    timeout 120 taxes profile ag-gemm --gpus 1 --shape M=1024,N=8192,K=8192 --iters 30 --rounds 3 --clock both \
        --hardware "$HW" -o "$OUT/ag_gemm-$GPU-x1-M1024.json" --force --timeout-s 110 --format md 2>&1 \
        | grep -E "^\| (E2E|measurement|kernel-launch|host-bound|speed|correct)|rror|wrote"
    for f in "$OUT"/*.json; do taxes check "$f" 2>&1 | head -12; done
fi
