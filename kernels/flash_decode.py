"""Flash Decode across GPUs: one decode step of attention with the KV cache split along the sequence.

Each rank holds S tokens of K and V (B x Hkv x S x D); the query (B x Hq x D) is replicated; Hq query
heads share Hkv KV heads (GQA, G = Hq / Hkv). Every rank ends with the full output (B x Hq x D).

Kernels:
- `split_kv_kernel`: one program per (batch, KV head, split of the sequence). The G query heads of the
  group form one tile (padded to 16 rows so tl.dot applies), so K and V are read once per group. It
  writes each split's partial output, already divided by its softmax sum, and its log-sum-exp in base 2
  (float32, packed as D + 1 values per (row, split)).
- `combine_kernel`: merges N partials of each row with the safe rescaling
  o = sum_i 2^(lse_i - m) o_i / sum_i 2^(lse_i - m), lse = m + log2(sum_i 2^(lse_i - m)), m = max_i lse_i.
- `fused_combine_kernel`: merges the splits, pushes the rank's partial into every peer's inbox, and
  merges the peers' partials as they arrive, in one launch of a small grid (all programs resident, so
  the waits cannot deadlock). The signal is a flag per (source rank, row block), or the data itself:
  the inbox is filled with a sentinel NaN bit pattern that no arithmetic produces, the consumer spins
  until none of its values is the sentinel, then writes the sentinel back. Inboxes are double-buffered
  by call parity: a peer can be at most one call ahead (it needs our partial of the next call first).

Variants: bsp (split-KV, local combine, NCCL all-gather of the packed partials, global combine: four
launches and a collective), bsp-graph (the same in one CUDA graph), fused-push (split-KV, then the
fused combine: two launches, no collective).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from taxes.kernels.runtime import RankContext, interpreting, replay_graph
from taxes.kernels.sync import (
    ERR_WORDS,
    cta_clock_ns,
    globaltimer_ns,
    peer_ptr,
    raise_if_timed_out,
    record_timeout,
    signal,
    spent_since,
    timed_out_elsewhere,
    wait_at_least,
    wait_budget,
)

VARIANTS = ("bsp", "bsp-graph", "fused-push", "fused-push-graph")
TRACE_WORDS = tl.constexpr(3)  # per program of a traced fused combine: start ns, ns spent waiting for peers, end ns
SENTINEL_BITS = 0x7F80DEAD  # a NaN payload float arithmetic never produces (it yields 0x7FC00000)
LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class Config:
    block_n: int = 0  # KV tokens per step of the split-KV loop; 0: block_n_for(B, Hkv)
    splits: int = 0  # splits per (batch, KV head); 0: fill the SMs about twice
    num_warps: int = 4
    num_stages: int = 2
    block_r: int = 16  # rows (batch x query head) per program of the combine kernels
    signal: str = "flag"  # fused: "flag" or "data" (sentinel overwritten by the payload)


def block_n_for(B: int, Hkv: int) -> int:
    """The split-KV step when the config leaves it open: 128 tokens when there are at most 8 (batch, KV
    head) pairs, else 64. At batch 1 (8 pairs) the larger step keeps more bytes in flight per program:
    fused-push-graph took 54/81/173 us at S=8K/32K/128K against 57/82/183 us with 64 (2 x H200, session
    4, reports/flash_decode/flash_b1_trials.md; session 3's trial also had 128 fastest at S=128K). Larger
    batches were measured with 64 only."""
    return 128 if B * Hkv <= 8 else 64


def split_count(S: int, B: int, Hkv: int, sm_count: int, block_n: int, requested: int = 0) -> tuple[int, int]:
    """(splits, tokens per split): no split empty, each a multiple of block_n."""
    want = requested or max(1, math.ceil(2 * sm_count / (B * Hkv)))
    want = max(1, min(want, math.ceil(S / block_n)))
    per = math.ceil(math.ceil(S / want) / block_n) * block_n
    return math.ceil(S / per), per


# ---- kernels --------------------------------------------------------------------------------------


@triton.jit
def split_kv_kernel(q_ptr, k_ptr, v_ptr, part_ptr, S, split_len, n_splits, qk_scale,
                    Hq: tl.constexpr, Hkv: tl.constexpr, D: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr,
                    BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr):
    pid = tl.program_id(0)
    sp = pid % n_splits
    bh = pid // n_splits
    hkv = bh % Hkv
    b = bh // Hkv
    rows = tl.arange(0, G_PAD)
    row_ok = rows < G
    d = tl.arange(0, D)
    heads = hkv * G + rows
    q = tl.load(q_ptr + ((b * Hq + heads) * D)[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
    kv_base = (b * Hkv + hkv).to(tl.int64) * S * D
    start = sp * split_len
    end = tl.minimum(start + split_len, S)
    m_i = tl.full((G_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((G_PAD,), tl.float32)
    acc = tl.zeros((G_PAD, D), tl.float32)
    for n in range(start, end, BLOCK_N):
        tok = n + tl.arange(0, BLOCK_N)
        tok_ok = tok < end
        offs = kv_base + tok.to(tl.int64)[:, None] * D + d[None, :]
        k = tl.load(k_ptr + offs, mask=tok_ok[:, None], other=0.0)
        v = tl.load(v_ptr + offs, mask=tok_ok[:, None], other=0.0)
        if DOT_F32:  # Triton 3.6's interpreter multiplies bf16 wrongly; float32 is exact there
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(tok_ok[None, :], s * qk_scale, float("-inf"))  # log2 domain: scale includes log2(e)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if DOT_F32:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32))
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    o = acc / l_i[:, None]
    lse = m_i + tl.log2(l_i)
    dst = part_ptr + ((b * Hq + heads) * n_splits + sp).to(tl.int64) * (D + 1)
    tl.store(dst[:, None] + d[None, :], o, mask=row_ok[:, None])
    tl.store(dst + D, lse, mask=row_ok)


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
def _count_sentinels(box, row_ok, D: tl.constexpr, SENTINEL: tl.constexpr):
    d = tl.arange(0, D)
    vals = tl.load(box[:, None] + d[None, :], mask=row_ok[:, None], other=0.0, volatile=True)
    lse = tl.load(box + D, mask=row_ok, other=0.0, volatile=True)
    n = tl.sum(tl.sum((vals.to(tl.int32, bitcast=True) == SENTINEL).to(tl.int32), 1), 0)
    n += tl.sum((lse.to(tl.int32, bitcast=True) == SENTINEL).to(tl.int32), 0)
    return vals, lse, n


@triton.jit
def _wait_data(box, row_ok, err_ptr, budget, index, epoch, D: tl.constexpr, SENTINEL: tl.constexpr,
               INTERPRET: tl.constexpr):
    """Spin until no value of this block of the inbox is the sentinel (the payload is the signal).
    Bounded like wait_at_least; returns the payload."""
    # pending is a reduction (the same in every thread), the clock cta_clock_ns and the error word a scalar
    # atomic: the whole CTA takes every branch together (kernels/sync.py says why it must)
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
    return vals, lse


@triton.jit(do_not_specialize=["rank", "budget"])
def fused_combine_kernel(part_ptr, inbox_ptr, out_ptr, bases, flags_ptr, err_ptr, state_ptr, trace_ptr, rank, R,
                         n_splits, n_blocks, budget, WORLD: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr,
                         DATA_SIGNAL: tl.constexpr, SENTINEL: tl.constexpr, TRACE: tl.constexpr,
                         INTERPRET: tl.constexpr):
    pid = tl.program_id(0)
    if TRACE:
        tl.store(trace_ptr + pid * TRACE_WORDS, globaltimer_ns(INTERPRET))
    # The epoch lives on the device (state[0]: last finished call), so a CUDA graph can replay the launch.
    epoch = tl.load(state_ptr, volatile=True) + 1
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    rows64 = rows.to(tl.int64)
    d = tl.arange(0, D)
    waited = tl.zeros((), tl.int64)
    # 1. this rank's partial: merge its splits
    acc, lse = _merge_sets(part_ptr, rows64, row_ok, n_splits, n_splits * (D + 1), D + 1, D, BLOCK_R)
    # 2. push it into slot `rank` of every peer's inbox (the buffer of this call's parity)
    parity = epoch % 2
    slot = inbox_ptr + ((parity * WORLD + rank) * R + rows64) * (D + 1)
    for dd in range(1, WORLD):
        peer = (rank + dd) % WORLD
        dst = peer_ptr(slot, bases, rank, peer)
        tl.store(dst[:, None] + d[None, :], acc, mask=row_ok[:, None])
        tl.store(dst + D, lse, mask=row_ok)
        if not DATA_SIGNAL:
            signal(peer_ptr(flags_ptr + rank * n_blocks + pid, bases, rank, peer), epoch, "sys")
    # 3. merge the peers' partials as they arrive: (acc, lse) stays a normalised output and its lse
    for dd in range(1, WORLD):
        src = (rank + dd) % WORLD
        box = inbox_ptr + ((parity * WORLD + src) * R + rows64) * (D + 1)
        if TRACE:
            t_wait = globaltimer_ns(INTERPRET)
        if DATA_SIGNAL:
            o_j, lse_j = _wait_data(box, row_ok, err_ptr, budget, src * n_blocks + pid, epoch, D, SENTINEL, INTERPRET)
            # back to the sentinel, for this buffer's next use two calls from now
            tl.store(box[:, None] + d[None, :], tl.full((BLOCK_R, D), SENTINEL, tl.int32).to(tl.float32, bitcast=True),
                     mask=row_ok[:, None])
            tl.store(box + D, tl.full((BLOCK_R,), SENTINEL, tl.int32).to(tl.float32, bitcast=True), mask=row_ok)
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


def attention_partial_f32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 attention of q (B x Hq x D) over one KV shard (B x Hkv x S x D): (output, natural-log lse).
    Query heads are grouped by their KV head (no copies of K and V per query head) and S is taken in
    chunks that fit in memory."""
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    chunk = max(256, min(8192, (1 << 30) // (B * Hkv * D * 4)))
    qf = q.float().view(B, Hkv, G, D)
    m = torch.full((B, Hkv, G), -math.inf, device=q.device)
    l = torch.zeros(B, Hkv, G, device=q.device)
    acc = torch.zeros(B, Hkv, G, D, device=q.device)
    for s0 in range(0, k.shape[2], chunk):
        kc = k[:, :, s0:s0 + chunk].float()
        vc = v[:, :, s0:s0 + chunk].float()
        s = torch.einsum("bkgd,bksd->bkgs", qf, kc) / math.sqrt(D)
        m_new = torch.maximum(m, s.amax(-1))
        p = torch.exp(s - m_new[..., None])
        alpha = torch.exp(m - m_new)
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + torch.einsum("bkgs,bksd->bkgd", p, vc)
        m = m_new
    return (acc / l[..., None]).view(B, Hq, D), (m + torch.log(l)).view(B, Hq)


def merge_partials_f32(outs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    """Merge per-rank float32 partials (ranks first) with softmax weights of their log-sum-exps."""
    return (torch.softmax(lses, dim=0)[..., None] * outs).sum(0)


def reference(q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor]) -> torch.Tensor:
    """float32 softmax(q k^T / sqrt(D)) v over every rank's KV (GQA)."""
    parts = [attention_partial_f32(q, k, v) for k, v in zip(ks, vs)]
    return merge_partials_f32(torch.stack([o for o, _ in parts]), torch.stack([lse for _, lse in parts]))


class FlashDecode:
    """One shape on one rank. run(q, k, v, out) -> out (B x Hq x D): attention over every rank's KV.

    phases(q, k, v, out) lists the same work as (name, role, thunk) steps for per-phase timing;
    fused variants also run traced (`traced=True`): the fused combine then records, per program, a
    globaltimer stamp at its start and end and the time it spent waiting for peers (`trace`)."""

    def __init__(self, ctx: RankContext, B: int, Hq: int, Hkv: int, D: int, S: int, dtype: torch.dtype, variant: str,
                 config: Config = Config(), wait_s: float = 5.0):
        if variant not in VARIANTS:
            raise ValueError(f"unknown flash-decode variant {variant!r}: choose from {', '.join(VARIANTS)}")
        if Hq % Hkv:
            raise ValueError(f"Hq={Hq} is not a multiple of Hkv={Hkv}")
        if D not in (64, 128):
            raise ValueError(f"head dim D={D} is not supported (64 or 128)")
        if config.block_n == 0:
            config = replace(config, block_n=block_n_for(B, Hkv))
        self.ctx, self.variant, self.cfg = ctx, variant, config
        self.B, self.Hq, self.Hkv, self.D, self.S = B, Hq, Hkv, D, S
        self.G = Hq // Hkv
        self.interp = interpreting()
        self.fused = variant.startswith("fused")
        self.graphed = variant.endswith("-graph") and ctx.device.type == "cuda"
        self.graphs: dict = {}
        sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count if ctx.device.type == "cuda" else 4
        self.n_splits, self.split_len = split_count(S, B, Hkv, sms, config.block_n, config.splits)
        R = B * Hq
        self.R = R
        dev = ctx.device
        self.part = torch.empty(R * self.n_splits * (D + 1), dtype=torch.float32, device=dev)
        self.n_blocks = triton.cdiv(R, config.block_r)
        if not self.fused:
            self.local = torch.empty(R * (D + 1), dtype=torch.float32, device=dev)
            self.gathered = torch.empty(ctx.world * R * (D + 1), dtype=torch.float32, device=dev)
        else:
            p = ctx.world
            self.inbox = ctx.heap.alloc((2, p, R, D + 1), torch.float32)
            if config.signal == "data":
                self.inbox.local.view(torch.int32).fill_(SENTINEL_BITS)
            self.flags = ctx.heap.zeros((p * self.n_blocks,), torch.int32)
            self.err = torch.zeros(ERR_WORDS, dtype=torch.int32, device=dev)
            self.state = torch.zeros(2, dtype=torch.int32, device=dev)  # [last finished epoch, programs done]
            self.trace = torch.zeros(self.n_blocks * TRACE_WORDS.value, dtype=torch.int64, device=dev)
            self.budget = wait_budget(wait_s, self.interp)
            ctx.barrier()  # inboxes and flags initialised everywhere before anyone pushes

    # -- the steps -------------------------------------------------------------------------------------

    def _split(self, q, k, v):
        G_PAD = max(16, triton.next_power_of_2(self.G))
        split_kv_kernel[(self.B * self.Hkv * self.n_splits,)](
            q, k, v, self.part, self.S, self.split_len, self.n_splits, LOG2E / math.sqrt(self.D),
            Hq=self.Hq, Hkv=self.Hkv, D=self.D, G=self.G, G_PAD=G_PAD, BLOCK_N=self.cfg.block_n,
            DOT_F32=self.interp, num_warps=self.cfg.num_warps, num_stages=self.cfg.num_stages)

    def _combine(self, part, out, n_sets, stride_row, stride_set, packed):
        combine_kernel[(self.n_blocks,)](part, out, self.R, n_sets, stride_row, stride_set, D=self.D,
                                         BLOCK_R=self.cfg.block_r, PACKED_OUT=packed, num_warps=4)

    def _local_combine(self):
        D = self.D
        self._combine(self.part, self.local, self.n_splits, self.n_splits * (D + 1), D + 1, True)

    def _all_gather(self):
        if self.ctx.backend == "cuda":
            import torch.distributed as dist

            dist.all_gather_into_tensor(self.gathered, self.local)
        else:  # emulated ranks: exchange through the host (a stand-in with the same result)
            self._emulated_all_gather()

    def _global_combine(self, out):
        # gathered is p blocks of R rows: row r of rank i at (i * R + r) * (D + 1)
        self._combine(self.gathered, out, self.ctx.world, self.D + 1, self.R * (self.D + 1), False)

    def _fused_combine(self, out, traced=False):
        ctx = self.ctx
        fused_combine_kernel[(self.n_blocks,)](
            self.part, self.inbox.local, out, ctx.heap.bases, self.flags.local, self.err, self.state, self.trace,
            ctx.rank, self.R, self.n_splits, self.n_blocks, self.budget, WORLD=ctx.world, D=self.D,
            BLOCK_R=self.cfg.block_r, DATA_SIGNAL=self.cfg.signal == "data", SENTINEL=SENTINEL_BITS, TRACE=traced,
            INTERPRET=self.interp, num_warps=4)

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
        steps = [("split-kv", "compute", lambda: self._split(q, k, v))]
        if self.fused:
            return steps + [("fused-combine", "compute", lambda: self._fused_combine(out, traced))]
        return steps + [("local-combine", "compute", self._local_combine),
                        ("all-gather", "communication", self._all_gather),
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

    def cta_trace(self) -> list[tuple[int, int, int]]:
        """The last traced call's fused combine, per program: (start ns, ns waiting for peers, end ns)."""
        t = self.trace.view(-1, TRACE_WORDS.value).tolist()
        return [tuple(row) for row in t]

    def check(self, what: str = "fused flash-decode combine") -> None:
        if self.fused:
            raise_if_timed_out(self.err, self.ctx.rank, what,
                               lambda kind, i: f"rows block {i % self.n_blocks} from rank {i // self.n_blocks}",
                               rearm=True)
