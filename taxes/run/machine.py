"""This machine's GPUs as a run sees them: how many, their name, the world a run gets, the hardware
profile that describes them, the per-kernel clock."""

from __future__ import annotations

import os

from taxes.errors import TaxesError
from taxes.run.preflight import surely_no_gpu

NO_GPU = ("profile: no CUDA GPU on this machine; use `taxes model` for predictions, or --emulate to check the "
          "kernels under Triton's interpreter (its timings mean nothing)")


def no_gpu(command: str) -> str:
    """The one-line refusal of a command that needs a GPU, on a machine without one."""
    return NO_GPU.replace("profile:", f"{command}:")


def gpu_count() -> int:
    if surely_no_gpu():
        return 0
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def run_world(gpus: int, emulate: bool) -> int:
    """The world size to run with, or a one-line error saying what is missing and what to do instead."""
    if emulate:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        return gpus
    if under_torchrun():
        return int(os.environ["WORLD_SIZE"])
    have = gpu_count()
    if have == 0:
        raise TaxesError(NO_GPU)
    if have < gpus:
        raise TaxesError(f"profile: --gpus {gpus} asked for, this machine has {have}; use --gpus {have}, "
                         f"`taxes model --gpus {gpus}`, or --emulate")
    from taxes.run.preflight import check_gpus

    check_gpus(gpus)
    return gpus


def run_hardware(given: str | None, emulate: bool, world: int, command: str):
    """The hardware profile of a run: named (--hardware), else the one that describes this machine's GPUs
    (taxes.model.hardware.machine_profile); says which on stderr, and warns when a named one describes
    another GPU."""
    from taxes.console import say
    from taxes.model.hardware import get_profile, machine_profile

    if emulate:
        return get_profile(given or "h200-sxm")
    hw, why, warn = machine_profile(gpu_name(), world, given)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 alone speaks
        say(f"taxes {command}: hardware profile {hw.name} ({why})")
        if warn:
            say(f"taxes {command}: warning: {warn}")
    return hw


def clock_name(clock: str, emulate: bool) -> str:
    """The per-kernel clock a run uses: the host's when emulated, else the one asked for; auto: cupti-python
    when installed."""
    if emulate:
        return "host"
    if clock in ("cupti", "torch.profiler"):
        return clock
    from taxes.run.cupti import available

    return "cupti" if available() is None else "torch.profiler"
