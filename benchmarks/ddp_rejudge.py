"""Judge a DDP known-answer run (benchmarks/ddp_known_answers.py) again by today's rules, from the traces it
kept: each case with a trace folder is analysed again (`taxes analyze` with its plain step times) and its
verdict redone as the run made it; a case whose traces were not kept keeps the verdict of the run and says so.

    python benchmarks/ddp_rejudge.py reports/known_answer/ddp-h200-x2.json \
        reports/known_answer/ddp-h200-x2-traces -o reports/known_answer/ddp-h200-x2.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ddp_known_answers as dk  # noqa: E402


def analyse(case_dir: Path) -> dict:
    """The report of `taxes analyze` over one case's rank traces, with its plain step times."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        p = subprocess.run([sys.executable, "-m", "taxes", "analyze", *sorted(map(str, case_dir.glob("rank*.json.gz"))),
                            "--plain", str(case_dir / "plain.json"), "--format", "json", "-o", str(out)],
                           capture_output=True, text=True, timeout=600)
        if p.returncode:
            raise SystemExit(f"{case_dir}: taxes analyze failed: {p.stderr.strip().splitlines()[-1:]}")
        return json.loads(out.read_text())


def rejudge(doc: dict, traces: Path) -> dict:
    meta = doc["metadata"]
    late_rank = meta["gpus"] - 1
    redone = []
    for c in doc["cases"]:
        case_dir = traces / (f"{c['late_on']}-{c['late_ms']:g}ms" if c["late_ms"] else "none")
        if not case_dir.is_dir():
            c["verdict_rules"] = "the run's (its traces were not kept)"
            if c["late_ms"] and meta.get("period", 0) and "steps" in c:  # step times need no rule
                c.setdefault("verdict", {}).update(dk.record_cost(c, meta["period"]))
                again = dk.judge_interleaved(c, late_rank, meta["period"])  # the intervals, from the stored steps
                c["verdict"].update({k: again[k] for k in ("truth_ci_us", "recovered_ci_us", "decidable",
                                                           "plain_steps", "plain_steps_needed") if k in again})
            continue
        c["verdict_at_run"] = c.get("verdict_at_run", c.get("verdict"))
        c.update(dk.analysis_of(analyse(case_dir)["trace_analysis"]))
        c["verdict"] = dk.verdict(c, doc["cases"][0], late_rank, meta.get("period", 0))
        c["verdict_rules"] = "today's, from the kept traces"
        redone.append(case_dir.name)
    meta["verdicts_redone"] = (f"{', '.join(redone)}: analysed again from the kept traces by the rules of "
                               f"docs/method.md; the other cases keep the run's verdicts") if redone else None
    return doc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("doc")
    ap.add_argument("traces")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    doc = rejudge(json.loads(Path(a.doc).read_text()), Path(a.traces))
    Path(a.output).write_text(json.dumps(doc, indent=1))
    for c in doc["cases"]:
        v = c.get("verdict", {})
        print(f"{c['late_on']:>6}:{c['late_ms']:<4g} truth {v.get('truth_us', float('nan')):8.0f} "
              f"recovered {v.get('recovered_us', float('nan')):8.0f} profiled {v.get('profiled_truth_us', float('nan')):8.0f} "
              f"truth 95% [{', '.join(f'{x:.0f}' for x in v.get('truth_ci_us') or [])}] decidable {v.get('decidable')} "
              f"named {v.get('named')} ok {v.get('ok')} rule_ok {v.get('rule_ok')} "
              f"({c.get('verdict_rules')})")


if __name__ == "__main__":
    main()
