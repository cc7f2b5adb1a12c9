"""Render result documents: terminal (rich), Markdown, JSON (the document with its report), HTML (jinja2).

Every view reads the same way, verdict first:
1. a title naming the workload(s) and the machine (GPU names, world), and marks that change how to read
   the numbers: EMULATED (the kernels ran under Triton's interpreter: times mean nothing), PREDICTED (a
   model document), PERTURBED (measuring cost more than 3% of a variant's plain E2E);
2. the summary, one table even 80 columns wide: per case the best variant with its E2E, its speed-up
   against bsp and against bsp-graph, its fraction of the floor, its largest costs whatever their kind (a
   tax, host-bound time, inefficiency, ...), and the measurement's checks, failed ones in colour and listed
   under it;
3. the details per case: one E2E per variant, its statistic named (the interquartile mean of the plain
   iterations, `plain_e2e_us`, else `e2e_us.iqm`; a model's prediction), [p10-p90] its spread; measured
   variants add what their rows add up to (`attributed_e2e_us`, the instrumented iterations) and the
   measurement cost between the two; then the rows, the taxes, the model, the speed-ups, correctness;
   floors, the ablation ladder, per-rank rows, and the checks.

Strings from documents reach every output through taxes.sanitize (terminal, Markdown) or jinja2's
autoescape (HTML).
"""

from __future__ import annotations

import base64
import json
import math

from taxes.attribution.rows import TAXES
from taxes.reports.plots import (
    COMPONENT_TITLES,
    COMPONENTS,
    case_title,
    cta_waits,
    overall_components,
    predicted_vs_measured,
    stacked_bars,
    timeline,
)
from taxes.documents.results import rows_state
from taxes.reports.analysis import trace_sections
from taxes.sanitize import markdown as md_escape
from taxes.sanitize import printable
from taxes.variants import lookup

LABEL_MARK = {"measured": "m", "derived": "d", "predicted": "p"}
STATISTIC = "interquartile mean"
PERTURBED_SHARE = 0.03  # as taxes.documents.profile_document.PERTURBED: measuring cost above this share of plain E2E
E2E_ROW = "E2E: interquartile mean [p10-p90]"
E2E_ROW_MODEL = "E2E: predicted"
LEGEND = ("labels: m measured, d derived, p predicted; times in us per iteration; E2E is the interquartile mean "
          "(the mean of the iterations ranked between the 25th and 75th percentile) of the plain iterations, "
          "[p10-p90] their 10th and 90th percentiles")
LEGEND_MODEL = "labels: p predicted, d derived; times in us per iteration, predicted from shapes and the hardware profile"
MATTER_SHARE = 0.02  # a tax worth naming in the summary: at least this share of the variant's E2E
ROWS_CELL = {"shown": "shown", "older rules": "not available (older rules)",
             "timed plain": "none (someone else's implementation, timed plain)",
             "none": "none (failed, or no instrumented records)"}


# ---- what every view shows ------------------------------------------------------------------------


def e2e_of(v: dict) -> float | None:
    """The E2E a view prints for a variant: the plain interquartile mean (older documents: from their
    samples), or the model's prediction."""
    if v.get("plain_e2e_us") is not None:
        return v["plain_e2e_us"]
    e = v.get("e2e_us") or {}
    return e.get("iqm", e.get("median"))


def baseline(case: dict, rung: str) -> float | None:
    """The E2E of the case's bsp (rung "bsp") or graph (rung "graph") variant."""
    v = baseline_variant(case, rung)
    return e2e_of(v) if v is not None else None


def baseline_variant(case: dict, rung: str) -> dict | None:
    for v in case["variants"]:
        x = lookup(v["variant"])
        if x is not None and x.rung == rung and v["variant"] in ("bsp", "all-bsp", "bsp-graph", "all-graph"):
            return v
    return None


def usable(v: dict) -> bool:
    """A variant whose E2E counts: it has one, and it did not fail its check or error."""
    return (e2e_of(v) is not None and e2e_of(v) > 0 and v["correctness"].get("passed") is not False
            and not (v.get("config") or {}).get("error"))


