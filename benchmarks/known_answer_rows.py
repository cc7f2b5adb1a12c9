"""Redo a `taxes validate --planted` run's rows from its raw records by today's rules.

The records (`--records`) hold every case's raw records and plain samples per rank; what they lack of the
single-rank cases (how long the spins took as they timed themselves, the intermediate's bytes, each rank's
copy rate) is read from the run's own rows. The rows are written back beside the run's metadata, which
then says they were redone and from what.

    python benchmarks/known_answer_rows.py reports/known_answer/h100-x2-1.json \
        reports/known_answer/h100-x2-1.records.json.gz -o reports/known_answer/h100-x2-1.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys


def facts_from_rows(rows: list[dict]) -> dict:
    """{case: {fact: value}} for the single-rank cases, from the run's rows (rank 0's figures where the rows
    keep only those)."""
    by = {r["case"]: r for r in rows}
    out: dict = {}
    spin = by.get("host spin before each launch")
    if spin:
        m = re.search(r"(\d+) spins of ([\d.]+) us", spin["method"])
        out["spin"] = {"spins_per_iteration": int(m.group(1)), "spun_us": float(m.group(2))}
    longer = by.get("a longer host spin lands in host_bound, not launch") or \
        by.get("a longer host spin leaves launch unchanged")  # its name in runs before it was judged on host_bound
    if longer:
        m = re.search(r"spins of ([\d.]+) and ([\d.]+) us", longer["method"])
        out["spin_more"] = {"spins_per_iteration": out.get("spin", {}).get("spins_per_iteration", 20),
                            "spun_us": float(m.group(2))}
    loc = by.get("one extra HBM round trip")
    if loc:
        nbytes = float(loc["bytes"])
        out["unfused"] = {"intermediate_bytes": nbytes, "locality_bytes": nbytes}
        out["fused"] = {"intermediate_bytes": 0.0, "locality_bytes": 0.0}
        per_rank = loc.get("per_rank") or [{"rank": 0, "recovered_us": loc["recovered_us"]}]
        out["us_per_byte_by_rank"] = {p["rank"]: p["recovered_us"] / nbytes for p in per_rank}
    return out


def redo(doc: dict, records: dict) -> dict:
    from taxes.run.planted_answers import known_answers
    from taxes.run.planted_records import results_from_records

    facts = facts_from_rows(doc["rows"])
    rates = facts.pop("us_per_byte_by_rank", {})
    results = results_from_records(records, facts)
    for r, res in enumerate(results):
        for key in ("unfused", "fused"):
            if key in res:
                res[key]["us_per_byte"] = rates.get(r, rates.get(0))
    rows = known_answers(results)
    meta = dict(doc["metadata"])
    meta["rows_redone"] = ("from the run's raw records and plain samples by the rules of docs/method.md; the spins' "
                           "own lengths, the intermediate's bytes and each rank's copy rate as the run's rows gave them")
    return {"metadata": meta, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("records")
    ap.add_argument("-o", "--output", default=None)
    a = ap.parse_args()
    doc = json.load(open(a.run))
    records = json.loads(gzip.decompress(open(a.records, "rb").read()))
    out = redo(doc, records)
    text = json.dumps(out, indent=1) + "\n"
    if a.output:
        with open(a.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    ok = sum(r["ok"] for r in out["rows"])
    print(f"{a.run}: {ok} of {len(out['rows'])} rows hold", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
