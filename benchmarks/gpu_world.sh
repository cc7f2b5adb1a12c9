#!/usr/bin/env bash
# The multi-GPU measurements behind reports/ (known answers, profiles with rows, a calibration), on every GPU of
# the machine (world W = the GPUs visible), one stage per call of at most ten minutes, from the installed package:
#
#   bash benchmarks/gpu_world.sh smoke OUT      # any machine: do the ranks' clocks line up (clock_pairing.py); the
#                                               # known answers at world 1 with the late-rank runners built and timed
#   bash benchmarks/gpu_world.sh planted OUT    # `taxes validate --planted` three times (RUNS="1 2 3"), each
#                                               # to OUT/GPU-xW-N.json with its raw records beside it
#   bash benchmarks/gpu_world.sh calibrate OUT  # `taxes calibrate --quick` to OUT/GPU-xW-calibrated.json
#   bash benchmarks/gpu_world.sh profiles OUT   # ag-gemm, flash decode, gemm-rs and tp-mlp at world W with rows
#                                               # (WORKLOADS picks some), each checked by `taxes check`
#   bash benchmarks/gpu_world.sh sweep OUT      # every variant side by side per shape: ag-gemm over M, gemm-rs and
#                                               # flash decode at the shapes docs/scaling.md quotes
#   bash benchmarks/gpu_world.sh skew OUT       # how far apart the ranks leave dist.barrier and the start gate
#                                               # (benchmarks/start_skew.py), to OUT/start_skew-GPU-xW.json
#   bash benchmarks/gpu_world.sh tune OUT       # benchmarks/tune.py for each of TUNE (default: ag-gemm gemm-rs) at
#                                               # world W, TUNE_ARGS passed on (e.g. --shape M=1024,N=8192,K=8192),
#                                               # to OUT/WORKLOAD-tune.json (every candidate and the winners)
#   bash benchmarks/gpu_world.sh heldout OUT    # the model on shapes in no test and no tuning table (HELDOUT picks
#                                               # some of: ag rs decode mlp): every variant profiled with rows, then
#                                               # `taxes validate` of them to OUT/validate-heldout-GPU-xW/
#   bash benchmarks/gpu_world.sh ddp OUT        # benchmarks/ddp_known_answers.py at world W (DDP_CASES picks the
#                                               # delays, DDP_STEPS the steps per case), to OUT/ddp-GPU-xW.json, the
#                                               # 3 ms cases' traces kept
#   bash benchmarks/gpu_world.sh "planted profiles" OUT
#
# DEADLINE_S (seconds from the start): every stage's limit is cut to what is left before it, and a stage
# that could not finish in what is left is skipped and says so, so that the archive below is always written
# inside one call's limit. A calibration is also saved where later calls on the same machine find it
# (~/.config/taxes/profiles), so their profiles and sweeps are priced by it.
#
# Stages run in this order, whatever order they are named in: smoke, skew, calibrate, planted, tune, profiles,
# heldout, sweep, ddp.
# Installs the carried wheels (.wheels) to /tmp/site and the project offline; NVLink multicast stays off.
set -u
stages=" ${1:?stage: smoke, skew, planted, calibrate, tune, profiles, heldout, sweep or ddp (several: quoted, space-separated)} "
OUT=${2:-${OUT:-gpu-out}}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if ls .wheels/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "install failed"; exit 1; }
# documents name the commit from the stamp written before the tree was copied (python -m taxes.provenance,
# carried with the tree): a copy's own .git may be an older one
[ -f .taxes-provenance.json ] && export TAXES_PROVENANCE=stamp \
    || echo "no .taxes-provenance.json: the documents name this copy's .git, which may not be the code's"
W=$(nvidia-smi -L | grep -c '^GPU')
GPU=$(python3 -c "import torch; from taxes.model.hardware import gpu_kind; print(gpu_kind(torch.cuda.get_device_name(0)))")
echo "world $W, $GPU"
LOG="$OUT/log-$GPU-x$W.txt"
T0=$SECONDS
# cap SECONDS [LEAST]: SECONDS, or what is left before DEADLINE_S (20 s kept for the archive) when that is
# less; 0 when less than LEAST (default 60) is left
cap() {
    local left=$(( ${DEADLINE_S:-1000000} - (SECONDS - T0) - 20 )) want=$1 least=${2:-60}
    if [ "$left" -lt "$least" ]; then echo 0; elif [ "$want" -lt "$left" ]; then echo "$want"; else echo "$left"; fi
}
at() { echo "[$((SECONDS - T0)) s] $*"; }
# --hardware for the profiles and validations: this call's calibration (the calibrate stage), else the committed
# one of this GPU kind and count, else none (taxes picks)
hardware_arg() {
    local hw=$OUT/$GPU-x$W-calibrated.json
    [ -f "$hw" ] || hw=reports/calibration/$GPU-x$W-calibrated.json
    [ -f "$hw" ] && echo "--hardware $hw"
}

