"""Launching the fused kernels cheaply: descriptors made once per buffer, kernels bound once per set of
buffers, then launched with a prepared argument tuple.

Why. An eager call of a Triton kernel through `kernel[grid](...)` binds and specialises every argument
(our fused kernels take about 35), builds launch metadata, and, for each TensorDescriptor argument,
encodes a CUtensorMap on the host; building the TensorDescriptors in Python every call came on top. That
put 60-80 us of host time on every eager fused call, more than the torch and NCCL calls of the
bulk-synchronous sequence it replaces. But a runner launches the same kernel on the same few buffers
again and again (a benchmark rotates a handful of input sets; a layer reuses its intermediates), so all
of it can be done once per set of buffers:

- `DescriptorCache`: one TensorDescriptor per (address, shape, strides, dtype, block shape);
- `BoundLaunch(fn, grid, args, kwargs)`: its first call goes through fn[grid](...) (compiling and
  loading the kernel if needed) and keeps the compiled kernel; later calls hand the prepared arguments
  (pointers as integers, CUtensorMaps already encoded, constants as they were) to Triton's C launcher:
  one Python call, then cuLaunchKernelEx.

A binding is valid only for the buffers it was made with. Callers key their bindings on `buffer_key`
of every tensor they pass (address, shape, strides, dtype: a buffer that moves or changes shape gets a
new key, so a new binding), and a binding holds its tensors, so no other allocation can take an address
that a live key names. A CUDA graph captured from a bound launch keeps its own copy of the kernel's
parameters (the CUtensorMaps included), so it replays correctly for as long as the buffers stay where
they were: the same condition as before.

The direct path relies on the layout of Triton 3.6's NVIDIA launcher, which `direct_launch_supported`
checks when a kernel is bound. Anywhere else (the interpreter, another backend or Triton, a launch hook
installed by a profiler) a bound launch calls fn[grid](...) with its cached arguments: correct, only
slower. `mode` says which path a binding took.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from triton import knobs

from taxes.kernels.device import interpreting

# Triton 3.6's C launcher: gridX, gridY, gridZ, stream, function, cooperative, pdl, global scratch,
# profile scratch, kernel metadata, launch metadata, enter hook, exit hook; then the kernel's arguments
_LAUNCHER_BASE_FORMAT = "iiiKKppOOOOOO"
_FIXED_ARGS = 9  # of `rest` (BoundLaunch._prepare): function, cooperative, pdl, scratch x2, metadata x2, hooks x2


def buffer_key(t: torch.Tensor) -> tuple:
    """What a descriptor or a binding of tensor t depends on: address, shape, strides, dtype."""
    return (t.data_ptr(), t.shape, t.stride(), t.dtype)


class BoundedCache:
    """A small dict that forgets its oldest entries past `capacity` (bindings hold their buffers alive,
    so a runner called on ever new buffers must not keep them all)."""

    def __init__(self, capacity: int = 16):
        self.capacity = capacity
        self._items: OrderedDict = OrderedDict()

    def get(self, key):
        return self._items.get(key)

    def put(self, key, value):
        self._items[key] = value
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        self._items.clear()


class DescriptorCache:
    """Host TMA descriptors (TensorDescriptor), one per buffer and block shape, made on first use."""

    def __init__(self, capacity: int = 32):
        self._cache = BoundedCache(capacity)
        self.made = 0  # descriptors built so far (the cache's misses)

    def get(self, t: torch.Tensor, block: list[int]):
        key = (buffer_key(t), tuple(block))
        desc = self._cache.get(key)
        if desc is None:
            from triton.tools.tensor_descriptor import TensorDescriptor

            desc = self._cache.put(key, TensorDescriptor.from_tensor(t, list(block)))
            self.made += 1
        return desc

    def __len__(self) -> int:
        return len(self._cache)


def _launch_hooks_idle() -> bool:
    """No launch hook installed (a profiler such as proton adds one): the direct path may skip them."""
    for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return False
    return True


def direct_launch_supported(kernel) -> bool:
    """Whether a compiled kernel's launcher has the layout the direct path was written for (Triton 3.6,
    NVIDIA): the base argument format, the tensor-descriptor wrapper, no scratch memory to allocate."""
    try:
        from triton.backends.nvidia import driver as nv
    except ImportError:
        return False
    if getattr(nv, "_BASE_ARGS_FORMAT", None) != _LAUNCHER_BASE_FORMAT or not hasattr(nv, "make_tensordesc_arg"):
        return False
    launcher = getattr(kernel, "run", None)
    if not isinstance(launcher, getattr(nv, "CudaLauncher", ())):
        return False
    if getattr(launcher, "global_scratch_size", 1) or getattr(launcher, "profile_scratch_size", 1):
        return False
    return _raw_launch(launcher) is not None


def _raw_launch(launcher):
    """The C `launch` of a CudaLauncher: its `launch` itself, or the one its tensor-descriptor wrapper
    closes over (the wrapper encodes every descriptor at every launch: the cost we bind away)."""
    fn = launcher.launch
    code = getattr(fn, "__code__", None)
    if code is None:  # the C function itself (no tensor-descriptor argument)
        return fn
    cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
    cell = cells.get("launcher")
    raw = cell.cell_contents if cell is not None else None
    return raw if raw is not None and getattr(raw, "__code__", None) is None else None


class BoundLaunch:
    """fn[grid](*args, **kwargs) with every argument fixed; call() issues it on the current stream.

    The first call launches through Triton's JIT path and keeps the compiled kernel; on a GPU whose
    launcher `direct_launch_supported`, later calls go straight to the C launcher with the arguments
    prepared then, on the device that was current at the first call (a rank never changes device).
    The arguments' tensors are held, so their addresses stay theirs.

    call(name=tensor, ...) swaps pointer arguments for this call only: for inputs that another library
    allocates anew every call (PyTorch attention's output), where a binding per address would never be
    reused. The caller keys such a binding on everything but those addresses (shape, strides, dtype), and
    keeps the tensors alive until the launch is issued; an address off the 16-byte alignment the kernel
    was compiled for goes through the JIT path."""

    def __init__(self, fn, grid, args: tuple, kwargs: dict):
        self.fn, self.grid, self.args, self.kwargs = fn, tuple(grid) + (1,) * (3 - len(grid)), tuple(args), dict(kwargs)
        self.mode = "unlaunched"  # then "jit" or "direct"
        self._direct = None  # (C launch, device index, arguments after the stream)
        self._may_go_direct = not interpreting()

    def __call__(self, **fresh) -> None:
        direct = self._direct
        if direct is not None and _launch_hooks_idle() and all(t.data_ptr() % 16 == 0 for t in fresh.values()):
            launch, device, rest = direct
            if fresh:
                rest = list(rest)
                for name, t in fresh.items():
                    rest[self._slots[name]] = t.data_ptr()
            gx, gy, gz = self.grid
            launch(gx, gy, gz, torch._C._cuda_getCurrentRawStream(device), *rest)
            return
        args = self.args
        if fresh:
            args = tuple(fresh.get(name, a) for name, a in zip(self.fn.arg_names, args))
        kernel = self.fn[self.grid](*args, **self.kwargs)
        if self.mode == "unlaunched":
            if hasattr(kernel, "result"):  # compiled asynchronously: by now it has been launched, so it is done
                kernel = kernel.result()
            if self._may_go_direct and kernel is not None and direct_launch_supported(kernel):
                self._direct = self._prepare(kernel)
            self.mode = "jit" if self._direct is None else "direct"

    def _prepare(self, kernel):
        """The C launcher's arguments after the stream, in the order the JIT path passes them."""
        from triton.backends.nvidia.driver import make_tensordesc_arg

        launcher = kernel.run
        values = dict(zip(self.fn.arg_names, self.args))
        values.update({k: v for k, v in self.kwargs.items() if k in values or k in self.fn.arg_names})
        metas = list(getattr(kernel.metadata, "tensordesc_meta", None) or [])
        n_descs = sum(1 for s in kernel.src.signature.values() if isinstance(s, str) and s.startswith("tensordesc"))
        metas = metas or [None] * n_descs
        prepared, d = [], 0
        self._slots = {}  # pointer argument -> its index in `rest` (call's swaps)
        for name, sig in kernel.src.signature.items():
            value = values[name]
            if isinstance(sig, tuple):
                return None
            if sig.startswith("tensordesc"):
                prepared.extend(make_tensordesc_arg(value, metas[d]))  # the CUtensorMap, encoded once
                d += 1
            elif sig.startswith("*") and hasattr(value, "data_ptr"):
                self._slots[name] = _FIXED_ARGS + len(prepared)
                prepared.append(value.data_ptr())  # an integer: the launcher skips its pointer query
            else:
                prepared.append(value)
        device = torch.cuda.current_device()
        rest = (kernel.function, launcher.launch_cooperative_grid, launcher.launch_pdl, None, None,
                kernel.packed_metadata, None, None, None, *prepared)
        assert len(rest) - len(prepared) == _FIXED_ARGS
        return _raw_launch(launcher), device, rest
