"""A point on a CUDA stream where the device waits for its host: a host delay whose effect on the device is
exactly the host's own time.

A host that is late (a data loader, a Python-side decision, a slow launch path) holds a rank's device only
once that device has nothing queued. Planting such a delay by spinning before a launching call mixes the
spin with the call's own host path (tens of us for a NCCL call through torch.distributed, varying by as
much from one iteration to the next), so the device sees the spin plus noise. The gate takes the launch path
out: everything after the gate is queued first; the device, once it reaches the gate, writes a sequence
number to pinned host memory and waits (CUDA stream memory operations, no kernel); the host waits for that
number, spins, and writes the number back to open the gate. The device idles exactly the host's spin plus
two crossings of PCIe, the same in a run with no spin.
"""

from __future__ import annotations

import ctypes
import time

WAIT_GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ
WRITE_DEFAULT = 0x0  # CU_STREAM_WRITE_VALUE_DEFAULT: the write follows every earlier write of the stream
ARRIVE_TIMEOUT_S = 30.0


def spin_us(us: float) -> float:
    """Busy-wait on the host for `us` microseconds; returns how long it actually spun."""
    t0 = time.perf_counter()
    end = t0 + us * 1e-6
    while time.perf_counter() < end:
        pass
    return (time.perf_counter() - t0) * 1e6


def _driver_call(lib, *names):
    for name in names:
        f = getattr(lib, name, None)
        if f is not None:
            return f
    raise RuntimeError(f"the CUDA driver has none of {', '.join(names)}: no host gate on this machine")


class HostGate:
    """`close()` queues the gate on the current stream (where the device will wait); `open_after(us)`, called
    once everything after the gate is queued, waits until the device is at the gate, spins us microseconds
    and opens it. Returns the spin's own length (us)."""

    def __init__(self):
        import torch

        self.flags = torch.zeros(2, dtype=torch.int32, pin_memory=True)  # [arrived, open]
        self.view = self.flags.numpy()
        self.seq = 0
        lib = ctypes.CDLL("libcuda.so.1")
        self._write = _driver_call(lib, "cuStreamWriteValue32_v2", "cuStreamWriteValue32")
        self._wait = _driver_call(lib, "cuStreamWaitValue32_v2", "cuStreamWaitValue32")
        for f in (self._write, self._wait):
            f.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            f.restype = ctypes.c_int
        pointer = _driver_call(lib, "cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer")
        pointer.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
        pointer.restype = ctypes.c_int
        dptr = ctypes.c_uint64(0)
        _check(pointer(ctypes.byref(dptr), ctypes.c_void_p(self.flags.data_ptr()), 0), "cuMemHostGetDevicePointer")
        self.arrived_ptr, self.open_ptr = dptr.value, dptr.value + 4

    def close(self) -> None:
        import torch

        self.seq += 1
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        _check(self._write(stream, self.arrived_ptr, self.seq, WRITE_DEFAULT), "cuStreamWriteValue32")
        _check(self._wait(stream, self.open_ptr, self.seq, WAIT_GEQ), "cuStreamWaitValue32")

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


def _check(result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"{what} failed (CUresult {result})")
