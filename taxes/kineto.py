"""Kineto (torch.profiler) traces: read one rank's Chrome trace, and turn it into a taxes.timeline.Timeline.

`taxes analyze` reads the traces of any PyTorch program through here, and `taxes profile` reads its own
torch.profiler recordings (the clock it falls back to without cupti-python) the same way, so both are
attributed by one code. Times are microseconds kept as floats (Kineto writes nanosecond digits).
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd

from taxes.errors import TaxesError
from taxes.timeline import Timeline, api_kind, timeline

MAX_TRACE_BYTES = 1 << 30  # refuse traces larger than this once decompressed (and gzip bombs)
NCCL_MARKS = ("ncclKernel", "ncclDevKernel")  # NCCL kernel names before and after NCCL 2.19
# Kineto's categories (and the older capitalised ones) -> what this module calls them.
_KIND_OF_CAT = {
    "kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
    "gpu_memset": "memset", "Memset": "memset", "cuda_runtime": "runtime", "Runtime": "runtime",
    "cuda_driver": "driver", "Driver": "driver", "cpu_op": "cpu_op", "Operator": "cpu_op",
    "user_annotation": "annotation",
}
_GPU_KINDS = ("kernel", "memcpy", "memset")
_STEP_NAME = re.compile(r"ProfilerStep#(\d{1,9})$")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_ABSOLUTE_TS_US = 2.0 ** 43  # above this a float keeps less than ~1 ns: re-read the file exactly



# ---- reading one trace ----------------------------------------------------------------------------


def _error(message: str) -> TaxesError:
    """The error as one printable line: a file or kernel name may hold line breaks or control bytes."""
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(message))
    return TaxesError(text if len(text) <= 400 else text[:397] + "...")


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, decompressed when it is gzip (by its magic number, whatever its name)."""
    from taxes.results import BrokenGzip, read_maybe_gzip

    try:
        data = read_maybe_gzip(path, MAX_TRACE_BYTES)
    except BrokenGzip as e:
        raise _error(f"{path}: a truncated or corrupt gzip file ({e})") from None
    except FileNotFoundError:
        raise _error(f"{path}: no such file") from None
    except IsADirectoryError:
        raise _error(f"{path}: a directory, not a trace file") from None
    except OSError as e:
        raise _error(f"{path}: cannot read it ({e.strerror or e})") from None
    if len(data) > MAX_TRACE_BYTES:
        raise _error(f"{path}: larger than {MAX_TRACE_BYTES >> 20} MiB decompressed; refusing to parse it")
    return data


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _parse_json(data: bytes, path: Path, exact: bool):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _error(f"{path}: not a trace (not UTF-8 text)") from None
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=Decimal if exact else float)
    except RecursionError:
        raise _error(f"{path}: not a trace (nested too deeply)") from None
    except ValueError as e:
        raise _error(f"{path}: not complete JSON, truncated or malformed ({str(e).splitlines()[0]})") from None


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


_COLUMNS = ("kind", "name", "pid", "tid", "ts", "dur", "correlation", "stream", "device", "flow_id",
            "input_dims", "input_type")


def _event_rows(events: list, path: Path, origin) -> dict[str, list]:
    """One pass over the events: keep the ones analysis needs, check each, convert times to float us."""
    rows: dict[str, list] = {c: [] for c in _COLUMNS}
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise _error(f"{path}: traceEvents[{i}] is not an object")
        ph, cat = e.get("ph"), e.get("cat")
        if ph == "X":
            kind = _KIND_OF_CAT.get(cat)
        elif ph in ("s", "f") and cat == "ac2g":
            kind = "flow_start" if ph == "s" else "flow_end"
        else:
            continue
        if kind is None:
            continue
        name = e.get("name", "")
        where = f"{path}: traceEvents[{i}] ({_short(name)})"
        if not isinstance(name, str):
            raise _error(f"{where}: its name is not a string")
        ts = e.get("ts")
        if not _is_number(ts):
            raise _error(f"{where}: ts is missing or not a number")
        dur = e.get("dur", 0) if ph != "X" else e.get("dur")
        if not _is_number(dur) or dur < 0:
            raise _error(f"{where}: dur is missing, negative or not a number")
        args = e.get("args", {})
        if not isinstance(args, dict):
            raise _error(f"{where}: args is not an object")
        rows["kind"].append(kind)
        rows["name"].append(name)
        rows["pid"].append(str(e.get("pid")))
        rows["tid"].append(str(e.get("tid")))
        rows["ts"].append(float(ts - origin) if origin is not None else float(ts))
        rows["dur"].append(float(dur))
        rows["correlation"].append(_int_or_nan(args.get("correlation")))
        rows["stream"].append(_int_or_nan(args.get("stream")))
        rows["device"].append(_int_or_nan(args.get("device")))
        rows["flow_id"].append(_int_or_nan(e.get("id")) if kind.startswith("flow") else math.nan)
        rows["input_dims"].append(args.get("Input Dims"))
        rows["input_type"].append(args.get("Input type"))
    return rows