def best_variant(case: dict) -> dict | None:
    ok = [v for v in case["variants"] if usable(v)]
    return min(ok, key=e2e_of) if ok else None


def _fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:,.1f}" if abs(v) < 1e5 else f"{v:,.0f}"


def _labels(var: dict) -> dict[str, str]:
    return {c["name"]: c["label"] for c in var["components"] if c["rank"] is None}


def tax_values(v: dict) -> dict[str, float]:
    oc = overall_components(v)
    return {t: math.fsum(oc.get(p, 0.0) for p in parts) for t, parts in TAXES.items()} if oc else {}


def is_model(doc: dict) -> bool:
    return doc["metadata"].get("kind") == "model"


def is_emulated(doc: dict) -> bool:
    return bool(doc["metadata"].get("emulated"))


def perturbed(v: dict) -> bool:
    """Measuring cost more than 3% of the plain E2E (the document's flag, or its numbers)."""
    if v.get("perturbed"):
        return True
    c, p = v.get("measurement_cost_us"), v.get("plain_e2e_us")
    return c is not None and bool(p) and c > PERTURBED_SHARE * p


def machine(doc: dict) -> str:
    """'2 x NVIDIA H200', 'NVIDIA H100, NVIDIA H200', 'emulated CPU ranks' or the model's hardware profile."""
    m = doc["metadata"]
    if is_model(doc):
        return f"{m['hardware_profile']} (model)"
    if is_emulated(doc):
        return "emulated CPU ranks"
    gpus = [str(g) for g in (m.get("gpu_names") or [])]
    if not gpus:
        return "unnamed GPUs"
    if len(set(gpus)) == 1:
        return f"{len(gpus)} x {gpus[0]}"
    return ", ".join(gpus)


def title(doc: dict) -> str:
    """The report's title: the workload(s), the machine and the world."""
    workloads = list(dict.fromkeys(c["workload"] for c in doc["cases"])) or ["no cases"]
    n = len(doc["cases"])
    what = ", ".join(workloads) + (f" ({n} cases)" if n > 1 else "")
    return f"{what} on {machine(doc)}, world {doc['metadata']['world_size']}"


def marks(doc: dict) -> list[tuple[str, str]]:
    """(MARK, what it means) for everything that changes how the numbers read; most important first."""
    out = []
    if is_emulated(doc):
        out.append(("EMULATED", "the kernels ran under Triton's interpreter on CPU ranks: correctness only, "
                                "the times mean nothing"))
    if is_model(doc):
        out.append(("PREDICTED", "every number comes from the analytical model, nothing was measured"))
    hit = [f"{c['workload']} {_shape(c)} {v['variant']}" for c in doc["cases"] for v in c["variants"] if perturbed(v)]
    if hit:
        out.append(("PERTURBED", f"measuring cost more than {PERTURBED_SHARE:.0%} of plain E2E for {len(hit)} "
                                 f"variant(s): " + ", ".join(hit[:6]) + (" ..." if len(hit) > 6 else "")))
    old = sum(1 for c in doc["cases"] for v in c["variants"] if rows_state(v) == "older rules")
    if old:
        out.append(("NO ROWS", f"{old} variant(s) were measured under attribution rules since replaced: their E2E "
                               "and ratios stand, their rows are not shown"))
    if doc["metadata"].get("git_dirty"):
        out.append(("DIRTY", "made from a checkout with uncommitted changes"))
    return out


def _shape(case: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in case["shape"].items())


def _ratio(base: float | None, v: dict) -> str:
    e = e2e_of(v)
    return f"{base / e:.2f}x" if base and e else "-"


# What a variant's time goes to besides its work (the floor, or compute where no floor is known): each tax
# whole, and every other row on its own; the verdict names the largest, whatever its kind.
COST_NAMES = {"host_bound": "host-bound", "sync": "host synchronisation", "compile": "compilation",
              "data_loading": "data loading", "graph_gaps": "gaps inside graph replays", "queued": "queued",
              "start_skew": "ranks' start skew", "inefficiency": "kernel inefficiency", "unattributed": "unattributed"}
WORK_ROWS = ("ideal", "compute")


