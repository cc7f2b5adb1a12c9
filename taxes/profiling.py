"""`taxes profile`: run every variant of a workload on the GPUs of this node and attribute its time.

Per variant, on every rank (one process per GPU, or torchrun's processes):
1. build it and check one run against the float32 reference (output poisoned with NaN first); the ranks
   agree on failures, so no rank enters a collective the others skipped;
2. plain timing: barrier-aligned iterations, a start and an end event each (E2E, measured);
3. instrumented timing: the same with events at every phase's boundaries and host stamps on each eager
   call's return (taxes.harness.time_phases); fused variants run their
   traced build, which stamps globaltimer per CTA around every wait (the bulk-synchronous tax);
4. optionally (--trace DIR) a few iterations under torch.profiler, one Chrome trace per rank.
Rank 0's launcher gathers every rank's records and builds one result document (taxes.results):
samples, phases, components per rank and overall (taxes.attribution), the ablation ladder, the model's
prediction, and how much instrumenting changed E2E.

`profile(...)` is the Python API: it returns the document wrapped with pandas frames.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from taxes import attribution
from taxes.errors import TaxesError
from taxes.hardware import HardwareProfile
from taxes.workloads import is_fused, is_graphed, make_workload, shape_of


@dataclass
class Job:
    workload: str
    shapes: list[dict]  # one case per shape, all in one launch
    world: int
    dtype: str
    variants: list[str]
    iters: int
    warmup: int
    wait_s: float
    trace_dir: str | None
    config: dict
    progress: bool
    rounds: int = 5  # timing rounds: every variant's iterations are interleaved in this many blocks


_BAR: dict = {}  # rank 0's rich progress bar, for the life of its rank process


def _progress(ctx, job: Job, text: str, advance: int = 0) -> None:
    """Rank 0 shows the run's progress on stderr: a rich bar over every (shape, variant, step) when stderr
    is a terminal, one line per step otherwise (logs)."""
    if ctx.rank != 0 or not job.progress:
        return
    if not sys.stderr.isatty():
        print(f"[taxes] {text}", file=sys.stderr, flush=True)
        return
    if "bar" not in _BAR:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       console=Console(stderr=True), transient=True)
        bar.start()
        _BAR["bar"] = bar
        _BAR["task"] = bar.add_task("taxes", total=len(job.shapes) * len(job.variants) * 3)  # check, plain, phased
    _BAR["bar"].update(_BAR["task"], description=f"[taxes] {text}", advance=advance)


def _progress_done() -> None:
    if "bar" in _BAR:
        _BAR.pop("bar").stop()


def rank_job(ctx, job: Job) -> dict:
    """Everything one rank measures, per shape (see the module's docstring)."""
    import torch

    from taxes.harness import gpu_metadata, warm_clocks

    if ctx.backend != "cuda":  # emulated: bf16 stores rounded as on a GPU, not truncated (Triton 3.6)
        from taxes.kernels.runtime import round_bf16_like_a_gpu

        round_bf16_like_a_gpu()
    warm_clocks(ctx, 2.0)
    out = {"cases": [], "meta": gpu_metadata() if ctx.rank == 0 else {}}
    try:
        for shape in job.shapes:
            ctx.heap.reset()
            out["cases"].append(_rank_case(ctx, job, shape))
            if ctx.device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        _progress_done()
    return out


def _rank_case(ctx, job: Job, shape: dict) -> dict:
    import torch

    from taxes.cases import TOLERANCE, fused_trace, make_case, rel_error
    from taxes.harness import agree, time_iterations, time_phases

    w = make_workload(job.workload, shape, job.world, job.dtype)
    ctx.doing(f"building the {job.workload} inputs for {shape}")
    _progress(ctx, job, f"{w.name} {shape}")
    case = make_case(ctx, w, job.wait_s, job.config)
    out = {"variants": [], "extra": case.extra, "shape": shape}
    built = []  # (variant, res, runner): every variant is built and checked first, then timed in rounds
    for variant in job.variants:
        ctx.doing(f"{variant}: build and check")
        _progress(ctx, job, f"{variant}: check")
        res = {"variant": variant, "error": None, "rel_error": None, "samples": [], "phased": [], "config": {}}
        holder = {}

        def build_and_check():
            runner = holder["run"] = case.build(variant)
            o = case.inputs[0][-1].fill_(float("nan"))
            got = runner(*case.inputs[0][:-1], o)
            if hasattr(runner, "check"):
                runner.check()
            res["rel_error"] = rel_error(got, case.reference)
            cfg = getattr(runner, "cfg", None)
            res["config"] = {k: v for k, v in vars(cfg).items()} if cfg is not None and hasattr(cfg, "__dict__") else {}
            if not res["rel_error"] <= TOLERANCE:
                raise RuntimeError(f"relative error {res['rel_error']:.3g} above {TOLERANCE}")

        agree(ctx, res, build_and_check)
        _progress(ctx, job, f"{variant}: checked", advance=1)
        built.append((variant, res, holder.get("run")))
        out["variants"].append(res)

    # Timing in rounds: each round times a block of plain and then of instrumented iterations of every
    # variant in turn, so clocks drifting over the case (10-14% within a minute under the power limit,
    # docs/gemm_rs.md) and host state touch every variant and both timings alike.
    rounds = max(1, min(job.rounds, job.iters))
    blocks = [job.iters // rounds + (1 if r < job.iters % rounds else 0) for r in range(rounds)]
    for r, n in enumerate(blocks):
        warmup = job.warmup if r == 0 else min(job.warmup, 2)
        last = r == rounds - 1
        for variant, res, runner in built:
            fused = is_fused(variant)

            def plain():
                ctx.doing(f"{variant}: timing (round {r + 1} of {rounds})")
                _progress(ctx, job, f"{variant}: round {r + 1}/{rounds}, {n} timed iterations", advance=int(last))
                res["samples"] += time_iterations(ctx, runner, case.inputs, n, warmup, label=variant)
                if hasattr(runner, "check"):
                    runner.check()

            def phased():
                if not hasattr(runner, "phases"):
                    return
                ctx.doing(f"{variant}: per-phase timing (round {r + 1} of {rounds})")
                _progress(ctx, job, f"{variant}: round {r + 1}/{rounds}, {n} instrumented iterations",
                          advance=int(last))

                def after(rec):
                    tr = fused_trace(runner) if fused else None
                    if tr:
                        rec["traced"] = {name: attribution.trace_summary(rows) for name, rows in tr.items()}
                        rec["cta"] = {name: rows for name, rows in tr.items()}

                recs = time_phases(ctx, lambda *x: runner.phases(*x, traced=fused), case.inputs, n, warmup,
                                   label=f"{variant} phases", after=after, graph=is_graphed(variant))
                if hasattr(runner, "check"):
                    runner.check()
                res["phased"] += recs
                for rec in res["phased"][:-1]:
                    rec.pop("cta", None)  # keep the per-CTA timeline of the last iteration only

            agree(ctx, res, plain)
            agree(ctx, res, phased)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize()
    # one collective for every variant, even where a rank has no error to report (-1)
    worst = ctx.all_max([-1.0 if res["rel_error"] is None else res["rel_error"] for _, res, _ in built])
    for (_, res, _), e in zip(built, worst):
        res["rel_error"] = None if e < 0 else e
    built.clear()
    if job.trace_dir:
        ctx.doing("recording a torch.profiler trace")
        out["trace"] = _record_trace(ctx, job, case, w)
    return out


def _record_trace(ctx, job: Job, case, w) -> dict | None:
    """Five instrumented iterations of every eager variant under torch.profiler: the Chrome/Perfetto trace
    DIR/<case>_rank<r>.json, and per phase the device events' durations beside the CUPTI kernel times
    of the same iterations (the check that both clocks tell the same story)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from taxes.harness import time_phases

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.device.type == "cuda" else [])
    stem = "_".join(f"{k}{v}" for k, v in shape_of(w).items())
    path = Path(job.trace_dir) / f"{w.name}_{stem}_rank{ctx.rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    runners, failed = {}, 0.0
    for v in job.variants:
        if is_graphed(v) or v.startswith("torch-"):
            continue  # a graph replays as one launch: its phases are not separate host ranges
        try:
            runners[v] = case.build(v)
            runners[v](*case.inputs[0])  # warm-up, compilation outside the trace
        except Exception:
            failed = 1.0
    if ctx.all_max([failed])[0]:
        return None
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    events = {}
    with profile(activities=acts, record_shapes=True) as prof:
        for v, r in runners.items():
            recs = time_phases(ctx, lambda *x, r=r, v=v: r.phases(*x, traced=False), case.inputs, 5, 0, label=v,
                               annotate=True)
            events[v] = recs
    tmp = path.with_suffix(".tmp")
    prof.export_chrome_trace(str(tmp))
    tmp.replace(path)
    return {"path": str(path), "check": profiler_check(json.loads(path.read_text()), events)}


def profiler_check(trace: dict, events: dict) -> dict:
    """Per variant and phase: median phase duration from our device events, the same less its host-bound
    part (events_busy_us: the device's time on the phase's work), and the median span of the kernels CUPTI
    recorded for the same phase (kernels launched inside its record_function range), in us."""
    evs = trace.get("traceEvents", [])
    kernels = {e["args"]["correlation"]: e for e in evs if e.get("cat") == "kernel" and "correlation" in e.get("args", {})}
    launches = [e for e in evs if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})]
    ranges = [e for e in evs if e.get("cat") == "user_annotation" and e.get("name", "").startswith("taxes:")]
    out = {}
    for r in ranges:
        fields = r["name"].split(":")
        if len(fields) != 4:
            continue
        _, variant, phase, _ = fields
        t0, t1 = r["ts"], r["ts"] + r["dur"]
        ks = [kernels[x["args"]["correlation"]] for x in launches
              if x.get("tid") == r.get("tid") and t0 <= x["ts"] <= t1 and x["args"]["correlation"] in kernels]
        if not ks:
            continue
        span = max(k["ts"] + k["dur"] for k in ks) - min(k["ts"] for k in ks)
        out.setdefault(variant, {}).setdefault(phase, {"cupti_us": [], "events_us": [], "busy_us": []})["cupti_us"].append(span)
    for variant, recs in events.items():
        for rec in recs:
            for ph in rec["phases"]:
                if ph["name"] in out.get(variant, {}):
                    d = out[variant][ph["name"]]
                    d["events_us"].append(ph["end_us"] - ph["start_us"])
                    d["busy_us"].append(ph["end_us"] - ph["start_us"] - attribution.host_bound_us(ph))
    return {v: {ph: {"cupti_us": statistics.median(d["cupti_us"]), "events_us": statistics.median(d["events_us"]),
                     "events_busy_us": statistics.median(d["busy_us"])}
                for ph, d in phases.items() if d["cupti_us"] and d["events_us"]} for v, phases in out.items()}


# ---- the document ---------------------------------------------------------------------------------


def _median(xs):
    return statistics.median(xs) if xs else None


def build_document(results: list[dict], job: Job, hw: HardwareProfile, emulated: bool) -> dict:
    """Rank 0: one result document from every rank's records."""
    from taxes.results import collect_metadata, new_document

    meta = collect_metadata("profile", job.world, hw.name, emulated=emulated, iterations=job.iters,
                            warmup=job.warmup, rounds=job.rounds,
                            timing="cuda events (plain and per phase, every variant interleaved in rounds); "
                                   "globaltimer per CTA (traced)",
                            **{k: v for k, v in results[0]["meta"].items()})
    doc = new_document(meta)
    for i in range(len(results[0]["cases"])):
        doc["cases"].append(_case_document([r["cases"][i] for r in results], job, hw))
    traces = [c["trace"]["path"] for r in results for c in r["cases"] if c.get("trace")]
    if traces:
        doc["metadata"]["trace_files"] = traces
    return doc


def _case_document(results: list[dict], job: Job, hw: HardwareProfile) -> dict:
    from taxes.cases import MODEL_OF, TOLERANCE
    from taxes.model import floor_of
    from taxes.results import case_entry, summarize_samples

    w = make_workload(job.workload, results[0]["shape"], job.world, job.dtype)
    fl = floor_of(w, hw)
    variants = []
    medians = {}
    for j, v0 in enumerate(results[0]["variants"]):
        name = v0["variant"]
        ok = v0["error"] is None
        samples = [r["variants"][j]["samples"] for r in results] if ok else []
        entry = {"variant": name, "config": v0["config"] | ({"error": v0["error"]} if v0["error"] else {}),
                 "correctness": {"checked": v0["rel_error"] is not None, "passed": ok and v0["rel_error"] is not None
                                 and v0["rel_error"] <= TOLERANCE, "rel_error": v0["rel_error"],
                                 "tolerance": TOLERANCE, "reference": "float32, outputs poisoned with NaN"},
                 "samples_us": samples, "e2e_us": summarize_samples(samples), "phases": [], "components": []}
        if ok and samples:
            medians[name] = entry["e2e_us"]["median"]
        phased = [r["variants"][j]["phased"] for r in results]
        if ok and all(phased):
            # the raw per-iteration records, so the attribution can be redone with another profile
            entry["phased_us"] = [[{k: x for k, x in rec.items() if k != "cta"} for rec in per_rank] for per_rank in phased]
            entry.update(_attribute_variant(name, phased, w, fl, hw, MODEL_OF))
        _predict_into(entry, w, fl, hw)
        variants.append(entry)
    case = case_entry(w, variants)
    case["extra"] = dict(results[0]["extra"]) | {"ladder": attribution.ladder(medians)}
    checks = [r["trace"]["check"] for r in results if r.get("trace")]
    if checks:  # per rank: {variant: {phase: {cupti_us, events_us}}}
        case["extra"]["profiler_check"] = checks
    _ladder_timeline(case)
    return case


def _ladder_timeline(case: dict) -> None:
    """Beside the ladder's launch tax (plain E2E medians): the same from the instrumented runs, and the
    timeline's, launch(bsp) - launch(bsp-graph), the graph's residual gaps being what it cannot remove."""
    lad = case["extra"].setdefault("ladder", {})
    for k in ("bsp_timeline_launch_us", "graph_timeline_launch_us", "launch_instrumented_us"):
        lad.pop(k, None)
    att = {v["variant"]: v.get("attribution") or {} for v in case["variants"]}
    for bsp, graph in attribution.GRAPH_OF.items():
        b, g = att.get(bsp, {}), att.get(graph, {})
        if "launch_us" in lad and b.get("launch_us") is not None:
            lad["bsp_timeline_launch_us"] = b["launch_us"]
            if g.get("launch_us") is not None:
                lad["graph_timeline_launch_us"] = g["launch_us"]
            if b.get("instrumented_e2e_us") is not None and g.get("instrumented_e2e_us") is not None:
                lad["launch_instrumented_us"] = b["instrumented_e2e_us"] - g["instrumented_e2e_us"]


def _predict_into(entry: dict, w, fl, hw: HardwareProfile) -> None:
    from taxes.cases import MODEL_OF
    from taxes.model import predict

    model_variant = MODEL_OF.get(entry["variant"])
    if model_variant:
        pred = predict(w, model_variant, hw)
        entry["prediction"] = {"variant": model_variant, "hardware": hw.name, "e2e_us": pred.e2e_us,
                               "components": pred.components, "label": "predicted"}
    entry["floor"] = {"compute_us": fl.compute_us, "hbm_us": fl.hbm_us, "link_us": fl.link_us, "ideal_us": fl.ideal_us}


def reattribute(doc: dict, hw: HardwareProfile) -> dict:
    """The same measurements attributed with another hardware profile (e.g. a calibration made after the
    run): floors, components, phase shading and predictions are recomputed from the stored per-iteration
    records; measured times are untouched. Returns a new document."""
    import copy

    from taxes.cases import MODEL_OF
    from taxes.model import floor_of
    from taxes.workloads import make_workload

    out = copy.deepcopy(doc)
    for case in out["cases"]:
        w = make_workload(case["workload"], case["shape"], case["world"], case["dtype"])
        fl = floor_of(w, hw)
        for entry in case["variants"]:
            if entry.get("phased_us"):
                cta = entry.get("cta_timeline")
                entry.update(_attribute_variant(entry["variant"], entry["phased_us"], w, fl, hw, MODEL_OF))
                if cta:
                    entry["cta_timeline"] = cta
            _predict_into(entry, w, fl, hw)
        if case.get("extra"):
            _ladder_timeline(case)
    out["metadata"]["hardware_profile"] = hw.name
    out["metadata"]["attributed_with"] = {"profile": hw.name, "source": hw.source}
    return out


def _attribute_variant(name, phased, w, fl, hw, model_of) -> dict:
    """Components, mean phases and the instrumentation check of one variant."""
    n = min(len(p) for p in phased)
    iterations = [[phased[r][i] for r in range(len(phased))] for i in range(n)]
    fused = is_fused(name)
    inter = w.intermediate_bytes(model_of[name], *(() if w.name != "flash-decode" else (1,))) if name in model_of else 0.0
    loc_us = inter / hw.hbm_bytes_per_us() if name in model_of else 0.0
    res = attribution.attribute(iterations, fused, fl, loc_us)
    keep = res["kept"]
    phases = []
    for r in range(len(phased)):
        names = [(ph["name"], ph["role"]) for ph in phased[r][0]["phases"]]
        for k, (pname, role) in enumerate(names):
            st = statistics.fmean(phased[r][i]["phases"][k]["start_us"] for i in keep)
            en = statistics.fmean(phased[r][i]["phases"][k]["end_us"] for i in keep)
            host = statistics.fmean(attribution.host_bound_us(phased[r][i]["phases"][k]) for i in keep)
            phases.append({"rank": r, "name": pname, "role": role if role in ("compute", "communication") else "compute",
                           "start_us": st, "end_us": max(st, en), "label": "measured", "host_bound_us": host})
    for r in range(len(phased)):
        traced_names = set(phased[r][0].get("traced", {}))
        _shade_phases([ph for ph in phases if ph["rank"] == r], res["per_rank"][r], fl, fused, traced_names,
                      e2e_us=res["e2e_us"][r])
    instrumented = [max(it[r]["e2e_us"] for r in range(len(it))) for it in iterations]
    out = {"phases": phases, "components": attribution.component_entries(res),
           "attribution": {"instrumented_e2e_us": _median(instrumented),
                           "launch_us": res["per_rank"][res["overall_rank"]]["launch"],
                           "unattributed_share": res["per_rank"][res["overall_rank"]]["unattributed"]
                           / max(res["e2e_us"][res["overall_rank"]], 1e-9),
                           "locality_bytes": inter, "kept_iterations": len(keep)}}
    if fused:
        traced = [it[r].get("traced") for it in iterations for r in range(len(it)) if it[r].get("traced")]
        if traced:
            share = [t["wait_share"] for tr in traced for t in tr.values()]
            out["attribution"]["cta_wait_share"] = statistics.fmean(share)
        last = phased[0][-1].get("cta")
        if last:
            out["cta_timeline"] = {k: [list(map(int, row)) for row in rows] for k, rows in last.items()}
    return out


def _shade_phases(phases: list[dict], comp: dict, fl, fused: bool, traced_names: set = frozenset(),
                  e2e_us: float | None = None) -> None:
    """Give each phase `parts` (derived): its host-bound part is launch tax; a rank's other components
    are spread over the phases of the role that holds them, in proportion to the rest of their duration;
    communication phases hold the bulk-synchronous tax and the unhideable link time, compute phases the
    rest (and, fused, the waiting). Any mismatch with the phase's duration is its unattributed part."""
    host = {id(ph): min(ph.get("host_bound_us", 0.0), ph["end_us"] - ph["start_us"]) for ph in phases}
    dur = {id(ph): ph["end_us"] - ph["start_us"] - host[id(ph)] for ph in phases}
    comm = [ph for ph in phases if ph["role"] == "communication"]
    work = [ph for ph in phases if ph["role"] != "communication"]
    comm_total = sum(dur[id(ph)] for ph in comm)
    work_total = sum(dur[id(ph)] for ph in work)
    unh = 0.0 if fused else min(fl.unhideable_link_us, max(0.0, comm_total - comp["sync_wait"]))
    pools = [(comm, comm_total, {"sync_wait": comp["sync_wait"], "exposed_transfer": comp["exposed_transfer"],
                                 "ideal": unh}),
             (work, work_total, {"locality": comp["locality"], "ideal": max(0.0, comp["ideal"] - unh),
                                 "inefficiency": comp["inefficiency"]})]
    if fused:  # waiting and the launch inside a phase belong to the traced kernels; the rest to all phases
        traced = [ph for ph in phases if ph["name"] in traced_names]
        in_phase_launch = max(0.0, comp["launch"] - attribution.gaps_us(phases, e2e_us) - sum(host.values()))
        pools = [(traced, sum(dur[id(ph)] for ph in traced), {"sync_wait": comp["sync_wait"], "launch": in_phase_launch}),
                 (phases, comm_total + work_total, {"locality": comp["locality"], "ideal": comp["ideal"],
                                                    "inefficiency": comp["inefficiency"]})]
    for ph in phases:
        ph["parts"] = {"launch": host[id(ph)]} if host[id(ph)] > 0 else {}
    for group, total, parts in pools:
        for ph in group:
            share = dur[id(ph)] / total if total > 0 else 0.0
            for k, v in parts.items():
                if v * share > 0:
                    ph["parts"][k] = ph["parts"].get(k, 0.0) + v * share
    for ph in phases:
        ph["parts"]["unattributed"] = ph["end_us"] - ph["start_us"] - sum(ph["parts"].values())


# ---- running --------------------------------------------------------------------------------------


def run_profile(job: Job, hw: HardwareProfile, emulate: bool = False, timeout_s: float = 600.0) -> dict:
    """Launch the ranks (or join torchrun's), measure, and return rank 0's document (None elsewhere)."""
    from taxes.kernels.runtime import launch

    heap = max(_heap_bytes(job, s) for s in job.shapes)
    results = launch(rank_job, job.world, job, backend="emulated" if emulate else "cuda", heap_bytes=heap,
                     timeout_s=timeout_s)
    if not results or results[0] is None:
        return None
    if os.environ.get("RANK", "0") != "0" and "LOCAL_RANK" in os.environ:
        return None  # under torchrun every rank gets every result; rank 0 alone writes the document
    return build_document(results, job, hw, emulate)


def _heap_bytes(job: Job, shape: dict) -> int:
    w = make_workload(job.workload, shape, job.world, job.dtype)
    if w.name == "ag-gemm":
        per_set = w.M * w.K * w.elt
        return 4 * per_set + (64 << 20)  # up to four rotated a_full sets, plus flags
    if w.name == "gemm-rs":  # rotated A sets, and the fused kernel's double-buffered inbox of p-1 slots
        return 4 * w.M * (w.K // w.world) * w.elt + 2 * w.M * w.N * 4 + (64 << 20)
    if w.name == "tp-mlp":  # four rotated X sets; each fused build's gemm-rs inbox (< 2 M H), each bsp
        # build's M x H partial when emulated (two of each, built again for --trace), the reference's W1 and W2
        return ((4 + 4 * 2 + 4) * w.M * w.H + 3 * w.H * (w.F // w.world)) * w.elt + (64 << 20)
    return int(4 * w.partial_bytes() * job.world * 2) + (64 << 20)


@dataclass
class Result:
    """What `taxes.profile(...)` returns: the document, and pandas views of it."""

    document: dict

    @property
    def summary(self):
        from taxes.results import summary_frame

        return summary_frame(self.document)

    @property
    def components(self):
        from taxes.results import components_frame

        return components_frame(self.document)

    @property
    def samples(self):
        from taxes.results import samples_frame

        return samples_frame(self.document)

    @property
    def phases(self):
        from taxes.results import phases_frame

        return phases_frame(self.document)


def plan(workload: str, shape: dict | str | list | None = None, gpus: int = 2, variants: list[str] | None = None,
         dtype: str = "bf16", iters: int = 30, warmup: int = 5, emulate: bool = False, trace_dir: str | None = None,
         wait_s: float = 5.0, progress: bool = False, config: dict | None = None, rounds: int = 5) -> Job:
    """Check every input (one-line TaxesError) and return the job, before anything runs. The iterations of
    every variant are timed in `rounds` interleaved blocks (1: one variant after another)."""
    from taxes.cases import VARIANTS
    from taxes.workloads import DEFAULT_SHAPES, parse_shape

    if workload not in VARIANTS:
        raise TaxesError(f"profile: no kernels for workload {workload!r} (profiled: {', '.join(VARIANTS)})")
    if iters < 1 or warmup < 0 or rounds < 1:
        raise TaxesError("profile: --iters and --rounds must be at least 1 and --warmup at least 0")
    shapes = shape if isinstance(shape, list) else [shape]
    shapes = [parse_shape(s) if isinstance(s, str) else dict(s or {}) for s in shapes]
    ws = [make_workload(workload, dict(DEFAULT_SHAPES[workload]) | s, gpus, dtype) for s in shapes]
    names = list(variants or VARIANTS[workload])
    unknown = [v for v in names if v not in VARIANTS[workload]]
    if unknown:
        raise TaxesError(f"profile: unknown {workload} variant {unknown[0]!r} (choose from {', '.join(VARIANTS[workload])})")
    if emulate:
        names = [v for v in names if not v.startswith("torch-")]  # PyTorch's fused ops need CUDA symmetric memory
    else:
        _check_memory(ws, names)
    return Job(workload, [shape_of(w) for w in ws], gpus, dtype, names, iters, warmup, wait_s, trace_dir, config or {},
               progress, rounds)


def profile(workload: str, shape: dict | str | list | None = None, gpus: int = 2, variants: list[str] | None = None,
            dtype: str = "bf16", iters: int = 30, warmup: int = 5, emulate: bool = False,
            hardware: str | HardwareProfile = "h200-sxm", trace_dir: str | None = None, wait_s: float = 5.0,
            timeout_s: float = 600.0, progress: bool = False, config: dict | None = None, rounds: int = 5) -> Result:
    """Profile a workload at one shape (or a list of shapes, one case each); returns a Result (document +
    DataFrames). See `taxes profile --help`."""
    from taxes.hardware import get_profile

    hw = hardware if isinstance(hardware, HardwareProfile) else get_profile(hardware)
    job = plan(workload, shape, gpus, variants, dtype, iters, warmup, emulate, trace_dir, wait_s, progress, config,
               rounds)
    return Result(run_profile(job, hw, emulate, timeout_s))


def bytes_for_case(w, names: list[str], sets: int) -> float:
    """Bytes one rank holds while a case is timed: every variant stays built across the interleaved rounds,
    so the largest variant's whole estimate (inputs rotated over `sets`, the reference, its buffers) plus
    every other variant's own buffers (gathered and staging buffers, the estimate's "gathered")."""
    from taxes import preflight

    kinds = [v.removesuffix("-graph") if v.startswith("fused") else v for v in names]
    parts = [preflight.memory_breakdown(w, k, sets) for k in kinds]
    largest = max(range(len(parts)), key=lambda i: sum(parts[i].values()))
    return sum(parts[largest].values()) + sum(p.get("gathered", 0.0) for i, p in enumerate(parts) if i != largest)


def _check_memory(ws: list, names: list[str]) -> None:
    """Refuse, before anything is allocated, a shape whose variants do not fit this GPU together
    (bytes_for_case)."""
    from taxes import preflight
    from taxes.cases import L2_BYTES

    try:
        import torch

        if not torch.cuda.is_available():
            return
        device = int(os.environ.get("LOCAL_RANK", "0"))
    except ImportError:
        return
    for w in ws:
        sets = 1 if w.name == "flash-decode" and w.kv_bytes() > 3 * L2_BYTES else 4
        preflight.check_memory(bytes_for_case(w, names, sets), device)


def summary_lines(doc: dict) -> list[str]:
    """A short text summary: E2E, the biggest tax and unattributed per variant."""
    lines = []
    for case in doc["cases"]:
        for v in case["variants"]:
            med = v["e2e_us"]["median"]
            att = v.get("attribution", {})
            un = att.get("unattributed_share")
            lines.append(f"{v['variant']:>16}: E2E {med:.1f} us" if med is not None and math.isfinite(med)
                         else f"{v['variant']:>16}: failed ({v['config'].get('error', 'no samples')})")
            if un is not None:
                lines[-1] += f", unattributed {100 * un:.1f}%"
    return lines
