"""Probes: the small kernels `taxes calibrate` measures this machine with, each with its launcher.

- `empty_kernel`: a kernel that does nothing, so timing its launches measures the launch path alone;
- `stamp_kernel` (`stamp`): this GPU's %globaltimer written to a buffer, for the ranks' skew after a
  barrier;
- `hbm_read_kernel` (`hbm_read_sums`): every byte of a buffer read once and summed per program, so the
  read is real and its result checkable: what HBM gives a kernel that only reads;
- `peer_copy_kernel` (`triton_peer_copy`): a peer's symmetric buffer written with stores or read with
  loads, addressed as the fused kernels address peers (kernels/sync.py: peer_ptr) or directly;
- `ping_pong_kernel` (`ping_pong`): one CTA on each of two ranks bouncing a flag, with relaxed stores and
  volatile polls (half a round trip is the link latency) or with the fused kernels' own release signal
  and acquire wait; stamped rounds give each GPU's clock offset from the leader's.

Each runs on a GPU and under Triton's interpreter (tests/test_calibrate.py runs them on emulated ranks).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from taxes.kernels.device import interpreting
from taxes.kernels.sync import (
    ERR_WORDS,
    globaltimer_ns,
    peer_ptr,
    raise_if_timed_out,
    record_timeout,
    signal,
    spent_since,
    wait_at_least,
    wait_budget,
)


# ---- launch cost ---------------------------------------------------------------------------------


@triton.jit
def empty_kernel(x_ptr):
    """A near-empty kernel: its one store never runs, so only the launch is measured."""
    if tl.program_id(0) < 0:
        tl.store(x_ptr, 0)


# ---- clocks --------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["slot"])
def stamp_kernel(out_ptr, slot, INTERPRET: tl.constexpr):
    """out[slot] = this GPU's %globaltimer (ns) when the kernel runs."""
    tl.store(out_ptr + slot, globaltimer_ns(INTERPRET))


def stamp(out, slot: int) -> None:
    """out[slot] = this GPU's clock (int64 ns) when the stream reaches this launch."""
    stamp_kernel[(1,)](out, slot, INTERPRET=interpreting())


# ---- HBM -----------------------------------------------------------------------------------------


@triton.jit
def hbm_read_kernel(x_ptr, sums_ptr, n, BLOCK: tl.constexpr):
    """Each program strides over the blocks of x (int32) and stores its sum: every byte read once, one
    word written per program. The sums are what makes the reads real (and checkable)."""
    pid, progs = tl.program_id(0), tl.num_programs(0)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for b in range(pid, tl.cdiv(n, BLOCK), progs):
        offs = b * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.store(sums_ptr + pid, tl.sum(acc, axis=0))


def hbm_read_sums(x, sums, block: int) -> None:
    """sums[i] = the sum of program i's blocks of x (int32), one program per element of sums."""
    hbm_read_kernel[(sums.numel(),)](x, sums, x.numel(), BLOCK=block, num_warps=8)


# ---- peer copies ---------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["me", "peer"])
def peer_copy_kernel(sym_ptr, remote_ptr, other_ptr, bases, me, peer, n, PUSH: tl.constexpr, VIA_BASES: tl.constexpr,
                     BLOCK: tl.constexpr, GRID: tl.constexpr):
    """PUSH: peer's copy of sym[0:n] = other[0:n] (stores over the link); else other = peer's sym (loads).

    VIA_BASES: reach the peer as the fused kernels do (sync.peer_ptr: address arithmetic, alignment
    unknown to the compiler); else through remote_ptr, the peer's buffer passed as an argument."""
    if VIA_BASES:
        remote = peer_ptr(sym_ptr, bases, me, peer)
    else:
        remote = remote_ptr
    offs0 = tl.arange(0, BLOCK)
    for start in range(tl.program_id(0) * BLOCK, n, GRID * BLOCK):
        offs = start + offs0
        mask = offs < n
        if PUSH:
            tl.store(remote + offs, tl.load(other_ptr + offs, mask=mask), mask=mask)
        else:
            tl.store(other_ptr + offs, tl.load(remote + offs, mask=mask), mask=mask)


def triton_peer_copy(ctx, buf, other, peer: int, push: bool, via_bases: bool = True, grid: int | None = None,
                     block: int = 4096) -> None:
    """Launch peer_copy_kernel between symmetric buffer `buf` on `peer` and `other` (int32, as many
    elements); GPU or interpreter."""
    n = other.numel()
    if grid is None:
        grid = 2 * torch.cuda.get_device_properties(ctx.device).multi_processor_count if ctx.device.type == "cuda" else 2
    peer_copy_kernel[(grid,)](buf.local, buf.peers[peer], other, ctx.heap.bases, ctx.rank, peer, n, PUSH=push,
                              VIA_BASES=via_bases, BLOCK=block, GRID=grid, num_warps=8 if ctx.device.type == "cuda" else 1)


