"""Kineto (torch.profiler) traces: read one rank's Chrome trace into an events frame, and what the file says
about itself (rank, world, devices, versions, clock). taxes.traces.kineto_timeline turns the events into a
taxes.traces.timeline.Timeline.

`taxes analyze` reads the traces of any PyTorch program through here, and `taxes profile` reads its own
torch.profiler recordings (the clock it falls back to without cupti-python) the same way, so both are
attributed by one code. Times are microseconds kept as floats (Kineto writes nanosecond digits). The file
is streamed (taxes.traces.stream): only the fields analysis needs are kept, in columns.
"""

from __future__ import annotations

import math
import os
import re
from array import array
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd

from taxes.errors import TaxesError
from taxes.traces.stream import TraceStream, one_line

MAX_RANK = 65535  # the result schema's bound: ranks 0..65535, worlds up to 65536
MAX_WORLD = MAX_RANK + 1


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 34


# Refuse traces larger than this once decompressed: what fits the machine (parsed columns take a few
# times the text, and ranks are parsed side by side), at most 8 GiB.
MAX_TRACE_BYTES = min(1 << 33, _memory_bytes() // 8)
# Kineto's categories (and the older capitalised ones) -> what this module calls them.
_KIND_OF_CAT = {
    "kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
    "gpu_memset": "memset", "Memset": "memset", "cuda_runtime": "runtime", "Runtime": "runtime",
    "cuda_driver": "driver", "Driver": "driver", "cpu_op": "cpu_op", "Operator": "cpu_op",
    "user_annotation": "annotation", "python_function": "python",
}
GPU_KINDS = ("kernel", "memcpy", "memset")
STEP_NAME = re.compile(r"ProfilerStep#(\d{1,9})$")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_DIGITS = 6  # more digits than any rank up to MAX_RANK needs: refused before int() reads them
_ABSOLUTE_TS_US = 2.0 ** 43  # above this a float keeps less than ~1 ns: re-read the file exactly
# Collective metadata: torch writes these on record_param_comms (and, newer, on NCCL kernels).
PG_KEYS = ("Process Group Name", "Process Group ID", "pg_name", "pg", "Process Group")
SEQ_KEYS = ("Seq", "seq", "Sequence id")
_COLUMNS = ("kind", "name", "pid", "tid", "ts", "dur", "correlation", "stream", "device", "flow_id", "ext_id",
            "rf_id", "input_dims", "input_type", "coll", "pg", "seq", "mem_addr", "mem_bytes")


def _error(message: str) -> TaxesError:
    return one_line(message)


def _is_number(v) -> bool:
    """A finite JSON number of sane size (math.isfinite(10**400) would raise, not answer)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, Decimal)):
        return False
    if isinstance(v, int):
        return abs(v) < 2**63
    return math.isfinite(v) and abs(v) < 1e18


def _short(v) -> str:
    text = str(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _int_or_nan(v) -> float:
    return float(v) if type(v) is int and abs(v) < 2**53 else math.nan


def _first(args: dict, keys):
    for k in keys:
        if k in args:
            return args[k]
    return None


# ---- reading one trace ----------------------------------------------------------------------------


class _Columns:
    """The kept events, column by column: numbers in typed arrays, strings interned once."""

    def __init__(self):
        self.kind, self.name, self.pid, self.tid = array("b"), array("i"), array("i"), array("i")
        self.ts, self.dur = array("d"), array("d")
        self.correlation, self.stream, self.device, self.flow_id = array("d"), array("d"), array("d"), array("d")
        self.ext_id, self.rf_id = array("d"), array("d")
        self.sparse = {k: {} for k in ("input_dims", "input_type", "coll", "pg", "seq", "mem_addr", "mem_bytes")}
        self.strings: dict = {}
        self.ids: dict = {}
        self.skipped: dict = {}  # category -> complete events of it not kept (a refusal names them)

    def code(self, s: str) -> int:
        c = self.strings.get(s)
        if c is None:
            c = self.strings[s] = len(self.strings)
        return c

    def ident(self, v) -> int:
        """pid / tid as interned text (they are numbers or names in the trace)."""
        try:
            c = self.ids.get(v)
        except TypeError:
            v = repr(v)
            c = self.ids.get(v)
        if c is None:
            c = self.ids[v] = self.code(str(v))
        return c


KINDS = ("kernel", "memcpy", "memset", "runtime", "driver", "cpu_op", "annotation", "python", "memory",
         "flow_start", "flow_end")
_KIND_CODE = {k: i for i, k in enumerate(KINDS)}
MAX_SKIPPED_KINDS = 8  # categories of complete events not kept that a trace's attrs remember, the most common first


def _read_events(stream: TraceStream, path: Path, exact: bool) -> tuple[_Columns, bool, object]:
    """One pass over the events: keep the ones analysis needs, check each, convert times to float us.
    Returns the columns, whether a timestamp was absolute (needs the exact re-read), and the origin."""
    cols = _Columns()
    kinds = {cat: _KIND_CODE[k] for cat, k in _KIND_OF_CAT.items()}
    flow_s, flow_f, memory = _KIND_CODE["flow_start"], _KIND_CODE["flow_end"], _KIND_CODE["memory"]
    gpu = {_KIND_CODE[k] for k in GPU_KINDS}
    ops = {_KIND_CODE["cpu_op"], _KIND_CODE["annotation"]}
    origin = None
    absolute = False
    n = 0
    sp = cols.sparse
    dims, types, colls, pgs, seqs = sp["input_dims"], sp["input_type"], sp["coll"], sp["pg"], sp["seq"]
    addrs, sizes = sp["mem_addr"], sp["mem_bytes"]
    strings, ids = cols.strings, cols.ids
    # bound appends: this loop runs once per event of the file
    kind_a, name_a, pid_a, tid_a = cols.kind.append, cols.name.append, cols.pid.append, cols.tid.append
    ts_a, dur_a, corr_a, ext_a = cols.ts.append, cols.dur.append, cols.correlation.append, cols.ext_id.append
    stream_a, dev_a, rf_a, flow_a = cols.stream.append, cols.device.append, cols.rf_id.append, cols.flow_id.append
    nan = math.nan
    i = -1
    for e in stream.events():
        i += 1
        if type(e) is not dict:
            raise _error(f"{path}: traceEvents[{i}] is not an object")
        ph = e.get("ph")
        cat = e.get("cat")
        if ph == "X":
            k = kinds.get(cat) if type(cat) is str else None
            if k is None and type(cat) is str:
                cols.skipped[cat] = cols.skipped.get(cat, 0) + 1
        elif ph in ("s", "f") and cat == "ac2g":
            k = flow_s if ph == "s" else flow_f
        elif ph == "i" and cat == "cpu_instant_event" and e.get("name") == "[memory]":
            k = memory
        else:
            continue
        if k is None:
            continue
        name = e.get("name", "")
        if type(name) is not str:
            raise _error(f"{path}: traceEvents[{i}] ({_short(name)}): its name is not a string")
        ts = e.get("ts")
        if not (type(ts) is float and -1e18 < ts < 1e18) and not _is_number(ts):
            raise _error(f"{path}: traceEvents[{i}] ({_short(name)}): ts is missing or not a number")
        if ph == "X":
            dur = e.get("dur")
            if not (type(dur) is float and 0 <= dur < 1e18) and (not _is_number(dur) or dur < 0):
                raise _error(f"{path}: traceEvents[{i}] ({_short(name)}): dur is missing, negative or not a number")
        else:
            dur = 0.0
        args = e.get("args")
        if args is None:
            args = {}
        elif type(args) is not dict:
            raise _error(f"{path}: traceEvents[{i}] ({_short(name)}): args is not an object")
        if exact:
            if origin is None:
                origin = Decimal(math.floor(ts))
            t = float(ts - origin)
        else:
            if not absolute and abs(ts) > _ABSOLUTE_TS_US:
                absolute = True
            t = float(ts)
        c = strings.get(name)
        if c is None:
            c = strings[name] = len(strings)
        kind_a(k)
        name_a(c)
        for v, append in ((e.get("pid"), pid_a), (e.get("tid"), tid_a)):
            try:
                c = ids.get(v)
            except TypeError:
                v = repr(v)
                c = ids.get(v)
            if c is None:
                c = ids[v] = cols.code(str(v))
            append(c)
        ts_a(t)
        dur_a(float(dur))
        if args:
            v = args.get("correlation")
            corr_a(float(v) if type(v) is int and -2**53 < v < 2**53 else nan)
            v = args.get("External id")
            ext_a(float(v) if type(v) is int and -2**53 < v < 2**53 else nan)
            if k in gpu:
                v = args.get("stream")
                stream_a(float(v) if type(v) is int and -2**53 < v < 2**53 else nan)
                v = args.get("device")
                dev_a(float(v) if type(v) is int and -2**53 < v < 2**53 else nan)
                rf_a(nan)
            else:
                stream_a(nan)
                dev_a(nan)
                v = args.get("Record function id")
                rf_a(float(v) if type(v) is int and -2**53 < v < 2**53 else nan)
            if k in ops and "Input Dims" in args:
                dims[n] = args.get("Input Dims")
                types[n] = args.get("Input type")
            if "Collective name" in args or k in ops and name == "record_param_comms":
                coll = args.get("Collective name")
                colls[n] = coll if type(coll) is str else ""
                pg = _first(args, PG_KEYS)
                if pg is not None:
                    pgs[n] = str(pg)[:200]
                seq = _first(args, SEQ_KEYS)
                if type(seq) is int:
                    seqs[n] = seq
            if k == memory:
                addr, nbytes = args.get("Addr"), args.get("Bytes")
                if type(addr) is int and type(nbytes) is int:
                    addrs[n] = addr
                    sizes[n] = nbytes
        else:
            corr_a(nan)
            ext_a(nan)
            stream_a(nan)
            dev_a(nan)
            rf_a(nan)
        if k == flow_s or k == flow_f:
            v = e.get("id")
            flow_a(float(v) if type(v) is int and -2**53 < v < 2**53 else nan)
        else:
            flow_a(nan)
        n += 1
    return cols, absolute, origin


def load_trace(path, special: bool = False) -> pd.DataFrame:
    """One Kineto trace as an events frame (one row per kept event, times in us as floats).

    Kept: complete events of the GPU (kernel, memcpy, memset), runtime and driver calls, cpu ops, user
    annotations and Python functions; ac2g flows; [memory] instant events (profile_memory=True).
    df.attrs["trace"] holds what the file says about itself: path, rank (distributedInfo, else the file
    name, else None), world_size, backend, nccl_version, devices, cuda_version, torch_version (when the
    recording added it as metadata), base_ns (baseTimeNanoseconds) and origin_us (subtracted from absolute
    timestamps of old traces, to keep their sub-us digits). special: read a FIFO or device too.
    A rank in the file name beyond MAX_RANK is refused before the file is opened."""
    path = Path(path)
    name_rank(path)
    stream = TraceStream(path, MAX_TRACE_BYTES, special=special)
    cols, absolute, origin = _read_events(stream, path, exact=False)
    if absolute:
        # Absolute epoch timestamps (old Kineto): floats would round them to 0.25 us; re-read exactly.
        if special:
            raise _error(f"{path}: absolute timestamps need a second, exact pass; copy the trace to a regular file")
        stream = TraceStream(path, MAX_TRACE_BYTES, exact=True)
        cols, _, origin = _read_events(stream, path, exact=True)
    frame = _frame(cols)
    frame.attrs["trace"] = trace_info(stream.meta, path, int(origin) if origin is not None else 0)
    frame.attrs["trace"]["skipped"] = dict(sorted(cols.skipped.items(), key=lambda kv: -kv[1])[:MAX_SKIPPED_KINDS])
    return frame


def _frame(cols: _Columns) -> pd.DataFrame:
    n = len(cols.kind)
    strings = np.empty(len(cols.strings), dtype=object)
    for s, c in cols.strings.items():
        strings[c] = s
    kinds = np.array(KINDS, dtype=object)
    data = {
        "kind": kinds[np.frombuffer(cols.kind, dtype=np.int8)] if n else np.empty(0, dtype=object),
        "name": strings[np.frombuffer(cols.name, dtype=np.int32)] if n else np.empty(0, dtype=object),
        "pid": strings[np.frombuffer(cols.pid, dtype=np.int32)] if n else np.empty(0, dtype=object),
        "tid": strings[np.frombuffer(cols.tid, dtype=np.int32)] if n else np.empty(0, dtype=object),
    }
    for c in ("ts", "dur", "correlation", "stream", "device", "flow_id", "ext_id", "rf_id"):
        data[c] = np.frombuffer(getattr(cols, c), dtype=np.float64).copy() if n else np.empty(0)
    for c, values in cols.sparse.items():
        numeric = c in ("seq", "mem_addr", "mem_bytes")
        col = np.full(n, np.nan) if numeric else np.full(n, None, dtype=object)
        if values:
            idx = np.fromiter(values.keys(), dtype=np.int64, count=len(values))
            if numeric:
                col[idx] = np.fromiter(values.values(), dtype=float, count=len(values))
            else:
                for i, v in zip(idx, values.values()):
                    col[i] = v
        data[c] = col
    frame = pd.DataFrame(data, columns=list(_COLUMNS))
    frame["end"] = frame["ts"] + frame["dur"]
    return frame


def trace_info(meta: dict, path: Path, origin_us: int) -> dict:
    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    props = meta.get("deviceProperties")
    devices = [d.get("name") for d in props if isinstance(d, dict)] if isinstance(props, list) else []
    base = meta.get("baseTimeNanoseconds")
    world = dist.get("world_size")
    cuda = meta.get("cuda_runtime_version")
    hip = meta.get("hip_runtime_version")

    def text(v):
        return str(v)[:60] if isinstance(v, (str, int, float)) and not isinstance(v, bool) else None

    if world is not None and not (isinstance(world, int) and not isinstance(world, bool) and 0 < world <= MAX_WORLD):
        raise _error(f"{path}: distributedInfo.world_size {_short(world)} is not a world size (1 to {MAX_WORLD})")
    return {
        "path": str(path),
        "rank": trace_rank(meta, path),
        "world_size": world,
        "backend": dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        "nccl_version": text(dist.get("nccl_version")),
        "devices": [d if isinstance(d, str) else "?" for d in devices],
        "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) and 0 < cuda < 10**7 else None,
        "hip_version": text(hip),
        "torch_version": text(meta.get("torch_version") or meta.get("pytorch_version")),
        "triton_version": text(meta.get("triton_version")),
        "record": text(meta.get("taxes_trace_record")),
        "inferred_launches": int(meta["taxes_inferred_launches"]) if _is_number(meta.get("taxes_inferred_launches"))
        and 0 <= meta["taxes_inferred_launches"] < 2**53 else 0,
        "base_ns": int(base) if _is_number(base) else 0,
        "origin_us": origin_us,
    }


def trace_rank(meta: dict, path) -> int | None:
    """The rank a trace belongs to: distributedInfo.rank, else a rankN in the file name, else None. A rank
    beyond MAX_RANK is refused in one line (ranks size tables and lists of missing ranks)."""
    dist = meta.get("distributedInfo")
    if isinstance(dist, dict) and "rank" in dist:
        r = dist.get("rank")
        if not (isinstance(r, int) and not isinstance(r, bool) and 0 <= r <= MAX_RANK):
            raise _error(f"{path}: distributedInfo.rank {_short(r)} is not a rank (0 to {MAX_RANK})")
        return r
    return name_rank(path)


def name_rank(path) -> int | None:
    """The rankN in a file name (None without one); beyond MAX_RANK a one-line error, told from the digits'
    count before any conversion."""
    m = _RANK_IN_NAME.search(Path(path).name)
    if not m:
        return None
    digits = m.group(1).lstrip("0") or "0"
    if len(digits) > _DIGITS or int(digits) > MAX_RANK:
        raise _error(f"{path}: rank {_short(m.group(1))} in the file name is not a rank (0 to {MAX_RANK})")
    return int(digits)


def profiler_steps(events: pd.DataFrame) -> pd.DataFrame:
    """The ProfilerStep#N annotations on the host: step, host_start_us, host_end_us (empty if none)."""
    marks = events[events["kind"].isin(("annotation", "cpu_op"))]
    found = marks["name"].str.extract(STEP_NAME, expand=False)
    marks = marks[found.notna()].assign(step=found[found.notna()].astype(int))
    marks = marks.sort_values("ts").drop_duplicates("step")
    return pd.DataFrame({"step": marks["step"].values, "host_start_us": marks["ts"].values,
                         "host_end_us": marks["end"].values}).sort_values("step").reset_index(drop=True)
