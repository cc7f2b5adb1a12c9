"""The tables of a `taxes analyze` document beyond the summary and the rows: every step, what if, host
frames, communication by rule, collective instances, stragglers and intermediates, as (title, header,
rows). They are made from the frames the document keeps under `trace_analysis` (docs/analyze.md), so
`taxes analyze` and `taxes report` of its JSON show the same tables. A row the traces cannot support
reads "not measured", never a number; every value of the document is checked before it is shown (a
document may come from anywhere).
"""

from __future__ import annotations

import math

from taxes.sanitize import printable

MAX_ROWS = 60  # rows per table; the document holds every one
NOT_MEASURED = "not measured"
STEP_ROWS = ("launch", "host_bound", "sync", "compile", "data_loading", "graph_gaps", "queued", "sync_wait",
             "exposed_transfer", "locality", "compute", "unattributed")
WHAT_IF = (("graphs", "CUDA graphs"), ("overlap", "full overlap"), ("fusion", "fusion"))
# what-if changes that rest on a row: without the row, the projection is not measured either
WHAT_IF_NEEDS = {"fusion": "locality"}
Table = tuple[str, list[str], list[list[str]]]


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _fmt(v) -> str:
    v = _num(v)
    if v is None:
        return "-"
    return f"{v:,.1f}" if abs(v) < 1e5 else f"{v:,.0f}"


def _cell(v, not_measured: bool) -> str:
    return NOT_MEASURED if not_measured and _num(v) is None else _fmt(v)


def _cut(name, n: int) -> str:
    name = str(name)
    return name if len(name) <= n else name[: n - 3] + "..."


def _records(ta: dict, key: str) -> list[dict]:
    rows = ta.get(key)
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _sort_key(key: tuple) -> tuple:
    """Numbers before text, each in its order: a key of a hostile document never fails to sort."""
    return tuple((0, x, "") if isinstance(x, (int, float)) and not isinstance(x, bool) else (1, 0, str(x)) for x in key)


def not_measured(doc: dict) -> dict:
    """{row: why} of an analyze document: the rows its traces cannot support, and what to record to get them."""
    ta = doc.get("trace_analysis")
    nm = ta.get("not_measured") if isinstance(ta, dict) else None
    return {str(k): str(v) for k, v in nm.items()} if isinstance(nm, dict) else {}


def untrusted(doc: dict) -> str | None:
    """Why the document's bulk-synchronous rows and stragglers are not to be trusted, or None."""
    ta = doc.get("trace_analysis")
    why = ta.get("untrusted") if isinstance(ta, dict) else None
    return why if isinstance(why, str) and why else None


def trace_sections(doc: dict) -> list[Table]:
    """The tables of a `taxes analyze` document (module docstring); none for other documents."""
    ta = doc.get("trace_analysis")
    if not isinstance(ta, dict):
        return []
    missing = not_measured(doc)
    steps = _records(ta, "decomposition")
    out = [("every step, us (flagged steps are left out of the statistics)", ["rank", "step", "flag", "span"] + list(STEP_ROWS),
            [[str(r.get("rank")), str(r.get("step")), str(r.get("flag") or ""), _fmt(r.get("span_us"))]
             + [_cell(r.get(k), k in missing) for k in STEP_ROWS] for r in steps][:MAX_ROWS])]
    out += [t for t in (_what_if(ta, steps, missing), _host_frames(ta), _communication(ta)) if t]
    out += _collectives(ta, untrusted(doc))
    loc = _intermediates(ta)
    return out + ([loc] if loc else [])


def _what_if(ta: dict, steps: list[dict], missing: dict) -> Table | None:
    projected: dict[tuple, dict] = {}
    for w in _records(ta, "what_if"):
        projected.setdefault((w.get("rank"), w.get("step")), {})[w.get("change")] = w.get("projected_us")
    if not projected:
        return None
    span = {(r.get("rank"), r.get("step")): r.get("span_us") for r in steps}
    return ("what if, per step (predicted): the step's time with the tax removed, us",
            ["rank", "step", "span"] + [title for _, title in WHAT_IF],
            [[str(r), str(st), _fmt(span.get((r, st)))] + [_cell(ch.get(key), WHAT_IF_NEEDS.get(key) in missing)
                                                           for key, _ in WHAT_IF]
             for (r, st), ch in sorted(projected.items(), key=lambda kv: _sort_key(kv[0]))][:MAX_ROWS])


