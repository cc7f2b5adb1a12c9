"""A point on a CUDA stream where the device waits for its host: a host delay whose effect on the device is
exactly the host's own time.

A host that is late (a data loader, a Python-side decision, a slow launch path) holds a rank's device only
once that device has nothing queued. Planting such a delay by spinning before a launching call mixes the
spin with the call's own host path (tens of us for a NCCL call through torch.distributed, varying by as
much from one iteration to the next), so the device sees the spin plus noise. The gate takes the launch path
out: everything after the gate is queued first; the device, once it reaches the gate, writes a sequence
number to pinned host memory and polls for the host's answer in a one-thread kernel; the host waits for that
number, spins, and writes the number back to open the gate. The device waits the host's spin plus two
crossings of PCIe (about 2 us), the same in a run with no spin.

Why a polling kernel and not the stream's own wait on host memory (cuStreamWaitValue32): on an H100 that
wait re-reads host memory about every 8-10 us, so a 20 us spin held the device 30 or 38 us at random
(reports/known_answer/host_gate-h100-x2.json, docs/method.md). The kernel's device time is the host's
delay; it is named so.
"""

from __future__ import annotations

import time

import triton
import triton.language as tl

from taxes.kernels.sync import globaltimer_ns, spent_since

ARRIVE_TIMEOUT_S = 30.0
WAIT_BUDGET_NS = 60_000_000_000  # the kernel gives up after a minute: a host that has gone never hangs the device


@triton.jit(do_not_specialize=["seq"])  # one compilation for every call
def host_gate_wait(flags_ptr, seq, budget_ns):
    """Write seq to flags[0] (the host sees the device at the gate), then spin until flags[1] >= seq."""
    tl.store(flags_ptr, seq)
    start = globaltimer_ns(False)
    polls = 0
    seen = tl.load(flags_ptr + 1, volatile=True)
    while seen < seq:
        seen = tl.load(flags_ptr + 1, volatile=True)
        polls += 1
        if spent_since(start, polls, False) > budget_ns:
            seen = seq


def spin_us(us: float) -> float:
    """Busy-wait on the host for `us` microseconds; returns how long it actually spun."""
    t0 = time.perf_counter()
    end = t0 + us * 1e-6
    while time.perf_counter() < end:
        pass
    return (time.perf_counter() - t0) * 1e6


class HostGate:
    """`close()` queues the gate on the current stream (where the device will wait); `open_after(us)`, called
    once everything after the gate is queued, waits until the device is at the gate, spins us microseconds
    and opens it. Returns the spin's own length (us)."""

    def __init__(self):
        import torch

        self.flags = torch.zeros(2, dtype=torch.int32, pin_memory=True)  # [arrived, open], read by the device
        self.view = self.flags.numpy()
        self.seq = 0

    def close(self) -> None:
        self.seq += 1
        host_gate_wait[(1,)](self.flags, self.seq, WAIT_BUDGET_NS, num_warps=1)

    def open_after(self, us: float) -> float:
        n = self.seq
        give_up = time.perf_counter() + ARRIVE_TIMEOUT_S
        while int(self.view[0]) < n:  # the device has not reached the gate yet
            if time.perf_counter() > give_up:
                self.view[1] = n  # never leave the device waiting on a host that has gone
                raise RuntimeError(f"the device did not reach the host gate in {ARRIVE_TIMEOUT_S:g} s")
        spun = spin_us(us) if us > 0 else 0.0
        self.view[1] = n
        return spun
