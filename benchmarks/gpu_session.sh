#!/usr/bin/env bash
# The measurements behind reports/, on a 2-GPU node, from a bare checkout (installs nothing):
#
#   bash benchmarks/gpu_session.sh calibrate OUT     # this machine's hardware profile, and real traces
#   bash benchmarks/gpu_session.sh sweeps OUT        # the benchmark sweeps of ag-gemm and flash decode,
#                                                    # profiler cross-check traces, fault injection
#
# Each stage fits one 10-minute call of the device tool; every command has its own time limit and
# writes its result document as soon as it ends; the short table comes last.
set -u
stage=${1:?stage: calibrate or sweeps}
OUT=${2:-${OUT:-bench-out}}
HW=${HW:-reports/calibration/h200-x2-calibrated.json}
CLI="python benchmarks/taxes_cli.py"
summary() { grep -E "^\| (E2E|speed|correct)|^## |rror|wrote"; }
mkdir -p "$OUT"

if [ "$stage" = calibrate ]; then
    timeout 330 python benchmarks/calibrate.py --out "$OUT/calibration" --name h200-x2-calibrated 2>&1 | tail -30
    timeout 120 python docs/record_traces.py --out "$OUT/traces_real" --world 2 2>&1 | tail -3
    exit 0
fi

for N in 8192 28672; do
    shapes=""
    for M in 1024 2048 4096 8192 16384; do shapes="$shapes --shape M=$M,N=$N,K=8192"; done
    timeout 200 $CLI profile ag-gemm --gpus 2 $shapes --iters 30 --warmup 5 --hardware "$HW" \
        -o "$OUT/ag_gemm_N$N.json" --force --timeout-s 190 --format md 2>&1 | summary
done
shapes=""
for B in 1 4 16 64; do for S in 8192 32768 131072; do shapes="$shapes --shape B=$B,S=$S"; done; done
timeout 260 $CLI profile flash-decode --gpus 2 $shapes --iters 30 --warmup 5 --hardware "$HW" \
    -o "$OUT/flash_decode.json" --force --timeout-s 250 --format md 2>&1 | summary
timeout 90 $CLI profile ag-gemm --gpus 2 --shape M=4096,N=8192,K=8192 --iters 10 --hardware "$HW" --trace "$OUT/traces" \
    -o "$OUT/ag_gemm_traced.json" --force --timeout-s 80 --format md 2>&1 | summary
timeout 90 $CLI profile flash-decode --gpus 2 --shape B=1,S=32768 --shape B=16,S=32768 --iters 10 --hardware "$HW" \
    --trace "$OUT/traces" -o "$OUT/flash_decode_traced.json" --force --timeout-s 80 --format md 2>&1 | summary
timeout 150 python benchmarks/fault_flag.py 2>&1 | tail -20
python benchmarks/tables.py ag-gemm "$OUT/ag_gemm_N8192.json" "$OUT/ag_gemm_N28672.json"
python benchmarks/tables.py flash-decode "$OUT/flash_decode.json"
