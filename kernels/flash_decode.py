"""Flash Decode across GPUs: one decode step of attention with the KV cache split along the sequence.

Each rank holds S tokens of K and V (B x Hkv x S x D); the query (B x Hq x D) is replicated; Hq query
heads share Hkv KV heads (GQA, G = Hq / Hkv). Every rank ends with the full output (B x Hq x D).

Each rank attends to its own tokens with the one-launch local decode (kernels/decode_local.py,
`LocalDecode`), which leaves the rank's partial (output and base-2 log-sum-exp per row) packed for an
all-gather, or pushes it into every peer's inbox from inside the launch. The kernels here merge the
ranks' partials:
- `combine_kernel`: merges N partials of each row with the safe rescaling
  o = sum_i 2^(lse_i - m) o_i / sum_i 2^(lse_i - m), lse = m + log2(sum_i 2^(lse_i - m)), m = max_i lse_i
  (bsp's global combine across ranks).
- `fused_combine_kernel`: one program per (batch, KV head): the rank's own partial (left in its inbox
  slot by the decode kernel) merged with the peers' partials as they arrive. The peers pushed theirs
  from inside their decode kernels, while their KV still streamed, so by the time this small launch
  runs they have usually landed. The signal is a flag per (source rank, group), or the data itself: the
  inbox is filled with a sentinel NaN bit pattern that no arithmetic produces, the consumer spins until
  none of its values is the sentinel, then writes the sentinel back (the polled tile holds no value in
  two threads: `poll_rows`). Inboxes are double-buffered by
  call parity: a peer can be at most one call ahead (it needs our partial of the next call first).

Variants: bsp (the local decode to the packed partial, NCCL all-gather, global combine: two launches
and a collective), bsp-graph (the same in one CUDA graph), fused-push(-graph) (the local decode pushing
to peers, then the fused combine: two launches, no collective), bsp-sdpa(-graph) (what a user would
write: PyTorch's attention that returns the log-sum-exp, then the same all-gather and global combine).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from taxes.kernels.decode_local import (
    LOG2E,
    Config,
    LocalDecode,
    attention_partial_f32,
    check_shape,
    merge_partials_f32,
    tuned_entry,
)
from taxes.kernels.launch import BoundedCache, BoundLaunch, buffer_key
from taxes.kernels.device import gpu_name_of, interpreting, replay_graph
from taxes.kernels.rank import RankContext
from taxes.kernels.sync import (
    ERR_WORDS,
    cta_clock_ns,
    globaltimer_ns,
    raise_if_timed_out,
    record_timeout,
    spent_since,
    timed_out_elsewhere,
    wait_at_least,
    wait_budget,
)
from taxes.variants import get, kernel_names

VARIANTS = kernel_names("flash-decode")  # the variants with kernels here (taxes.variants)
TRACE_WORDS = tl.constexpr(3)  # per program of a traced fused combine: start ns, ns spent waiting for peers, end ns
SENTINEL_BITS = 0x7F80DEAD  # a NaN payload float arithmetic never produces (it yields 0x7FC00000)
SDPA_LSE_BACKENDS = ("cudnn", "flash", "efficient")  # bsp-sdpa's local attention, tried in this order
PACK_ROWS = 16  # rows per program of pack_kernel


# ---- kernels --------------------------------------------------------------------------------------


@triton.jit
def _merge_sets(part_ptr, rows, row_ok, n_sets, stride_row, stride_set, D: tl.constexpr, BLOCK_R: tl.constexpr):
    """Merge n_sets partials (o, lse) of each row: returns (o, lse) in the log2 domain."""
    d = tl.arange(0, D)
    m = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    for s in range(n_sets):
        lse_s = tl.load(part_ptr + rows * stride_row + s * stride_set + D, mask=row_ok, other=float("-inf"))
        m = tl.maximum(m, lse_s)
    wsum = tl.zeros((BLOCK_R,), tl.float32)
    acc = tl.zeros((BLOCK_R, D), tl.float32)
    for s in range(n_sets):
        base = part_ptr + rows * stride_row + s * stride_set
        lse_s = tl.load(base + D, mask=row_ok, other=float("-inf"))
        w = tl.exp2(lse_s - m)
        o_s = tl.load(base[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
        acc += w[:, None] * o_s
        wsum += w
    return acc / wsum[:, None], m + tl.log2(wsum)


@triton.jit
def combine_kernel(part_ptr, out_ptr, R, n_sets, stride_row, stride_set, D: tl.constexpr, BLOCK_R: tl.constexpr,
                   PACKED_OUT: tl.constexpr):
    """out[r] = merge of n_sets partials; PACKED_OUT: float32 (o, lse) rows of D+1, else o in out's dtype."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    rows64 = rows.to(tl.int64)
    o, lse = _merge_sets(part_ptr, rows64, row_ok, n_sets, stride_row, stride_set, D, BLOCK_R)
    d = tl.arange(0, D)
    if PACKED_OUT:
        dst = out_ptr + rows64 * (D + 1)
        tl.store(dst[:, None] + d[None, :], o, mask=row_ok[:, None])
        tl.store(dst + D, lse, mask=row_ok)
    else:
        tl.store(out_ptr + rows64[:, None] * D + d[None, :], o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def pack_kernel(o_ptr, lse_ptr, dst_ptr, R, Hkv, G, so_b, so_h, so_g, sl_b, sl_h, sl_g, lse_scale,
                D: tl.constexpr, BLOCK_R: tl.constexpr):
    """dst[r] = (o[r] as float32, lse[r] * lse_scale) for R = B x Hkv x G rows: PyTorch attention's
    output and log-sum-exp, at whatever strides its backend left them, packed as our partial in one
    launch (bsp-sdpa; a copy and a multiply were two launches and two calls on the host)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    g = rows % G
    h = (rows // G) % Hkv
    b = rows // (G * Hkv)
    d = tl.arange(0, D)
    o = tl.load(o_ptr + (b.to(tl.int64) * so_b + h * so_h + g * so_g)[:, None] + d[None, :], mask=row_ok[:, None])
    lse = tl.load(lse_ptr + b.to(tl.int64) * sl_b + h * sl_h + g * sl_g, mask=row_ok)
    dst = dst_ptr + rows.to(tl.int64) * (D + 1)
    tl.store(dst[:, None] + d[None, :], o.to(tl.float32), mask=row_ok[:, None])
    tl.store(dst + D, lse.to(tl.float32) * lse_scale, mask=row_ok)


COMBINE_WARPS = 4  # fused_combine_kernel's warps


def poll_rows(G: int, D: int, num_warps: int) -> int:
    """Rows of the fused combine's tile: the group's G query heads rounded up to a power of two, and more
    (masked) until the tile has 4 values per thread. A smaller tile puts some values in several threads,
    and a reduction over copies need not be the same in every thread (an 8-value vector gave 16 results in
    a 4-warp program on an H100: benchmarks/data_signal_stress.py); tests/test_data_signal_layout.py
    checks from the compiled kernel that no polled tile holds copies."""
    return max(triton.next_power_of_2(G), (4 * 32 * num_warps) // D, 1)


@triton.jit
def _count_sentinels(box, row_ok, D: tl.constexpr, SENTINEL: tl.constexpr):
    """One poll of a block's rows: (values, log-sum-exps, how many values are still the sentinel), the
    log-sum-exp of each row in all D columns. Every value the caller goes on to use is one this count saw.
    The log-sum-exp is read into every
    column of a [rows, D] tile, not as a [rows] vector: a vector that small sits in several threads at
    once, a reduction over it counts one copy per group of threads, and a copy that still held the sentinel
    went on into the merge as NaN (benchmarks/data_signal_stress.py: 4 to 57 calls in 1000 on one H100)."""
    d = tl.arange(0, D)
    vals = tl.load(box[:, None] + d[None, :], mask=row_ok[:, None], other=0.0, volatile=True)
    lse = tl.load((box + D)[:, None] + d[None, :] * 0, mask=row_ok[:, None], other=0.0, volatile=True)
    pending = (vals.to(tl.int32, bitcast=True) == SENTINEL) | (lse.to(tl.int32, bitcast=True) == SENTINEL)
    n = tl.sum(tl.sum(pending.to(tl.int32), 1), 0)
    return vals, lse, n


@triton.jit
def _wait_data(box, row_ok, err_ptr, budget, index, epoch, D: tl.constexpr, SENTINEL: tl.constexpr,
               INTERPRET: tl.constexpr):
    """Spin until no value of this block of the inbox is the sentinel (the payload is the signal).
    Bounded like wait_at_least; returns the payload."""
    # pending is a reduction over a tile with no copies (the same in every thread: poll_rows),
    # the clock cta_clock_ns and the error word a scalar atomic: the whole CTA takes every branch together
    # (kernels/sync.py says why it must)
    vals, lse, pending = _count_sentinels(box, row_ok, D, SENTINEL)
    if pending > 0:
        start = cta_clock_ns(INTERPRET)
        polls = 0
        gave_up = timed_out_elsewhere(err_ptr)
        while (pending > 0) & (gave_up == 0):
            vals, lse, pending = _count_sentinels(box, row_ok, D, SENTINEL)
            polls += 1
            if (polls % 64 == 0) & (pending > 0):
                if spent_since(start, polls, INTERPRET) > budget:  # recorded: waited for epoch `epoch`, `pending` values still sentinel
                    record_timeout(err_ptr, 3, index, epoch, pending)
                    gave_up = 1
                else:
                    gave_up = timed_out_elsewhere(err_ptr)
    return vals, tl.max(lse, 1)  # every column holds the row's value


@triton.jit(do_not_specialize=["rank", "budget"])
def fused_combine_kernel(inbox_ptr, out_ptr, flags_ptr, err_ptr, state_ptr, trace_ptr, rank, R, n_blocks, budget,
                         WORLD: tl.constexpr, D: tl.constexpr, G: tl.constexpr, G_POW2: tl.constexpr,
                         DATA_SIGNAL: tl.constexpr, SENTINEL: tl.constexpr, TRACE: tl.constexpr,
                         INTERPRET: tl.constexpr):
    """One program per (batch, KV head) group: its G rows."""
    pid = tl.program_id(0)
    if TRACE:
        tl.store(trace_ptr + pid * TRACE_WORDS, globaltimer_ns(INTERPRET))
    epoch = tl.load(state_ptr, volatile=True) + 1
    g = tl.arange(0, G_POW2)
    row_ok = g < G
    rows64 = (pid * G + g).to(tl.int64)
    d = tl.arange(0, D)
    waited = tl.zeros((), tl.int64)
    parity = epoch % 2
    # 1. this rank's partial, left in its own slot by the decode kernel (an earlier launch of this stream)
    own = inbox_ptr + ((parity * WORLD + rank) * R + rows64) * (D + 1)
    acc = tl.load(own[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
    lse = tl.load(own + D, mask=row_ok, other=0.0)
    # 2. merge the peers' partials as they arrive: (acc, lse) stays a normalised output and its lse
    for dd in range(1, WORLD):
        src = (rank + dd) % WORLD
        box = inbox_ptr + ((parity * WORLD + src) * R + rows64) * (D + 1)
        if TRACE:
            t_wait = globaltimer_ns(INTERPRET)
        if DATA_SIGNAL:
            o_j, lse_j = _wait_data(box, row_ok, err_ptr, budget, src * n_blocks + pid, epoch, D, SENTINEL, INTERPRET)
            # back to the sentinel, for this buffer's next use two calls from now
            tl.store(box[:, None] + d[None, :], tl.full((G_POW2, D), SENTINEL, tl.int32).to(tl.float32, bitcast=True),
                     mask=row_ok[:, None])
            tl.store(box + D, tl.full((G_POW2,), SENTINEL, tl.int32).to(tl.float32, bitcast=True), mask=row_ok)
        else:
            wait_at_least(flags_ptr + src * n_blocks + pid, epoch, err_ptr, budget, 1, src * n_blocks + pid, "sys",
                          INTERPRET)
            o_j = tl.load(box[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
            lse_j = tl.load(box + D, mask=row_ok, other=0.0)
        if TRACE:
            waited += globaltimer_ns(INTERPRET) - t_wait
        m = tl.maximum(lse, lse_j)
        a = tl.exp2(lse - m)
        b = tl.exp2(lse_j - m)
        acc = (acc * a[:, None] + o_j * b[:, None]) / (a + b)[:, None]
        lse = m + tl.log2(a + b)
    tl.store(out_ptr + rows64[:, None] * D + d[None, :], acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    if TRACE:
        tl.store(trace_ptr + pid * TRACE_WORDS + 1, waited)
        tl.store(trace_ptr + pid * TRACE_WORDS + 2, globaltimer_ns(INTERPRET))
    # the last program to finish publishes the epoch; no program of the next call starts before (stream order)
    done = tl.atomic_add(state_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if done == n_blocks - 1:
        tl.store(state_ptr + 1, 0)
        tl.atomic_xchg(state_ptr, epoch, sem="release", scope="gpu")


# ---- host side ------------------------------------------------------------------------------------


def reference(q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor]) -> torch.Tensor:
    """float32 softmax(q k^T / sqrt(D)) v over every rank's KV (GQA)."""
    parts = [attention_partial_f32(q, k, v) for k, v in zip(ks, vs)]
    return merge_partials_f32(torch.stack([o for o, _ in parts]), torch.stack([lse for _, lse in parts]))


def sdpa_lse(q, k, v, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's attention that also returns the log-sum-exp, with the GQA group as the query length:
    q (B x Hq x D) viewed as (B, Hkv, G, D) against K, V (B, Hkv, S, D), non-causal. Returns (o as
    (B, Hkv, G, D), natural-log lse as (B, Hkv, G))."""
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    qg = q.view(B, Hkv, G, D)
    ops = torch.ops.aten
    if backend == "cudnn":
        o, lse = ops._scaled_dot_product_cudnn_attention(qg, k, v, None, True)[:2]
    elif backend == "flash":
        o, lse = ops._scaled_dot_product_flash_attention(qg, k, v)[:2]
    elif backend == "efficient":
        o, lse = ops._scaled_dot_product_efficient_attention(qg, k, v, None, True)[:2]
    else:
        raise ValueError(f"unknown attention backend {backend!r}: choose from {', '.join(SDPA_LSE_BACKENDS)}")
    return o, lse.reshape(B, Hkv, -1)[..., :G]  # cuDNN adds a trailing 1; the efficient kernel pads L to 32


class FlashDecode:
    """One shape on one rank. run(q, k, v, out) -> out (B x Hq x D): attention over every rank's KV.

    phases(q, k, v, out) lists the same work as (name, role, thunk) steps for per-phase timing;
    fused variants also run traced (`traced=True`): the fused combine then records, per program, a
    globaltimer stamp at its start and end and the time it spent waiting for peers (`trace`)."""

    def __init__(self, ctx: RankContext, B: int, Hq: int, Hkv: int, D: int, S: int, dtype: torch.dtype, variant: str,
                 config: Config = Config(), wait_s: float = 5.0):
        if variant not in VARIANTS:
            raise ValueError(f"unknown flash-decode variant {variant!r}: choose from {', '.join(VARIANTS)}")
        check_shape(Hq, Hkv, D)
        self.ctx, self.variant = ctx, variant
        self.sdpa = variant.startswith("bsp-sdpa")
        # bsp-sdpa: PyTorch's kernel splits the sequence itself (n_splits says 1: nothing of ours splits)
        self.decode = None if self.sdpa else LocalDecode(B, Hq, Hkv, D, S, ctx.device, config)
        self.cfg = config if self.sdpa else self.decode.cfg
        self.n_splits = 1 if self.sdpa else self.decode.n_splits
        self.sdpa_backend = None  # the first backend of SDPA_LSE_BACKENDS that runs, found on the first call
        self.B, self.Hq, self.Hkv, self.D, self.S = B, Hq, Hkv, D, S
        self.G = Hq // Hkv
        self.interp = interpreting()
        kind = get("flash-decode", variant)
        self.fused = kind.fused
        self.graphed = kind.graphed and ctx.device.type == "cuda"
        self.graphs: dict = {}
        self._bound = BoundedCache(16)  # the combine launches, bound once per output buffer
        R = B * Hq
        self.R = R
        dev = ctx.device
        self.n_blocks = B * Hkv if self.fused else triton.cdiv(R, config.block_r)
        if not self.fused:
            self.local = torch.empty(R * (D + 1), dtype=torch.float32, device=dev)
            self.gathered = torch.empty(ctx.world * R * (D + 1), dtype=torch.float32, device=dev)
        else:
            p = ctx.world
            self.inbox = ctx.heap.alloc((2, p, R, D + 1), torch.float32)
            if config.signal == "data":
                self.inbox.local.view(torch.int32).fill_(SENTINEL_BITS)
            self.flags = ctx.heap.zeros((p * self.n_blocks,), torch.int32)  # per (source rank, group)
            self.err = torch.zeros(ERR_WORDS, dtype=torch.int32, device=dev)
            self.state = torch.zeros(2, dtype=torch.int32, device=dev)  # [last finished epoch, programs done]
            self.trace = torch.zeros(self.n_blocks * TRACE_WORDS.value, dtype=torch.int64, device=dev)
            self.budget = wait_budget(wait_s, self.interp)
            ctx.barrier()  # inboxes and flags initialised everywhere before anyone pushes

    # -- the steps -------------------------------------------------------------------------------------

    def _local_decode(self, q, k, v):
        self.decode.packed(q, k, v, self.local)

    def _push_decode(self, q, k, v):
        ctx = self.ctx
        self.decode.push(q, k, v, self.inbox.local, ctx.heap.bases, self.flags.local, self.state, ctx.rank, ctx.world,
                         self.cfg.signal == "data")

    def _local_sdpa(self, q, k, v):
        """PyTorch's attention with the log-sum-exp, packed like our partial (lse in base 2)."""
        B, Hkv, G, D = self.B, self.Hkv, self.G, self.D
        if self.ctx.device.type != "cuda":  # emulated ranks: the float32 math path, same outputs
            o, lse = attention_partial_f32(q, k, v)
        else:
            o, lse = self._sdpa_run(q, k, v)
        o, lse = o.view(B, Hkv, G, D), lse.view(B, Hkv, G)  # views (the emulated path's o is B x Hq x D)
        if o.stride(3) != 1:
            o = o.contiguous()
        # the attention allocates o and lse anew each call: one binding per layout, their addresses swapped in
        key = ("pack", o.dtype, o.stride(), lse.dtype, lse.stride())
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bound.put(key, BoundLaunch(pack_kernel, (triton.cdiv(self.R, PACK_ROWS),), (
                o, lse, self.local, self.R, Hkv, G, *o.stride()[:3], *lse.stride(), LOG2E),
                dict(D=D, BLOCK_R=PACK_ROWS, num_warps=4)))
        bound(o_ptr=o, lse_ptr=lse)

    def _sdpa_run(self, q, k, v):
        if self.sdpa_backend is not None:
            return sdpa_lse(q, k, v, self.sdpa_backend)
        failures = []
        for name in self._sdpa_order():
            try:
                res = sdpa_lse(q, k, v, name)
            except RuntimeError as e:
                failures.append(f"{name}: {' '.join(str(e).split())[:120]}")
                continue
            self.sdpa_backend = name
            return res
        raise RuntimeError("no PyTorch attention backend with the log-sum-exp runs this shape: " + "; ".join(failures))

    def describe(self) -> dict:
        """What ran, for the result document: the local decode's resolved configuration (splits and programs
        included), or the PyTorch attention backend bsp-sdpa found; the combine's rows per program."""
        if self.sdpa:
            return {"sdpa_backend": self.sdpa_backend, "block_r": self.cfg.block_r}
        return {**self.decode.describe(), "block_r": self.cfg.block_r, "signal": self.cfg.signal}

    def _sdpa_order(self) -> list[str]:
        e = tuned_entry(self.B, self.Hkv, self.S, self.D, gpu=gpu_name_of(self.ctx.device))
        first = e.get("sdpa_lse") if e else None
        return ([first] if first in SDPA_LSE_BACKENDS else []) + [b for b in SDPA_LSE_BACKENDS if b != first]

    def _all_gather(self):
        if self.ctx.backend == "cuda":
            import torch.distributed as dist

            dist.all_gather_into_tensor(self.gathered, self.local)
        else:  # emulated ranks: exchange through the host (a stand-in with the same result)
            self._emulated_all_gather()

    def _global_combine(self, out):
        # gathered is p blocks of R rows: row r of rank i at (i * R + r) * (D + 1)
        key = ("global", buffer_key(out))
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bound.put(key, BoundLaunch(combine_kernel, (self.n_blocks,), (
                self.gathered, out, self.R, self.ctx.world, self.D + 1, self.R * (self.D + 1)),
                dict(D=self.D, BLOCK_R=self.cfg.block_r, PACKED_OUT=False, num_warps=4)))
        bound()

    def _fused_combine(self, out, traced=False):
        ctx = self.ctx
        key = ("fused", buffer_key(out), traced)
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bound.put(key, BoundLaunch(fused_combine_kernel, (self.n_blocks,), (
                self.inbox.local, out, self.flags.local, self.err, self.state, self.trace, ctx.rank, self.R,
                self.n_blocks, self.budget), dict(
                WORLD=ctx.world, D=self.D, G=self.G, G_POW2=poll_rows(self.G, self.D, COMBINE_WARPS),
                DATA_SIGNAL=self.cfg.signal == "data", SENTINEL=SENTINEL_BITS, TRACE=traced, INTERPRET=self.interp,
                num_warps=COMBINE_WARPS)))
        bound()

    def _emulated_all_gather(self):
        ctx = self.ctx
        if not hasattr(self, "_ex"):
            self._ex = ctx.heap.alloc((self.local.numel(),), torch.float32)
        ctx.barrier()
        self._ex.local.copy_(self.local)
        ctx.barrier()
        n = self.local.numel()
        for r in range(ctx.world):
            self.gathered[r * n:(r + 1) * n].copy_(self._ex.peers[r])
        ctx.barrier()

    def phases(self, q, k, v, out, traced: bool = False) -> list[tuple[str, str, object]]:
        """The eager steps as (name, role, thunk); running the thunks in order is one call."""
        if self.fused:
            return [("local-decode", "compute", lambda: self._push_decode(q, k, v)),
                    ("fused-combine", "compute", lambda: self._fused_combine(out, traced))]
        local = ("local-sdpa", "compute", lambda: self._local_sdpa(q, k, v)) if self.sdpa else \
            ("local-decode", "compute", lambda: self._local_decode(q, k, v))
        return [local, ("all-gather", "communication", self._all_gather),
                ("global-combine", "compute", lambda: self._global_combine(out))]

    def _eager(self, q, k, v, out, traced=False):
        for _, _, step in self.phases(q, k, v, out, traced):
            step()
        return out

    def __call__(self, q, k, v, out, traced: bool = False):
        if not self.graphed:
            return self._eager(q, k, v, out, traced)
        # the warm-up call before the capture is a real call on every rank: device epochs stay in step
        replay_graph(self.graphs, (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), traced),
                     lambda: self._eager(q, k, v, out, traced))
        return out

    def trace_buffers(self) -> list:
        """The device tensor the traced combine writes (cta_trace reads it); none for the bsp variants."""
        return [self.trace] if self.fused else []

    def cta_trace(self) -> list[tuple[int, int, int]]:
        """The last traced call's fused combine, per program: (start ns, ns waiting for peers, end ns)."""
        t = self.trace.view(-1, TRACE_WORDS.value).tolist()
        return [tuple(row) for row in t]

    def check(self, what: str = "fused flash-decode combine") -> None:
        if self.fused:
            raise_if_timed_out(self.err, self.ctx.rank, what,
                               lambda kind, i: f"rows block {i % self.n_blocks} from rank {i // self.n_blocks}",
                               rearm=True)
