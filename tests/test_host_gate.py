"""The late rank's host delay: a gate on its stream that the host opens after a spin (taxes.run.host_gate), and
the roles of host work around a runner's launching steps (taxes.run.instrument)."""

from __future__ import annotations

import time

import pytest
import torch

from taxes.run.instrument import HOST_ROLES, host_work, launching


def test_host_work_is_never_captured_and_runs_before_or_after_the_launches():
    order = []
    steps = [("gate", "host", lambda: order.append("close")), ("ag", "communication", lambda: order.append("ag")),
             ("mm", "compute", lambda: order.append("mm")), ("delay", "host-after", lambda: order.append("open"))]
    assert [n for n, _, _ in launching(steps)] == ["ag", "mm"]
    for f in host_work(steps, "host") + [f for _, _, f in launching(steps)] + host_work(steps, "host-after"):
        f()
    assert order == ["close", "ag", "mm", "open"]
    assert set(HOST_ROLES) == {"host", "host-after"}


def test_an_emulated_late_rank_spins_where_the_gate_would_be():
    from types import SimpleNamespace

    from taxes.run.planted import Late

    class Runner:
        def phases(self, *inputs, traced=False):
            return [("prep", "compute", lambda: None), ("ag", "communication", lambda: None),
                    ("mm", "compute", lambda: None)]

    ctx = SimpleNamespace(device=torch.device("cpu"), rank=1)
    late = Late(ctx, Runner(), "host", 200.0)
    assert [(n, r) for n, r, _ in late.phases()] == [("prep", "compute"), ("delay", "host"),
                                                     ("ag", "communication"), ("mm", "compute")]
    late()
    assert late.spun and late.spun[0] >= 200.0  # the spin timed itself
    on_time = Late(SimpleNamespace(device=torch.device("cpu"), rank=0), Runner(), "host", 200.0)
    assert [n for n, _, _ in on_time.phases()] == ["prep", "ag", "mm"]  # only rank 1 is late


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_device_waits_at_the_gate_as_long_as_the_host_spins():
    from taxes.run.host_gate import HostGate

    gate = HostGate()
    x = torch.randn(1 << 20, device="cuda")
    y = x * 2
    torch.cuda.synchronize()
    gate.close()
    y = x * 3  # queued behind the gate
    done = torch.cuda.Event()
    done.record()
    time.sleep(0.005)
    assert not done.query()  # nothing after the gate runs before the host opens it
    gate.open_after(0.0)
    done.synchronize()
    assert torch.equal(y, x * 3)
    from taxes.run.harness import sleep_cycles_per_us

    cycles = sleep_cycles_per_us(torch.device("cuda"))
    late = []
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i, us in enumerate((0.0, 0.0, 50.0, 300.0, 0.0, 50.0) + (20.0,) * 8):
        torch.cuda._sleep(int(1000 * cycles))  # the device busy while the host queues: the gate's wait alone counts
        a.record()
        gate.close()
        y = x * 2
        b.record()
        spun = gate.open_after(us)
        b.synchronize()
        waited = a.elapsed_time(b) * 1e3
        assert spun >= us
        if i == 0:  # the first timed call pays for the events' first use
            continue
        # the device waited the spin, plus the host's poll, two PCIe crossings and the multiply
        assert -2.0 <= waited - spun < 30.0, (us, spun, waited)
        late.append(waited - spun)
    assert torch.equal(y, x * 2)
    # no quantum of its own (the stream's wait on host memory re-reads it every 8-10 us)
    assert max(late[-8:]) - min(late[-8:]) < 5.0, late