def costs(v: dict) -> list[tuple[str, float]]:
    """(name, us) of every cost of a variant with rows, largest first: the three taxes (each the sum of its
    rows) and every other row that is not its work (COST_NAMES); those at most 0 left out."""
    oc = overall_components(v)
    if not oc:
        return []
    in_a_tax = {row for parts in TAXES.values() for row in parts}
    out = [(tax, math.fsum(oc.get(r, 0.0) for r in parts)) for tax, parts in TAXES.items()]
    out += [(COST_NAMES.get(row, row), x) for row, x in oc.items() if row not in in_a_tax and row not in WORK_ROWS]
    return sorted(((n, x) for n, x in out if x > 0), key=lambda nx: -nx[1])


def _costs_text(v: dict | None, most: int = 3) -> str:
    """The largest costs of a variant worth naming (at least MATTER_SHARE of its E2E), largest first."""
    if v is None:
        return "-"
    if not overall_components(v):
        return "rows not available" if not (v.get("attribution") or {}).get("available", True) else "-"
    e2e = v.get("attributed_e2e_us") or e2e_of(v)
    big = [(n, x) for n, x in costs(v) if e2e and x >= MATTER_SHARE * e2e][:most]
    return "; ".join(f"{n} {_fmt(x)} ({x / e2e:.0%})" for n, x in big) or "none over 2%"


def checks_by_case(doc: dict):
    """{(workload, shape text): frame of its checks} for measured documents (taxes/documents/checks.py)."""
    if doc["metadata"].get("kind") != "profile":
        return {}
    from taxes.documents.checks import checks_frame

    frame = checks_frame(doc)
    return {key: grp for key, grp in frame.groupby(["workload", "shape"], sort=False)} if not frame.empty else {}


def _checks_text(frame) -> tuple[str, bool]:
    """('all 12 hold' | '3 of 12 FAIL', failed?): the failing rows are listed under the summary."""
    if frame is None or frame.empty:
        return "-", False
    bad = frame[~frame["ok"]]
    if bad.empty:
        return f"all {len(frame)} hold", False
    return f"{len(bad)} of {len(frame)} FAIL", True


# Six columns, few long words: one table, read across its row, even 80 columns wide (its text wraps)
SUMMARY_HEADER = ["case", "best variant, its E2E us", "speed-up vs bsp / bsp-graph", "of the floor",
                  "its largest costs (share)", "checks"]


def floor_fraction(v: dict) -> float | None:
    """The floor's share of a variant's E2E (T_ideal / E2E): 1.0 is a variant at the floor."""
    ideal, e2e = (v.get("floor") or {}).get("ideal_us"), e2e_of(v)
    return ideal / e2e if ideal and e2e else None


def _fraction_text(v: dict | None) -> str:
    f = floor_fraction(v) if v else None
    return "-" if f is None else f"{f:.2f}"


def summary_rows(doc: dict) -> tuple[list[str], list[list[str]], list[bool]]:
    """The verdict per case: SUMMARY_HEADER, rows of strings, and per row whether a check failed. The best
    variant comes with its E2E (its statistic named) and its largest costs, whatever their kind."""
    checks = checks_by_case(doc)
    rows, failed = [], []
    stat = "predicted" if is_model(doc) else "IQM"
    for case in doc["cases"]:
        best = best_variant(case)
        bsp, graph = baseline_variant(case, "bsp"), baseline_variant(case, "graph")
        check_text, bad = _checks_text(checks.get((case["workload"], _shape(case))))
        name = f"{case['workload']} " + ", ".join(f"{k}={v}" for k, v in case["shape"].items())
        if best is None:
            rows.append([name, "none usable", "- / -", "-", "-", check_text])
        else:
            rows.append([name, f"{best['variant']}{' PERTURBED' if perturbed(best) else ''} {_fmt(e2e_of(best))} ({stat})",
                         _speedups_text(best, bsp, graph), _fraction_text(best), _costs_text(best), check_text])
        failed.append(bad)
    # a column nothing fills (no bsp, no rows, no checks) says nothing: leave it out
    keep = [i for i, h in enumerate(SUMMARY_HEADER)
            if i < 2 or any(r[i] not in ("-", "- / -", "rows not available") for r in rows)]
    return [SUMMARY_HEADER[i] for i in keep], [[r[i] for i in keep] for r in rows], failed