def _host_frames(ta: dict) -> Table | None:
    frames = _records(ta, "host_frames")
    if not frames:
        return None
    return ("where the host was before host-bound gaps (own time, top frames)", ["rank", "step", "frame", "us"],
            [[str(f.get("rank")), str(f.get("step")), _cut(f.get("frame"), 70), _fmt(f.get("us"))]
             for f in frames][:MAX_ROWS])


def _communication(ta: dict) -> Table | None:
    comm = _records(ta, "communication_by_rule")
    if not comm:
        return None
    return ("communication, by the rule that classified it", ["rank", "rule", "activities", "us"],
            [[str(c.get("rank")), str(c.get("rule")), str(c.get("kernels")), _fmt(c.get("us"))] for c in comm])


def _collectives(ta: dict, doubt: str | None) -> list[Table]:
    inst = _records(ta, "instances")
    if not inst:
        return []
    unmatched = sum(1 for x in inst if not x.get("matched"))
    instances = (f"collective instances ({len(inst)}; {unmatched} unmatched)",
                 ["instance", "kernel", "step", "identified by", "ranks", "matched", "arrival skew us", "slowest rank",
                  "max wait us"],
                 [[_cut(x.get("key"), 40), _cut(x.get("name"), 40), str(x.get("step")), str(x.get("source")),
                   str(x.get("n_ranks")), "yes" if x.get("matched") else "NO", _fmt(x.get("skew_us")),
                   str(x.get("slowest_rank")) if x.get("matched") else "-", _fmt(x.get("max_wait_us"))]
                  for x in inst][:MAX_ROWS])
    score = [_num(x.get("score")) for x in _records(ta, "stragglers")]
    stragglers = ("stragglers: per rank, at matched instances (score: its share of the wait it caused; the "
                  "straggler caused at least twice a fair share)" + (f"; {doubt}" if doubt else ""),
                  ["rank", "instances", "arrived last", "wait it caused us", "wait it suffered us", "mean lateness us",
                   "score", "straggler", "where it was while the others waited"],
                  [[str(x.get("rank")), str(x.get("instances")), str(x.get("times_last")), _fmt(x.get("caused_wait_us")),
                    _fmt(x.get("suffered_wait_us")), _fmt(x.get("lateness_us")), "-" if s is None else f"{s:.2f}",
                    "YES" if x.get("straggler") is True else "", _cut(x.get("where") or "", 160)]
                   for x, s in zip(_records(ta, "stragglers"), score)][:MAX_ROWS])
    return [instances, stragglers]


def _intermediates(ta: dict) -> Table | None:
    moved: dict[tuple, list] = {}
    for x in _records(ta, "locality"):
        key = (x.get("rank"), str(x.get("producer")), str(x.get("consumer")), str(x.get("source")))
        n_mb = moved.setdefault(key, [0, 0.0])
        n_mb[0] += 1
        n_mb[1] += _num(x.get("moved_bytes")) or 0.0
    if not moved:
        return None
    return ("intermediates through device memory (producer -> consumer)",
            ["rank", "written by", "read by", "evidence", "times", "MB moved"],
            [[str(k[0]), _cut(k[1], 40), _cut(k[2], 40), k[3], str(n), f"{mb / 1e6:,.2f}"]
             for k, (n, mb) in sorted(moved.items(), key=lambda kv: _sort_key(kv[0]))][:MAX_ROWS])


def trace_warnings(doc: dict) -> list[str]:
    """What `taxes analyze` warned about the traces (the document keeps it)."""
    return [printable(w) for w in doc["metadata"].get("warnings") or [] if isinstance(w, str)] \
        if doc["metadata"].get("source") == "trace" else []
