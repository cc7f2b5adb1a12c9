"""Data locality from tensors that moved: intermediates one op wrote to device memory and a later op read back.

The ops are the top-level cpu ops that launched device work (the timeline's "call" ranges), per thread
and step. Evidence, best first:

    tensor ids    torch's execution trace (ExecutionTraceObserver, one JSON per rank) lists every op's input
                  and output tensors as [tensor id, storage id, offset, numel, itemsize, device]. A storage
                  on a GPU that a launching op wrote (in its outputs) and a later launching op of the same
                  step read (in its inputs) is an intermediate: the first reader pays a write and a read
                  (2 x bytes), each later reader one more read (bytes). Ops are joined to the trace by
                  their record-function id (Kineto's "Record function id" = the node's rf_id).
    shapes        (heuristic, only without an execution trace) with record_shapes, the output an op writes
                  is inferred from its inputs' shapes where a rule knows it (in-place and out-variant ops
                  write their first tensor, c10d collectives too; matmuls; elementwise and normalisation
                  ops: the broadcast shape), and claimed when the next launching op of the thread reads a
                  tensor of that shape and dtype (2 x bytes). With profile_memory's allocation events, a
                  pair is kept only if the producer allocated a block that large and the block still
                  existed when the consumer began. Shapes cannot tell two tensors of one shape apart, so
                  these pairs are labelled heuristic.

bytes x the hardware's time per byte (1 / HBM bandwidth) is the locality row of the pair's step.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from taxes.errors import TaxesError
from taxes.traces.steps import assign_steps
from taxes.traces.stream import one_line

MAX_ET_BYTES = 1 << 31
PAIR_COLUMNS = ["step", "producer", "consumer", "tensor", "shape", "dtype", "bytes", "moved_bytes", "source"]
TENSOR_IDS = "tensor ids (execution trace)"
SHAPES = "shapes (heuristic)"
SHAPES_ALLOC = "shapes + allocations (heuristic)"

# Bytes per element of the "Input type" strings torch.profiler writes.
DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "int": 4, "long int": 8, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
}
# Ops whose output has the broadcast shape of their tensor inputs and the first input's dtype.
_ELEMENTWISE = {
    "relu", "gelu", "silu", "sigmoid", "tanh", "add", "sub", "mul", "div", "neg", "exp", "pow", "rsqrt", "sqrt",
    "softmax", "_softmax", "log_softmax", "_log_softmax", "layer_norm", "native_layer_norm", "rms_norm",
    "_fused_rms_norm", "dropout", "native_dropout", "clone", "contiguous", "where", "masked_fill", "scale",
}


_SHAPED = _ELEMENTWISE | {"mm", "matmul", "bmm", "addmm", "linear"}


# ---- the execution trace ---------------------------------------------------------------------------


def read_execution_trace(path) -> dict[int, tuple[list, list]]:
    """{rf_id: (input tensors, output tensors)} of an execution trace, each tensor (storage id, bytes,
    device) for tensors on a GPU. One-line errors for anything malformed."""
    from taxes.files import BrokenGzip, read_maybe_gzip

    try:
        data = read_maybe_gzip(path, MAX_ET_BYTES)
    except BrokenGzip as e:
        raise one_line(f"{path}: a truncated or corrupt gzip file ({e})") from None
    except OSError as e:
        raise one_line(f"{path}: cannot read the execution trace ({e.strerror or e})") from None
    if len(data) > MAX_ET_BYTES:
        raise one_line(f"{path}: larger than {MAX_ET_BYTES >> 20} MiB; refusing to parse it")
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise one_line(f"{path}: not an execution trace ({type(e).__name__}: {str(e)[:80]})") from None
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, list):
        raise one_line(f"{path}: not an execution trace (no nodes list)")
    out = {}
    for n in nodes:
        if not isinstance(n, dict):
            continue
        rf = n.get("rf_id")
        if rf is None:
            for a in n.get("attrs") or []:
                if isinstance(a, dict) and a.get("name") == "rf_id":
                    rf = a.get("value")
        if type(rf) is not int or rf <= 0:
            continue
        out[rf] = (_tensors_of(n.get("inputs")), _tensors_of(n.get("outputs")))
    return out


def _tensors_of(part) -> list:
    values = part.get("values") if isinstance(part, dict) else part
    found = []
    stack = [values] if isinstance(values, list) else []
    while stack:
        v = stack.pop()
        if not isinstance(v, list):
            continue
        if len(v) == 6 and all(type(x) is int for x in v[:5]) and isinstance(v[5], str):
            if "cuda" in v[5] or "hip" in v[5] or v[5].isdigit():
                found.append((v[1], v[3] * v[4], v[5]))
        else:
            stack.extend(v)
    return found


def pairs_from_ids(calls: pd.DataFrame, et: dict) -> pd.DataFrame:
    """Producer -> consumer pairs from tensor identity. calls: the launching top-level ops (name, rf_id,
    step, tid, start_us) in launch order."""
    rows = []
    for (tid, step), g in calls[calls["step"] >= 0].sort_values("start_us").groupby(["tid", "step"], sort=False):
        writer: dict = {}  # storage -> (op name, bytes, readers so far)
        for name, rf in zip(g["name"].values, g["rf_id"].values):
            if rf != rf or int(rf) not in et:
                continue
            ins, outs = et[int(rf)]
            for storage, nbytes, _dev in ins:
                w = writer.get(storage)
                if w is None or w[0] is None:
                    continue
                moved = 2 * nbytes if w[2] == 0 else nbytes
                rows.append((step, w[0], name, f"storage {storage}", "", "", nbytes, moved, TENSOR_IDS))
                writer[storage] = (w[0], w[1], w[2] + 1)
            for storage, nbytes, _dev in outs:
                writer[storage] = (name, nbytes, 0)
    return pd.DataFrame(rows, columns=PAIR_COLUMNS)


# ---- shapes (heuristic) ----------------------------------------------------------------------------


def _tensors(dims, types) -> list[tuple[tuple, str | None]]:
    """(shape, dtype) of each tensor argument; a tensor list contributes its elements (dtype unknown)."""
    out = []
    if not isinstance(dims, list) or not isinstance(types, list):
        return out
    for d, t in zip(dims, types):
        if t in DTYPE_BYTES and isinstance(d, list) and all(type(x) is int for x in d):
            out.append((tuple(d), t))
        elif t == "TensorList" and isinstance(d, list):
            out += [(tuple(x), None) for x in d if isinstance(x, list) and all(type(v) is int for v in x)]
    return out


def _outputs(name: str, ins: list[tuple[tuple, str | None]]) -> list[tuple[tuple, str | None]]:
    """The tensor an op writes, where its inputs' shapes tell (module docstring); unknown ops: nothing."""
    base = name.split("::")[-1]
    if not ins:
        return []
    if name.startswith("c10d::") or base.endswith("_"):
        return ins[:1]
    try:
        if base in ("mm", "matmul", "bmm") and len(ins) >= 2 and len(ins[0][0]) >= 2 and len(ins[1][0]) >= 2:
            return [(ins[0][0][:-1] + ins[1][0][-1:], ins[0][1])]
        if base == "addmm" and len(ins) >= 3:
            return [((ins[1][0][0], ins[2][0][-1]), ins[1][1])]
        if base == "linear" and len(ins) >= 2 and len(ins[1][0]) == 2:
            return [(ins[0][0][:-1] + (ins[1][0][0],), ins[0][1])]
        if base in _ELEMENTWISE:
            return [(tuple(np.broadcast_shapes(*[t[0] for t in ins])), ins[0][1])]
    except (ValueError, IndexError, TypeError):
        return []
    return []