def _speedups_text(best: dict, bsp: dict | None, graph: dict | None) -> str:
    """'1.98x / 2.00x': the best variant against bsp, then against bsp-graph ('-' where one is missing)."""
    return f"{_ratio(e2e_of(bsp) if bsp else None, best)} / {_ratio(e2e_of(graph) if graph else None, best)}"


def failed_checks(doc: dict) -> list[str]:
    """One line per failing check row."""
    out = []
    for frame in checks_by_case(doc).values():
        for r in frame[~frame["ok"]].itertuples():
            err = "-" if r.error is None or r.error != r.error else f"{100 * r.error:+.1f}%"
            out.append(f"{r.check} {r.workload} {r.shape} {r.variant} ({r.where}): error {err}, limit {100 * r.limit:.1f}%")
    return out


def case_rows(case: dict) -> tuple[list[str], list[list[str]]]:
    """The attribution table of one case: a header and rows of strings, one column per variant. The first
    row is the E2E every ratio uses, its statistic named; rows of a measured variant add up to the
    instrumented E2E printed below it, and the measurement cost is the difference between the two."""
    variants = case["variants"]
    header = ["us per iteration"] + [v["variant"] for v in variants]
    rows = []

    def e2e_cell(v):
        e, val = v["e2e_us"], e2e_of(v)
        spread = f" [{_fmt(e.get('p10'))}-{_fmt(e.get('p90'))}]" if e.get("p10") is not None and e.get("p90") is not None else ""
        return f"{_fmt(val)}{spread} {LABEL_MARK[e['label']]}"

    predicted = all(v["e2e_us"]["label"] == "predicted" for v in variants) and variants
    rows.append([E2E_ROW_MODEL if predicted else E2E_ROW] + [e2e_cell(v) for v in variants])
    if any(v.get("attributed_e2e_us") is not None for v in variants):
        rows.append(["rows add up to (instrumented E2E)"] + [
            f"{_fmt(v['attributed_e2e_us'])} m" if v.get("attributed_e2e_us") is not None else "-" for v in variants])

        def cost_cell(v):
            c, p = v.get("measurement_cost_us"), v.get("plain_e2e_us")
            if c is None or not p:
                return "-"
            return f"{c:+,.1f} ({100 * c / p:+.1f}%)" + (" PERTURBED" if perturbed(v) else "")
        rows.append(["measurement cost (instrumented - plain)"] + [cost_cell(v) for v in variants])
    core = ("ideal", "launch", "sync_wait", "exposed_transfer", "locality", "inefficiency", "unattributed")
    has = any(overall_components(v) for v in variants)
    present = [c for c in COMPONENTS if has and (c in core or any(abs(overall_components(v).get(c, 0.0)) > 0
                                                                  for v in variants))]
    for comp in present:
        cells = []
        for v in variants:
            val = overall_components(v).get(comp)
            cells.append("-" if val is None else f"{_fmt(val)} {LABEL_MARK.get(_labels(v).get(comp), '?')}")
        rows.append([COMPONENT_TITLES[comp]] + cells)
    if present:
        for tax in TAXES:
            rows.append([f"= {tax} tax"] + [_fmt(tax_values(v)[tax]) if overall_components(v) else "-" for v in variants])
    if any(rows_state(v) != "shown" for v in variants):
        rows.append(["rows"] + [ROWS_CELL[rows_state(v)] for v in variants])
    if any(v.get("prediction") for v in variants):
        def pred_cell(v):
            pr, med = v.get("prediction"), e2e_of(v)
            if not pr:
                return "-"
            err = f" ({100 * (pr['e2e_us'] - med) / med:+.0f}%)" if med else ""
            return f"{_fmt(pr['e2e_us'])} p{err}"
        rows.append(["model E2E (error)"] + [pred_cell(v) for v in variants])
    for rung, name in (("bsp", "speed-up vs bsp"), ("graph", "speed-up vs bsp-graph")):
        base = baseline(case, rung)
        if base:
            rows.append([name] + [_ratio(base, v) for v in variants])
    if any(floor_fraction(v) is not None for v in variants):
        rows.append(["of the floor (T_ideal / E2E)"] + [_fraction_text(v) for v in variants])
    if any(v["correctness"].get("checked") for v in variants):
        rows.append(["correct (rel. error)"] + [_correct_cell(v["correctness"]) for v in variants])
    return header, rows


