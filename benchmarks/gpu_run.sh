#!/usr/bin/env bash
# The GPU measurements behind reports/, one stage per call of at most ten minutes, from the installed package:
#
#   bash benchmarks/gpu_run.sh timeline OUT   # one GPU: a calibration, the known answers (validate --planted),
#                                             # flash decode and ag-gemm profiled at world 1 with both clocks,
#                                             # host launch cost with CUPTI's API records
#   bash benchmarks/gpu_run.sh profiles OUT   # one GPU: the timeline stage's profiles alone (flash decode at B=1,
#                                             # S=128K and 32K, ag-gemm; each checked by `taxes check`)
#   bash benchmarks/gpu_run.sh planted OUT    # one GPU: the known answers alone (validate --planted)
#   bash benchmarks/gpu_run.sh traces OUT     # one GPU: programs nobody here wrote, run by `taxes trace`
#                                             # (traces + plain step times, tarred into OUT/traces.tar.gz)
#   bash benchmarks/gpu_run.sh devicebound OUT   # one GPU: the same Llama made device-bound, for the timing record's
#                                             # device-bound known answers (traces into OUT/traces-devicebound.tar.gz)
#   bash benchmarks/gpu_run.sh cost OUT       # one GPU: flash decode's measurement cost, 1000 iterations in 100 rounds
#                                             # (COST_S=32768: at S=32K; COST_RUNS="1 2": two runs)
#   bash benchmarks/gpu_run.sh decode OUT     # one GPU: the per-GPU decode against PyTorch's attention (18 shapes),
#                                             # and where a B=1 decode's time goes (benchmarks/decode_probe.py)
#   bash benchmarks/gpu_run.sh "traces cost" OUT   # several stages in one call
#
# Installs the carried wheels (.wheels: cupti-python, pyelftools, and jsonschema with its dependencies, which the
# GPU machine lacks) to /tmp/site when they are there, and the
# project offline. Every command has its own time limit and writes its result as soon as it ends; a short
# table comes last.
set -u
stages=" ${1:?stage: timeline, profiles, planted, traces, devicebound, cost or decode (several: quoted, space-separated)} "
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

run() {  # NAME SECONDS RECORD STEPS ARGS...: one `taxes trace` run into $T/NAME, its log beside it
    local name=$1 secs=$2 record=$3 n=$4; shift 4
    timeout "$secs" taxes trace --out "$T/$name" --record "$record" --steps "$n" --plain "$n" --block "${BLOCK:-2}" \
        --skip 5 --format json \
        --hardware "$HW" -- "$@" > "$T/$name.log" 2>&1
    echo "$name: exit $? $(grep -E '^llama|^chain|traced|error' "$T/$name.log" | tr '\n' ' ')"
}

if [[ "$stages" == *" timeline "* ]]; then
    HW=reports/calibration/$GPU-x1-calibrated.json
    [ -f "$HW" ] || { timeout 120 taxes calibrate --gpus 1 --quick -o "$OUT/$GPU-x1-calibrated.json" 2>&1 | tail -2; HW="$OUT/$GPU-x1-calibrated.json"; }
    timeout 150 taxes validate --planted --gpus 1 --iters 30 --clock cupti -o "$OUT/known_answer-$GPU-x1.json" \
        --records "$OUT/known_answer-$GPU-x1.records.json.gz" 2>&1 | tail -8
    timeout 120 python3 benchmarks/clock_cost.py --workload flash-decode --shape B=1,S=131072 --iters 40 --rounds 3 \
        --out "$OUT/clock_cost-$GPU.json" 2>&1 | tail -9
fi

if [[ "$stages" == *" timeline "* || "$stages" == *" profiles "* ]]; then
    HW=reports/calibration/$GPU-x1-calibrated.json
    [ -f "$HW" ] || HW="$OUT/$GPU-x1-calibrated.json"
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

if [[ "$stages" == *" planted "* ]]; then
    timeout 150 taxes validate --planted --gpus 1 --iters 30 --clock cupti -o "$OUT/known_answer-$GPU-x1.json" \
        --records "$OUT/known_answer-$GPU-x1.records.json.gz" 2>&1 | tail -8