def _intermediate(outs, ins) -> tuple[tuple, str] | None:
    for shape, dtype in outs:
        for s, t in ins:
            if s == shape and (t is None or dtype is None or t == dtype) and (dtype or t) in DTYPE_BYTES:
                return shape, dtype or t
    return None


def pairs_from_shapes(calls: pd.DataFrame, allocations: pd.DataFrame | None = None) -> pd.DataFrame:
    """Adjacent launching ops of a thread and step where the first writes a tensor of the shape the second
    reads (module docstring). calls: name, input_dims, input_type, step, tid, start_us, end_us."""
    rows = []
    for (tid, step), g in calls[calls["step"] >= 0].sort_values("start_us").groupby(["tid", "step"], sort=False):
        names, dims, types = g["name"].values, g["input_dims"].values, g["input_type"].values
        starts, ends = g["start_us"].values, g["end_us"].values
        ins = [None] * len(g)
        for i in range(len(g) - 1):
            name = names[i]
            base = name.split("::")[-1]
            if not (name.startswith("c10d::") or base.endswith("_") or base in _SHAPED):
                continue  # no rule knows what it writes
            if ins[i] is None:
                ins[i] = _tensors(dims[i], types[i])
            ins[i + 1] = _tensors(dims[i + 1], types[i + 1])
            found = _intermediate(_outputs(name, ins[i]), ins[i + 1])
            if not found:
                continue
            shape, dtype = found
            nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPE_BYTES[dtype]
            source = SHAPES
            if allocations is not None and len(allocations):
                if not _allocated(allocations, tid, starts[i], ends[i], starts[i + 1], nbytes):
                    continue
                source = SHAPES_ALLOC
            rows.append((step, name, names[i + 1], "", "x".join(map(str, shape)), dtype, nbytes, 2 * nbytes, source))
    return pd.DataFrame(rows, columns=PAIR_COLUMNS)