def _correct_cell(c: dict) -> str:
    if not c.get("checked"):
        return "not checked"
    err = c.get("rel_error")
    word = "yes" if c.get("passed") else "NO"
    return f"{word} ({err:.1e})" if err is not None else word


def floor_rows(case: dict) -> tuple[list[str], list[list[str]]] | None:
    if not all("floor" in v for v in case["variants"]) or not case["variants"]:
        return None
    f = case["variants"][0]["floor"]
    return (["floor", "us"], [["T_compute", _fmt(f["compute_us"])], ["T_hbm", _fmt(f["hbm_us"])],
                              ["T_link", _fmt(f["link_us"])], ["T_ideal = max", _fmt(f["ideal_us"])]])


def per_rank_rows(case: dict) -> tuple[list[str], list[list[str]]] | None:
    """Per-rank components (measured documents), one row per (variant, rank)."""
    rows = []
    for v in case["variants"]:
        ranks = sorted({c["rank"] for c in v["components"] if c["rank"] is not None})
        for r in ranks:
            vals = {c["name"]: c["value_us"] for c in v["components"] if c["rank"] == r}
            rows.append([v["variant"], str(r)] + [_fmt(vals.get(c)) for c in COMPONENTS])
    if not rows:
        return None
    return ["variant", "rank"] + [COMPONENT_TITLES[c] for c in COMPONENTS], rows


def ladder_rows(case: dict) -> tuple[list[str], list[list[str]]] | None:
    """The ablation ladder beside the timeline: two measures of what a graph removes, which should agree."""
    lad = (case.get("extra") or {}).get("ladder") or {}
    rows = []
    for p in lad.get("pairs", []) if isinstance(lad.get("pairs"), list) else []:
        if not isinstance(p, dict) or not {"bsp", "graph", "plain_us"} <= set(p):
            continue
        rows.append([f"E2E({p['bsp']}) - E2E({p['graph']}), plain (derived)", _fmt(_num(p["plain_us"]))])
        if p.get("timeline_us") is not None:
            rows.append([f"launch + host_bound of {p['bsp']} minus {p['graph']}'s, timeline (measured)",
                         _fmt(_num(p["timeline_us"]))])
            rows.append([f"{p['graph']}: its replay's launch and the gaps inside it (a graph keeps these)",
                         _fmt(_num(p.get("graph_residual_us")))])
    if "fused_vs_graph_us" in lad:
        rows.append([f"E2E(best graph) - E2E({lad.get('best_fused')}), plain (derived)", _fmt(_num(lad["fused_vs_graph_us"]))])
    return (["ablation ladder", "us"], rows) if rows else None


def _num(x) -> float | None:
    """A number from a free-form part of a document (case.extra), or None."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def pct(x) -> str:
    """A signed fraction as a percentage; '-' for none."""
    return "-" if x is None or x != x else f"{100 * x:+.1f}%"


def checks_summary_rows(frame, title: str = "check") -> tuple[list[str], list[list[str]]]:
    """One row per check of a taxes.documents.checks frame: its limit, how many rows hold, the worst error."""
    from taxes.documents.checks import checks_summary

    rows = [[r.check, f"{100 * r.limit:.1f}%", f"{r.ok} of {r.of}" + ("" if r.ok == r.of else " FAIL"),
             pct(r.worst_error)] for r in checks_summary(frame).itertuples()]
    return [title, "limit", "holds", "worst error"], rows


def checks_rows(doc: dict) -> tuple[list[str], list[list[str]]] | None:
    """The method's checks (taxes/documents/checks.py) over the whole document: one row per check."""
    if doc["metadata"].get("kind") != "profile":
        return None
    from taxes.documents.checks import checks_frame

    frame = checks_frame(doc)
    if frame.empty:
        return None
    return checks_summary_rows(frame, "check (taxes check lists every row)")


