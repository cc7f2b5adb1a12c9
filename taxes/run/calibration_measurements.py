"""The device measurements: one function per figure, each returning raw readings (plain lists of numbers,
JSON ready) that taxes.model.calibrate.derive turns into figures.

Every function runs on every rank together (`measure_FIGURE(ctx, plan, cycles_per_us)`), times on the
device (taxes.run.harness: back-to-back calls behind a sleep kernel, so launches stay outside the timed
window) and checks what it measures where a result can be wrong (the copy, the read's sums, the GEMM and
the combine against float32, each peer method's data). A figure that fails on one rank must fail on all
before any rank starts another collective (else one rank's barrier meets another's all_max); `_agree` is
that meeting point.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import triton

from taxes.model.calibrate.plan import (
    COMBINE_SETS,
    PEER_CTA_BYTES,
    PEER_CTAS,
    READ_CONFIGS,
    Plan,
    collective_worlds,
    matmul_shapes,
)
from taxes.run.cases import copies_done_us, cta_stamps, rel_error
from taxes.run.harness import device_batch_us, device_calls_us
from taxes.kernels import ag_gemm as ag
from taxes.kernels.flash_decode import combine_kernel
from taxes.kernels.probes import empty_kernel, hbm_read_sums, ping_pong, stamp, triton_peer_copy


def error_line(e: BaseException) -> str:
    """An exception as one line: its type and the first line of its message, at most 300 characters."""
    return (f"{type(e).__name__}: {e}".splitlines() or [type(e).__name__])[0][:300]


def _agree(ctx, fn=None, error: BaseException | None = None):
    """Run fn() here (or take `error`); if it raised on any rank, raise on every rank."""
    out = None
    if fn is not None and error is None:
        try:
            out = fn()
        except Exception as e:
            error = e
    if ctx.world > 1 and ctx.all_max([1.0 if error else 0.0])[0] and error is None:
        raise RuntimeError("failed on another rank")
    if error is not None:
        raise error
    return out


def device_info(device) -> dict:
    p = torch.cuda.get_device_properties(device)
    return {"name": p.name, "sm_count": int(p.multi_processor_count), "memory_bytes": int(p.total_memory),
            "capability": f"{p.major}.{p.minor}"}


def measure_launch(ctx, plan: Plan, cycles_per_us: float) -> dict:
    """Host cost of eager launches; device time per empty kernel eager (host ahead or not) and in a graph."""
    x = torch.zeros(16, dtype=torch.int32, device=ctx.device)
    n = plan.launches

    def triton_launch():
        empty_kernel[(1,)](x)

    def torch_launch():
        x.add_(1)

    # our fused GEMMs' launch path (tiny shape): a persistent Triton kernel with three TMA descriptors, bound
    # once to its buffers and then launched directly (kernels/launch.py)
    gemm = ag.PersistentGemm(ctx.device, ag.Config(num_stages=3))
    ga = torch.zeros(128, 64, dtype=torch.bfloat16, device=ctx.device)
    gw = torch.zeros(64, 256, dtype=torch.bfloat16, device=ctx.device)
    go = torch.empty(128, 256, dtype=torch.bfloat16, device=ctx.device)

    def triton_tma_launch():
        gemm(ga, gw, go)

    sdpa_launch, sdpa_backend = _sdpa_call(ctx.device)

    one = torch.cuda.CUDAGraph()  # one CUDA graph replay's host call (a one-kernel graph)
    with torch.cuda.graph(one):
        triton_launch()

    kinds = [("triton_host_us", triton_launch), ("torch_host_us", torch_launch),
             ("triton_tma_host_us", triton_tma_launch), ("graph_host_us", one.replay)]
    if sdpa_launch is not None:
        kinds.append(("sdpa_host_us", sdpa_launch))
    if ctx.world == 1 and dist.is_initialized():  # NCCL's one-rank all-gather (a copy) still costs c10d's host call
        gather_in = torch.zeros(256, dtype=torch.float32, device=ctx.device)
        gather_out = torch.empty_like(gather_in)
        kinds.append(("nccl_host_us", lambda: dist.all_gather_into_tensor(gather_out, gather_in)))
    for _ in range(20):
        for _, fn in kinds:
            fn()
    torch.cuda.synchronize()
    out = {"launches": n, "triton_host_us": [], "torch_host_us": [], "triton_tma_host_us": [], "graph_host_us": [],
           "sdpa_host_us": [], "nccl_host_us": [], "sdpa_backend": sdpa_backend, "eager_device_us": [], "prefilled_device_us": [],
           "prefilled_ahead": [], "graph_device_us": [], "graph_ahead": []}
    for _ in range(plan.reps):
        for key, fn in kinds:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            t1 = time.perf_counter()
            end.record()
            end.synchronize()
            out[key].append((t1 - t0) / n * 1e6)
            if fn is triton_launch:
                out["eager_device_us"].append(start.elapsed_time(end) * 1e3 / n)
        us, ahead = device_batch_us(triton_launch, n, cycles_per_us)
        out["prefilled_device_us"].append(us)
        out["prefilled_ahead"].append(ahead)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            triton_launch()
    graph.replay()
    torch.cuda.synchronize()
    for _ in range(plan.reps):
        us, ahead = device_batch_us(graph.replay, 1, cycles_per_us, spin_us=1000)
        out["graph_device_us"].append(us / n)
        out["graph_ahead"].append(ahead)
    out["first_launch"] = idle_launches({key.removesuffix("_host_us"): fn for key, fn in kinds},
                                        max(IDLE_ROUNDS, plan.reps), cycles_per_us)
    return out


IDLE_ROUNDS = 16  # readings per kind of the idle launch, quick or not: one reading moves with the host's state


def idle_launches(fns: dict, rounds: int, cycles_per_us: float) -> dict:
    """idle_launch for every kind, one reading of each kind per round (so a slow stretch of the host falls on
    every kind alike, not on the kind timed then), after one round not kept (each kind's first reading
    after the back-to-back loops read 2-4 times its median on H200s)."""
    out = {kind: {"idle_us": [], "host_us": [], "device_us": []} for kind in fns}
    events = _made_events()
    for r in range(rounds + 1):
        for kind, fn in fns.items():
            reading = idle_launch(fn, 1, cycles_per_us, events)
            if r:
                for key, values in reading.items():
                    out[kind][key] += values
    return out


def _sdpa_call(device) -> tuple[object, str | None]:
    """(fn, backend): one eager call of PyTorch's attention with the log-sum-exp as flash decode's bsp-sdpa
    makes it (kernels/flash_decode.py sdpa_lse: the GQA group as the query length) at a small decode shape,
    with the first backend that runs it (flash first: the one the tuned tables name at most shapes); (None,
    None) where none runs. Its host time is the model's "sdpa" launcher: tens of us, several times a kernel's."""
    from taxes.kernels.flash_decode import sdpa_lse

    q = torch.randn(1, 8, 128, dtype=torch.bfloat16, device=device)
    k = torch.randn(1, 1, 4096, 128, dtype=torch.bfloat16, device=device)
    v = torch.randn_like(k)
    for backend in ("flash", "cudnn", "efficient"):
        try:
            sdpa_lse(q, k, v, backend)
            torch.cuda.synchronize()
        except RuntimeError:
            continue
        return (lambda: sdpa_lse(q, k, v, backend)), backend
    return None, None


def _made_events() -> tuple:
    """A start and an end event, each recorded once: a CUDA event is made at its first record, and making one
    between a launch and its end event would be timed as that launch's (the profile's iterations make theirs
    before their first iteration too: taxes.run.harness.time_iterations)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    end.record()
    end.synchronize()
    return start, end


