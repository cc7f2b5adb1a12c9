"""The result document: what a profile (or a model run) writes and every report reads.

A versioned JSON document:

    {"schema": "taxes.result", "schema_version": 1,
     "metadata": {tool_version, git_commit, date, torch_version, triton_version, cuda_version,
                  nccl_version, gpu_names, world_size, hardware_profile, kind ("profile"|"model"), ...},
     "cases": [{"workload", "shape": {dim: int}, "world", "dtype",
                "variants": [{"variant", "config": {...},
                              "correctness": {"checked", "passed", "rel_error", "tolerance", "reference"},
                              "samples_us": [[rank 0 per-iteration times], [rank 1 ...], ...],
                              "e2e_us": {"median", "p10", "p90", "n", "label"},
                              "phases": [{"rank", "name", "role", "start_us", "end_us", "label",
                                          "host_bound_us" (optional), "parts": {component: us}}],
                              "components": [{"name", "rank" (null: overall), "value_us", "label"}]}]}]}

Every number carries a label: measured (read off a clock), derived (a measured time split by a
stated rule) or predicted (the analytical model). Times are microseconds throughout.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from taxes.errors import TaxesError
from taxes.files import BrokenGzip, NotARegularFile, read_maybe_gzip, write_atomic, write_error
from taxes.provenance import VERSION, collect_metadata
from taxes.attribution.rows import ROWS
from taxes.model.predict import COMPONENTS, Prediction
from taxes.workloads import WORKLOADS, shape_of

SCHEMA = "taxes.result"
SCHEMA_VERSION = 1
LABELS = ("measured", "derived", "predicted")
# `taxes analyze` documents: one case per trace set, workload "trace", shape {"steps": n}
TRACE_WORKLOAD = "trace"
TRACE_DIMS = ("steps",)
MAX_BYTES = 256 * 1024 * 1024  # refuse to parse result files larger than this
MAX_DEPTH = 32  # deepest nesting a document may have (taxes writes 7 levels)


# ---- building documents ---------------------------------------------------------------------------


def new_document(metadata: dict) -> dict:
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "metadata": metadata, "cases": []}


def case_entry(workload, variants: list[dict]) -> dict:
    return {"workload": workload.name, "shape": shape_of(workload), "world": workload.world,
            "dtype": workload.dtype, "variants": variants}


def summarize_samples(samples_us: list[list[float]], label: str = "measured") -> dict:
    """E2E per iteration is the slowest rank's time; report its interquartile mean (the statistic every
    view prints), median and 10th/90th percentiles. (numpy: a document may hold millions of samples.)"""
    import numpy as np

    if len({len(s) for s in samples_us}) > 1:
        raise ValueError(f"ranks have different numbers of samples: {[len(s) for s in samples_us]}")
    per_iter = np.asarray(samples_us, dtype=float).max(axis=0) if samples_us and samples_us[0] else np.zeros(0)
    if not len(per_iter):
        return {"iqm": None, "median": None, "p10": None, "p90": None, "n": 0, "label": label}
    from scipy.stats import trim_mean  # n // 4 cut at each end, as taxes.attribution.attribute.iqm

    p10, median, p90 = np.quantile(per_iter, [0.1, 0.5, 0.9])  # pandas' default: linear interpolation
    return {"iqm": float(trim_mean(per_iter, 0.25)), "median": float(median), "p10": float(p10),
            "p90": float(p90), "n": len(per_iter), "label": label}


NO_ROWS = ("measured with per-phase CUDA events; its rows came from attribution rules since replaced, so none "
           "are shown (its E2E and ratios stand; run `taxes profile` again to attribute it)")
TIMED_PLAIN = "not timed with the per-kernel clock (someone else's implementation: timed plain)"


def rows_state(v: dict) -> str:
    """Why a variant entry has rows or not: 'shown', 'older rules' (NO_ROWS), 'timed plain' (a peer: by
    design), or 'none' (it failed, or no instrumented records)."""
    att = v.get("attribution") or {}
    if att.get("available", True):
        return "shown"
    return {NO_ROWS: "older rules", TIMED_PLAIN: "timed plain"}.get(att.get("why"), "none")


def upgrade(doc: dict) -> dict:
    """A document measured before the one-timeline attribution keeps its E2E and ratios, and loses the rows
    of the older rules: each measured variant says its rows are not available (NO_ROWS)."""
    if doc.get("metadata", {}).get("kind") != "profile" or doc.get("metadata", {}).get("source") == "trace":
        return doc
    for case in doc.get("cases", []):
        older = False
        for v in case.get("variants", []):
            if "attributed_e2e_us" in v or not v.get("samples_us"):
                continue
            older = True
            v["e2e_us"] = summarize_samples(v["samples_us"], v["e2e_us"].get("label", "measured"))
            for key in ("phased_us", "cta_timeline"):
                v.pop(key, None)
            v["components"], v["phases"] = [], []
            v.update(plain_e2e_us=v["e2e_us"]["iqm"], attributed_e2e_us=None, measurement_cost_us=None)
            v["attribution"] = {"available": False, "why": NO_ROWS}
        extra = case.get("extra") or {}
        if older:  # the older rules' ladder entries went with their rows
            extra.pop("profiler_check", None)
            if "ladder" in extra:
                extra["ladder"] = {k: extra["ladder"][k] for k in ("best_fused",) if k in extra["ladder"]}
    return doc


def prediction_entry(pred: Prediction) -> dict:
    """A variant entry holding the model's prediction (no samples)."""
    return {
        "variant": pred.variant,
        "config": {},
        "correctness": {"checked": False, "passed": None, "rel_error": None, "tolerance": None, "reference": None},
        "samples_us": [],
        "e2e_us": {"median": pred.e2e_us, "p10": None, "p90": None, "n": 0, "label": "predicted"},
        "phases": [{"rank": 0, "name": ph.name, "role": ph.role, "start_us": ph.start_us, "end_us": ph.end_us,
                    "label": "predicted", "parts": ph.parts} for ph in pred.phases],
        "components": [{"name": c, "rank": None, "value_us": pred.components[c], "label": "predicted"} for c in COMPONENTS],
        "floor": {"compute_us": pred.floor.compute_us, "hbm_us": pred.floor.hbm_us, "link_us": pred.floor.link_us,
                  "ideal_us": pred.floor.ideal_us, "exposed_communication_us": pred.exposed_communication_us},
    }


