"""Known answers (`taxes validate --planted`): every planted case measured on a world of ranks, the rows
written as a known-answer document (and every case's raw records, to look into a row later)."""

from __future__ import annotations

import os

from taxes.model.hardware import gpu_kind
from taxes.run.machine import clock_name, gpu_name, run_world


DEFAULT_DIR = os.path.join("reports", "known_answer")


def known_answer_path(out_dir: str | None, world: int, emulate: bool) -> str:
    """Where a known-answer document goes: DIR/GPU-xWORLD.json (DIR: reports/known_answer by default)."""
    gpu = "emulated" if emulate else gpu_kind(gpu_name())
    return os.path.join(out_dir or DEFAULT_DIR, f"{gpu}-x{world}.json")


def run_planted(gpus: int, emulate: bool, iters: int, clock: str, output: str | None, timeout_s: float,
                records: str | None = None) -> tuple[list, str]:
    """Measure every planted case on `gpus` ranks; returns (rows, the file they were written to)."""
    import json

    from taxes.kernels.runtime import launch
    from taxes.run.planted import planted_heap_bytes, rank_cases
    from taxes.run.planted_answers import known_answers
    from taxes.files import write_atomic
    from taxes.provenance import collect_metadata

    world = run_world(gpus, emulate)
    opts = {"clock": clock_name(clock, emulate), "iters": iters, "warmup": 3, "late_iters": 4 * iters, "late_rounds": 8}
    if emulate:
        from taxes.run.planted import EMULATED_LATE_US, EMULATED_RUNNERS

        opts.update(late_us=EMULATED_LATE_US, runners=EMULATED_RUNNERS)
    results = launch(rank_cases, world, opts, backend="emulated" if emulate else "cuda", timeout_s=timeout_s,
                     heap_bytes=planted_heap_bytes(world, emulate))
    if not results or results[0] is None:
        return [], ""
    # the rows are made from the records as they are stored (times to the nanosecond): a rule's decision on
    # two times a nanosecond apart then comes out the same when the rows are redone from the records
    from taxes.traces.records import raw_from_columns, raw_to_columns

    stored = [{k: raw_to_columns(m["raw"]) for k, m in r.items() if isinstance(m, dict) and "raw" in m}
              for r in results]
    for r, cols in zip(results, stored):
        for k, c in cols.items():
            r[k]["raw"] = raw_from_columns(c)
    rows = known_answers(results)
    gpu = "emulated" if emulate else gpu_kind(gpu_name())
    path = output or os.path.join(DEFAULT_DIR, f"{gpu}-x{world}.json")
    meta = collect_metadata("known-answer", world, gpu, clock=opts["clock"], iterations=iters,
                            late_iterations=opts["late_iters"], late_rounds=opts["late_rounds"])
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_atomic(path, json.dumps({"metadata": meta, "rows": rows}, indent=1) + "\n")
    if records:  # every case's raw records, to look into a row later
        import gzip

        from taxes.run.planted_records import stored_facts

        recs = {k: [cols[k] | {"plain_us": list(r[k]["plain"]), "facts": stored_facts(r[k])}
                    for r, cols in zip(results, stored)]
                for k in stored[0]}
        write_atomic(records, gzip.compress(json.dumps(recs).encode(), mtime=0))
    return rows, path


def known_answer_rows(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the known answers as a table."""
    return (["tax", "case", "planted us", "recovered us", "error", "ok"],
            [[r["tax"], r["case"], f"{r['planted_us']:.1f}", f"{r['recovered_us']:.1f}",
              f"{r['error_pct']:+.1f}%" if r["error_pct"] is not None else "-", "yes" if r["ok"] else "NO"]
             for r in rows])