if [[ "$stages" == *" smoke "* ]]; then
    timeout 60 python3 benchmarks/clock_pairing.py --procs 2 --out "$OUT/clock_pairing-$GPU.json" 2>&1 | tail -4
    cat > /tmp/late_smoke.py <<'PY'
import time
from taxes.kernels.runtime import launch
from taxes.run.planted import late_cases, planted_heap_bytes

def job(ctx, opts):
    return late_cases(ctx, opts)

if __name__ == "__main__":
    t = time.time()
    opts = {"clock": "cupti", "iters": 5, "warmup": 2, "late_us": (20.0,)}
    res = launch(job, 1, opts, backend="cuda", heap_bytes=planted_heap_bytes(2, False), timeout_s=180)
    for k, m in res[0].items():
        print(k, "plain", round(sorted(m["plain"])[len(m["plain"]) // 2], 1), "acts", len(m["raw"]["activities"]),
              "origin", m["raw"]["shared_origin_us"])
    print("late cases at world 1 ran in", round(time.time() - t, 1), "s")
PY
    timeout 200 python3 /tmp/late_smoke.py 2>&1 | tail -25
    [ -n "${SMOKE_PLANTED:-}" ] && timeout 150 taxes validate --planted --gpus 1 --iters 20 --clock cupti \
        -o "$OUT/$GPU-x1-smoke.json" 2>&1 | tail -9
fi

if [[ "$stages" == *" skew "* ]]; then
    t=$(cap 120 30)
    [ "$t" = 0 ] && at "skew skipped: too little time left"
    [ "$t" = 0 ] || timeout "$t" python3 benchmarks/start_skew.py --gpus "$W" --reps ${SKEW_REPS:-300} --out "$OUT/start_skew-$GPU-x$W.json" 2>&1 | tail -3
fi

if [[ "$stages" == *" calibrate "* ]]; then
    t=$(cap ${CALIBRATE_S:-150} 90)
    if [ "$t" = 0 ]; then at "calibrate skipped: too little time left"; else
        at calibrate
        timeout "$t" taxes calibrate --gpus "$W" --quick -o "$OUT/$GPU-x$W-calibrated.json" 2>&1 | tail -3
        [ -f "$OUT/$GPU-x$W-calibrated.json" ] && mkdir -p ~/.config/taxes/profiles \
            && cp "$OUT/$GPU-x$W-calibrated.json" ~/.config/taxes/profiles/
    fi
fi

if [[ "$stages" == *" planted "* ]]; then
    # the late rank's host gate first: a run that cannot plant a host delay should stop in seconds
    # (once more on a failure: the first timed gate on a machine just started once ran 30 us long on 4 H200s)
    for try in 1 2; do
        gate=$(TRITON_INTERPRET=0 timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_host_gate.py 2>&1)
        status=$?
        [ "$status" = 0 ] && break
    done
    echo "$gate" | tail -${GATE_TAIL:-3}
    [ "$status" = 0 ] || { echo "the host gate does not hold: no planted run"; RUNS=""; }
    for n in ${RUNS-1 2 3}; do
        t=$(cap ${PLANTED_S:-170} ${PLANTED_S:-170})
        [ "$t" = 0 ] && { at "planted run $n skipped: less than ${PLANTED_S:-170} s left"; continue; }
        at "planted run $n"
        timeout "$t" taxes validate --planted --gpus "$W" --iters ${ITERS:-20} --clock cupti \
            -o "$OUT/$GPU-x$W-$n.json" --records "$OUT/$GPU-x$W-$n.records.json.gz" 2>&1 | tail -${TAIL:-25}
    done
fi

if [[ "$stages" == *" tune "* ]]; then
    for wl in ${TUNE:-ag-gemm gemm-rs}; do
        t=$(cap ${TUNE_S:-280} 90)
        [ "$t" = 0 ] && { at "tune $wl skipped: too little time left"; continue; }
        at "tune $wl"
        # shellcheck disable=SC2086  # TUNE_ARGS holds several arguments
        timeout "$t" python3 benchmarks/tune.py "$wl" --gpus "$W" ${TUNE_ARGS:-} --out "$OUT" 2>&1 | tail -14
    done
fi

if [[ "$stages" == *" profiles "* ]]; then
    HWARG=$(hardware_arg)
    prof() {  # NAME WORKLOAD SECONDS ARGS...
        local name=$1 wl=$2 secs=$(cap $3 60); shift 3
        [ "$secs" = 0 ] && { at "$name skipped: too little time left"; return; }
        at "$name"
        timeout "$secs" taxes profile "$wl" --gpus "$W" --clock cupti $HWARG --iters ${PITERS:-40} --rounds 4 \
            -o "$OUT/$name-$GPU-x$W.json.gz" --force --timeout-s $((secs - 5)) --format md "$@" > "$OUT/$name.md" 2>&1
        echo "$name: exit $?"; grep -E "^\| (E2E|measurement|speed|correct)|rror" "$OUT/$name.md" | head -12
        taxes check "$OUT/$name-$GPU-x$W.json.gz" 2>&1 | head -14
    }
    for wl in ${WORKLOADS:-ag-gemm flash-decode gemm-rs tp-mlp}; do
        case $wl in
            ag-gemm) prof ag_gemm ag-gemm 200 --shape M=1024,N=8192,K=8192 --shape M=8192,N=8192,K=8192 ;;
            flash-decode) prof flash_decode flash-decode 120 --shape B=1,S=32768 ;;
            gemm-rs) prof gemm_rs gemm-rs 150 --shape M=4096,N=4096,K=14336 ;;
            # fused and bulk-synchronous variants in turns, fused-auto left out (docs/tp_mlp.md: two fused
            # tp-mlp blocks in a row fail under the cupti-python clock)
            tp-mlp) prof tp_mlp tp-mlp 150 --shape M=4096,H=4096,F=14336 \
                        --variants all-fused-eager,all-bsp,all-fused,all-graph ;;
        esac
    done