def _int_or_nan(v) -> float:
    return float(v) if isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**53 else math.nan


def load_trace(path) -> pd.DataFrame:
    """One Kineto trace as an events frame (one row per kept event, times in us as floats).

    df.attrs["trace"] holds what the file says about itself: path, rank (distributedInfo, else the file
    name, else None), world_size, backend, nccl_version, devices, base_ns (baseTimeNanoseconds) and
    origin_us (subtracted from absolute timestamps of old traces, to keep their sub-us digits)."""
    path = Path(path)
    data = _read_bytes(path)
    doc = _parse_json(data, path, exact=False)
    meta, events = _split_document(doc, path)
    origin = None
    if any(isinstance(e, dict) and _is_number(e.get("ts")) and abs(e["ts"]) > _ABSOLUTE_TS_US for e in events):
        # Absolute epoch timestamps (old Kineto): floats would round them to 0.25 us; re-read exactly.
        meta, events = _split_document(_parse_json(data, path, exact=True), path)
        origin = min((e["ts"] for e in events if isinstance(e, dict) and _is_number(e.get("ts"))), default=Decimal(0))
        origin = Decimal(math.floor(origin))
    frame = pd.DataFrame(_event_rows(events, path, origin), columns=list(_COLUMNS))
    frame["end"] = frame["ts"] + frame["dur"]
    frame.attrs["trace"] = _trace_info(meta, path, int(origin) if origin is not None else 0)
    return frame


def _split_document(doc, path: Path) -> tuple[dict, list]:
    if isinstance(doc, list):  # the bare JSON-array form of the Chrome trace format
        return {}, doc
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise _error(f"{path}: not a Chrome trace (no traceEvents list)")
    return doc, doc["traceEvents"]


def _trace_info(meta: dict, path: Path, origin_us: int) -> dict:
    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    props = meta.get("deviceProperties")
    devices = [d.get("name") for d in props if isinstance(d, dict)] if isinstance(props, list) else []
    base = meta.get("baseTimeNanoseconds")
    world = dist.get("world_size")
    cuda = meta.get("cuda_runtime_version")
    return {
        "path": str(path),
        "rank": trace_rank(meta, path),
        "world_size": world if isinstance(world, int) and not isinstance(world, bool) and world > 0 else None,
        "backend": dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        "nccl_version": str(dist["nccl_version"]) if dist.get("nccl_version") is not None else None,
        "devices": [d if isinstance(d, str) else "?" for d in devices],
        "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) and cuda > 0 else None,
        "base_ns": int(base) if _is_number(base) else 0,
        "origin_us": origin_us,
    }


def trace_rank(meta: dict, path) -> int | None:
    """The rank a trace belongs to: distributedInfo.rank, else a rankN in the file name, else None."""
    dist = meta.get("distributedInfo")
    if isinstance(dist, dict):
        r = dist.get("rank")
        if isinstance(r, int) and not isinstance(r, bool) and r >= 0:
            return r
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None


# ---- one rank: GPU activities, their launches, steps ----------------------------------------------


def is_communication(name: str) -> bool:
    return any(mark in name for mark in NCCL_MARKS)


def gpu_activities(events: pd.DataFrame) -> pd.DataFrame:
    """One row per GPU activity (kernel, memcpy, memset), joined to the host call that launched it.

    Columns: name, kind (compute | communication | memory), stream, device, start_us, end_us, dur_us,
    correlation, launch_api, launch_us (host start of the launch call; NaN when the trace lacks it),
    launch_tid, in_graph (launched by a CUDA graph replay)."""
    gpu = events[events["kind"].isin(_GPU_KINDS)]
    acts = pd.DataFrame({
        "name": gpu["name"].values,
        "kind": np.where(gpu["kind"].values == "kernel",
                         np.where([is_communication(n) for n in gpu["name"]], "communication", "compute"), "memory"),
        "stream": gpu["stream"].values, "device": gpu["device"].values,
        "start_us": gpu["ts"].values, "end_us": gpu["end"].values, "dur_us": gpu["dur"].values,
        "correlation": gpu["correlation"].values,
        "pid": gpu["pid"].values, "tid": gpu["tid"].values,
    })
    host = events[events["kind"].isin(("runtime", "driver"))]
    calls = host[host["correlation"].notna()].sort_values("ts").drop_duplicates("correlation")
    calls = calls.set_index("correlation")[["name", "ts", "tid"]]
    joined = calls.reindex(acts["correlation"].values)
    acts["launch_api"] = joined["name"].values
    acts["launch_us"] = joined["ts"].values.astype(float)
    acts["launch_tid"] = joined["tid"].values
    _launches_from_flows(events, acts)
    acts["in_graph"] = acts["launch_api"].fillna("").str.contains("GraphLaunch").values
    acts = acts.sort_values(["start_us", "end_us"], kind="stable").reset_index(drop=True)
    return acts.drop(columns=["pid", "tid"])