VERSIONS = (("torch", "torch_version"), ("triton", "triton_version"), ("CUDA", "cuda_version"), ("NCCL", "nccl_version"))


def versions_text(meta: dict) -> str:
    """The versions the measurement ran under, those the document records ('torch 2.6.0, CUDA 12.4'), and
    which it does not record; never 'None'."""
    known = [f"{name} {meta[key]}" for name, key in VERSIONS if meta.get(key) not in (None, "")]
    missing = [name for name, key in VERSIONS if meta.get(key) in (None, "")]
    where = "the traces" if meta.get("source") == "trace" else "the document"
    return ", ".join(known + ([f"{' and '.join(missing)} not recorded in {where}"] if missing else []))


def _meta_line(doc: dict) -> str:
    m = doc["metadata"]
    gpus = ", ".join(str(g) for g in (m.get("gpu_names") or [])) or "no GPU"
    commit = str(m.get("git_commit") or "unknown")[:10] + (" + uncommitted changes" if m.get("git_dirty") else "")
    return printable(f"{m['kind']} by taxes {m['tool_version']} (commit {commit}), {m.get('date', '?')}; hardware "
                     f"profile {m['hardware_profile']}; world {m['world_size']}; {gpus}; {versions_text(m)}"
                     + (f"; iterations start: {m['iteration_start'].get('mode')}"
                        if isinstance(m.get("iteration_start"), dict) else ""))


def sections(doc: dict) -> list[tuple[str, list[tuple[str | None, list[str], list[list[str]]]]]]:
    """The details after the summary: per case (title, [(table title, header, rows)])."""
    out = []
    for case in doc["cases"]:
        tables = [(None, *case_rows(case))]
        for title_, fn in (("floor", floor_rows), ("ablation ladder", ladder_rows), ("per rank", per_rank_rows)):
            t = fn(case)
            if t:
                tables.append((title_, *t))
        out.append((case_title(case), tables))
    return out


def trace_warnings(doc: dict) -> list[str]:
    """What `taxes analyze` warned about the traces (the document keeps it)."""
    return [printable(w) for w in doc["metadata"].get("warnings") or [] if isinstance(w, str)] \
        if doc["metadata"].get("source") == "trace" else []


# ---- terminal -------------------------------------------------------------------------------------

_MARK_STYLE = {"EMULATED": "bold red", "PREDICTED": "bold yellow", "PERTURBED": "bold red", "NO ROWS": "yellow",
               "DIRTY": "yellow"}
_ROW_STYLE = {E2E_ROW: "bold", E2E_ROW_MODEL: "bold", "speed-up vs bsp": "bold"}


def render_terminal(doc: dict, console, head: bool = True, trace_details: bool = False) -> None:
    """The report on a rich console: title, marks, summary (one table whatever the width: its text wraps),
    failed checks, then the details (every table folded to the console's width, never cut); with
    trace_details, a `taxes analyze` document's own tables after them (trace_sections)."""
    from taxes.console import print_table, text

    if head:
        console.print(text(title(doc), "bold"))
        for mark, why in marks(doc):
            console.print(text(f"{mark}: {why}", _MARK_STYLE.get(mark)))
        header, rows, failed = summary_rows(doc)
        if rows:
            checks = header.index("checks") if "checks" in header else -1
            print_table(console, "summary", header, rows, left=1, text_columns=tuple(range(1, len(header))),
                        cell_styles={(i, checks): "bold red" for i, bad in enumerate(failed) if bad}, fold=False)
        for line in failed_checks(doc):
            console.print(text(f"FAILED check: {line}", "bold red"))
    for case_name, tables in sections(doc):
        console.print()
        console.print(text(case_name, "bold underline"))
        for name, header, rows in tables:
            styles = [_ROW_STYLE.get(r[0], "dim" if r[0].startswith("=") else None) for r in rows]
            print_table(console, name, header, rows, left=2 if name == "per rank" else 1, row_styles=styles)
    cr = checks_rows(doc)
    if cr:
        bad = {i: "bold red" for i, r in enumerate(cr[1]) if r[2].endswith("FAIL")}
        print_table(console, "checks of the measurement", *cr, cell_styles={(i, 2): s for i, s in bad.items()})
    if trace_details:
        for name, header, rows in trace_sections(doc):
            print_table(console, name, header, rows, left=2 if header[:2] == ["rank", "step"] else 1)
        for w in trace_warnings(doc):
            console.print(text(f"warning: {w}", "yellow"))