fi

if [[ "$stages" == *" heldout "* ]]; then
    # Shapes of real layers that no test and no tuning table names (tests/test_gpu_scripts.py checks that they stay
    # so): the fused kernels take the nearest tuned configuration, fused-auto the nearest measured pick. Priced
    # with this machine's calibration when the call made one (the calibrate stage), else the committed one.
    HWARG=$(hardware_arg)
    held() {  # NAME WORKLOAD SECONDS VARIANTS (all: every one) SHAPE...
        local name=heldout_$1 wl=$2 secs=$(cap $3 60) variants=$4; shift 4
        [ "$secs" = 0 ] && { at "$name skipped: too little time left"; return; }
        at "$name"
        local shapes=(); for sh in "$@"; do shapes+=(--shape "$sh"); done
        [ "$variants" = all ] || shapes+=(--variants "$variants")
        timeout "$secs" taxes profile "$wl" --gpus "$W" --clock cupti $HWARG --iters ${HITERS:-20} --rounds 2 \
            "${shapes[@]}" -o "$OUT/$name-$GPU-x$W.json.gz" --force --timeout-s $((secs - 5)) --format md \
            > "$OUT/$name.md" 2>&1
        echo "$name: exit $?"; grep -E "^\| (E2E|model E2E)" "$OUT/$name.md" | head -6
    }
    for what in ${HELDOUT:-ag rs decode mlp}; do
        case $what in
            ag) held ag_gemm ag-gemm ${HELDOUT_S:-160} all M=6144,N=5120,K=5120 M=1536,N=12288,K=4096 ;;
            rs) held gemm_rs gemm-rs ${HELDOUT_S:-110} all M=3072,N=5120,K=13824 ;;
            decode) held flash_decode flash-decode ${HELDOUT_S:-90} all B=2,Hq=32,Hkv=8,D=128,S=20480 ;;
            # the layer's fused and bulk-synchronous variants in turns (as in the profiles stage)
            mlp) held tp_mlp tp-mlp ${HELDOUT_S:-130} all-fused-eager,all-bsp,all-fused,all-graph,fused-auto \
                     M=2048,H=5120,F=13824 ;;
        esac
    done
    docs=$(ls "$OUT"/heldout_*-"$GPU"-x"$W".json.gz 2>/dev/null)
    # one run: the table on stdout, the whole validation in OUT/validate-heldout-GPU-xW/validation.json
    # shellcheck disable=SC2086  # one word per document
    [ -n "$docs" ] && timeout 180 taxes validate $HWARG --each-calibration reports/calibration \
        --out-dir "$OUT/validate-heldout-$GPU-x$W" --force --from $docs 2>&1 | tail -8
