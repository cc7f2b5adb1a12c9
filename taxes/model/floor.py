"""The floor: what one rank's work would take with no tax at all, from its shape and hardware figures.

T_ideal = max(T_compute, T_hbm, T_link): FLOPs / matrix peak, essential HBM bytes (inputs read once,
outputs written once) / HBM bandwidth, bytes that must cross the link / link bandwidth plus one link
latency. The model predicts from it; the attribution measures against it.
"""

from __future__ import annotations

from dataclasses import dataclass

from taxes.model.hardware import HardwareProfile


@dataclass(frozen=True)
class Floor:
    """The no-tax floor of one rank, us."""

    compute_us: float
    hbm_us: float
    link_us: float = 0.0

    @property
    def work_us(self) -> float:
        """The local work's floor: max(compute, HBM)."""
        return max(self.compute_us, self.hbm_us)

    @property
    def ideal_us(self) -> float:
        return max(self.work_us, self.link_us)

    @property
    def unhideable_link_us(self) -> float:
        """Link time no schedule can hide behind local work."""
        return self.ideal_us - self.work_us


def floor_of(w, hw: HardwareProfile) -> Floor:
    """The floor of workload w (taxes.workloads) on hardware hw."""
    compute = w.flops() / hw.peak_flops(w.dtype) * 1e6
    hbm = w.hbm_bytes() / hw.hbm_bytes_per_us()
    link = w.link_bytes() / hw.inbound_bytes_per_us(w.world) + hw.link_latency_us if w.world > 1 else 0.0
    return Floor(compute, hbm, link)


def kernel_floor_us(flops: float, hbm_bytes: float, hw: HardwareProfile, dtype: str = "bf16") -> float:
    """One kernel's own floor: max(its FLOPs / matrix peak, its HBM bytes / HBM bandwidth), us."""
    return max(flops / hw.peak_flops(dtype) * 1e6 if flops else 0.0, hbm_bytes / hw.hbm_bytes_per_us())
