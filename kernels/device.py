"""What the kernels ask of the device they run on: whether Triton interprets them, the SMs a grid is sized
for, a CUDA graph replay of a call, and the interpreter's bf16 rounding made a GPU's."""

from __future__ import annotations

import os

import torch


def replay_graph(graphs: dict, key, run) -> None:
    """Replay the CUDA graph of run() kept in graphs[key], capturing it first: one eager call (a real call,
    which also compiles and warms up outside the capture), then the capture. One graph per input set,
    since a graph replays fixed addresses."""
    g = graphs.get(key)
    if g is None:
        run()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            run()
        graphs[key] = g
    g.replay()


def round_bf16_like_a_gpu() -> None:
    """Make Triton 3.6's interpreter convert float32 to bfloat16 by rounding to nearest, as GPUs do,
    instead of truncating: a bias of about 2^-9 per store, which the ag-gemm and gemm-rs kernels' bf16
    stores inherit under emulation (four in a row put the fused tp-mlp layer at ~1.1%, over the 1e-2
    tolerance, while it is ~0.35% with rounding). For emulated rank processes only (`taxes profile
    --emulate` calls it); tests/test_tp_mlp.py keeps a strict xfail on the stock behaviour."""
    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as interp

    stock = interp.InterpreterBuilder.cast_impl
    if getattr(stock, "rounds_bf16", False):
        return

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            f32 = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32))
            return interp.TensorHandle(f32.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16), dst_type.scalar)
        return stock(self, src, dst_type)

    cast_impl.rounds_bf16 = True
    interp.InterpreterBuilder.cast_impl = cast_impl


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def sm_count_of(device: torch.device) -> int:
    """The SMs a kernel's grid is sized for: the GPU's, or 4 stand-in SMs off a GPU, so that under the
    interpreter a few programs (persistent CTAs, splits of the sequence) run the same scheduling logic."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def gpu_name_of(device: torch.device) -> str | None:
    """The GPU's name as CUDA gives it (the key of the per-GPU tuned tables); None off a GPU."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None
