"""`taxes analyze`'s own tables, from the document: `taxes analyze` keeps its frames under the document's
`trace_analysis` (docs/analyze.md); these tables are made from them, so a document written with --format
json reports them as `analyze` showed them."""

from __future__ import annotations

from taxes.reports.rows import finite_number
from taxes.reports.verdict import number_text
from taxes.sanitize import printable

TRACE_ROWS = 60  # rows per table; the document holds every one
STEP_ROWS = ("launch", "host_bound", "sync", "compile", "data_loading", "graph_gaps", "queued", "sync_wait",
             "exposed_transfer", "locality", "compute", "unattributed")
WHAT_IF = (("graphs", "CUDA graphs"), ("overlap", "full overlap"), ("fusion", "fusion"))


def _cut(name, n: int) -> str:
    name = str(name)
    return name if len(name) <= n else name[: n - 3] + "..."


def _records(ta: dict, key: str) -> list[dict]:
    return [r for r in ta.get(key) or [] if isinstance(r, dict)]


def trace_sections(doc: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """The tables of a `taxes analyze` document beyond the summary and the rows (every step, what if, host
    frames, communication by rule, collective instances, stragglers, intermediates), as (title, header, rows);
    none for other documents."""
    ta = doc.get("trace_analysis")
    if not isinstance(ta, dict):
        return []
    out = []
    steps = _records(ta, "decomposition")
    out.append(("every step, us (flagged steps are left out of the statistics)",
                ["rank", "step", "flag", "span"] + list(STEP_ROWS),
                [[str(r.get("rank")), str(r.get("step")), r.get("flag") or "", number_text(finite_number(r.get("span_us")))]
                 + [number_text(finite_number(r.get(k))) for k in STEP_ROWS] for r in steps][:TRACE_ROWS]))
    projected: dict[tuple, dict] = {}
    for w in _records(ta, "what_if"):
        projected.setdefault((w.get("rank"), w.get("step")), {})[w.get("change")] = finite_number(w.get("projected_us"))
    if projected:
        span = {(r.get("rank"), r.get("step")): finite_number(r.get("span_us")) for r in steps}
        out.append(("what if, per step (predicted): the step's time with the tax removed, us",
                    ["rank", "step", "span"] + [title for _, title in WHAT_IF],
                    [[str(r), str(st), number_text(span.get((r, st)))] + [number_text(ch.get(key)) for key, _ in WHAT_IF]
                     for (r, st), ch in sorted(projected.items(), key=lambda kv: _sort_key(kv[0]))][:TRACE_ROWS]))
    frames = _records(ta, "host_frames")
    if frames:
        out.append(("where the host was before host-bound gaps (own time, top frames)", ["rank", "step", "frame", "us"],
                    [[str(f.get("rank")), str(f.get("step")), _cut(f.get("frame"), 70), number_text(finite_number(f.get("us")))]
                     for f in frames][:TRACE_ROWS]))
    comm = _records(ta, "communication_by_rule")
    if comm:
        out.append(("communication, by the rule that classified it", ["rank", "rule", "activities", "us"],
                    [[str(c.get("rank")), str(c.get("rule")), str(c.get("kernels")), number_text(finite_number(c.get("us")))]
                     for c in comm]))
    inst = _records(ta, "instances")
    if inst:
        unmatched = sum(1 for x in inst if not x.get("matched"))
        out.append((f"collective instances ({len(inst)}; {unmatched} unmatched)",
                    ["instance", "kernel", "step", "identified by", "ranks", "matched", "arrival skew us", "slowest rank",
                     "max wait us"],
                    [[_cut(x.get("key"), 40), _cut(x.get("name"), 40), str(x.get("step")), str(x.get("source")),
                      str(x.get("n_ranks")), "yes" if x.get("matched") else "NO", number_text(finite_number(x.get("skew_us"))),
                      str(x.get("slowest_rank")) if x.get("matched") else "-", number_text(finite_number(x.get("max_wait_us")))]
                     for x in inst][:TRACE_ROWS]))
        out.append(("stragglers: per rank, at matched instances",
                    ["rank", "instances", "arrived last", "wait it caused us", "wait it paid us"],
                    [[str(x.get("rank")), str(x.get("instances")), str(x.get("times_last")),
                      number_text(finite_number(x.get("caused_wait_us"))), number_text(finite_number(x.get("own_wait_us")))]
                     for x in _records(ta, "stragglers")]))
    moved: dict[tuple, list] = {}
    for x in _records(ta, "locality"):
        key = (x.get("rank"), str(x.get("producer")), str(x.get("consumer")), str(x.get("source")))
        n_mb = moved.setdefault(key, [0, 0.0])
        n_mb[0] += 1
        n_mb[1] += finite_number(x.get("moved_bytes")) or 0.0
    if moved:
        out.append(("intermediates through device memory (producer -> consumer)",
                    ["rank", "written by", "read by", "evidence", "times", "MB moved"],
                    [[str(k[0]), _cut(k[1], 40), _cut(k[2], 40), k[3], str(n), f"{mb / 1e6:,.2f}"]
                     for k, (n, mb) in sorted(moved.items(), key=lambda kv: _sort_key(kv[0]))][:TRACE_ROWS]))
    return out


def _sort_key(key: tuple) -> tuple:
    """Numbers before text, each in its order: a key of a hostile document never fails to sort."""
    return tuple((0, x, "") if isinstance(x, (int, float)) and not isinstance(x, bool) else (1, 0, str(x)) for x in key)


def trace_warnings(doc: dict) -> list[str]:
    """What `taxes analyze` warned about the traces (the document keeps it)."""
    return [printable(w) for w in doc["metadata"].get("warnings") or [] if isinstance(w, str)] \
        if doc["metadata"].get("source") == "trace" else []