def allocation_lifetimes(events: pd.DataFrame) -> pd.DataFrame:
    """profile_memory's [memory] events as blocks: tid, addr, bytes, alloc_us, free_us (inf if never freed
    in the trace)."""
    m = events[(events["kind"].values == "memory") & events["mem_addr"].notna().values]
    if m.empty:
        return pd.DataFrame(columns=["tid", "addr", "bytes", "alloc_us", "free_us"])
    m = m.sort_values("ts")
    alloc = m[m["mem_bytes"] > 0]
    free = m[m["mem_bytes"] < 0]
    rows = []
    frees = {}
    for addr, t in zip(free["mem_addr"].values, free["ts"].values):
        frees.setdefault(addr, []).append(t)
    for tid, addr, nbytes, t in zip(alloc["tid"].values, alloc["mem_addr"].values, alloc["mem_bytes"].values,
                                    alloc["ts"].values):
        later = [f for f in frees.get(addr, []) if f >= t]
        rows.append((tid, addr, nbytes, t, min(later) if later else math.inf))
    return pd.DataFrame(rows, columns=["tid", "addr", "bytes", "alloc_us", "free_us"])


def _allocated(blocks: pd.DataFrame, tid, a0: float, a1: float, b0: float, nbytes: int) -> bool:
    """The producer [a0, a1) allocated a block of at least nbytes (the allocator rounds up, at most 2x) on
    its thread, still alive when the consumer began at b0."""
    sel = blocks[(blocks["tid"].values == tid) & (blocks["alloc_us"].values >= a0) & (blocks["alloc_us"].values <= a1)]
    ok = (sel["bytes"].values >= nbytes) & (sel["bytes"].values <= 2 * nbytes + 512) & (sel["free_us"].values > b0)
    return bool(ok.any())


# ---- one rank ----------------------------------------------------------------------------------------


def rank_pairs(events: pd.DataFrame, host: pd.DataFrame, steps: pd.DataFrame, et_path=None) -> pd.DataFrame:
    """Every intermediate of one rank: with an execution trace by tensor ids, else by shapes (heuristic).
    host: the timeline's host ranges (its "call" ranges are the launching ops)."""
    calls = host[host["kind"] == "call"][["name", "start_us", "end_us", "tid"]]
    if calls.empty:
        return pd.DataFrame(columns=PAIR_COLUMNS)
    ops = events[events["kind"].values == "cpu_op"][["name", "ts", "end", "tid", "rf_id", "input_dims", "input_type"]]
    calls = calls.merge(ops.rename(columns={"ts": "start_us", "end": "end_us"}), on=["name", "start_us", "end_us", "tid"],
                        how="left").drop_duplicates(["start_us", "tid"])
    if calls.empty:
        return pd.DataFrame(columns=PAIR_COLUMNS)
    calls["step"] = assign_steps(calls["start_us"].values, steps) if not steps.empty else 0
    if et_path is not None:
        et = read_execution_trace(et_path)
        if not et:
            raise TaxesError(f"{et_path}: the execution trace has no op with a record-function id")
        return pairs_from_ids(calls, et)
    return pairs_from_shapes(calls, allocation_lifetimes(events))
