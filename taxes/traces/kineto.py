"""Kineto (torch.profiler) traces: read one rank's Chrome trace, and turn it into a taxes.traces.timeline.Timeline.

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

from taxes.traces.classify import BUILTIN_RULES, classify
from taxes.errors import TaxesError
from taxes.traces.timeline import EXTRA_COLUMNS, Timeline, api_kind, merge, timeline
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
_GPU_KINDS = ("kernel", "memcpy", "memset")
_STEP_NAME = re.compile(r"ProfilerStep#(\d{1,9})$")
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


def _read_events(stream: TraceStream, path: Path, exact: bool) -> tuple[_Columns, bool, object]:
    """One pass over the events: keep the ones analysis needs, check each, convert times to float us.
    Returns the columns, whether a timestamp was absolute (needs the exact re-read), and the origin."""
    cols = _Columns()
    kinds = {cat: _KIND_CODE[k] for cat, k in _KIND_OF_CAT.items()}
    flow_s, flow_f, memory = _KIND_CODE["flow_start"], _KIND_CODE["flow_end"], _KIND_CODE["memory"]
    gpu = {_KIND_CODE[k] for k in _GPU_KINDS}
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
    found = marks["name"].str.extract(_STEP_NAME, expand=False)
    marks = marks[found.notna()].assign(step=found[found.notna()].astype(int))
    marks = marks.sort_values("ts").drop_duplicates("step")
    return pd.DataFrame({"step": marks["step"].values, "host_start_us": marks["ts"].values,
                         "host_end_us": marks["end"].values}).sort_values("step").reset_index(drop=True)


# ---- one trace -> one timeline --------------------------------------------------------------------

_TAXES_MARK = re.compile(r"taxes:(step|call):(.*)$")
# Host work that is compilation: torch.compile (Dynamo, AOTAutograd, Inductor) and Triton's compiler and
# autotuner, as record_function annotations (dynamo_timed) and as Python frames (with_stack). The
# compiled region's own run ("Torch-Compiled Region", "CompiledFunction") is not compilation.
COMPILE = re.compile(
    r"(?:^|[ .:/])(?:_compile\.compile_inner|compile_inner|entire_frame_compile|backend_compile|inductor_compile|"
    r"compile_fx(?:_inner)?|compile_to_module|compile_to_fn|fw_compiler_base|bw_compiler|call_user_compiler|"
    r"GraphLowering\.(?:run|codegen|compile_to)\w*|async_compile\.wait|CachingAutotuner\.(?:benchmark_all_configs|"
    r"precompile)|benchmark_all_configs|triton\.compile|TorchDynamo compile)"
    r"|_dynamo/convert_frame\.py\(\d+\): (?:_compile|compile_inner|_convert_frame\w*)"
    r"|_inductor/(?:compile_fx|codecache|async_compile|select_algorithm)\.py\(\d+\)"
    r"|triton/compiler/compiler\.py\(\d+\): compile"
    r"|triton/runtime/autotuner\.py\(\d+\): _bench")
# Host work that is data loading: the DataLoader's iterator (its record_function and its Python frames).
DATA = re.compile(r"enumerate\(DataLoader\)|DataLoaderIter\.__next__|_DataLoaderIter|"
                  r"torch/utils/data/dataloader\.py\(\d+\): (?:__next__|_next_data)")


def top_level(starts: np.ndarray, ends: np.ndarray, tids: np.ndarray) -> np.ndarray:
    """Mask of ranges not nested in an earlier range of the same thread (ranges sorted by start, then
    longest first)."""
    keep = np.zeros(len(starts), dtype=bool)
    if not len(starts):
        return keep
    df = pd.DataFrame({"s": starts, "e": ends, "t": tids, "i": np.arange(len(starts))})
    df = df.sort_values(["t", "s", "e"], ascending=[True, True, False], kind="stable")
    reach = df.groupby("t", sort=False)["e"].transform(lambda e: e.cummax().shift(fill_value=-math.inf))
    keep[df["i"].values[(df["s"].values >= reach.values)]] = True
    return keep


def launches_inside(points_t, points_tid, ranges_s, ranges_e, ranges_tid) -> np.ndarray:
    """For each point (time, thread): the index of the range of the same thread holding it (ranges of a
    thread must not overlap), -1 for none."""
    out = np.full(len(points_t), -1, dtype=np.int64)
    if not len(ranges_s) or not len(points_t):
        return out
    rs, re_, rt = np.asarray(ranges_s, float), np.asarray(ranges_e, float), np.asarray(ranges_tid, dtype=object)
    pt, ptid = np.asarray(points_t, float), np.asarray(points_tid, dtype=object)
    for tid in pd.unique(rt):
        on_r = np.flatnonzero(rt == tid)
        on_p = np.flatnonzero(ptid == tid)
        if not len(on_p):
            continue
        order = on_r[np.argsort(rs[on_r], kind="stable")]
        k = np.searchsorted(rs[order], pt[on_p], side="right") - 1
        hit = (k >= 0) & (pt[on_p] <= re_[order[np.maximum(k, 0)]])
        out[on_p[hit]] = order[k[hit]]
    return out


def to_timeline(events: pd.DataFrame, rank: int, rule_set=BUILTIN_RULES, unlaunched_graphs=frozenset()) -> Timeline:
    """A rank's events (load_trace) as a taxes.traces.timeline.Timeline.

    activities  GPU kernels, copies and sets, sorted by start, with their launch correlation (a graph
                replay's kernels carry the graph launch's), communication by rule (taxes.traces.classify)
    launches    the runtime and driver calls, kind launch | graph | sync | other
    host        "call": top-level cpu ops that launch device work, and taxes:call:NAME marks; "step":
                ProfilerStep#N and taxes:step:N marks; "compile" and "data": the ranges COMPILE and DATA
                name (annotations, cpu ops, Python frames)
    Windows are left to the caller (steps differ between profile and analyze). The activities frame keeps
    extra columns the analysis reads (device, ext_id, launch_tid, launch_us). unlaunched_graphs: correlation
    ids of graph replays whose launch the record missed (taxes.traces.checks.repair_events)."""
    kind = events["kind"].values
    gpu = events[np.isin(kind, _GPU_KINDS)]
    host_calls = events[np.isin(kind, ("runtime", "driver"))]
    api = pd.Series(host_calls["name"].values)
    kinds = api.map({n: api_kind(n) or "other" for n in pd.unique(api)}).values
    launches = pd.DataFrame({"name": host_calls["name"].values, "kind": kinds,
                             "start_us": host_calls["ts"].values, "end_us": host_calls["end"].values,
                             "correlation": host_calls["correlation"].fillna(-1).astype(np.int64).values,
                             "tid": host_calls["tid"].values})
    corr = gpu["correlation"].fillna(-1).astype(np.int64).values
    acts = pd.DataFrame({"name": gpu["name"].values, "kind": gpu["kind"].values,
                         "stream": gpu["stream"].fillna(-1).astype(np.int64).values,
                         "start_us": gpu["ts"].values, "end_us": gpu["end"].values, "correlation": corr,
                         "device": gpu["device"].values, "ext_id": gpu["ext_id"].values,
                         "pg": gpu["pg"].values, "seq": gpu["seq"].values,
                         "pid": gpu["pid"].values, "tid": gpu["tid"].values})
    _join_launches(events, acts, launches)
    graph_corr = np.concatenate([launches.loc[launches["kind"] == "graph", "correlation"].values,
                                 np.fromiter(unlaunched_graphs, dtype=np.int64, count=len(unlaunched_graphs))])
    acts["graph"] = np.where(np.isin(acts["correlation"].values, graph_corr) & (acts["correlation"].values >= 0),
                             acts["correlation"].values, -1)
    ops = events[kind == "cpu_op"]
    top = top_level(ops["ts"].values, ops["end"].values, ops["tid"].values)
    la = launches[launches["kind"].isin(("launch", "graph"))]
    tops = ops[top]
    holder = launches_inside(la["start_us"].values, la["tid"].values, tops["ts"].values, tops["end"].values,
                             tops["tid"].values)
    calls = tops.iloc[np.unique(holder[holder >= 0])]
    acts["comm"] = classify(acts["name"].values, acts["kind"].values, _in_op(events, acts, rule_set), rule_set)
    host = [pd.DataFrame({"name": calls["name"].values, "kind": "call", "start_us": calls["ts"].values,
                          "end_us": calls["end"].values, "tid": calls["tid"].values})]
    marks = events[np.isin(kind, ("annotation", "cpu_op", "python"))]
    names = marks["name"].astype(str)
    for hkind, rx in (("compile", COMPILE), ("data", DATA)):
        sel = marks[names.str.contains(rx).values]
        host.append(pd.DataFrame({"name": sel["name"].values, "kind": hkind, "start_us": sel["ts"].values,
                                  "end_us": sel["end"].values, "tid": sel["tid"].values}))
    steps = names.str.extract(_STEP_NAME, expand=False)
    sel = marks[steps.notna().values]
    host.append(pd.DataFrame({"name": "step " + steps[steps.notna()].astype(str).values, "kind": "step",
                              "start_us": sel["ts"].values, "end_us": sel["end"].values, "tid": sel["tid"].values}))
    ours = names.str.extract(_TAXES_MARK)
    sel = marks[ours[0].notna().values]
    ours = ours[ours[0].notna()]
    host.append(pd.DataFrame({"name": np.where(ours[0] == "step", "step " + ours[1], ours[1]), "kind": ours[0].values,
                              "start_us": sel["ts"].values, "end_us": sel["end"].values, "tid": sel["tid"].values}))
    acts = acts.sort_values(["start_us", "end_us"], kind="stable").reset_index(drop=True)
    tl = timeline(rank, acts, launches, pd.concat([h for h in host if len(h)], ignore_index=True) if any(len(h) for h in host)
                  else None, None, {"source": "torch.profiler", **{k: v for k, v in events.attrs.get("trace", {}).items()
                                                                  if k in ("devices", "world_size", "path")}},
                  extra=acts[list(EXTRA_COLUMNS)])
    return tl


def _join_launches(events: pd.DataFrame, acts: pd.DataFrame, launches: pd.DataFrame) -> None:
    """Each activity's launch call: by correlation id, else through its ac2g flow (its end sits on the
    activity: same pid, tid, ts; its start on the launch call). A flow is the activity's own only if its
    id is the activity's correlation, where it has one."""
    calls = launches[launches["correlation"] >= 0].sort_values("start_us").drop_duplicates("correlation")
    j = calls.set_index("correlation").reindex(acts["correlation"].values)
    acts["launch_api"] = j["name"].values
    acts["launch_us"] = j["start_us"].values.astype(float)
    acts["launch_tid"] = j["tid"].values
    missing = acts["launch_us"].isna()
    if not missing.any():
        return
    kind = events["kind"].values
    ends = events[kind == "flow_end"][["pid", "tid", "ts", "flow_id"]]
    starts = events[kind == "flow_start"][["pid", "tid", "ts", "flow_id"]]
    host = events[np.isin(kind, ("runtime", "driver"))][["pid", "tid", "ts", "name", "correlation"]]
    if ends.empty or starts.empty or host.empty:
        return
    want = acts.loc[missing, ["pid", "tid", "start_us", "correlation"]].rename(columns={"start_us": "ts"}).reset_index()
    at = want.merge(ends.drop_duplicates(["pid", "tid", "ts", "flow_id"]), on=["pid", "tid", "ts"])
    corr = pd.to_numeric(at["correlation"], errors="coerce")
    at = at[(corr < 0) | (corr == pd.to_numeric(at["flow_id"], errors="coerce"))].drop_duplicates("index")
    hit = (at.merge(starts.drop_duplicates("flow_id"), on="flow_id", suffixes=("", "_call"))
           .merge(host.drop_duplicates(["pid", "tid", "ts"]), left_on=["pid_call", "tid_call", "ts_call"],
                  right_on=["pid", "tid", "ts"], suffixes=("", "_host")))
    if hit.empty:
        return
    idx = hit["index"].values
    acts.loc[idx, "launch_api"] = hit["name"].values
    acts.loc[idx, "launch_us"] = hit["ts_call"].values
    acts.loc[idx, "launch_tid"] = hit["tid_call"].values
    # the activity now carries its launch's correlation, so the timeline joins it the same way
    hc = hit["correlation_host"].fillna(-1).astype(np.int64).values
    acts.loc[idx, "correlation"] = np.where(hc >= 0, hc, acts.loc[idx, "correlation"].values)


def _in_op(events: pd.DataFrame, acts: pd.DataFrame, rule_set) -> dict:
    """{rule name: mask of activities whose launch lies inside a cpu op its op pattern matches}."""
    out = {}
    ops = events[events["kind"].values == "cpu_op"]
    for r in rule_set:
        if r.op is None:
            continue
        hit_ops = ops[ops["name"].str.contains(r.op).values]
        if hit_ops.empty:
            continue
        s, e = hit_ops["ts"].values, hit_ops["end"].values
        mask = np.zeros(len(acts), dtype=bool)
        launched = acts["launch_us"].notna().values
        for tid in pd.unique(hit_ops["tid"].values):
            m = merge(s[hit_ops["tid"].values == tid], e[hit_ops["tid"].values == tid])
            on = launched & (acts["launch_tid"].values == tid)
            t = acts["launch_us"].values[on]
            k = np.searchsorted(m[0], t, side="right") - 1
            mask[np.flatnonzero(on)[(k >= 0) & (t <= m[1][np.maximum(k, 0)])]] = True
        out[r.name] = mask
    return out