fi

if [[ "$stages" == *" traces "* ]]; then
    # the known answers of benchmarks/analyze_known_answers.py: the host-bound Llama runs recorded with --record
    # timing (cupti-python), the chain with --record full (it needs tensors for locality); 80 plain and 80
    # profiled steps of the Llama (its host time varies by a third from step to step), 20 and 20 of the chain;
    # the timing record's plain and profiled steps alternate in blocks of 2 (the host's speed moved between
    # regimes every second or two)
    T="$OUT/traces"; mkdir -p "$T"
    HW=reports/calibration/$GPU-x1-calibrated.json
    run llama-alternate 100 timing 80 python3 benchmarks/programs/llama.py --mode alternate --steps 170
    run llama-forward 100 timing 80 python3 benchmarks/programs/llama.py --mode forward --steps 170
    run llama-spin-alternate 100 timing 80 python3 benchmarks/programs/llama.py --mode forward --steps 170 --spin-us 200 \
        --spin-every 2
    run chain-eager 60 full 20 python3 benchmarks/programs/chain.py --mode eager --steps 50
    run chain-compiled 120 full 20 python3 benchmarks/programs/chain.py --mode compiled --steps 50
    run llama-forward-full 90 full 40 python3 benchmarks/programs/llama.py --mode forward --steps 90  # what full costs
    tar -czf "$OUT/traces.tar.gz" -C "$OUT" traces && rm -rf "$T"
    ls -la "$OUT"
fi

if [[ "$stages" == *" devicebound "* ]]; then
    # the same Llama made device-bound (2048 tokens, hidden 4096): its graph twin, a host spin the device's work
    # hides, and a spin after a synchronisation that stalls the device (benchmarks/analyze_known_answers.py
    # --set device-bound)
    T="$OUT/traces-devicebound"; mkdir -p "$T"
    HW=reports/calibration/$GPU-x1-calibrated.json
    BIG="--tokens 2048 --hidden 4096"
    run llama-big-alternate 150 timing 80 python3 benchmarks/programs/llama.py --mode alternate --steps 170 $BIG
    run llama-big-spin 150 timing 80 python3 benchmarks/programs/llama.py --mode forward --steps 170 --spin-us 200 \
        --spin-every 2 $BIG
    run llama-big-sync-spin 150 timing 80 python3 benchmarks/programs/llama.py --mode forward --steps 170 --spin-us 200 \
        --spin-every 2 --sync-spin $BIG
    tar -czf "$OUT/traces-devicebound.tar.gz" -C "$OUT" traces-devicebound && rm -rf "$T"
fi

if [[ "$stages" == *" cost "* ]]; then
    # measuring's cost at flash decode B=1, S=128K: 1000 iterations in 100 interleaved rounds (the eager SDPA
    # variant waits 50-110 us for PyTorch's attention call before its first kernel, and that wait follows the
    # host's speed: at 400 iterations two runs estimated its cost at +3.1% and +1.0%)
    # COST_S: the sequence length (default 131072)
    HW=reports/calibration/$GPU-x1-calibrated.json
    S=${COST_S:-131072}
    for n in ${COST_RUNS:-1}; do
        timeout 280 taxes profile flash-decode --gpus 1 --shape B=1,S=$S --iters 1000 --rounds 100 --clock cupti \
            --hardware "$HW" -o "$OUT/flash_decode-$GPU-x1-B1-S$S-iters1000-$n.json" --force --timeout-s 275 \
            --format md 2>&1 | grep -E "^\| (E2E|rows add|measurement|speed|correct)|rror|wrote"
    done
fi

if [[ "$stages" == *" decode "* ]]; then
    COMMIT=$(python3 -c "import json; print(json.load(open('.taxes-provenance.json'))['git_commit'])" 2>/dev/null)
    (cd benchmarks && timeout 330 python3 decode_world1.py --gpu "$GPU" --commit "$COMMIT" --out "$OUT" --replays 40 \
        --budget-s 240 2>&1 | tail -24)
    (cd benchmarks && timeout 150 python3 decode_probe.py --out "$OUT" --parts 1 --budget-s 100 2>&1 | tail -3)
fi