# ---- flag ping-pong ------------------------------------------------------------------------------


@triton.jit
def _wait_relaxed(flag_ptr, target, err_ptr, budget, index, INTERPRET: tl.constexpr):
    """Spin on volatile loads until *flag_ptr >= target; bounded like sync.wait_at_least."""
    seen = tl.load(flag_ptr, volatile=True)
    if seen < target:
        start = globaltimer_ns(INTERPRET)
        polls = 0
        gave_up = tl.load(err_ptr, volatile=True)
        while (seen < target) & (gave_up == 0):
            seen = tl.load(flag_ptr, volatile=True)
            polls += 1
            if spent_since(start, polls, INTERPRET) > budget:
                if seen < target:
                    record_timeout(err_ptr, 2, index, target, seen)
                    gave_up = 1


@triton.jit
def _ping(theirs, mine, value, err_ptr, budget, peer, SEND_FIRST: tl.constexpr, RELAXED: tl.constexpr,
          INTERPRET: tl.constexpr):
    """One half of a round: the leader sends then waits; the follower waits then sends. Returns the
    stamp taken between the two (the follower's t1) or after both (the leader's t2)."""
    if SEND_FIRST:
        if RELAXED:
            tl.atomic_xchg(theirs, value, sem="relaxed", scope="sys")
            _wait_relaxed(mine, value, err_ptr, budget, peer, INTERPRET)
        else:
            signal(theirs, value, "sys")
            wait_at_least(mine, value, err_ptr, budget, 2, peer, "sys", INTERPRET)
        t = globaltimer_ns(INTERPRET)
    else:
        if RELAXED:
            _wait_relaxed(mine, value, err_ptr, budget, peer, INTERPRET)
        else:
            wait_at_least(mine, value, err_ptr, budget, 2, peer, "sys", INTERPRET)
        t = globaltimer_ns(INTERPRET)
        if RELAXED:
            tl.atomic_xchg(theirs, value, sem="relaxed", scope="sys")
        else:
            signal(theirs, value, "sys")
    return t


@triton.jit(do_not_specialize=["me", "peer", "base", "rounds", "budget"])
def ping_pong_kernel(flags_ptr, bases, stamps_ptr, err_ptr, me, peer, base, rounds, budget, LEADER: tl.constexpr,
                     RELAXED: tl.constexpr, STAMPS: tl.constexpr, INTERPRET: tl.constexpr):
    """`rounds` flag round trips between this rank and `peer` (one CTA on each).

    flags[peer] on this rank is written only by `peer`, and this rank writes only flags[me] on the peer:
    one writer per flag; values base+1, base+2, ... only grow (later runs pass a larger base).
    stamps (int64, ns): with STAMPS the leader writes t0, t2 of round i at [2i], [2i+1] and the follower
    t1 at [i]; always [2*rounds] = the end of round 1 and [2*rounds+1] = the end, so rounds 2..rounds
    time (rounds - 1) round trips with the ranks already lined up by round 1."""
    mine = flags_ptr + peer
    theirs = peer_ptr(flags_ptr + me, bases, me, peer)
    t_first = globaltimer_ns(INTERPRET)
    for i in range(0, rounds):
        t0 = globaltimer_ns(INTERPRET)
        t = _ping(theirs, mine, base + i + 1, err_ptr, budget, peer, LEADER, RELAXED, INTERPRET)
        if STAMPS:
            if LEADER:
                tl.store(stamps_ptr + 2 * i, t0)
                tl.store(stamps_ptr + 2 * i + 1, t)
            else:
                tl.store(stamps_ptr + i, t)
        if i == 0:
            t_first = t
    tl.store(stamps_ptr + 2 * rounds, t_first)
    tl.store(stamps_ptr + 2 * rounds + 1, globaltimer_ns(INTERPRET))


def ping_pong(ctx, flags, stamps, peer: int, base: int, rounds: int, relaxed: bool, stamped: bool,
              wait_s: float) -> list[int]:
    """One ping-pong run with `peer` (both ranks call it; the lower rank leads); returns this rank's
    stamps (synchronises). Raises FlagTimeout when a wait gave up."""
    if 2 * rounds + 2 > stamps.local.numel():
        raise ValueError(f"{rounds} rounds need {2 * rounds + 2} stamps; the buffer holds {stamps.local.numel()}")
    interp = interpreting()
    err = torch.zeros(ERR_WORDS, dtype=torch.int32, device=ctx.device)
    ping_pong_kernel[(1,)](flags.local, ctx.heap.bases, stamps.local, err, ctx.rank, peer, base, rounds,
                           wait_budget(wait_s, interp), LEADER=ctx.rank < peer, RELAXED=relaxed, STAMPS=stamped,
                           INTERPRET=interp, num_warps=1)
    raise_if_timed_out(err, ctx.rank, "the ping-pong kernel", lambda kind, i: f"round trip with rank {i}")
    return stamps.local[: 2 * rounds + 2].tolist()