# ---- Markdown -------------------------------------------------------------------------------------


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; every cell passes taxes.sanitize.markdown (no HTML, pipes or line breaks get
    through)."""
    lines = ["| " + " | ".join(md_escape(h) for h in header) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(doc: dict, trace_details: bool = False) -> str:
    """The report in Markdown; with trace_details, a `taxes analyze` document's own tables at the end."""
    out = [f"# {md_escape(title(doc))}", ""]
    for mark, why in marks(doc):
        out += [f"> **{mark}**: {md_escape(why)}", ""]
    out += [md_escape(_meta_line(doc)), ""]
    header, rows, failed = summary_rows(doc)
    if rows:
        out += ["## Summary", "", md_table(header, rows), ""]
    bad = failed_checks(doc)
    if bad:
        out += ["**Failed checks:**", ""] + [f"- **FAILED** {md_escape(line)}" for line in bad] + [""]
    out += [md_escape(LEGEND), ""]
    for case_name, tables in sections(doc):
        out += [f"## {md_escape(case_name)}", ""]
        for name, header, rows in tables:
            out += ([f"{name.capitalize()}:", ""] if name == "per rank" else []) + [md_table(header, rows), ""]
    cr = checks_rows(doc)
    if cr:
        out += ["## Checks of the measurement", "", md_table(*cr), ""]
    if trace_details:
        for name, header, rows in trace_sections(doc):
            out += [f"### {md_escape(name)}", "", md_table(header, rows), ""]
        out += [f"**warning:** {md_escape(w)}" for w in trace_warnings(doc)] + ([""] if trace_warnings(doc) else [])
    return "\n".join(out)


# ---- JSON: the document and its report --------------------------------------------------------------


def summary(doc: dict) -> dict:
    """What the views show, as data: the title, the marks, and per case and variant the E2E (its
    statistic named), the rows, the taxes, the speed-ups and the verdict."""
    cases = []
    checks = checks_by_case(doc)
    for case in doc["cases"]:
        bsp, graph = baseline(case, "bsp"), baseline(case, "graph")
        best = best_variant(case)
        variants = []
        for v in case["variants"]:
            oc = overall_components(v)
            e2e = e2e_of(v)
            variants.append({
                "variant": v["variant"], "e2e_us": e2e,
                "statistic": "predicted" if v["e2e_us"].get("label") == "predicted" else STATISTIC,
                "p10_us": v["e2e_us"].get("p10"), "p90_us": v["e2e_us"].get("p90"),
                "attributed_e2e_us": v.get("attributed_e2e_us"), "measurement_cost_us": v.get("measurement_cost_us"),
                "perturbed": perturbed(v), "rows_available": (v.get("attribution") or {}).get("available", bool(oc)),
                "components_us": oc, "labels": _labels(v), "taxes_us": tax_values(v),
                "speedup_vs_bsp": (bsp / e2e) if bsp and e2e else None,
                "speedup_vs_bsp_graph": (graph / e2e) if graph and e2e else None,
                "correct": v["correctness"].get("passed"),
            })
        frame = checks.get((case["workload"], _shape(case)))
        cases.append({k: case[k] for k in ("workload", "shape", "world", "dtype")} | {
            "best_variant": best["variant"] if best else None,
            "best_largest_costs_us": [{"cost": n, "us": x} for n, x in costs(best)] if best else [],
            "checks_failed": int((~frame["ok"]).sum()) if frame is not None else 0,
            "checks": int(len(frame)) if frame is not None else 0,
            "variants": variants})
    return {"title": title(doc), "marks": [m for m, _ in marks(doc)], "statistic": STATISTIC, "cases": cases}


