"""Documents and the command shared by the `taxes compare` tests: GPU-like noisy samples, variants and
documents built from them, and `taxes compare` run through TaxesGroup's error handling.
"""

from __future__ import annotations

import click
import numpy as np
from click.testing import CliRunner

from taxes.documents import results
from taxes.cli.compare_cmd import compare
from taxes.cli.main import TaxesGroup
from taxes.workloads import make_workload


# ---- helpers --------------------------------------------------------------------------------------


@click.group(cls=TaxesGroup)
def taxes_cli():
    """A stand-in for cli/main.py's `cli`: the same group class, with `compare` added the same way."""


taxes_cli.add_command(compare)


def run(args, env=None):
    """(exit code, stdout, stderr) of `taxes compare ARGS`."""
    res = CliRunner(env={"GITHUB_STEP_SUMMARY": None, **(env or {})}).invoke(taxes_cli, ["compare", *map(str, args)])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, res.stdout, res.stderr


def noisy_samples(rng, median_us, n_iter, ranks=2, spread=0.02, spike_rate=0.05):
    """Per-rank iteration times like a GPU's: a floor, right-skewed jitter, rare large spikes, one rank a
    little slower than the other."""
    out = []
    for r in range(ranks):
        t = median_us * (1 + 0.003 * r) * (1 + rng.gamma(2.0, spread / 2, n_iter))
        t += (rng.random(n_iter) < spike_rate) * rng.exponential(0.3 * median_us, n_iter)
        out.append([float(x) for x in t])
    return out


def variant(name, samples_us, *, passed=True, error=None, median=None, label="measured"):
    e2e = results.summarize_samples(samples_us, label) if samples_us else \
        {"median": median, "p10": None, "p90": None, "n": 0, "label": label}
    return {"variant": name, "config": {"error": error} if error else {}, "samples_us": samples_us, "e2e_us": e2e,
            "correctness": {"checked": True, "passed": passed, "rel_error": 1e-3, "tolerance": 1e-2, "reference": "fp32"},
            "phases": [], "components": []}


def document(cases):
    """cases: [(workload, shape, [variant entries])] -> a validated result document."""
    doc = results.new_document({"kind": "profile", "tool_version": "0.1.0", "world_size": 2,
                                "hardware_profile": "h200-sxm"})
    for name, shape, variants in cases:
        doc["cases"].append(results.case_entry(make_workload(name, shape, 2), variants))
    return results.validate(doc)


def two_docs(rng, slowdown, n_iter=40, spread=0.02, variants=("bsp", "fused-push")):
    """BASE and NEW: the same two cases, NEW's times `slowdown` times BASE's distribution."""
    medians = {"bsp": 300.0, "fused-push": 250.0, "bsp-graph": 280.0}
    shapes = [("ag-gemm", {"M": 2048}), ("flash-decode", {})]
    base = document([(w, s, [variant(v, noisy_samples(rng, medians[v], n_iter, spread=spread)) for v in variants])
                     for w, s in shapes])
    new = document([(w, s, [variant(v, noisy_samples(rng, medians[v] * slowdown, n_iter, spread=spread)) for v in variants])
                    for w, s in shapes])
    return base, new


def save(tmp_path, name, doc):
    path = tmp_path / name
    results.save(doc, path)
    return path


def independent_iqm(doc, case_index, variant_name):
    """The interquartile mean of per-iteration E2E (slowest rank) computed through results.samples_frame
    (pandas), not compare: sorted, a quarter (n // 4) dropped at each end, the rest averaged."""
    sf = results.samples_frame(doc)
    case = doc["cases"][case_index]
    shape = ",".join(f"{k}={v}" for k, v in case["shape"].items())
    sf = sf[(sf["workload"] == case["workload"]) & (sf["shape"] == shape) & (sf["variant"] == variant_name)]
    x = np.sort(sf.groupby("iteration")["time_us"].max().to_numpy())
    return float(x[len(x) // 4:len(x) - len(x) // 4].mean())