def model_document(predictions: list[list[Prediction]], hardware: str, world: int) -> dict:
    doc = new_document(collect_metadata("model", world, hardware))
    for preds in predictions:
        doc["cases"].append(case_entry(preds[0].workload, [prediction_entry(p) for p in preds]))
    return doc


# ---- validation -----------------------------------------------------------------------------------
# The document's structure, types and bounds are the published JSON Schema (taxes/schema/result-v1.json);
# what a schema cannot say is checked here, after it.

from taxes.sanitize import json_type, one_line, reject_constant  # noqa: E402  (one_line stays importable from here)


def _fail(origin: str, where: str, what: str):
    raise TaxesError(one_line(f"{origin}: {where}: {what}"))


def _short(v) -> str:
    try:
        text = json.dumps(v) if not isinstance(v, (str, bytes)) else repr(v)
    except (RecursionError, ValueError, TypeError):  # nested too deeply, an int too long to print, a non-JSON type
        text = f"a {type(v).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


def validate(doc, origin: str = "result") -> dict:
    """Check a document against the schema, then what the schema cannot state; raise one TaxesError line
    naming the field ('ORIGIN: cases[0].variants[1].samples_us[0][3]: ...')."""
    from taxes import schema

    _check_depth(doc, origin)
    if not isinstance(doc, dict):
        _fail(origin, "document", f"expected an object, found {json_type(doc)}")
    if "schema" not in doc:
        _fail(origin, "document", "missing 'schema' (not a taxes result document)")
    if doc["schema"] != SCHEMA:
        _fail(origin, "schema", f"not a taxes result document (schema {_short(doc['schema'])})")
    if type(doc.get("schema_version")) is not int or doc["schema_version"] != SCHEMA_VERSION:
        _fail(origin, "schema_version", f"version {_short(doc.get('schema_version'))} is not supported (this taxes reads "
                                        f"version {SCHEMA_VERSION})")
    schema.check(doc, origin)
    meta = doc["metadata"]
    for i, case in enumerate(doc["cases"]):
        w = f"cases[{i}]"
        from_trace = case["workload"] == TRACE_WORKLOAD and meta.get("source") == "trace"
        if case["workload"] not in WORKLOADS and not from_trace:
            _fail(origin, f"{w}.workload", f"unknown workload {_short(case['workload'])}")
        dims = TRACE_DIMS if from_trace else WORKLOADS[case["workload"]].dims
        for k in case["shape"]:
            if k not in dims:
                _fail(origin, f"{w}.shape", f"{case['workload']} has no dimension {_short(k)} (its dimensions: {', '.join(dims)})")
        for j, var in enumerate(case["variants"]):
            _check_variant(var, case, origin, f"{w}.variants[{j}]")
    return doc