def _launches_from_flows(events: pd.DataFrame, acts: pd.DataFrame) -> None:
    """For activities without a correlated launch, follow the ac2g flow: its end sits on the activity
    (same pid, tid, ts), its start on the launch call (same pid, tid, ts)."""
    missing = acts["launch_us"].isna()
    if not missing.any():
        return
    ends = events[events["kind"] == "flow_end"][["pid", "tid", "ts", "flow_id"]]
    starts = events[events["kind"] == "flow_start"][["pid", "tid", "ts", "flow_id"]]
    host = events[events["kind"].isin(("runtime", "driver"))][["pid", "tid", "ts", "name"]]
    if ends.empty or starts.empty or host.empty:
        return
    want = acts.loc[missing, ["pid", "tid", "start_us", "correlation"]].rename(columns={"start_us": "ts"}).reset_index()
    at = want.merge(ends.drop_duplicates(["pid", "tid", "ts", "flow_id"]), on=["pid", "tid", "ts"])
    # a flow is an activity's own only if its id is the activity's correlation (where it has one): another
    # activity may start at the same instant on the same stream in a malformed or merged trace
    corr = pd.to_numeric(at["correlation"], errors="coerce")
    at = at[corr.isna() | (corr == pd.to_numeric(at["flow_id"], errors="coerce"))].drop_duplicates("index")
    hit = (at.merge(starts.drop_duplicates("flow_id"), on="flow_id", suffixes=("", "_call"))
           .merge(host.drop_duplicates(["pid", "tid", "ts"]), left_on=["pid_call", "tid_call", "ts_call"],
                  right_on=["pid", "tid", "ts"], suffixes=("", "_host")))
    if hit.empty:
        return
    acts.loc[hit["index"].values, "launch_api"] = hit["name"].values
    acts.loc[hit["index"].values, "launch_us"] = hit["ts_call"].values
    acts.loc[hit["index"].values, "launch_tid"] = hit["tid_call"].values


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
COMPILE_MARKS = ("TorchDynamo", "Torch-Compiled Region", "CompiledFunction compile", "triton.compile",
                 "compile_fx", "autotune")
DATA_MARKS = ("DataLoader", "_DataLoaderIter")


def to_timeline(events: pd.DataFrame, rank: int) -> Timeline:
    """A rank's events (load_trace) as a taxes.timeline.Timeline: GPU activities with their launch
    correlation (a graph replay's kernels keyed by the graph launch), the runtime and driver calls that
    launch, replay or synchronise, and host ranges: CPU ops as launching calls, ProfilerStep#N and
    taxes:step:N marks as steps, taxes:call:NAME marks as the calls of a profiled variant, compile and
    data-loader ranges. Windows are left to the caller (steps differ between profile and analyze)."""
    gpu = events[events["kind"].isin(_GPU_KINDS)]
    corr = gpu["correlation"].fillna(-1).astype(np.int64).values
    acts = pd.DataFrame({"name": gpu["name"].values, "kind": gpu["kind"].values,
                         "stream": gpu["stream"].fillna(-1).astype(np.int64).values,
                         "start_us": gpu["ts"].values, "end_us": gpu["end"].values, "correlation": corr,
                         "comm": np.where([is_communication(n) for n in gpu["name"]], "nccl", "")})
    host_calls = events[events["kind"].isin(("runtime", "driver"))]
    kinds = [api_kind(n) or "other" for n in host_calls["name"]]
    launches = pd.DataFrame({"name": host_calls["name"].values, "kind": kinds,
                             "start_us": host_calls["ts"].values, "end_us": host_calls["end"].values,
                             "correlation": host_calls["correlation"].fillna(-1).astype(np.int64).values,
                             "tid": host_calls["tid"].values})
    graph_corr = set(launches.loc[launches["kind"] == "graph", "correlation"])
    acts["graph"] = np.where(np.isin(corr, list(graph_corr)) & (corr >= 0), corr, -1)
    host = []
    ops = events[events["kind"] == "cpu_op"]
    host.append(pd.DataFrame({"name": ops["name"].values, "kind": "call", "start_us": ops["ts"].values,
                              "end_us": ops["end"].values, "tid": ops["tid"].values}))
    marks = events[events["kind"].isin(("annotation", "cpu_op"))]
    names = marks["name"].astype(str)
    for kind, test in (("compile", names.str.contains("|".join(map(re.escape, COMPILE_MARKS)))),
                       ("data", names.str.contains("|".join(DATA_MARKS)))):
        sel = marks[test.values]
        host.append(pd.DataFrame({"name": sel["name"].values, "kind": kind, "start_us": sel["ts"].values,
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
    return timeline(rank, acts, launches, pd.concat(host, ignore_index=True), None,
                    {"source": "torch.profiler", **{k: v for k, v in events.attrs.get("trace", {}).items()
                                                    if k in ("devices", "world_size", "path")}})
