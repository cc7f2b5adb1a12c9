"""The model against measurement: per variant the E2E, per tax and per world, predicted against measured.

From measured result documents (taxes.documents.results) attributed with one hardware profile, every variant the
model predicts gives a row: measured and predicted E2E (the plain iterations' interquartile mean) with
the signed error, and per tax the measured rows' sum (the instrumented iterations, rank null: the slowest
rank's) against the prediction's, with the signed error and the tax's share of measured E2E. The measured
kernel-launch tax is the launch, host-bound and graph-gap rows together: the model's launch term is the
host's whole launch path and a graph's gaps between its kernels. The start skew (no tax) is compared too.

Summaries per world: E2E mean absolute and worst error, per tax the mean signed and absolute errors over
every row and over the rows where the tax is at least MATTERS of measured E2E. The spread over
calibrations: the same measurements predicted with every calibrated profile of a directory. Held out: a
shape no test names and no tuning table holds (held_out).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

from taxes.errors import TaxesError
from taxes.method import TAXES
from taxes.model.predict import predict
from taxes.model.steps import options_from_config
from taxes.variants import lookup
from taxes.workloads import DEFAULT_SHAPES, WORKLOADS, make_workload, parse_int

MEASURED_TAXES = {
    "bulk-synchronous": ("sync_wait", "exposed_transfer"),
    "data-locality": ("locality",),
    "kernel-launch": ("launch", "host_bound", "graph_gaps"),
}
MATTERS = 0.05  # a tax at least this share of measured E2E is one the model must get right
ROOT = Path(__file__).resolve().parents[2]  # the checkout: tests/ and kernels/*_tuned.json


def shape_text(shape: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())


def _interquartile_mean(v: dict) -> float | None:
    """A variant's measured E2E where no plain E2E is recorded: its interquartile mean (an older document
    without one: the median it records)."""
    e = v.get("e2e_us") or {}
    return e["iqm"] if e.get("iqm") is not None else e.get("median")


def _pct(predicted: float, measured: float) -> float | None:
    return 100.0 * (predicted - measured) / measured if measured > 0 else None


def validation_rows(docs: list[dict], sources: list[str] | None = None) -> list[dict]:
    """Per case and variant with a prediction and a measured E2E: measured and predicted E2E and every tax
    (and the start skew), signed errors in percent of measured; the tax's share of measured E2E; the
    document it came from (sources[i] for docs[i]) where given."""
    rows = []
    for i, doc in enumerate(docs):
        for case in doc["cases"]:
            for v in case["variants"]:
                pred = v.get("prediction")
                med = v.get("plain_e2e_us") or _interquartile_mean(v)
                if not pred or not med:
                    continue
                model_variant = pred.get("variant") or v["variant"]
                overall = {c["name"]: c["value_us"] for c in v.get("components", []) if c["rank"] is None}
                row = {"document": sources[i]} if sources else {}
                row |= {"workload": case["workload"], "shape": shape_text(case["shape"]), "world": case["world"],
                       "variant": v["variant"], "model_variant": model_variant, "measured_e2e_us": med,
                       "predicted_e2e_us": pred["e2e_us"], "e2e_error_pct": _pct(pred["e2e_us"], med)}
                parts = dict(TAXES) | {"start skew": ("start_skew",)}
                for tax, names in parts.items():
                    p = math.fsum(pred["components"].get(c, 0.0) for c in names)
                    row[f"predicted_{tax}_us"] = p
                    if overall:
                        m = math.fsum(overall.get(c, 0.0) for c in MEASURED_TAXES.get(tax, names))
                        row[f"measured_{tax}_us"] = m
                        row[f"{tax}_share_pct"] = 100.0 * m / med
                        row[f"{tax}_error_pct"] = _pct(p, m)
                        row[f"{tax}_error_us"] = p - m
                rows.append(row)
    return rows


def _stats(errors: list[float]) -> dict:
    return {"cases": len(errors), "mean_signed_error_pct": sum(errors) / len(errors),
            "mean_absolute_error_pct": sum(map(abs, errors)) / len(errors), "max_absolute_error_pct": max(map(abs, errors))}


def _worst(rows: list[dict], key: str) -> dict:
    w = max(rows, key=lambda r: abs(r[key]))
    return {k: w[k] for k in ("workload", "shape", "world", "variant")} | {"error_pct": w[key]}


def summarize(rows: list[dict]) -> dict:
    """E2E and per-tax error statistics over the rows (errors in percent of measured)."""
    e2e = [r["e2e_error_pct"] for r in rows]
    out = {"cases": len(rows), "e2e": _stats(e2e) | {"within_10_pct": sum(abs(x) <= 10 for x in e2e),
                                                    "worst": _worst(rows, "e2e_error_pct")}, "per_tax": {}}
    for tax in list(TAXES) + ["start skew"]:
        have = [r for r in rows if r.get(f"{tax}_error_pct") is not None]
        if not have:
            continue
        d = _stats([r[f"{tax}_error_pct"] for r in have])
        d["mean_signed_error_us"] = sum(r[f"{tax}_error_us"] for r in have) / len(have)
        matter = [r for r in have if r[f"{tax}_share_pct"] >= 100 * MATTERS]
        if matter:
            d["where_it_matters"] = _stats([r[f"{tax}_error_pct"] for r in matter]) | {
                "share_at_least_pct": 100 * MATTERS, "within_25_pct": sum(abs(r[f"{tax}_error_pct"]) <= 25 for r in matter),
                "worst": _worst(matter, f"{tax}_error_pct")}
        out["per_tax"][tax] = d
    return out


def per_world(rows: list[dict]) -> dict:
    """summarize() for each world the rows hold, keyed by the world as text (JSON keys)."""
    return {str(w): summarize([r for r in rows if r["world"] == w]) for w in sorted({r["world"] for r in rows})}


# ---- the same measurements, predicted with every calibration ---------------------------------------


def calibration_spread(docs: list[dict], profiles: list) -> dict:
    """Per profile, the E2E error of every row predicted with it (the measured E2E is the documents'); and
    per row its least and greatest error over the profiles. profiles: HardwareProfile objects."""
    per_profile, by_row = [], {}
    for hw in profiles:
        errors = []
        for doc in docs:
            for case in doc["cases"]:
                w = make_workload(case["workload"], case["shape"], case["world"], case["dtype"])
                for v in case["variants"]:
                    kind = lookup(v["variant"])
                    med = v.get("plain_e2e_us") or _interquartile_mean(v)
                    if kind is None or not kind.model or not med:
                        continue
                    err = _pct(predict(w, kind.model, hw, options_from_config(v.get("config"))).e2e_us, med)
                    key = (case["workload"], shape_text(case["shape"]), case["world"], v["variant"])
                    by_row.setdefault(key, []).append(err)
                    errors.append(err)
        if errors:
            per_profile.append({"profile": hw.name, "source": hw.source, "cases": len(errors),
                                "e2e_mean_absolute_error_pct": sum(map(abs, errors)) / len(errors),
                                "e2e_mean_signed_error_pct": sum(errors) / len(errors)})
    rows = [{"workload": k[0], "shape": k[1], "world": k[2], "variant": k[3], "least_error_pct": min(v),
             "greatest_error_pct": max(v)} for k, v in by_row.items()]
    return {"profiles": per_profile, "rows": rows}


# ---- held-out shapes ----------------------------------------------------------------------------------

_ASSIGN = re.compile(r"""["']?\b([A-Z][a-z]{0,2})\b["']?\s*[=:]\s*(\d+[kKmM]?)\b""")
_DEFAULTS = re.compile(r"""make_workload\(\s*[^,()]+,\s*\{\s*\}""")


def _line_shapes(line: str) -> list[dict]:
    """Shapes a line of test code names: its DIM=VALUE and "DIM": VALUE pairs (at least one), or a
    make_workload with no dimensions (the defaults)."""
    pairs = {}
    for dim, value in _ASSIGN.findall(line):
        try:
            pairs[dim] = parse_int(value, dim)
        except TaxesError:
            continue
    out = [pairs] if pairs else []
    if _DEFAULTS.search(line):
        out.append({})
    return out


def _named_by(line_shape: dict, workload: str, shape: dict) -> bool:
    """A line's dimensions, the workload's defaults filled in, are the shape (the line names only dimensions
    the workload has)."""
    cls = WORKLOADS[workload]
    if not set(line_shape) <= set(cls.dims):
        return False
    return {**DEFAULT_SHAPES[workload], **line_shape} == {d: shape[d] for d in cls.dims}


def _tuned_shapes(workload: str, shape: dict) -> list[tuple[str, dict]]:
    """(table, dims) that a tuning table would hold for this shape: the workload's own, and for tp-mlp its
    two GEMMs' (the ag-gemm at N = 2F, K = H; the gemm-rs at N = H, K = F)."""
    if workload == "tp-mlp":
        return [("ag_gemm", {"M": shape["M"], "N": 2 * shape["F"], "K": shape["H"]}),
                ("gemm_rs", {"M": shape["M"], "N": shape["H"], "K": shape["F"]})]
    return [(workload.replace("-", "_"), dict(shape))]


def _holds(entry: dict, dims: dict) -> bool:
    """A tuning-table entry holds a shape when every dimension it names is the shape's (a table keyed by
    fewer dimensions, like flash decode's without Hq, matches on those)."""
    named = [k for k in dims if k in entry]
    return bool(named) and all(entry[k] == dims[k] for k in named)


def held_out(cases: list[tuple[str, dict]], root: Path = ROOT) -> list[dict]:
    """For each (workload, shape): the test files that name it and the tuning tables that hold it; held out
    when neither does. A test names a shape when one of its lines gives its dimensions (DIM=VALUE or
    "DIM": VALUE, the workload's defaults filling the rest; a make_workload with no dimensions names the
    defaults); a tuning table (kernels/*_tuned.json) holds it when the dimensions an entry names are the
    shape's, at any world and on any GPU kind. `known` is False where the checkout has no tests/ to look in."""
    tests = sorted((root / "tests").glob("*.py"))
    lines = [(p.name, s) for p in tests for line in p.read_text(errors="replace").splitlines()
             for s in _line_shapes(line)]
    tables = {}
    for p in sorted((root / "kernels").glob("*_tuned.json")):
        try:
            doc = json.loads(p.read_text())
            tables[p.name.removesuffix("_tuned.json")] = doc.get("entries", []) + [
                e for t in doc.get("tables", []) for e in t.get("entries", [])]  # one table per GPU kind
        except (OSError, ValueError, AttributeError):
            continue
    out = []
    for workload, shape in cases:
        in_tests = sorted({name for name, s in lines if _named_by(s, workload, shape)})
        in_tuning = sorted({f"kernels/{table}_tuned.json" for table, dims in _tuned_shapes(workload, shape)
                            for e in tables.get(table, []) if _holds(e, dims)})
        out.append({"workload": workload, "shape": shape_text(shape), "in_tests": in_tests, "in_tuning_tables": in_tuning,
                    "held_out": not in_tests and not in_tuning, "known": bool(tests)})
    return out


def distinct_cases(docs: list[dict]) -> list[tuple[str, dict]]:
    seen, out = set(), []
    for doc in docs:
        for case in doc["cases"]:
            key = (case["workload"], shape_text(case["shape"]))
            if key not in seen:
                seen.add(key)
                out.append((case["workload"], dict(case["shape"])))
    return out


# ---- the profile of a measured document -------------------------------------------------------------


def document_profile(doc: dict):
    """The hardware profile to validate a document with: the one it names when that loads here, else the
    calibration saved for its GPUs and world (KIND-xWORLD-calibrated), else the built-in for its GPU.
    Returns (profile, why)."""
    from taxes.model.hardware import get_profile, machine_profile

    meta = doc.get("metadata", {})
    name = meta.get("hardware_profile")
    if isinstance(name, str) and name:
        try:
            return get_profile(name), f"named by the document ({name})"
        except TaxesError:
            pass
    gpus = meta.get("gpu_names") or []
    world = meta.get("world_size") or (doc["cases"][0]["world"] if doc.get("cases") else 1)
    hw, why, _ = machine_profile(gpus[0] if gpus else None, int(world))
    return hw, why


def calibrations_in(directory: str | Path) -> list:
    """Every hardware profile a directory holds (files that are not profiles, like raw readings, skipped)."""
    from taxes.model.hardware import load_profile_file

    d = Path(directory)
    if not d.is_dir():
        raise TaxesError(f"--each-calibration {directory}: not a directory of calibrated profiles")
    out = []
    for path in sorted(d.glob("*.json")):
        try:  # named as it loads by name: its file's stem
            out.append(dataclasses.replace(load_profile_file(path), name=path.stem))
        except TaxesError:
            continue
    if not out:
        raise TaxesError(f"--each-calibration {directory}: no hardware profile there")
    return out


def table(docs: list[dict], hw, sources: list[str] | None = None, calibrations: str | Path | None = None) -> dict:
    """The validation table of measured documents attributed and predicted with profile hw: every row, the
    summaries (all worlds and per world), the held-out list, and with `calibrations` (a directory) the
    spread of the E2E error over every profile in it."""
    rows = validation_rows(docs, sources)
    if not rows:
        raise TaxesError("validate: no variant with both a prediction and a measurement")
    summary = summarize(rows)
    out = {"hardware": hw.name, "hardware_source": hw.source, "documents": list(sources or []),
           "measured": "E2E: the plain iterations' interquartile mean; taxes: the instrumented iterations' rows "
                       "of the slowest rank (kernel-launch: launch + host_bound + graph_gaps)",
           "cases": len(rows), "e2e_mape_pct": summary["e2e"]["mean_absolute_error_pct"],
           "worst": summary["e2e"]["worst"], "summary": summary, "per_world": per_world(rows),
           "held_out": held_out(distinct_cases(docs)), "rows": rows}
    if calibrations:
        out["calibrations"] = calibration_spread(docs, calibrations_in(calibrations))
    return out


def measured_document(path: str) -> dict:
    """A document `validate --from` can judge the model by: one that holds measurements of a workload (not
    the model's own predictions, which would agree with themselves)."""
    from taxes.documents.results import TRACE_WORKLOAD, load
    from taxes.errors import TaxesError
    from taxes.sanitize import printable

    doc = load(path)
    kind = doc["metadata"].get("kind")
    if kind != "profile":
        raise TaxesError(f"--from {printable(path)}: a {kind} document holds predictions, not measurements; give "
                         "documents from taxes profile")
    if any(c["workload"] == TRACE_WORKLOAD for c in doc["cases"]):
        raise TaxesError(f"--from {printable(path)}: made from traces (taxes analyze): no workload shape for the model "
                         "to predict; give documents from taxes profile")
    return doc