def idle_launch(fn, reps: int, cycles_per_us: float, events: tuple | None = None) -> dict:
    """What an iteration's first launch costs: per reading, the device drained, a start event, one fn() and
    an end event (idle_us: the event's time to the launch's end on the device; host_us: the call's own host
    time, one call after a drained device rather than one of many back to back), and the same call's device
    time with the host ahead (device_us), so idle_us - device_us is the start event to the kernel's start.
    events: the (start, end) pair to record, made beforehand (_made_events)."""
    out = {"idle_us": [], "host_us": [], "device_us": []}
    start, end = events or _made_events()
    for _ in range(reps):
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        end.record()
        end.synchronize()
        out["idle_us"].append(start.elapsed_time(end) * 1e3)
        out["host_us"].append((t1 - t0) * 1e6)  # the call alone, right after a drained device
        out["device_us"].append(device_calls_us(fn, 1, cycles_per_us)[0][0])
    return out


def measure_hbm(ctx, plan: Plan, cycles_per_us: float) -> dict:
    src = torch.randint(-2 ** 31, 2 ** 31 - 1, (plan.copy_bytes // 4,), dtype=torch.int32, device=ctx.device)
    dst = torch.empty_like(src)
    for _ in range(plan.warmup):
        dst.copy_(src)
    times, ahead = device_calls_us(lambda: dst.copy_(src), plan.reps, cycles_per_us)
    if not torch.equal(dst, src):
        raise RuntimeError("the device copy did not copy")
    dst = None  # free the copy's 1 GiB before the reads
    src.random_(0, 16)  # small values: the read kernel's int32 sums cannot overflow, so they check exactly
    read = [hbm_read(src, grid_per_sm, block, plan, cycles_per_us) for grid_per_sm, block in READ_CONFIGS]
    return {"bytes_moved": 2 * plan.copy_bytes, "us": times, "host_ahead": ahead, "read": read}


def hbm_read(x, grid_per_sm: int, block: int, plan: Plan, cycles_per_us: float) -> dict:
    """Time the read of x (kernels/probes.py: hbm_read_kernel; int32 values in [0, 16)); its sums checked
    against torch's."""
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 2
    grid = sms * grid_per_sm
    sums = torch.empty(grid, dtype=torch.int32, device=x.device)

    def run():
        hbm_read_sums(x, sums, block)

    run()
    checked = int(sums.sum(dtype=torch.int64)) == int(x.sum(dtype=torch.int64))
    for _ in range(plan.warmup):
        run()
    times = device_calls_us(run, plan.reps, cycles_per_us)[0] if x.is_cuda else []
    return {"config": f"{grid_per_sm} programs per SM, block {block}", "bytes": x.numel() * 4, "us": times,
            "checked": checked}


def _matmul_inputs(n: int, dtype, device, seed: int, m: int | None = None, k: int | None = None):
    """A (m x k), W (k x n) scaled by 1/sqrt(k), and an output (m x n); m and k default to n (square)."""
    m, k = m or n, k or n
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(m, k, generator=g, device=device).to(dtype)
    w = (torch.randn(k, n, generator=g, device=device) / k ** 0.5).to(dtype)
    return a, w, torch.empty(m, n, dtype=dtype, device=device)


def measure_matmul(ctx, plan: Plan, cycles_per_us: float) -> dict:
    n = plan.matmul_n
    out = {"n": n, "flops": 2 * n ** 3}
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        out[f"torch_{name}_us"] = _time_torch_matmul(n, dtype, ctx, plan, cycles_per_us)
    out["bf16_shapes"] = []
    for m, nn, k in matmul_shapes(n):
        a, w, c = _matmul_inputs(nn, torch.bfloat16, ctx.device, 11 + ctx.rank, m=m, k=k)
        for _ in range(plan.warmup):
            torch.matmul(a, w, out=c)
        us = device_calls_us(lambda: torch.matmul(a, w, out=c), plan.matmul_reps, cycles_per_us)[0]
        out["bf16_shapes"].append({"m": m, "n": nn, "k": k, "flops": 2 * m * nn * k, "us": us})
    return out


def _time_torch_matmul(n, dtype, ctx, plan: Plan, cycles_per_us: float) -> list[float]:
    a, w, c = _matmul_inputs(n, dtype, ctx.device, 1 + ctx.rank)
    for _ in range(plan.warmup):
        torch.matmul(a, w, out=c)
    return device_calls_us(lambda: torch.matmul(a, w, out=c), plan.matmul_reps, cycles_per_us)[0]


def measure_triton_gemm(ctx, plan: Plan, cycles_per_us: float) -> dict:
    """Our persistent GEMM (kernels/ag_gemm.py) at the matmul shape, checked against float32 first."""
    n = plan.matmul_n
    a, w, c = _matmul_inputs(n, torch.bfloat16, ctx.device, 7 + ctx.rank)
    cfg = ag.tuned_config(n, n, n, 1, "fused-pull")
    gemm = ag.PersistentGemm(ctx.device, cfg)
    err = rel_error(gemm(a, w, c.fill_(float("nan"))), a.float() @ w.float())
    out = {"n": n, "flops": 2 * n ** 3, "rel_error": err, "tolerance": 1e-2, "config": str(cfg)}
    if not err <= 1e-2:
        out["us"] = []
        return out
    for _ in range(plan.warmup):
        gemm(a, w, c)
    out["us"], _ = device_calls_us(lambda: gemm(a, w, c), plan.matmul_reps, cycles_per_us)
    return out


def measure_combine(ctx, plan: Plan, cycles_per_us: float, rows: int = 64, D: int = 128) -> dict:
    """flash decode's combine kernel at 4 programs of 16 rows (batch 1, 64 query heads), merging each
    of COMBINE_SETS partial sets per row; each run checked against a float32 merge first."""
    out = {"rows": rows, "sets": list(COMBINE_SETS), "us": [], "checked": True}
    g = torch.Generator(device=ctx.device).manual_seed(21 + ctx.rank)
    for n in COMBINE_SETS:
        part = torch.randn(rows, n, D + 1, generator=g, device=ctx.device)
        res = torch.full((rows, D + 1), float("nan"), device=ctx.device)

        def run():
            combine_kernel[(triton.cdiv(rows, 16),)](part, res, rows, n, n * (D + 1), D + 1, D=D, BLOCK_R=16,
                                                     PACKED_OUT=True, num_warps=4)

        run()
        w = torch.exp2(part[:, :, D] - part[:, :, D].max(dim=1, keepdim=True).values)  # log2-domain weights
        want = (w[:, :, None] * part[:, :, :D]).sum(1) / w.sum(1, keepdim=True)
        out["checked"] &= bool(torch.allclose(res[:, :D], want, rtol=1e-4, atol=1e-5))
        for _ in range(plan.warmup):
            run()
        out["us"].append(device_calls_us(run, plan.reps, cycles_per_us)[0] if ctx.device.type == "cuda" else [])
    return out


def _nccl_calls(size: int) -> int:
    """Back-to-back all-gathers per reading: about 2 ms of work, 3 to 30 calls."""
    est_us = 20 + size / 2e5
    return max(3, min(30, int(2000 / est_us)))


def measure_nccl(ctx, plan: Plan, cycles_per_us: float) -> dict:
    """NCCL's all-gather on every rank by size (the keys every calibration keeps), then the curves the model
    reads by collective and world (`curves`): the reduce-scatter at this world, and both collectives on the
    first w ranks for every smaller world of collective_worlds."""
    out = {"world": ctx.world}
    out.update(_collective_curve(ctx, plan, cycles_per_us, "all_gather", ctx.world, None))
    out["small_host_us"] = [h for size, host in zip(out["sizes"], out["host_us"]) if size <= 64 << 10 for h in host]
    out["curves"] = []
    for world in collective_worlds(ctx.world):
        group = dist.new_group(list(range(world))) if world < ctx.world else None  # every rank makes every group
        for op in ("all_gather", "reduce_scatter"):
            if world == ctx.world and op == "all_gather":
                continue
            curve = _collective_curve(ctx, plan, cycles_per_us, op, world, group)
            out["curves"].append(curve | {"op": op, "world": world})
    return out


def _collective_curve(ctx, plan: Plan, cycles_per_us: float, op: str, world: int, group) -> dict:
    """One collective's device time per call at every size of the plan, on the first `world` ranks (group:
    their process group, None for all): back-to-back calls behind a sleep after one call that lines the
    ranks up. Ranks outside the group meet the same barriers and record nothing."""
    member = ctx.rank < world
    out = {"world": world, "sizes": list(plan.nccl_sizes), "calls": [], "us": [], "host_ahead": [], "host_us": []}
    for size in plan.nccl_sizes:
        ctx.doing(f"calibrating nccl {op.replace('_', '-')} of {size} bytes per rank on {world} ranks")
        small, big = (size, world * size) if op == "all_gather" else (world * size, size)
        inp, res = _agree(ctx, lambda: (torch.randint(0, 255, (small,), dtype=torch.uint8, device=ctx.device),
                                        torch.empty(big, dtype=torch.uint8, device=ctx.device)) if member else (None, None))
        def call():
            if op == "all_gather":
                dist.all_gather_into_tensor(res, inp, group=group)
            else:
                dist.reduce_scatter_tensor(res, inp, group=group)

        calls = _nccl_calls(size)
        if member:
            for _ in range(2):
                call()
        times, ahead, host = [], [], []
        for _ in range(plan.reps):
            ctx.barrier()
            if not member:
                continue
            torch.cuda._sleep(int((1000 + 150 * (calls + 1)) * cycles_per_us))
            slept = torch.cuda.Event()
            slept.record()
            call()  # lines the ranks up: the timed calls start together
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            for _ in range(calls):
                call()
            t1 = time.perf_counter()
            end.record()
            ahead.append(not slept.query())
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / calls)
            host.append((t1 - t0) / calls * 1e6)
        out["calls"].append(calls)
        out["us"].append(times)
        out["host_ahead"].append(ahead)
        out["host_us"].append(host)
        del inp, res
    return out


def measure_peer(ctx, plan: Plan, cycles_per_us: float) -> dict:
    """Each rank in turn writes the next rank's symmetric buffer (copy engine, then Triton stores) and
    reads it back (Triton loads); every method's data is checked once. Then rank 0 writes to all peers
    at once (more than 2 GPUs)."""
    ctx.heap.reset()
    n = plan.peer_bytes // 4
    buf = ctx.heap.alloc((n,), torch.int32)
    g = torch.Generator(device=ctx.device).manual_seed(11 + ctx.rank)
    src = torch.randint(-2 ** 31, 2 ** 31 - 1, (n,), generator=g, dtype=torch.int32, device=ctx.device)
    back = torch.empty_like(src)
    out = {"pairs": []}
    error = None
    ctx.barrier()
    for sender in range(ctx.world):
        if ctx.rank == sender:
            try:
                out["pairs"].append(_peer_methods(ctx, plan, cycles_per_us, buf, src, back))
            except Exception as e:
                error = e
        ctx.barrier()
    if ctx.world > 2 and ctx.rank == 0 and error is None:
        ctx.doing("calibrating copies to all peers at once")
        try:
            out["injection"] = _injection(ctx, plan, cycles_per_us, buf, src)
        except Exception as e:
            error = e
    _agree(ctx, error=error)
    ctx.barrier()
    return out


def _peer_methods(ctx, plan: Plan, cycles_per_us: float, buf, src, back) -> dict:
    """This rank writes the next rank's buffer (copy engine; Triton stores addressed as the fused kernels
    do, and through the peer tensor), then reads it (Triton loads); each method's data is checked."""
    dst = (ctx.rank + 1) % ctx.world
    ctx.doing(f"calibrating peer copies to rank {dst}")
    pair = {"src": ctx.rank, "dst": dst, "bytes": plan.peer_bytes}
    methods = (("copy", lambda: buf.peers[dst].copy_(src)),
               ("store", lambda: triton_peer_copy(ctx, buf, src, dst, push=True)),
               ("store_direct", lambda: triton_peer_copy(ctx, buf, src, dst, push=True, via_bases=False)),
               ("load", lambda: triton_peer_copy(ctx, buf, back, dst, push=False)))
    for name, fn in methods:
        target = back if name == "load" else buf.peers[dst]
        try:  # one method failing (e.g. a kernel that does not compile) leaves the others standing
            target.fill_(-1)
            fn()  # warm-up (compiles the Triton kernel) and the checked run
            torch.cuda.synchronize()
            pair[f"{name}_checked"] = bool(torch.equal(target, src))
            for _ in range(plan.warmup):
                fn()
            pair[f"{name}_us"], _ = device_calls_us(fn, plan.reps, cycles_per_us)
        except Exception as e:
            pair[f"{name}_error"] = error_line(e)
            torch.cuda.synchronize()  # a broken context raises here, and the figure fails as a whole
    try:
        pair["ctas"] = _peer_by_ctas(ctx, plan, cycles_per_us, buf, src, back, dst)
    except Exception as e:
        pair["ctas_error"] = error_line(e)
        torch.cuda.synchronize()
    return pair


def _peer_by_ctas(ctx, plan: Plan, cycles_per_us: float, buf, src, back, dst: int) -> dict:
    """The same Triton stores and loads by PEER_CTAS programs, as the fused kernels' copier CTAs move peers'
    rows: what a few CTAs deliver (the fused GEMMs give 16 or 32 of their SMs to copying). A smaller copy
    (PEER_CTA_BYTES), checked once per count."""
    n = min(src.numel(), PEER_CTA_BYTES // 4)
    part, into = src[:n], back[:n]
    out = {"bytes": 4 * n, "ctas": list(PEER_CTAS), "store_us": [], "load_us": [], "checked": True}
    for ctas in PEER_CTAS:
        for name, fn, target in (
                ("store", lambda: triton_peer_copy(ctx, buf, part, dst, push=True, grid=ctas), buf.peers[dst][:n]),
                ("load", lambda: triton_peer_copy(ctx, buf, into, dst, push=False, grid=ctas), into)):
            target.fill_(-1)
            fn()
            torch.cuda.synchronize()
            out["checked"] &= bool(torch.equal(target, part))
            out[f"{name}_us"].append(device_calls_us(fn, plan.reps, cycles_per_us)[0])
    return out


def _injection(ctx, plan: Plan, cycles_per_us: float, buf, src) -> dict:
    """Rank 0 writes every peer's buffer at once, one stream per peer."""
    streams = [torch.cuda.Stream(ctx.device) for _ in range(ctx.world - 1)]

    def to_all():
        here = torch.cuda.current_stream()
        for s, peer in zip(streams, range(1, ctx.world)):
            s.wait_stream(here)
            with torch.cuda.stream(s):
                buf.peers[peer].copy_(src)
        for s in streams:
            here.wait_stream(s)

    for _ in range(plan.warmup):
        to_all()
    us, _ = device_calls_us(to_all, plan.reps, cycles_per_us)
    return {"bytes": (ctx.world - 1) * plan.peer_bytes, "us": us}


def measure_pingpong(ctx, plan: Plan, cycles_per_us: float, wait_s: float = 5.0) -> dict:
    """Rank 0 with each other rank in turn: relaxed and release/acquire round trips, then a stamped run
    for the clock offset. Both ranks of a pair track the same growing flag base."""
    if plan.rounds < 2:
        raise ValueError(f"a ping-pong reading needs 2 or more rounds, not {plan.rounds}")
    ctx.heap.reset()
    flags = ctx.heap.zeros((ctx.world,), torch.int32)
    stamps = ctx.heap.zeros((2 * plan.rounds + 2,), torch.int64)
    ctx.barrier()
    out = {"rounds": plan.rounds, "pairs": []}
    base = 0
    for peer in range(1, ctx.world):
        in_pair = ctx.rank in (0, peer)
        other = peer if ctx.rank == 0 else 0
        pair = {"peer": peer, "relaxed_rtt_us": [], "acquire_rtt_us": []}
        for relaxed in (True, False):
            kind = "relaxed_rtt_us" if relaxed else "acquire_rtt_us"
            for rep in range(-1, plan.pingpong_reps):  # rep -1: compiles, with a long budget for the slower peer
                rounds = min(8, plan.rounds) if rep < 0 else plan.rounds
                ctx.barrier()
                ctx.doing(f"calibrating flag ping-pong of ranks 0 and {peer} ({'relaxed' if relaxed else 'acquire'})")
                s = _agree(ctx, lambda: ping_pong(ctx, flags, stamps, other, base, rounds, relaxed, False,
                                                  120.0 if rep < 0 else wait_s) if in_pair else None)
                if rep >= 0 and ctx.rank == 0:  # rank 0 is in every pair
                    pair[kind].append((s[2 * rounds + 1] - s[2 * rounds]) / (rounds - 1) / 1e3)
                base += rounds
        rounds = min(plan.rounds, 200)
        for rep in range(2):  # the first compiles the stamped build
            ctx.barrier()
            s = _agree(ctx, lambda: ping_pong(ctx, flags, stamps, other, base, rounds, True, True,
                                              120.0 if rep == 0 else wait_s) if in_pair else None)
            base += rounds
        ctx.barrier()
        if ctx.rank == 0:
            t1 = stamps.peers[peer][:rounds].tolist()
            pair.update(t0=s[0:2 * rounds:2], t2=s[1:2 * rounds:2], t1=t1)
            out["pairs"].append(pair)
        ctx.barrier()
    return out


def measure_skew(ctx, plan: Plan, cycles_per_us: float) -> dict:
    """After each iteration-start barrier (RankContext.start_barrier) every rank stamps %globaltimer in a kernel; also the spread of a tiny
    all-reduce's device duration across ranks (the early rank waits for the late one)."""
    stamps = torch.zeros(plan.skew_reps, dtype=torch.int64, device=ctx.device)
    _agree(ctx, lambda: stamp(stamps, 0))  # compile before the timed barriers
    tiny = torch.zeros(1, device=ctx.device)
    dist.all_reduce(tiny)
    for k in range(plan.skew_reps):
        ctx.start_barrier()  # the barrier every timed iteration starts from
        stamp(stamps, k)
    torch.cuda.synchronize()
    gathered = torch.zeros(ctx.world * plan.skew_reps, dtype=torch.int64, device=ctx.device)
    dist.all_gather_into_tensor(gathered, stamps)
    spreads = []
    for _ in range(plan.skew_reps):
        ctx.start_barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dist.all_reduce(tiny)
        end.record()
        end.synchronize()
        d = start.elapsed_time(end) * 1e3
        hi, neg_lo = ctx.all_max([d, -d])
        spreads.append(hi + neg_lo)
    if ctx.rank != 0:
        return {}
    return {"stamps_ns": gathered.view(ctx.world, plan.skew_reps).tolist(), "collective_spread_us": spreads}


def measure_copiers(ctx, plan: Plan, cycles_per_us: float, config=None) -> dict:
    """The fused ag-gemm's copier CTAs beside its own GEMM, as the kernel runs them: every rank pushes its
    plan.copier_rows rows (K = plan.copier_nk) to every peer while its other CTAs compute (N/p =
    copier_nk / world columns), the kernel's default configuration unless `config`. Per timed call, the
    copiers' last "copies done" after the kernel's first CTA started (its traced build's stamps); the output
    is checked against float32 once. Peer copies by CTAs alone (measure_peer) overstate this rate when the
    copiers share the links with every other rank's and the HBM with the GEMM."""
    ctx.heap.reset()
    p, rows, K = ctx.world, plan.copier_rows, plan.copier_nk
    M, N_local = rows * p, K // p
    dtype = torch.bfloat16
    g = torch.Generator(device=ctx.device).manual_seed(23 + ctx.rank)
    a_full = ctx.heap.alloc((M, K), dtype)
    a_full.local.fill_(float("nan"))
    a_full.local[ctx.rank * rows:(ctx.rank + 1) * rows] = torch.randn(rows, K, generator=g, device=ctx.device).to(dtype)
    w_local = (torch.randn(K, N_local, generator=g, device=ctx.device) / K ** 0.5).to(dtype)
    out = torch.full((M, N_local), float("nan"), dtype=dtype, device=ctx.device)
    runner = ag.make_variant(ctx, "fused-push", M, N_local, K, dtype, config or ag.Config())
    on_gpu = ctx.device.type == "cuda"
    us, copiers = [], 0
    for i in range(plan.warmup + plan.reps):
        ctx.start_barrier()
        runner(a_full, w_local, out, traced=True)
        if on_gpu:
            torch.cuda.synchronize()
        done = copies_done_us(next(iter(cta_stamps(runner).values())))
        if i >= plan.warmup and done:
            copiers, t = done
            us.append(t)
    runner.check("the copiers' reading (fused all-gather + GEMM)")
    ctx.barrier()
    ref = ag.reference([a_full.peers[r][r * rows:(r + 1) * rows] for r in range(p)], w_local)
    err = rel_error(out, ref)
    return {"bytes": rows * K * torch.finfo(dtype).bits // 8 * (p - 1), "copiers": copiers, "us": us,
            "shape": {"M": M, "N": K, "K": K}, "checked": bool(err < 2e-2), "rel_error": err}