def _check_variant(var: dict, case: dict, origin: str, w: str) -> None:
    """What the schema cannot say about one variant."""
    samples = var["samples_us"]
    if len({len(s) for s in samples}) > 1:
        _fail(origin, f"{w}.samples_us", f"ranks hold different numbers of samples ({', '.join(str(len(s)) for s in samples)})")
    if len(samples) > case["world"]:
        _fail(origin, f"{w}.samples_us", f"{len(samples)} ranks of samples in a world of {case['world']}")
    e2e = var["e2e_us"]
    lo, mid, hi = e2e.get("p10"), e2e.get("median"), e2e.get("p90")
    if None not in (lo, mid, hi) and not (lo <= mid * (1 + 1e-9) and mid <= hi * (1 + 1e-9)):
        _fail(origin, f"{w}.e2e_us", f"p10 {lo:g} <= median {mid:g} <= p90 {hi:g} does not hold")
    for k, ph in enumerate(var["phases"]):
        if ph["end_us"] < ph["start_us"]:
            _fail(origin, f"{w}.phases[{k}]", "ends before it starts")
    for k, tl in enumerate(var.get("timelines") or []):
        for part in ("activities", "launches", "host", "windows"):
            cols = tl.get(part) or {}
            lengths = {len(v) for v in cols.values() if isinstance(v, list)}
            if len(lengths) > 1:
                _fail(origin, f"{w}.timelines[{k}].{part}", "columns of different lengths")


def _check_depth(doc, origin: str) -> None:
    """Nothing nested deeper than MAX_DEPTH (taxes writes 7 levels), so whatever later walks the document
    recursively (the schema validator, copies, renderers, json.dumps) cannot run out of stack; and no
    number anywhere that is not finite (1e999 parses as inf; NaN passes every bound of a schema)."""
    stack = [(doc, 0, "document")]
    while stack:
        node, depth, where = stack.pop()
        if depth > MAX_DEPTH:
            _fail(origin, "document", f"nested deeper than {MAX_DEPTH} levels; not a result document")
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(v, (dict, list)):
                    stack.append((v, depth + 1, f"{where}.{k}"))
                elif type(v) is float and not math.isfinite(v):
                    _fail(origin, f"{where}.{k}", f"expected a finite number, found {v}")
        elif isinstance(node, list) and node:
            numbers = _all_finite(node)
            if numbers is None:  # not all numbers: look at each
                for i, v in enumerate(node):
                    if type(v) is float and not math.isfinite(v):
                        _fail(origin, f"{where}[{i}]", f"expected a finite number, found {v}")
                stack.extend((v, depth + 1, f"{where}[{i}]") for i, v in enumerate(node) if isinstance(v, (dict, list)))
            elif not numbers:
                i = next(i for i, v in enumerate(node) if type(v) is float and not math.isfinite(v))
                _fail(origin, f"{where}[{i}]", f"expected a finite number, found {node[i]}")