fi

if [[ "$stages" == *" sweep "* ]]; then
    # every variant side by side, interleaved: ag-gemm over M at N=K=8192 and at N=28672, gemm-rs at a 70B
    # layer's down projection, flash decode at B=1, S=32K per rank (SWEEP picks some of: ag-small ag-large
    # gemm-rs decode); a group that outruns its time leaves the others; SWEEP_START: how each iteration starts
    # (barrier: isolated, the default; ahead: the host queues the iteration first, as a model's layer runs)
    sw() {  # NAME WORKLOAD SECONDS SHAPE...
        local name=$1${SWEEP_START:+-$SWEEP_START} wl=$2 secs=$(cap $3 45); shift 3
        [ "$secs" = 0 ] && { at "$name skipped: too little time left"; return; }
        at "$name"
        local shapes=(); for sh in "$@"; do shapes+=(--shape "$sh"); done
        timeout "$secs" taxes profile "$wl" --gpus "$W" --clock cupti --iters ${SITERS:-20} --rounds 2 \
            --start ${SWEEP_START:-barrier} "${shapes[@]}" -o "$OUT/$name-$GPU-x$W.json.gz" --force \
            --timeout-s $((secs - 5)) --format md > "$OUT/$name.md" 2>&1
        echo "$name: exit $?"; grep -i "error" "$OUT/$name.md" | head -3
        [ -f "$OUT/$name-$GPU-x$W.json.gz" ] && python3 benchmarks/tables.py "$OUT/$name-$GPU-x$W.json.gz" 2>&1 | tail -8
    }
    for what in ${SWEEP:-ag-small ag-large gemm-rs decode}; do
        case $what in
            ag-small) sw sweep-ag_gemm-small ag-gemm ${SWEEP_S:-150} M=512,N=8192,K=8192 M=1024,N=8192,K=8192 \
                          M=2048,N=8192,K=8192 M=4096,N=8192,K=8192 ;;
            ag-large) sw sweep-ag_gemm-large ag-gemm ${SWEEP_S:-200} M=8192,N=8192,K=8192 M=16384,N=8192,K=8192 \
                          M=8192,N=28672,K=8192 ;;
            gemm-rs) sw sweep-gemm_rs gemm-rs ${SWEEP_S:-100} M=8192,N=8192,K=28672 ;;
            decode) sw sweep-flash_decode flash-decode ${SWEEP_S:-80} B=1,S=32768 ;;
        esac
    done
fi

if [[ "$stages" == *" ddp "* ]]; then
    t=$(cap ${DDP_S:-560} 120)
    [ "$t" = 0 ] && at "ddp skipped: too little time left"
    [ "$t" = 0 ] || timeout "$t" python3 benchmarks/ddp_known_answers.py --gpus "$W" \
        --cases "${DDP_CASES:-host:1,host:3,host:10,device:1,device:3,device:10}" ${DDP_STEPS:+--steps "$DDP_STEPS"} \
        --out "$OUT/ddp-$GPU-x$W.json" 2>&1 | tail -14
    # the traces of the 3 ms cases stay (fixtures with their measured truth), the others would only weigh
    # (DDP_KEEP=all keeps every case's, to judge them again by later rules)
    [ "${DDP_KEEP:-}" = all ] || \
        find "$OUT/ddp-$GPU-x$W-traces" -mindepth 1 -maxdepth 1 -type d ! -name '*-3ms' -exec rm -rf {} + 2>/dev/null
fi

at "done"
# at most eight files of 16 MiB come back from a call: everything in one archive, in 15 MiB parts where it is
# larger (cat bundle-*.tgz.part-* | tar xz), the short tables above on stdout
( cd "$OUT" && tar czf /tmp/bundle.tgz . && find . -mindepth 1 -delete \
    && if [ "$(stat -c %s /tmp/bundle.tgz)" -gt 15728640 ]; then split -b 15M -d /tmp/bundle.tgz "bundle-$GPU-x$W.tgz.part-"; \
       rm /tmp/bundle.tgz; else mv /tmp/bundle.tgz "bundle-$GPU-x$W.tgz"; fi && ls -la )
