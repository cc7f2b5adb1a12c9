"""Recompute the known-answer rows that need only the timelines, from a --planted run's records (the launch
rows and the graph case), keeping the run's other rows (which also need its plain samples) as measured:

    python benchmarks/known_answer_rows.py RUN.json RUN.records.json.gz OUT.json
"""

from __future__ import annotations

import gzip
import json
import sys

from taxes.instrument import raw_from_columns
from taxes.planted import attributed, graph_row, row
from taxes.provenance import collect


def main(rows_path: str, records_path: str, out_path: str) -> int:
    run = json.loads(open(rows_path).read())
    recs = json.loads(gzip.decompress(open(records_path, "rb").read()))

    def A(key):
        return attributed([{"raw": raw_from_columns(r), "plain": [], "comm": (), "locality_bytes": 0.0,
                             "us_per_byte": None} for r in recs[key]])

    base, spin, extra, graph = A("base"), A("spin"), A("extra"), A("graph")
    old = {r["case"]: r for r in run["rows"]}
    new_rows = []
    for r in run["rows"]:
        if r["tax"] == "graph":
            r = graph_row(extra, graph, plain_ladder=r.get("plain_planted_us", r["planted_us"]))
        elif r["tax"] == "launch" and "spin" in r["case"]:
            r = row("launch", "a host spin leaves the launch path", spin["launch_path_us"] - base["launch_path_us"],
                    spin["rows"]["launch"] - base["rows"]["launch"],
                    "the launch row with and without the spins, against the change of the launch path itself "
                    "(each call's time from its start until its kernel started, API records): a spin adds none",
                    base_launch_path_us=base["launch_path_us"], spun_launch_path_us=spin["launch_path_us"])
        new_rows.append(r)
    assert set(old) >= {r["case"] for r in new_rows} - {"a host spin leaves the launch path"}
    meta = dict(run["metadata"])
    meta["rows_recomputed"] = {"from": "this run's raw records", "by": collect().get("git_commit"),
                               "rows": ["graph", "a host spin leaves the launch path"]}
    with open(out_path, "w") as f:
        json.dump({"metadata": meta, "rows": new_rows}, f, indent=1)
    for r in new_rows:
        print(f"{r['tax']:12s} {r['case'][:42]:44s} {r['planted_us']:9.1f} {r['recovered_us']:9.1f} "
              f"{'ok' if r['ok'] else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