def _all_finite(values: list) -> bool | None:
    """For a list of numbers only: whether every one is finite (one C-speed pass). None when the list holds
    anything else (strings, containers, null), which the caller then looks at item by item."""
    try:
        if math.isfinite(math.fsum(values)):
            return True
    except TypeError:  # not all numbers
        return None
    except (ValueError, OverflowError):  # inf - inf, or a sum beyond the largest float
        pass
    if not all(isinstance(v, (int, float)) for v in values):
        return None
    return all(type(v) is not float or math.isfinite(v) for v in values)


# ---- load / save ----------------------------------------------------------------------------------


def loads(text: str, origin: str = "result") -> dict:
    """Parse and validate a document (JSON text; NaN, Infinity and over-deep nesting refused)."""
    try:
        doc = json.loads(text, parse_constant=reject_constant)
    except RecursionError:
        raise TaxesError(one_line(f"{origin}: not a result document (nested too deeply)")) from None
    except ValueError as e:  # also: integers of more than 4300 digits (Python's int_max_str_digits)
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TaxesError(one_line(f"{origin}: not valid JSON ({why})")) from None
    return validate(doc, origin)


def load(path: str | Path) -> dict:
    """Read and validate a result document file (at most MAX_BYTES, UTF-8; gzip-compressed or not)."""
    path = Path(path)
    try:
        if path.is_dir():
            raise TaxesError(one_line(f"{path}: cannot read it (a directory, not a result document)"))
        if path.stat().st_size > MAX_BYTES:
            raise TaxesError(one_line(f"{path}: larger than {MAX_BYTES >> 20} MiB; not a result document"))
        raw = read_maybe_gzip(path, MAX_BYTES)  # a file that grew since stat(), or a gzip bomb, is still bounded
    except BrokenGzip as e:
        raise TaxesError(one_line(f"{path}: not a result document (a broken gzip file: {e})")) from None
    except NotARegularFile as e:
        raise TaxesError(one_line(f"{path}: {e.strerror}; a result document is a regular file")) from None
    except OSError as e:
        raise TaxesError(one_line(f"{path}: cannot read it ({e.strerror or e})")) from None
    if len(raw) > MAX_BYTES:
        raise TaxesError(one_line(f"{path}: more than {MAX_BYTES >> 20} MiB uncompressed; not a result document"))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TaxesError(one_line(f"{path}: not a result document (not UTF-8 text)")) from None
    doc = loads(text, str(path))
    doc.pop("report", None)  # what `taxes report --format json` added: derived, made again by whoever renders
    return upgrade(doc)


def dumps(doc: dict) -> str:
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


def save(doc: dict, path: str | Path, overwrite: bool = True) -> None:
    """Validate and write a document atomically (gzip-compressed when the name ends in .gz; load() reads
    both); overwrite=False refuses an existing file."""
    validate(doc, str(path))
    data: str | bytes = dumps(doc)
    if str(path).endswith(".gz"):
        import gzip

        data = gzip.compress(data.encode("utf-8"), mtime=0)
    try:
        write_atomic(path, data, overwrite=overwrite)
    except OSError as e:
        raise write_error(path, e) from None


def save_new(doc: dict, directory: str | Path, stem: str) -> Path:
    """Add a document to a results directory without touching what is there: DIR/STEM.json, or
    STEM-2.json, STEM-3.json, ... for the first free name (free at the moment of writing, so runs
    appending at once each get their own file). Returns the path written."""
    directory = Path(directory)
    if not directory.is_dir():
        raise TaxesError(one_line(f"{directory}: not a directory; create it first"))
    if not stem or "/" in stem or os.sep in stem or stem.startswith("."):
        raise TaxesError(one_line(f"result name {stem!r}: give a plain file name without directories"))
    validate(doc, str(directory / f"{stem}.json"))
    text = dumps(doc)
    for n in range(1, 10000):
        path = directory / (f"{stem}.json" if n == 1 else f"{stem}-{n}.json")
        try:
            write_atomic(path, text, overwrite=False)
            return path
        except FileExistsError:
            continue
        except OSError as e:
            raise write_error(path, e) from None
    raise TaxesError(one_line(f"{directory}: 9999 results named {stem} already; choose another name"))


