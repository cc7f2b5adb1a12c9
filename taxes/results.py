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

import datetime as _dt
import errno
import json
import math
import os
import subprocess
import sys
import tempfile
from importlib import metadata as _md
from pathlib import Path

import pandas as pd

import taxes
from taxes.errors import TaxesError
from taxes.attribute import ROWS
from taxes.model import COMPONENTS, Prediction
from taxes.workloads import WORKLOADS, shape_of

SCHEMA = "taxes.result"
SCHEMA_VERSION = 1
LABELS = ("measured", "derived", "predicted")
ROLES = ("compute", "communication", "synchronisation")
FLOOR_KEYS = ("compute_us", "hbm_us", "link_us", "ideal_us")  # what a variant's "floor" must hold
# `taxes analyze` documents: one case per trace set, workload "trace", shape {"steps": n}
TRACE_WORKLOAD = "trace"
TRACE_DIMS = ("steps",)
MAX_BYTES = 256 * 1024 * 1024  # refuse to parse result files larger than this
MAX_DIM = 1 << 40  # largest shape dimension (as make_workload accepts)
MAX_RANKS = 1 << 16  # largest world size or rank number a document may name
MAX_DEPTH = 32  # deepest nesting a document may have (taxes writes 7 levels)


# ---- metadata -------------------------------------------------------------------------------------


def _version(dist: str) -> str | None:
    try:
        return _md.version(dist)
    except _md.PackageNotFoundError:
        return None


