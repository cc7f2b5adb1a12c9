"""One rank's Kineto events (taxes.traces.kineto.load_trace) as a taxes.traces.timeline.Timeline: device
activities joined to the host calls that launched them, communication classified by rule
(taxes.traces.classify), and the host ranges that say what the host was doing (launching calls, steps,
compilation, data loading).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from taxes.traces.classify import BUILTIN_RULES, classify
from taxes.traces.kineto import GPU_KINDS, STEP_NAME
from taxes.traces.timeline import EXTRA_COLUMNS, Timeline, api_kind, merge, timeline

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
    gpu = events[np.isin(kind, GPU_KINDS)]
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
    acts = with_launches(events, acts, launches)
    graph_corr = np.concatenate([launches.loc[launches["kind"] == "graph", "correlation"].values,
                                 np.fromiter(unlaunched_graphs, dtype=np.int64, count=len(unlaunched_graphs))])
    acts = acts.assign(graph=np.where(np.isin(acts["correlation"].values, graph_corr) & (acts["correlation"].values >= 0),
                                      acts["correlation"].values, -1))
    ops = events[kind == "cpu_op"]
    top = top_level(ops["ts"].values, ops["end"].values, ops["tid"].values)
    la = launches[launches["kind"].isin(("launch", "graph"))]
    tops = ops[top]
    holder = launches_inside(la["start_us"].values, la["tid"].values, tops["ts"].values, tops["end"].values,
                             tops["tid"].values)
    calls = tops.iloc[np.unique(holder[holder >= 0])]
    acts = acts.assign(comm=classify(acts["name"].values, acts["kind"].values, _in_op(events, acts, rule_set), rule_set))
    host = [pd.DataFrame({"name": calls["name"].values, "kind": "call", "start_us": calls["ts"].values,
                          "end_us": calls["end"].values, "tid": calls["tid"].values})]
    marks = events[np.isin(kind, ("annotation", "cpu_op", "python"))]
    names = marks["name"].astype(str)
    for hkind, rx in (("compile", COMPILE), ("data", DATA)):
        sel = marks[names.str.contains(rx).values]
        host.append(pd.DataFrame({"name": sel["name"].values, "kind": hkind, "start_us": sel["ts"].values,
                                  "end_us": sel["end"].values, "tid": sel["tid"].values}))
    steps = names.str.extract(STEP_NAME, expand=False)
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


def with_launches(events: pd.DataFrame, acts: pd.DataFrame, launches: pd.DataFrame) -> pd.DataFrame:
    """The activities with their launch call (launch_api, launch_us, launch_tid) added, as a new frame: by
    correlation id, else through its ac2g flow (its end sits on the activity: same pid, tid, ts; its start
    on the launch call). A flow is the activity's own only if its id is the activity's correlation, where it
    has one; an activity joined by its flow takes its launch's correlation."""
    calls = launches[launches["correlation"] >= 0].sort_values("start_us").drop_duplicates("correlation")
    j = calls.set_index("correlation").reindex(acts["correlation"].values)
    acts = acts.assign(launch_api=j["name"].values, launch_us=j["start_us"].values.astype(float),
                       launch_tid=j["tid"].values)
    missing = acts["launch_us"].isna()
    if not missing.any():
        return acts
    kind = events["kind"].values
    ends = events[kind == "flow_end"][["pid", "tid", "ts", "flow_id"]]
    starts = events[kind == "flow_start"][["pid", "tid", "ts", "flow_id"]]
    host = events[np.isin(kind, ("runtime", "driver"))][["pid", "tid", "ts", "name", "correlation"]]
    if ends.empty or starts.empty or host.empty:
        return acts
    want = acts.loc[missing, ["pid", "tid", "start_us", "correlation"]].rename(columns={"start_us": "ts"}).reset_index()
    at = want.merge(ends.drop_duplicates(["pid", "tid", "ts", "flow_id"]), on=["pid", "tid", "ts"])
    corr = pd.to_numeric(at["correlation"], errors="coerce")
    at = at[(corr < 0) | (corr == pd.to_numeric(at["flow_id"], errors="coerce"))].drop_duplicates("index")
    hit = (at.merge(starts.drop_duplicates("flow_id"), on="flow_id", suffixes=("", "_call"))
           .merge(host.drop_duplicates(["pid", "tid", "ts"]), left_on=["pid_call", "tid_call", "ts_call"],
                  right_on=["pid", "tid", "ts"], suffixes=("", "_host")))
    if hit.empty:
        return acts
    idx = hit["index"].values
    acts.loc[idx, "launch_api"] = hit["name"].values
    acts.loc[idx, "launch_us"] = hit["ts_call"].values
    acts.loc[idx, "launch_tid"] = hit["tid_call"].values
    # the activity now carries its launch's correlation, so the timeline joins it the same way
    hc = hit["correlation_host"].fillna(-1).astype(np.int64).values
    acts.loc[idx, "correlation"] = np.where(hc >= 0, hc, acts.loc[idx, "correlation"].values)  # acts: our own copy
    return acts


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
