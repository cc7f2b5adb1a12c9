"""One GPU's flash decode in one launch: a decode step's attention over this GPU's KV cache, with the
sequence split across programs.

The query (B x Hq x D) attends to S tokens of K and V (B x Hkv x S x D); Hq query heads share Hkv KV
heads (GQA, G = Hq / Hkv).

`decode_kernel`: one program per (batch, KV head, split of the sequence; a split is every n-th tile of
BLOCK_N tokens, not a contiguous range); the G query heads of the group form one tile (padded to 16 rows
so tl.dot applies), so K and V are read once per group. Each program writes its split's partial output
(divided by its softmax sum) and log-sum-exp (base 2, float32), then takes a ticket from its group's arrival
counter. The program that draws the group's last ticket merges
the group's splits and writes the result: the output in the output's dtype (one GPU), the packed float32
(o, lse) rows of the rank's partial (bsp), or that partial pushed into every peer's inbox (fused).
Counters only grow (call c hands out tickets c*splits .. c*splits + splits - 1 of each group), so nothing
is reset between calls and the launch replays from a CUDA graph. Nobody waits: the last arriver finds
every other split written (release by each writer, acquire by it), which keeps the launch correct under
Triton's interpreter, where programs run one after another. A separate combine kernel cost ~17 us at
batch 1 (a few programs looping over 32 partial sets after the split kernel ended); the merge in the last
arriver runs while other groups still stream KV, and only the last group's merge is exposed. A group of
one split (large batches) writes its rows at once: no partial, no ticket, no merge. K and V
come through TMA descriptors or pointer loads, block size, warps, pipeline stages and splits as the
tuned table of the GPU (kernels/flash_decode_tuned.json, measured by benchmarks/decode_world1.py --tune)
says for the shape.

The partials' merge across GPUs (the combine kernels, the variants: kernels/flash_decode.py) reads what
`LocalDecode.packed` and `LocalDecode.push` leave.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import triton
import triton.language as tl

from taxes.kernels.launch import BoundedCache, BoundLaunch, DescriptorCache, buffer_key
from taxes.kernels.device import gpu_name_of, interpreting, sm_count_of
from taxes.kernels.sync import peer_ptr, signal

try:  # host-side TMA descriptors (Triton 3.3 and later)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: pointer loads only
    TensorDescriptor = None

LOG2E = 1.4426950408889634
OUT_FINAL, OUT_PACKED, OUT_PUSH = 0, 1, 2  # what decode_kernel's last arrivers write
TUNED_FILE = Path(__file__).with_name("flash_decode_tuned.json")


@dataclass(frozen=True)
class Config:
    """The local decode's configuration (0 or None: the tuned table's), with the two fields only the
    cross-GPU variants read (block_r, signal: kernels/flash_decode.py)."""

    block_n: int = 0  # KV tokens per step of the decode loop; 0: the tuned table's
    splits: int = 0  # splits per (batch, KV head); 0: the tuned table's rule
    num_warps: int = 0  # 0: the tuned table's
    num_stages: int = 0  # software-pipelined K/V loads in flight; 0: the tuned table's
    tma: bool | None = None  # K/V through the tensor memory accelerator (needs S % block_n == 0); None: table's
    evict_first: bool | None = None  # K/V loads hint L2 to evict them first (pointer loads); None: table's
    block_r: int = 16  # rows (batch x query head) per program of the global combine
    signal: str = "flag"  # fused: "flag" or "data" (sentinel overwritten by the payload)


def block_n_for(B: int, Hkv: int) -> int:
    """The decode step without a tuned table: 128 tokens when there are at most 8 (batch, KV head) pairs
    (fewer, longer steps where few programs share the GPU), else 64."""
    return 128 if B * Hkv <= 8 else 64


def split_count(S: int, B: int, Hkv: int, sm_count: int, block_n: int, requested: int = 0,
                programs_per_sm: float = 2.0) -> tuple[int, int]:
    """(splits, tokens per split): at most programs_per_sm programs per SM unless `requested`; no split
    empty, each a multiple of block_n. Rounded down: a program beyond the rate starts a wave of its own and
    costs a whole program's time (at B=2, Hkv=8 on 132 SMs, 9 splits at one per SM made 144 programs, and
    the decode 1.6x its floor)."""
    want = requested or max(1, math.floor(programs_per_sm * sm_count / (B * Hkv) + 1e-3))  # 1e-3: a rounded rate
    want = max(1, min(want, math.ceil(S / block_n)))
    per = math.ceil(math.ceil(S / want) / block_n) * block_n
    return math.ceil(S / per), per


def load_tuned(path: Path = TUNED_FILE, gpu: str | None = None) -> dict:
    """The tuned table measured on `gpu` (its name as CUDA gives it), else the file's first table:
    {"gpu", "made_by", "date", "source", "entries"}; {} without a readable file. One table per GPU kind,
    since the best block, stages and splits move with the HBM rate (the H100's configurations leave an
    H200's decode 10-30% slower at some shapes: reports/flash_decode/decode_tune-h200.json.gz)."""
    try:
        tables = json.loads(path.read_text()).get("tables") or []
    except (OSError, ValueError, AttributeError):
        return {}
    return next((t for t in tables if gpu and t.get("gpu") == gpu), tables[0] if tables else {})


def tuned_entry(B: int, Hkv: int, S: int, D: int, table: dict | None = None, gpu: str | None = None) -> dict | None:
    """The tuned table's entry for this shape, or for the nearest measured one: same head dim (else the
    nearest), then the least |log2| distance in (batch x KV heads) plus in S. None without a table."""
    rows = (load_tuned(gpu=gpu) if table is None else table).get("entries", [])
    if not rows:
        return None
    dist_d = min(abs(math.log2(r["D"] / D)) for r in rows)
    rows = [r for r in rows if abs(math.log2(r["D"] / D)) == dist_d]
    return min(rows, key=lambda r: (abs(math.log2(r["B"] * r["Hkv"] / (B * Hkv))) + abs(math.log2(r["S"] / S)),
                                    -r["S"]))


def resolve(config: Config, B: int, Hkv: int, S: int, D: int, sm_count: int, on_gpu: bool,
            table: dict | None = None, gpu: str | None = None) -> tuple[Config, int, int]:
    """Fill the config's open fields (0) and split the sequence: (config, splits, tokens per split).
    On a GPU the open fields come from the tuned table of that GPU (kernels/flash_decode_tuned.json): its splits
    where the shape and SM count are the ones measured, else its programs-per-SM rule; elsewhere (the
    interpreter) from block_n_for, 4 warps, 2 stages and two programs per SM."""
    e = tuned_entry(B, Hkv, S, D, table, gpu) if on_gpu else None
    pick = {"block_n": block_n_for(B, Hkv), "num_warps": 4, "num_stages": 2, "tma": False, "evict_first": False}
    if e:
        pick = {k: e.get(k, v) for k, v in pick.items()}
    config = replace(config, **{k: v for k, v in pick.items() if getattr(config, k) in (0, None)})
    requested, pps = config.splits, 2.0
    if e and not requested:
        exact = (e["B"] * e["Hkv"], e["S"], e["D"]) == (B * Hkv, S, D) and e.get("sm_count") == sm_count
        same_block = e["block_n"] == config.block_n
        requested = e["splits"] if exact and same_block else 0
        pps = e["programs_per_sm"]
    splits, per = split_count(S, B, Hkv, sm_count, config.block_n, requested, pps)
    return config, splits, per


# ---- kernels --------------------------------------------------------------------------------------


@triton.jit
def group_query(q_ptr, grp, Hq: tl.constexpr, Hkv: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                G_PAD: tl.constexpr):
    """The G query heads of group grp (= b * Hkv + hkv) as one [G_PAD, D] tile, rows past G zero: (tile, row
    index, which rows are heads)."""
    hkv = grp % Hkv
    b = grp // Hkv
    rows = tl.arange(0, G_PAD)
    row_ok = rows < G
    d = tl.arange(0, D)
    q = tl.load(q_ptr + ((b * Hq + hkv * G + rows) * D)[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
    return q, rows, row_ok


@triton.jit
def attend_tile(q, k, v, tok_ok, m_i, l_i, acc, qk_scale, DOT_F32: tl.constexpr):
    """One tile of K and V into the online softmax of the G_PAD query rows (base 2: qk_scale includes
    log2 e): returns the new (running max, softmax sum, output sum)."""
    if DOT_F32:  # Triton 3.6's interpreter multiplies bf16 wrongly; float32 is exact there
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(tok_ok[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if DOT_F32:
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32))
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _push_epoch(state_ptr, OUT: tl.constexpr):
    """(epoch, inbox parity) of this call for OUT_PUSH (state[0]: the last finished call, kept on the device
    so a CUDA graph can replay the launch); (0, 0) for the other outputs."""
    epoch = 0
    if OUT == 2:
        epoch = tl.load(state_ptr, volatile=True) + 1
    return epoch, epoch % 2


@triton.jit
def _write_rows(o, lse, row, ok, out_ptr, inbox_ptr, bases, rank, parity, R, D: tl.constexpr, OUT: tl.constexpr,
                WORLD: tl.constexpr):
    """Write finished rows (o: [rows, D] float32, lse: base 2; row: b * Hq + head): the output in its dtype
    (OUT_FINAL), the packed float32 (o, lse) rows (OUT_PACKED), or slot `rank` of this call's parity in
    every rank's inbox, ours included (OUT_PUSH)."""
    d = tl.arange(0, D)
    row = row.to(tl.int64)
    if OUT == 0:
        tl.store(out_ptr + row[:, None] * D + d[None, :], o.to(out_ptr.dtype.element_ty), mask=ok[:, None])
    elif OUT == 1:
        dst = out_ptr + row * (D + 1)
        tl.store(dst[:, None] + d[None, :], o, mask=ok[:, None])
        tl.store(dst + D, lse, mask=ok)
    else:
        slot = inbox_ptr + ((parity * WORLD + rank) * R + row) * (D + 1)
        for dd in range(0, WORLD):
            dst = peer_ptr(slot, bases, rank, (rank + dd) % WORLD)
            tl.store(dst[:, None] + d[None, :], o, mask=ok[:, None])
            tl.store(dst + D, lse, mask=ok)


@triton.jit
def _signal_group(flags_ptr, bases, rank, grp, epoch, R, G: tl.constexpr, WORLD: tl.constexpr,
                  DATA_SIGNAL: tl.constexpr):
    """OUT_PUSH with flags: tell every peer that group grp's rows of this call are in its inbox."""
    if not DATA_SIGNAL:
        for dd in range(1, WORLD):
            peer = (rank + dd) % WORLD
            signal(peer_ptr(flags_ptr + rank * (R // G) + grp, bases, rank, peer), epoch, "sys")


@triton.jit
def _merge_group(o_part_ptr, lse_part_ptr, out_ptr, inbox_ptr, bases, flags_ptr, state_ptr, rank, grp, n_splits, R,
                 D: tl.constexpr, G: tl.constexpr, MERGE_ROWS: tl.constexpr, MERGE_SPLITS: tl.constexpr,
                 OUT: tl.constexpr, WORLD: tl.constexpr, DATA_SIGNAL: tl.constexpr):
    """The last arriver of group `grp`: merge its splits' partials, MERGE_ROWS query heads by MERGE_SPLITS
    splits at a time (one [rows, splits, D] tile per step), and write the group's rows."""
    d = tl.arange(0, D)
    epoch, parity = _push_epoch(state_ptr, OUT)
    for g0 in tl.static_range(0, G, MERGE_ROWS):
        g = g0 + tl.arange(0, MERGE_ROWS)
        g_ok = g < G
        first = (grp * G + g) * n_splits  # partial rows of (query head, split 0)
        m = tl.full((MERGE_ROWS,), float("-inf"), tl.float32)
        wsum = tl.zeros((MERGE_ROWS,), tl.float32)
        acc = tl.zeros((MERGE_ROWS, D), tl.float32)
        for s0 in range(0, n_splits, MERGE_SPLITS):
            s = s0 + tl.arange(0, MERGE_SPLITS)
            ok = g_ok[:, None] & (s < n_splits)[None, :]
            idx = first[:, None] + s[None, :]
            # .cg: read at L2, where the other programs' stores are, not from a line this SM's L1 kept
            lse_c = tl.load(lse_part_ptr + idx, mask=ok, other=float("-inf"), cache_modifier=".cg")
            o_c = tl.load(o_part_ptr + idx[:, :, None] * D + d[None, None, :], mask=ok[:, :, None], other=0.0,
                          cache_modifier=".cg")
            m_new = tl.maximum(m, tl.max(lse_c, 1))
            m_new = tl.where(m_new > float("-inf"), m_new, 0.0)  # rows past G: keep the arithmetic finite
            alpha = tl.exp2(m - m_new)
            w = tl.exp2(lse_c - m_new[:, None])
            wsum = wsum * alpha + tl.sum(w, 1)
            acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * o_c, 1)
            m = m_new
        _write_rows(acc / wsum[:, None], m + tl.log2(wsum), grp * G + g, g_ok, out_ptr, inbox_ptr, bases, rank,
                    parity, R, D, OUT, WORLD)
    if OUT == 2:
        _signal_group(flags_ptr, bases, rank, grp, epoch, R, G, WORLD, DATA_SIGNAL)


@triton.jit(do_not_specialize=["S", "n_splits", "rank"])
def decode_kernel(q_ptr, k_ptr, v_ptr, k_desc, v_desc, o_part_ptr, lse_part_ptr, count_ptr, out_ptr, inbox_ptr, bases,
                  flags_ptr, state_ptr, rank, R, S, n_splits, qk_scale,
                  Hq: tl.constexpr, Hkv: tl.constexpr, D: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr,
                  BLOCK_N: tl.constexpr, MERGE_ROWS: tl.constexpr, MERGE_SPLITS: tl.constexpr, OUT: tl.constexpr,
                  WORLD: tl.constexpr, DATA_SIGNAL: tl.constexpr, TMA: tl.constexpr, EVICT: tl.constexpr,
                  DOT_F32: tl.constexpr):
    pid = tl.program_id(0)
    sp = pid % n_splits
    grp = pid // n_splits  # = b * Hkv + hkv
    q, rows, row_ok = group_query(q_ptr, grp, Hq, Hkv, D, G, G_PAD)
    d = tl.arange(0, D)
    kv_base = grp.to(tl.int64) * S * D
    m_i = tl.full((G_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((G_PAD,), tl.float32)
    acc = tl.zeros((G_PAD, D), tl.float32)
    # tiles dealt round-robin: split sp takes tiles sp, sp + n_splits, ... of its group, so every split reads
    # across the whole sequence; the splits of a group then finish closer together than with one contiguous
    # range each (0.5-1 us sooner at B=1, S=32K and 128K: benchmarks/decode_probe.py)
    for n in range(sp * BLOCK_N, S, n_splits * BLOCK_N):
        tok = n + tl.arange(0, BLOCK_N)
        tok_ok = tok < S
        if TMA:  # K, V as (B*Hkv*S) x D rows; S is a multiple of BLOCK_N: whole blocks
            k = k_desc.load([grp * S + n, 0])
            v = v_desc.load([grp * S + n, 0])
        else:
            offs = kv_base + tok.to(tl.int64)[:, None] * D + d[None, :]
            k = tl.load(k_ptr + offs, mask=tok_ok[:, None], other=0.0, eviction_policy=EVICT)
            v = tl.load(v_ptr + offs, mask=tok_ok[:, None], other=0.0, eviction_policy=EVICT)
        m_i, l_i, acc = attend_tile(q, k, v, tok_ok, m_i, l_i, acc, qk_scale, DOT_F32)
    if n_splits == 1:
        # the group's only split: its result is the group's, written at once (no partial, ticket or merge:
        # 1-4 us less at B=16, benchmarks/decode_schedule_probe.py)
        epoch, parity = _push_epoch(state_ptr, OUT)
        _write_rows(acc / l_i[:, None], m_i + tl.log2(l_i), grp * G + rows, row_ok, out_ptr, inbox_ptr, bases, rank,
                    parity, R, D, OUT, WORLD)
        if OUT == 2:
            _signal_group(flags_ptr, bases, rank, grp, epoch, R, G, WORLD, DATA_SIGNAL)
    else:
        prow = (grp * G + rows) * n_splits + sp
        tl.store(o_part_ptr + prow[:, None] * D + d[None, :], acc / l_i[:, None], mask=row_ok[:, None])
        tl.store(lse_part_ptr + prow, m_i + tl.log2(l_i), mask=row_ok)
        # every thread's stores issued, then one release: the group's last arriver sees them all
        tl.debug_barrier()
        ticket = tl.atomic_add(count_ptr + grp, 1, sem="acq_rel", scope="gpu")
        if ticket % n_splits == n_splits - 1:
            tl.debug_barrier()  # no thread's load of the partials moves above the acquire
            _merge_group(o_part_ptr, lse_part_ptr, out_ptr, inbox_ptr, bases, flags_ptr, state_ptr, rank, grp,
                         n_splits, R, D, G, MERGE_ROWS, MERGE_SPLITS, OUT, WORLD, DATA_SIGNAL)


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


def check_shape(Hq: int, Hkv: int, D: int) -> None:
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} is not a multiple of Hkv={Hkv}")
    if D not in (64, 128):
        raise ValueError(f"head dim D={D} is not supported (64 or 128)")


def _merge_tile(G: int, D: int, num_warps: int) -> tuple[int, int]:
    """(query heads, splits) merged per step by a last arriver: every head of the group at once, and as
    many splits as keep the [heads, splits, D] float32 tile at 64 values per thread."""
    rows = triton.next_power_of_2(G)
    return rows, max(1, (2048 * num_warps) // (rows * D))


class LocalDecode:
    """Attention of q (B x Hq x D) over one GPU's KV (B x Hkv x S x D, contiguous) in one launch of
    decode_kernel. final(q, k, v, out) writes out (B x Hq x D, q's dtype); packed(q, k, v, dst) writes
    the float32 rows (o, lse in base 2) of R = B x Hq, D + 1 values each (a rank's partial for a
    cross-rank combine); push(...) sends that partial to every rank's inbox (FlashDecode's fused
    variants). The arrival counters make one instance good for one stream at a time."""

    def __init__(self, B: int, Hq: int, Hkv: int, D: int, S: int, device: torch.device, config: Config = Config(),
                 table: dict | None = None):
        check_shape(Hq, Hkv, D)
        self.B, self.Hq, self.Hkv, self.D, self.S = B, Hq, Hkv, D, S
        self.G = Hq // Hkv
        self.R = B * Hq
        self.device = device
        self.interp = interpreting()
        self.cfg, self.n_splits, self.split_len = resolve(config, B, Hkv, S, D, sm_count_of(device),
                                                          device.type == "cuda", table, gpu_name_of(device))
        self.merge_rows, self.merge_splits = _merge_tile(self.G, D, self.cfg.num_warps)
        self.tma = bool(self.cfg.tma) and S % self.cfg.block_n == 0 and TensorDescriptor is not None
        self.o_part = torch.empty(self.R * self.n_splits * D, dtype=torch.float32, device=device)
        self.lse_part = torch.empty(self.R * self.n_splits, dtype=torch.float32, device=device)
        self.counts = torch.zeros(B * Hkv, dtype=torch.int64, device=device)  # tickets handed out, per group
        self._bound = BoundedCache(16)  # launches bound once per set of buffers (kernels/launch.py)
        self._descs = DescriptorCache()

    def _check(self, q, k, v):
        want = (self.B, self.Hkv, self.S, self.D)
        if tuple(k.shape) != want or tuple(v.shape) != want or tuple(q.shape) != (self.B, self.Hq, self.D):
            raise ValueError(f"decode built for q {(self.B, self.Hq, self.D)} and K, V {want}; got q {tuple(q.shape)}, "
                             f"K {tuple(k.shape)}, V {tuple(v.shape)}")
        if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
            raise ValueError("decode wants contiguous q, K and V")

    def _launch(self, q, k, v, out, mode, push=None):
        inbox, bases, flags, state, rank, world, data = push or (self.counts, self.counts, self.counts, self.counts,
                                                                  0, 1, False)
        key = (mode, buffer_key(q), buffer_key(k), buffer_key(v), buffer_key(out), buffer_key(inbox), buffer_key(bases),
               buffer_key(flags), buffer_key(state), rank, world, data)
        bound = self._bound.get(key)
        if bound is None:  # a new set of buffers: checked, its descriptors made and its launch bound, once
            self._check(q, k, v)
            k_desc, v_desc = k, v  # unused by pointer loads
            if self.tma:
                rows, box = self.B * self.Hkv * self.S, [self.cfg.block_n, self.D]
                k_desc = self._descs.get(k.view(rows, self.D), box)
                v_desc = self._descs.get(v.view(rows, self.D), box)
            bound = self._bound.put(key, BoundLaunch(decode_kernel, (self.B * self.Hkv * self.n_splits,), (
                q, k, v, k_desc, v_desc, self.o_part, self.lse_part, self.counts, out, inbox, bases, flags, state, rank,
                self.R, self.S, self.n_splits, LOG2E / math.sqrt(self.D)), dict(
                Hq=self.Hq, Hkv=self.Hkv, D=self.D, G=self.G, G_PAD=max(16, triton.next_power_of_2(self.G)),
                BLOCK_N=self.cfg.block_n, MERGE_ROWS=self.merge_rows, MERGE_SPLITS=self.merge_splits, OUT=mode,
                WORLD=world, DATA_SIGNAL=data, TMA=self.tma, EVICT="evict_first" if self.cfg.evict_first else "",
                DOT_F32=self.interp, num_warps=self.cfg.num_warps, num_stages=self.cfg.num_stages)))
        bound()

    def final(self, q, k, v, out):
        self._launch(q, k, v, out, OUT_FINAL)
        return out

    __call__ = final

    def packed(self, q, k, v, dst):
        self._launch(q, k, v, dst, OUT_PACKED)
        return dst

    def push(self, q, k, v, inbox, bases, flags, state, rank, world, data_signal):
        self._launch(q, k, v, inbox, OUT_PUSH, (inbox, bases, flags, state, rank, world, data_signal))

    def describe(self) -> dict:
        c = self.cfg
        return {"block_n": c.block_n, "num_warps": c.num_warps, "num_stages": c.num_stages, "tma": self.tma,
                "evict_first": bool(c.evict_first), "splits": self.n_splits, "split_len": self.split_len,
                "programs": self.B * self.Hkv * self.n_splits}