def render_json(doc: dict) -> str:
    """The document itself (valid against taxes/documents/schema/result-v1.json, so it loads back) with its report
    under "report"."""
    from taxes.documents.results import dumps

    out = {k: v for k, v in doc.items() if k != "report"} | {"report": summary(doc)}
    return dumps(out)


# ---- HTML -----------------------------------------------------------------------------------------


def _data_uri(data: bytes, fmt: str) -> str:
    mime = {"png": "image/png", "svg": "image/svg+xml"}[fmt]
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def charts(case: dict, fmt: str = "svg") -> list[tuple[str, str]]:
    """(data URI, alt text) of every chart a case has."""
    name = case_title(case)
    out = []
    if any(overall_components(v) for v in case["variants"]):
        out.append((_data_uri(stacked_bars(case, fmt), fmt), f"rows per variant: {name}"))
    if any(v.get("prediction") and overall_components(v) for v in case["variants"]):
        out.append((_data_uri(predicted_vs_measured(case, fmt), fmt), f"predicted against measured: {name}"))
    if any(v["phases"] for v in case["variants"]):
        out.append((_data_uri(timeline(case, fmt), fmt), f"per-rank timeline: {name}"))
    if any(v.get("cta_timeline") for v in case["variants"]):
        out.append((_data_uri(cta_waits(case, fmt), fmt), f"fused kernels, per CTA: {name}"))
    return out


def _environment():
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("taxes.reports", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["clean"] = printable
    return env


def html_view(doc: dict, images: bool = True, trace_details: bool = False) -> dict:
    """Everything the HTML template shows of one document (with trace_details: a `taxes analyze` document's
    own tables and warnings too)."""
    header, rows, failed = summary_rows(doc)
    checks = header.index("checks") if "checks" in header else -1
    return {"title": title(doc), "marks": marks(doc), "meta": _meta_line(doc), "legend": LEGEND,
            "summary": {"header": header, "rows": rows, "fail_cells": {(i, checks): "fail" for i, bad in
                                                                      enumerate(failed) if bad}},
            "failed_checks": failed_checks(doc),
            "cases": [{"title": name, "tables": [{"title": t, "header": h, "rows": r} for t, h, r in tables],
                       "charts": charts(case) if images else []}
                      for case, (name, tables) in zip(doc["cases"], sections(doc))],
            "checks": checks_rows(doc),
            "trace_tables": [{"title": t, "header": h, "rows": r} for t, h, r in trace_sections(doc)]
            if trace_details else [],
            "warnings": trace_warnings(doc) if trace_details else []}


def render_html(doc: dict | list[dict], trace_details: bool = False) -> str:
    """One self-contained page (no script, no external resource): per document the title, its marks, the
    summary, then the details with the charts embedded as SVG data: URIs; with trace_details, a `taxes
    analyze` document's own tables after them."""
    docs = doc if isinstance(doc, list) else [doc]
    views = [html_view(d, trace_details=trace_details) for d in docs]
    page_title = views[0]["title"] if len(views) == 1 else f"{len(views)} result documents"
    return _environment().get_template("report.html.j2").render(page_title=page_title, docs=views, css=_CSS)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    """A bare HTML table (escaped), for pages built elsewhere."""
    return _environment().get_template("table.html.j2").render(header=header, rows=rows, cls=None, row_classes=None,
                                                                cell_classes=None).strip()


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}td:not(:first-child){white-space:nowrap}th{background:#f3f3f3}img{max-width:100%;margin:0.5em 0}
.meta{color:#555;font-size:13px}h2{margin-top:2em;border-bottom:1px solid #ddd}
.mark{font-weight:bold;padding:0.4em 0.8em;margin:0.3em 0;border-radius:4px;background:#fff4e5;color:#8a4b00}
.mark.EMULATED,.mark.PERTURBED{background:#fde8e8;color:#a00}.fail{color:#c00;font-weight:bold}
table.summary td,table.summary th{text-align:left;white-space:normal}.summary td:nth-child(2){font-weight:bold}.failed-checks li{color:#c00}"""
