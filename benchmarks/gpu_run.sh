#!/usr/bin/env bash
# The GPU measurements behind reports/, one stage per call of at most ten minutes, from the installed package:
#
#   bash benchmarks/gpu_run.sh timeline OUT   # one GPU: a calibration, the known answers (validate --planted),
#                                             # flash decode and ag-gemm profiled at world 1 with both clocks,
#                                             # host launch cost with CUPTI's API records
#   bash benchmarks/gpu_run.sh traces OUT     # one GPU: programs nobody here wrote, run by `taxes trace`
#                                             # (traces + plain step times, tarred into OUT/traces.tar.gz)
#
# Installs the carried wheels (.wheels: cupti-python, pyelftools) to /tmp/site when they are there, and the
# project offline. Every command has its own time limit and writes its result as soon as it ends; a short
# table comes last.
set -u
stage=${1:?stage: timeline or traces}
OUT=${2:-${OUT:-gpu-out}}
mkdir -p "$OUT"
if ls .wheels/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "install failed"; exit 1; }
export PYTHONUNBUFFERED=1
# the copy's .git (if any) is not the code's: documents take their commit from the stamp written before the copy
[ -f .taxes-provenance.json ] && export TAXES_PROVENANCE=stamp
GPU=$(python3 -c "import torch; n=torch.cuda.get_device_name(0).upper(); print(next((k.lower() for k in ('H100','H200','A100','B200') if k in n), 'gpu'))")
HW="$OUT/$GPU-x1-calibrated.json"

if [ "$stage" = timeline ]; then
    HW=reports/calibration/$GPU-x1-calibrated.json
    [ -f "$HW" ] || { timeout 120 taxes calibrate --gpus 1 --quick -o "$OUT/$GPU-x1-calibrated.json" 2>&1 | tail -2; HW="$OUT/$GPU-x1-calibrated.json"; }
    timeout 150 taxes validate --planted --gpus 1 --iters 30 --clock cupti -o "$OUT/known_answer-$GPU-x1.json" \
        --records "$OUT/known_answer-$GPU-x1.records.json.gz" 2>&1 | tail -8
    timeout 120 python3 benchmarks/clock_cost.py --workload flash-decode --shape B=1,S=131072 --iters 40 --rounds 3 \
        --out "$OUT/clock_cost-$GPU.json" 2>&1 | tail -9
    for S in 131072 32768; do
        timeout 110 taxes profile flash-decode --gpus 1 --shape B=1,S=$S --iters 100 --rounds 5 --clock cupti \
            --hardware "$HW" -o "$OUT/flash_decode-$GPU-x1-B1-S$S.json" --force --timeout-s 100 --format md 2>&1 \
            | grep -E "^\| (E2E|measurement|kernel-launch|host-bound|speed|correct)|rror|wrote"
    done
    timeout 100 taxes profile ag-gemm --gpus 1 --shape M=1024,N=8192,K=8192 --shape M=8192,N=8192,K=8192 --iters 60 \
        --rounds 5 --clock cupti --hardware "$HW" -o "$OUT/ag_gemm-$GPU-x1.json" --force --timeout-s 95 --format md 2>&1 \
        | grep -E "^\| (E2E|measurement|kernel-launch|host-bound|speed|correct)|rror|wrote"
    for f in "$OUT"/flash_decode*.json "$OUT"/ag_gemm*.json; do taxes check "$f" 2>&1 | head -8; done
fi

if [ "$stage" = traces ]; then
    T="$OUT/traces"; mkdir -p "$T"
    run() {  # NAME SECONDS ARGS...
        local name=$1 secs=$2; shift 2
        timeout "$secs" taxes trace --out "$T/$name" --steps 5 --plain 10 --skip 5 --format json -- "$@" \
            > "$T/$name.log" 2>&1; echo "$name: exit $? $(grep -E '^llama|^chain|traced|error' "$T/$name.log" | tr '\n' ' ')"
    }
    run llama-forward 60 python3 benchmarks/programs/llama.py --mode forward --steps 30
    run llama-graph 60 python3 benchmarks/programs/llama.py --mode graph --steps 30
    run llama-spin 60 python3 benchmarks/programs/llama.py --mode forward --steps 30 --spin-us 50
    run llama-train 60 python3 benchmarks/programs/llama.py --mode train --steps 30
    run chain-eager 40 python3 benchmarks/programs/chain.py --mode eager --steps 30
    run chain-compiled 90 python3 benchmarks/programs/chain.py --mode compiled --steps 30
    tar -czf "$OUT/traces.tar.gz" -C "$OUT" traces && rm -rf "$T"
    ls -la "$OUT"
fi
