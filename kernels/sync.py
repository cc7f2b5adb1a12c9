"""Device helpers for fused kernels: reaching a peer's memory, signalling, and bounded waiting.

Flag protocol: flags are int32 epochs that only grow, tested with >=, so a fast
rank publishing epoch e+1 never hides epoch e from a slow one. Every flag has a single writer. A signal
is a CTA barrier (all threads' stores issued) then an atomic exchange with release semantics; a wait
is an acquire poll then a CTA barrier (no thread's later load moves above it). Flags written by
another GPU use scope "sys"; flags between CTAs of one launch use "gpu".

Every wait is bounded: it gives up after a budget (nanoseconds of %globaltimer on a GPU; polls under
Triton's interpreter, which has no clock), records in the kernel's error buffer which flag it was
waiting for, and makes every later wait of the launch give up at once, so the kernel ends and the host
raises (`raise_if_timed_out`) instead of hanging.

Every branch of a wait loop must be taken by the whole CTA: a scalar atomic (each poll, the error
check, the timeout record) is lowered to one thread's atomic plus a CTA barrier that broadcasts its
result, so warps that disagree about leaving the loop meet different barriers and the CTA hangs for
good. The flag and error values come from scalar atomics (the same in every thread); the clock is
read by every thread and reduced to one value (`cta_clock_ns`). A per-thread clock read or a volatile
load here was the bug behind a silent peer hanging the 8-warp GEMM on the GPU while the 1-warp probe
and the interpreter (no warps) timed out fine.

Error buffer (int32[8], zeroed per call): [0] 1 if a wait gave up, [1] flag kind, [2] flag index,
[3] value waited for, [4] value seen, [5] program id.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

ERR_WORDS = 8
FLAG_KINDS = {1: "data chunk", 2: "peer ready/free", 3: "payload (data as the signal)", 4: "probe"}


@triton.jit
def peer_ptr(ptr, bases, me, peer):
    """The address of the same symmetric-heap offset in `peer`'s arena."""
    delta = tl.load(bases + peer) - tl.load(bases + me)
    return (ptr.to(tl.int64) + delta).to(ptr.dtype)


@triton.jit
def globaltimer_ns(INTERPRET: tl.constexpr):
    if INTERPRET:
        t = tl.full((), 0, tl.int64)
    else:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    return t


@triton.jit
def signal(flag_ptr, value, SCOPE: tl.constexpr):
    """Publish `value` after every store this CTA made before it."""
    tl.debug_barrier()
    tl.atomic_xchg(flag_ptr, value, sem="release", scope=SCOPE)


@triton.jit
def cta_clock_ns(INTERPRET: tl.constexpr):
    """%globaltimer as one value for the whole CTA (the latest of its threads' readings; a reduction
    goes through shared memory, so every thread gets the same value). Threads of different warps read
    the clock at different instants: a branch on their own reading would split the CTA."""
    if INTERPRET:
        t = tl.full((), 0, tl.int64)
    else:
        # 1024 lanes: at least one per thread for any num_warps, so no warp's reading is dropped as a replica
        lanes = tl.zeros([1024], tl.int64)
        stamps = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,l", [lanes], dtype=tl.int64,
                                           is_pure=False, pack=1)
        t = tl.max(stamps, 0)
    return t


@triton.jit
def spent_since(start, polls, INTERPRET: tl.constexpr):
    """How much of a wait's budget is used: ns on a GPU (start from cta_clock_ns), polls under the
    interpreter. The same value in every thread of the CTA."""
    if INTERPRET:
        spent = polls.to(tl.int64)
    else:
        spent = cta_clock_ns(INTERPRET) - start
    return spent