# ---- pandas views ---------------------------------------------------------------------------------


def _case_keys(case: dict) -> dict:
    shape = ",".join(f"{k}={v}" for k, v in case["shape"].items())
    return {"workload": case["workload"], "shape": shape, "world": case["world"], "dtype": case["dtype"]}


def components_frame(doc: dict) -> pd.DataFrame:
    """One row per (case, variant, rank, component): value_us and its label. rank is None overall."""
    import pandas as pd

    rows = [{**_case_keys(case), "variant": var["variant"], "rank": comp["rank"], "component": comp["name"],
             "value_us": comp["value_us"], "label": comp["label"]}
            for case in doc["cases"] for var in case["variants"] for comp in var["components"]]
    return pd.DataFrame(rows, columns=["workload", "shape", "world", "dtype", "variant", "rank", "component", "value_us", "label"])


def samples_frame(doc: dict) -> pd.DataFrame:
    """One row per (case, variant, rank, iteration): the measured iteration time."""
    import pandas as pd

    rows = [{**_case_keys(case), "variant": var["variant"], "rank": r, "iteration": i, "time_us": t}
            for case in doc["cases"] for var in case["variants"]
            for r, samples in enumerate(var["samples_us"]) for i, t in enumerate(samples)]
    return pd.DataFrame(rows, columns=["workload", "shape", "world", "dtype", "variant", "rank", "iteration", "time_us"])


def phases_frame(doc: dict) -> pd.DataFrame:
    import pandas as pd

    rows = [{**_case_keys(case), "variant": var["variant"], "rank": ph["rank"], "phase": ph["name"], "role": ph["role"],
             "start_us": ph["start_us"], "end_us": ph["end_us"], "label": ph["label"]}
            for case in doc["cases"] for var in case["variants"] for ph in var["phases"]]
    return pd.DataFrame(rows, columns=["workload", "shape", "world", "dtype", "variant", "rank", "phase", "role", "start_us", "end_us", "label"])


def summary_frame(doc: dict) -> pd.DataFrame:
    """One row per (case, variant): E2E (the interquartile mean; a prediction, or an older document's
    median where it records no other) and its spread, correctness, and the overall components."""
    import pandas as pd

    rows = []
    for case in doc["cases"]:
        for var in case["variants"]:
            overall = {c["name"]: c["value_us"] for c in var["components"] if c["rank"] is None}
            e2e = var["e2e_us"]
            corr = var["correctness"]
            rows.append({**_case_keys(case), "variant": var["variant"], "e2e_us": e2e["iqm"] if e2e.get("iqm") is not None else e2e["median"],
                         "p10_us": e2e.get("p10"),
                         "p90_us": e2e.get("p90"), "n": e2e.get("n", 0), "label": e2e["label"],
                         "correct": corr.get("passed"), "rel_error": corr.get("rel_error"),
                         **{c: overall.get(c) for c in ROWS}})
    return pd.DataFrame(rows)


def failures(doc: dict) -> list[str]:
    """One line per variant that errored or failed its correctness check."""
    out = []
    for case in doc["cases"]:
        for v in case["variants"]:
            corr = v["correctness"]
            error = v.get("config", {}).get("error")
            if error or corr.get("passed") is False:
                shape = ",".join(f"{k}={x}" for k, x in case["shape"].items())
                out.append(f"{case['workload']} {shape} {v['variant']}: {error or 'relative error %.2e' % corr['rel_error']}")
    return out