def git_commit(path: str | Path | None = None) -> str | None:
    """The commit of the checkout `taxes` runs from, when it runs from one."""
    here = Path(path) if path else Path(taxes.__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def git_dirty(path: str | Path | None = None) -> bool | None:
    """Whether the checkout has changes git would commit (the commit alone does not say what ran)."""
    here = Path(path) if path else Path(taxes.__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None


def collect_metadata(kind: str, world_size: int, hardware_profile: str, **extra) -> dict:
    """Versions, commit, date and (when torch is already loaded with CUDA) the GPUs and their clocks."""
    from taxes.provenance import collect

    meta = {
        "kind": kind,
        "tool_version": taxes.__version__,
        **{k: v for k, v in collect().items()},
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "torch_version": _version("torch"),
        "triton_version": _version("triton"),
        "cuda_version": None,
        "nccl_version": None,
        "gpu_names": [],
        "world_size": world_size,
        "hardware_profile": hardware_profile,
        "python": sys.version.split()[0],
    }
    torch = sys.modules.get("torch")  # never import torch just for metadata: it is slow
    if torch is not None:
        meta["cuda_version"] = torch.version.cuda
        if torch.cuda.is_available():
            meta["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            try:
                meta["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:  # NCCL absent from this build
                pass
    meta.update(extra)
    return meta


# ---- building documents ---------------------------------------------------------------------------


def new_document(metadata: dict) -> dict:
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "metadata": metadata, "cases": []}


def case_entry(workload, variants: list[dict]) -> dict:
    return {"workload": workload.name, "shape": shape_of(workload), "world": workload.world,
            "dtype": workload.dtype, "variants": variants}


def summarize_samples(samples_us: list[list[float]], label: str = "measured") -> dict:
    """E2E per iteration is the slowest rank's time; report its interquartile mean (the statistic every
    view prints), median and 10th/90th percentiles."""
    from taxes.attribute import iqm

    if len({len(s) for s in samples_us}) > 1:
        raise ValueError(f"ranks have different numbers of samples: {[len(s) for s in samples_us]}")
    per_iter = [max(vals) for vals in zip(*samples_us)] if samples_us else []
    if not per_iter:
        return {"iqm": None, "median": None, "p10": None, "p90": None, "n": 0, "label": label}
    s = pd.Series(per_iter, dtype=float)
    return {"iqm": iqm(per_iter), "median": float(s.median()), "p10": float(s.quantile(0.1)),
            "p90": float(s.quantile(0.9)), "n": len(per_iter), "label": label}


NO_ROWS = ("measured with per-phase CUDA events; its rows came from attribution rules since replaced, so none "
           "are shown (its E2E and ratios stand; run `taxes profile` again to attribute it)")


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


def one_line(text: str, limit: int = 400) -> str:
    """`text` as one printable line: control characters and line breaks (which a hostile file name or
    key may hold) escaped, runs of spaces kept, long text cut."""
    out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))
    return out if len(out) <= limit else out[:limit - 3] + "..."


def _fail(origin: str, where: str, what: str):
    raise TaxesError(one_line(f"{origin}: {where}: {what}"))


def _number(v, origin, where, allow_none=False):
    if v is None and allow_none:
        return
    # ints first: math.isfinite(10**400) raises OverflowError instead of answering
    ok = not isinstance(v, bool) and (
        (isinstance(v, int) and abs(v) <= 10 ** 15) or (isinstance(v, float) and math.isfinite(v) and abs(v) <= 1e15))
    if not ok:
        _fail(origin, where, f"expected a finite number, found {_short(v)}")


def _whole(v, origin, where, low: int, high: int, what: str = "a positive whole number"):
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        _fail(origin, where, f"expected {what} (at most {high}), found {_short(v)}")


def _short(v) -> str:
    try:
        text = json.dumps(v) if not isinstance(v, (str, bytes)) else repr(v)
    except (RecursionError, ValueError, TypeError):  # nested too deeply, an int too long to print, a non-JSON type
        text = f"a {type(v).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


def json_type(v) -> str:
    """The JSON name of a parsed value's type, for messages."""
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    return {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}.get(type(v), type(v).__name__)


def _obj(v, origin, where, keys=()):
    if not isinstance(v, dict):
        _fail(origin, where, f"expected an object, found {json_type(v)}")
    for k in keys:
        if k not in v:
            _fail(origin, where, f"missing {k!r}")
    return v


def _list(v, origin, where):
    if not isinstance(v, list):
        _fail(origin, where, f"expected a list, found {json_type(v)}")
    return v


def validate(doc, origin: str = "result") -> dict:
    """Check a document's structure and values; raise one TaxesError line naming the first problem."""
    _check_depth(doc, origin)
    _obj(doc, origin, "document", ("schema", "schema_version", "metadata", "cases"))
    if doc["schema"] != SCHEMA:
        _fail(origin, "schema", f"not a taxes result document (schema {_short(doc['schema'])})")
    if type(doc["schema_version"]) is not int or doc["schema_version"] != SCHEMA_VERSION:
        _fail(origin, "schema_version", f"version {_short(doc['schema_version'])} is not supported (this taxes reads version {SCHEMA_VERSION})")
    meta = _obj(doc["metadata"], origin, "metadata", ("kind", "tool_version", "world_size", "hardware_profile"))
    if meta["kind"] not in ("profile", "model"):
        _fail(origin, "metadata.kind", f"must be profile or model, found {_short(meta['kind'])}")
    for key in ("tool_version", "hardware_profile"):
        if not isinstance(meta[key], str):
            _fail(origin, f"metadata.{key}", "expected a string")
    for key in ("git_commit", "date", "torch_version", "triton_version", "cuda_version", "nccl_version"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            _fail(origin, f"metadata.{key}", "expected a string or null")
    _whole(meta["world_size"], origin, "metadata.world_size", 1, MAX_RANKS)
    gpus = meta.get("gpu_names", [])
    if not isinstance(gpus, list) or not all(isinstance(g, str) for g in gpus):
        _fail(origin, "metadata.gpu_names", "expected a list of strings")
    for i, case in enumerate(_list(doc["cases"], origin, "cases")):
        w = f"cases[{i}]"
        _obj(case, origin, w, ("workload", "shape", "world", "dtype", "variants"))
        from_trace = case["workload"] == TRACE_WORKLOAD and meta.get("source") == "trace"
        if not isinstance(case["workload"], str) or (case["workload"] not in WORKLOADS and not from_trace):
            _fail(origin, f"{w}.workload", f"unknown workload {_short(case['workload'])}")
        shape = _obj(case["shape"], origin, f"{w}.shape")
        dims = TRACE_DIMS if from_trace else WORKLOADS[case["workload"]].dims
        for k, v in shape.items():
            if k not in dims:
                _fail(origin, f"{w}.shape", f"{case['workload']} has no dimension {_short(k)} (its dimensions: {', '.join(dims)})")
            _whole(v, origin, f"{w}.shape.{k}", 1, MAX_DIM)
        _whole(case["world"], origin, f"{w}.world", 1, MAX_RANKS)
        if not isinstance(case["dtype"], str):
            _fail(origin, f"{w}.dtype", "expected a string")
        for j, var in enumerate(_list(case["variants"], origin, f"{w}.variants")):
            _validate_variant(var, origin, f"{w}.variants[{j}]")
    _check_all_finite(doc, origin)
    return doc


def _check_depth(doc, origin: str) -> None:
    """Nothing nested deeper than MAX_DEPTH (taxes writes 7 levels): whatever later walks the document
    recursively (copies, renderers, json.dumps) cannot run out of stack."""
    stack = [(doc, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            _fail(origin, "document", f"nested deeper than {MAX_DEPTH} levels; not a result document")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def _check_all_finite(doc, origin: str) -> None:
    """No non-finite number anywhere (JSON cannot hold one; 1e999 parses as inf)."""
    stack = [(doc, "document")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict):
            stack.extend((v, f"{where}.{k}") for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(node))
        elif isinstance(node, float) and not math.isfinite(node):
            _fail(origin, where, f"expected a finite number, found {node}")


def _validate_variant(var, origin, w):
    _obj(var, origin, w, ("variant", "samples_us", "e2e_us", "phases", "components", "correctness"))
    if not isinstance(var["variant"], str) or not var["variant"]:
        _fail(origin, f"{w}.variant", "expected a variant name")
    for r, samples in enumerate(_list(var["samples_us"], origin, f"{w}.samples_us")):
        for k, v in enumerate(_list(samples, origin, f"{w}.samples_us[{r}]")):
            _number(v, origin, f"{w}.samples_us[{r}][{k}]")
    e2e = _obj(var["e2e_us"], origin, f"{w}.e2e_us", ("median", "label"))
    for k in ("median", "p10", "p90"):
        _number(e2e.get(k), origin, f"{w}.e2e_us.{k}", allow_none=True)
    if e2e["label"] not in LABELS:
        _fail(origin, f"{w}.e2e_us.label", f"must be one of {', '.join(LABELS)}")
    for k, ph in enumerate(_list(var["phases"], origin, f"{w}.phases")):
        p = f"{w}.phases[{k}]"
        _obj(ph, origin, p, ("rank", "name", "role", "start_us", "end_us", "label"))
        _whole(ph["rank"], origin, f"{p}.rank", 0, MAX_RANKS, "a rank number")
        if ph["role"] not in ROLES:
            _fail(origin, f"{p}.role", f"must be one of {', '.join(ROLES)}")
        if ph["label"] not in LABELS:
            _fail(origin, f"{p}.label", f"must be one of {', '.join(LABELS)}")
        if not isinstance(ph["name"], str):
            _fail(origin, f"{p}.name", "expected a phase name")
        _number(ph["start_us"], origin, f"{p}.start_us")
        _number(ph["end_us"], origin, f"{p}.end_us")
        if ph["end_us"] < ph["start_us"]:
            _fail(origin, p, "ends before it starts")
        if "host_bound_us" in ph:
            _number(ph["host_bound_us"], origin, f"{p}.host_bound_us")
        for c, v in _obj(ph.get("parts", {}), origin, f"{p}.parts").items():
            _number(v, origin, f"{p}.parts.{c}")
    for k, comp in enumerate(_list(var["components"], origin, f"{w}.components")):
        c = f"{w}.components[{k}]"
        _obj(comp, origin, c, ("name", "rank", "value_us", "label"))
        if not isinstance(comp["name"], str):
            _fail(origin, f"{c}.name", "expected a component name")
        if comp["rank"] is not None:
            _whole(comp["rank"], origin, f"{c}.rank", 0, MAX_RANKS, "a rank number or null")
        _number(comp["value_us"], origin, f"{c}.value_us")
        if comp["label"] not in LABELS:
            _fail(origin, f"{c}.label", f"must be one of {', '.join(LABELS)}")
    corr = _obj(var["correctness"], origin, f"{w}.correctness", ("checked",))
    if not isinstance(corr["checked"], bool) or not (corr.get("passed") is None or isinstance(corr.get("passed"), bool)):
        _fail(origin, f"{w}.correctness", "checked and passed must be true/false")
    _number(corr.get("rel_error"), origin, f"{w}.correctness.rel_error", allow_none=True)
    _number(corr.get("tolerance"), origin, f"{w}.correctness.tolerance", allow_none=True)
    if "floor" in var:
        for k, v in _obj(var["floor"], origin, f"{w}.floor", FLOOR_KEYS).items():
            _number(v, origin, f"{w}.floor.{k}")
    _obj(var.get("config", {}), origin, f"{w}.config")


# ---- load / save ----------------------------------------------------------------------------------


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def loads(text: str, origin: str = "result") -> dict:
    """Parse and validate a document (JSON text; NaN, Infinity and over-deep nesting refused)."""
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise TaxesError(one_line(f"{origin}: not a result document (nested too deeply)")) from None
    except ValueError as e:  # also: integers of more than 4300 digits (Python's int_max_str_digits)
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TaxesError(one_line(f"{origin}: not valid JSON ({why})")) from None
    return validate(doc, origin)


class BrokenGzip(ValueError):
    """A truncated or corrupt gzip stream (read_maybe_gzip)."""


def read_maybe_gzip(path: str | Path, limit: int) -> bytes:
    """The file's bytes, decompressed when it is gzip (by its magic number, whatever its name), at most
    limit + 1 of them, so a caller can refuse more and a gzip bomb stops there. OSError as open and read
    raise it; BrokenGzip for a truncated or corrupt gzip stream. (Result documents and taxes analyze's
    traces both read through here.)"""
    import gzip
    import zlib

    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        if not gz:
            return f.read(limit + 1)
        try:
            with gzip.open(f) as g:
                return g.read(limit + 1)
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise BrokenGzip(str(e)) from None


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
    except OSError as e:
        raise TaxesError(one_line(f"{path}: cannot read it ({e.strerror or e})")) from None
    if len(raw) > MAX_BYTES:
        raise TaxesError(one_line(f"{path}: more than {MAX_BYTES >> 20} MiB uncompressed; not a result document"))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TaxesError(one_line(f"{path}: not a result document (not UTF-8 text)")) from None
    return upgrade(loads(text, str(path)))


def dumps(doc: dict) -> str:
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


def write_atomic(path: str | Path, data: str | bytes, overwrite: bool = True) -> None:
    """Write to a temporary file beside the target, then rename: readers see the old file or the whole
    new one, never a part (a run killed mid-write leaves the old file, and at most a stray
    `.NAME.*.tmp` beside it). overwrite=False: raise FileExistsError if `path` exists, checked at the
    moment the file is published (a hard link, which never replaces), so two runs cannot clobber each
    other either."""
    path = Path(path)
    if not overwrite and os.path.lexists(path):
        raise FileExistsError(errno.EEXIST, "File exists", str(path))
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        try:  # keep the replaced file's permissions; a new file gets the usual 0666 & ~umask
            perm = path.stat().st_mode & 0o777
        except OSError:
            umask = os.umask(0)
            os.umask(umask)
            perm = 0o666 & ~umask
        os.chmod(tmp, perm)
        with os.fdopen(fd, mode) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            _publish_new(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _publish_new(tmp: str, path: Path) -> None:
    """Give the finished temporary file its name only if that name is free."""
    try:
        os.link(tmp, path)  # fails with FileExistsError if path exists: no check-then-write race
    except FileExistsError:
        raise
    except OSError:  # a filesystem without hard links: check, then rename (a narrow race remains)
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "File exists", str(path)) from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def write_error(path: str | Path, e: OSError) -> TaxesError:
    """The one-line error for a failed write_atomic."""
    if isinstance(e, FileExistsError):
        return TaxesError(one_line(f"{path}: already exists; pass --force to replace it (or choose another name)"))
    return TaxesError(one_line(f"{path}: cannot write it ({e.strerror or e})"))


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
    rows = [{**_case_keys(case), "variant": var["variant"], "rank": comp["rank"], "component": comp["name"],
             "value_us": comp["value_us"], "label": comp["label"]}
            for case in doc["cases"] for var in case["variants"] for comp in var["components"]]
    return pd.DataFrame(rows, columns=["workload", "shape", "world", "dtype", "variant", "rank", "component", "value_us", "label"])


def samples_frame(doc: dict) -> pd.DataFrame:
    """One row per (case, variant, rank, iteration): the measured iteration time."""
    rows = [{**_case_keys(case), "variant": var["variant"], "rank": r, "iteration": i, "time_us": t}
            for case in doc["cases"] for var in case["variants"]
            for r, samples in enumerate(var["samples_us"]) for i, t in enumerate(samples)]
    return pd.DataFrame(rows, columns=["workload", "shape", "world", "dtype", "variant", "rank", "iteration", "time_us"])


def phases_frame(doc: dict) -> pd.DataFrame:
    rows = [{**_case_keys(case), "variant": var["variant"], "rank": ph["rank"], "phase": ph["name"], "role": ph["role"],
             "start_us": ph["start_us"], "end_us": ph["end_us"], "label": ph["label"]}
            for case in doc["cases"] for var in case["variants"] for ph in var["phases"]]
    return pd.DataFrame(rows, columns=["workload", "shape", "world", "dtype", "variant", "rank", "phase", "role", "start_us", "end_us", "label"])


def summary_frame(doc: dict) -> pd.DataFrame:
    """One row per (case, variant): E2E median and spread, correctness, and the overall components."""
    rows = []
    for case in doc["cases"]:
        for var in case["variants"]:
            overall = {c["name"]: c["value_us"] for c in var["components"] if c["rank"] is None}
            e2e = var["e2e_us"]
            corr = var["correctness"]
            rows.append({**_case_keys(case), "variant": var["variant"], "e2e_us": e2e["median"], "p10_us": e2e.get("p10"),
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