@triton.jit
def timed_out_elsewhere(err_ptr):
    """1 once any wait of this launch gave up (a scalar atomic: the same value in every thread)."""
    return tl.atomic_add(err_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit
def record_timeout(err_ptr, kind, index, target, seen):
    """The first wait of a launch to give up records what it waited for; later ones see err[0] set."""
    if tl.atomic_cas(err_ptr, 0, 1) == 0:
        tl.store(err_ptr + 1, kind)
        tl.store(err_ptr + 2, index)
        tl.store(err_ptr + 3, target)
        tl.store(err_ptr + 4, seen)
        tl.store(err_ptr + 5, tl.program_id(0))


@triton.jit
def wait_at_least(flag_ptr, target, err_ptr, budget, kind, index, SCOPE: tl.constexpr, INTERPRET: tl.constexpr):
    """Spin until *flag_ptr >= target (acquire); bounded by `budget` (ns, or polls when interpreting)."""
    # Every value a branch below depends on is CTA-uniform (module docstring): the polls are scalar
    # atomics, the clock is cta_clock_ns; the clock and the error word are looked at every 64 polls.
    seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope=SCOPE)
    if seen < target:
        start = cta_clock_ns(INTERPRET)
        polls = 0
        gave_up = timed_out_elsewhere(err_ptr)
        while (seen < target) & (gave_up == 0):
            seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope=SCOPE)
            polls += 1
            if (polls % 64 == 0) & (seen < target):
                if spent_since(start, polls, INTERPRET) > budget:
                    record_timeout(err_ptr, kind, index, target, seen)
                    gave_up = 1
                else:
                    gave_up = timed_out_elsewhere(err_ptr)
    tl.debug_barrier()


def wait_budget(seconds: float, interpreting: bool) -> int:
    """The kernel's `budget` argument for a wait of about `seconds`."""
    # An interpreted poll takes about 0.3 ms on our CPU machines (measured); the budget is approximate there.
    return max(1, int(seconds / 3e-4)) if interpreting else int(seconds * 1e9)


class FlagTimeout(RuntimeError):
    """A fused kernel gave up waiting for a flag; the message names rank, flag and values."""


def raise_if_timed_out(err: torch.Tensor, rank: int, what: str, describe=None, rearm: bool = False) -> None:
    """Check a kernel's error buffer (synchronises with the device). rearm: clear a reported timeout, so
    the next calls' waits are bounded again instead of giving up at once."""
    e = err.tolist()
    if e[0]:
        if rearm:
            err.zero_()
        kind = FLAG_KINDS.get(e[1], f"kind {e[1]}")
        where = describe(e[1], e[2]) if describe else f"index {e[2]}"
        raise FlagTimeout(f"rank {rank}: {what} gave up waiting for the {kind} flag ({where}) to reach {e[3]}; "
                          f"it still read {e[4]} (program {e[5]}); a peer never sent it or died (if the peer is only "
                          f"slow, give the kernel a larger wait_s)")


# ---- the smallest bounded wait, for fault tests ---------------------------------------------------


@triton.jit
def wait_flag_kernel(flags_ptr, index, target, err_ptr, budget, SCOPE: tl.constexpr, INTERPRET: tl.constexpr):
    """One program waits until flags[index] >= target: wait_at_least with nothing around it."""
    wait_at_least(flags_ptr + index, target, err_ptr, budget, 4, index, SCOPE, INTERPRET)


def wait_for_flag(flags: torch.Tensor, index: int, target: int, rank: int, wait_s: float,
                  what: str = "flag probe") -> None:
    """Launch wait_flag_kernel on int32 `flags` and raise FlagTimeout if it gave up (after about wait_s).

    Used by the fault tests and benchmarks/fault_flag.py to show that a flag nobody raises ends in a
    host error naming the rank, the flag and the value waited for, not a hang."""
    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    err = torch.zeros(ERR_WORDS, dtype=torch.int32, device=flags.device)
    wait_flag_kernel[(1,)](flags, index, target, err, wait_budget(wait_s, interp), SCOPE="sys", INTERPRET=interp,
                           num_warps=1)
    raise_if_timed_out(err, rank, what)
