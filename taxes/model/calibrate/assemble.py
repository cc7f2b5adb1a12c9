"""Figures -> profile: the calibrated HardwareProfile from every rank's readings, and its persistence.

Peaks (docs/model.md): by default a calibrated profile's peaks are the highest rate any method reached on
this machine (matrix: the fastest torch.matmul over its shapes and our Triton GEMM; HBM: the faster of
the copy and the read; peer link: the fastest of copy engine, Triton stores and loads, and NCCL at
world 2) and each efficiency is its method's rate over that peak. `peaks="datasheet"` keeps the base
profile's peaks and makes the efficiencies fractions of those. Either way efficiency x peak is the
measured rate, which is all the model's times depend on; only the floor (T_ideal) differs. A figure that
could not be measured keeps the base profile's value (for an efficiency: the base's achieved rate,
re-expressed against the new peak) and is listed as kept, with the reason.

Every rank's readings are kept in the profile (extra.calibration.readings), so a profile can be assembled
again from them; a run cut short saves each rank's readings as it goes (read_progress).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from collections import Counter
from pathlib import Path

import numpy as np

from taxes.model.calibrate.derive import derive_figures
from taxes.provenance import VERSION
from taxes.errors import TaxesError
from taxes.model.hardware import BUILTIN, HardwareProfile, profile_dirs, profile_from_dict, profile_to_dict
from taxes.files import write_atomic
from taxes.provenance import collect_metadata


def gpu_summary(names: list[str]) -> str:
    """['NVIDIA H200', 'NVIDIA H200'] -> '2 x NVIDIA H200'."""
    if not names:
        return "unknown GPUs"
    return ", ".join(f"{n} x {name}" if n > 1 else name for name, n in Counter(names).items())


def base_for_gpu(name: str) -> HardwareProfile:
    """The built-in profile a GPU's calibration starts from (h200-sxm when the name is not recognised)."""
    n = name.upper()
    for key, prof in (("H100", "h100-sxm"), ("H200", "h200-sxm"), ("MI300", "mi300x")):
        if key in n:
            return BUILTIN[prof]
    return BUILTIN["h200-sxm"]


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_profile_name(name: str) -> str:
    if not _NAME.fullmatch(name or ""):
        raise TaxesError(f"profile name {name!r}: use letters, digits, '.', '_' and '-' (64 at most), starting "
                         "with a letter or digit")
    if name in BUILTIN:
        raise TaxesError(f"profile name {name!r} is a built-in profile's; built-ins win over saved files, so choose "
                         "another (e.g. {name}-calibrated)")
    return name


class _Fields:
    """The profile's fields as they are decided: each measured (and how) or kept from the base (and why)."""

    def __init__(self, base: HardwareProfile, failed: dict, world: int):
        self.base, self.failed, self.world = base, failed, world
        self.v: dict = {}
        self.how: dict[str, str] = {}
        self.notes: list[str] = []

    def measured(self, field: str, value, what: str) -> None:
        self.v[field] = value
        self.how[field] = f"measured: {what}"

    def kept(self, field: str, why: str) -> None:
        self.v[field] = getattr(self.base, field)
        self.how[field] = f"kept from {self.base.name}: {why}"

    def rescaled(self, field: str, value, how: str, why: str) -> None:
        """A field the base profile gives relative to another one (its achieved rate, a ratio): kept so."""
        self.v[field] = value
        self.how[field] = f"kept from {self.base.name} ({how}): {why}"

    def why(self, *names: str) -> str:
        """Why nothing was measured: the first of these measurements' failures."""
        for n in names:
            if n in self.failed:
                return f"{n} {self.failed[n]}"
        return "not measured" if self.world > 1 else "one GPU: no link to measure"

    def fraction(self, rate: float, peak: float, field: str) -> float:
        """rate / peak as an efficiency in (0, 1]; above 1 (a peak below a measured rate) is clipped, said."""
        f = rate / peak
        if f > 1:
            self.notes.append(f"{field}: measured {rate:.4g} exceeds the peak {peak:.4g}; clipped to 1")
            return 1.0
        return max(f, 1e-6)


def _device(f: _Fields, ranks: list[dict]) -> None:
    sm = [r.get("device", {}).get("sm_count") for r in ranks]
    sm = [s for s in sm if isinstance(s, int) and s > 0]
    if sm:
        f.measured("sm_count", min(sm), "device properties")
    else:
        f.kept("sm_count", "no device properties")


def _matrix(f: _Fields, fig: dict, peaks: str) -> None:
    """The matrix peak, the vendor GEMM's and our GEMM's efficiencies."""
    base = f.base
    b16, f16, tri = (fig.get(k) for k in ("torch_bf16_tflops", "torch_fp16_tflops", "triton_bf16_tflops"))
    base_b16 = base.matrix_tflops.get("bf16")
    if b16 and peaks == "measured":
        best_b16 = max(b16, fig.get("torch_bf16_best_tflops") or 0)
        peak = max(best_b16, tri or 0)
        tf = {}
        for dt, old in base.matrix_tflops.items():
            if dt == "bf16":
                tf[dt] = peak
            elif dt == "fp16" and f16:
                tf[dt] = f16
            else:  # not measured: the base's ratio to bf16
                tf[dt] = old * peak / base_b16 if base_b16 else old
                f.notes.append(f"matrix_tflops[{dt}]: not measured; scaled from bf16 by the base profile's ratio")
        tf.setdefault("bf16", peak)
        best_at = fig.get("torch_bf16_best_shape", "8192^3")
        f.measured("matrix_tflops", tf, f"max of torch.matmul over its shapes (best {best_at}) and our Triton GEMM 8192^3"
                   + (", fp16 torch.matmul" if f16 else ""))
    else:
        f.kept("matrix_tflops", "datasheet peaks requested" if b16 else f.why("matmul"))
    peak_b16 = f.v["matrix_tflops"].get("bf16") or base_b16
    if b16:
        f.measured("matmul_efficiency", f.fraction(b16, peak_b16, "matmul_efficiency"), f"torch.matmul bf16 {b16:.0f} TFLOP/s")
    else:
        f.rescaled("matmul_efficiency", min(1.0, base.matmul_efficiency * base_b16 / peak_b16), "its achieved rate",
                   f.why("matmul"))
    if tri:
        f.measured("triton_matmul_efficiency", f.fraction(tri, peak_b16, "triton_matmul_efficiency"),
                   f"our Triton GEMM bf16 {tri:.0f} TFLOP/s")
    else:  # our GEMM keeps its ratio to the vendor GEMM
        f.rescaled("triton_matmul_efficiency",
                   min(1.0, base.triton_matmul_efficiency / base.matmul_efficiency * f.v["matmul_efficiency"]),
                   "its ratio to the vendor GEMM", f.why("triton_gemm"))


def _hbm(f: _Fields, fig: dict, peaks: str) -> None:
    """The HBM peak (the faster of the copy and the read) and the copy's efficiency."""
    hbm = fig.get("hbm_copy_gbps")
    if hbm and peaks == "measured":
        read = fig.get("hbm_read_gbps") or 0
        if read > hbm:
            f.measured("hbm_gbps", read, f"1 GiB read by a Triton kernel ({fig.get('hbm_read_config')}), above the copy's {hbm:.0f}")
        else:
            f.measured("hbm_gbps", hbm, "1 GiB device copy, read + write" + (f" (the read reached {read:.0f})" if read else ""))
    else:
        f.kept("hbm_gbps", "datasheet peaks requested" if hbm else f.why("hbm"))
    if hbm:
        f.measured("hbm_efficiency", f.fraction(hbm, f.v["hbm_gbps"], "hbm_efficiency"), f"device copy {hbm:.0f} GB/s")
    else:
        f.rescaled("hbm_efficiency", min(1.0, f.base.hbm_efficiency * f.base.hbm_gbps / f.v["hbm_gbps"]),
                   "its achieved rate", f.why("hbm"))


def _links(f: _Fields, fig: dict, peaks: str) -> None:
    """The peer link and injection peaks, peer stores' and NCCL's efficiencies, NCCL's latency."""
    base, world = f.base, f.world
    rates = {k: fig[k] for k in ("peer_copy_gbps", "peer_store_gbps", "peer_load_gbps", "peer_store_direct_gbps")
             if fig.get(k)}
    if world == 2 and fig.get("nccl_largest_gbps"):
        rates["nccl_largest_gbps"] = fig["nccl_largest_gbps"]
    if rates and peaks == "measured":
        best = max(rates, key=rates.get)
        f.measured("peer_link_gbps", rates[best], f"highest one-peer rate ({best.replace('_gbps', '')})")
        if fig.get("injection_copy_gbps"):
            f.measured("injection_gbps", max(fig["injection_copy_gbps"], f.v["peer_link_gbps"]), "copy to all peers at once")
        else:
            f.v["injection_gbps"] = f.v["peer_link_gbps"] * max(1.0, base.injection_gbps / base.peer_link_gbps)
            f.how["injection_gbps"] = (f"kept from {base.name} as a ratio to the peer link: "
                                       + ("2 GPUs, one peer only" if world == 2 else f.why("peer")))
    else:
        f.kept("peer_link_gbps", "datasheet peaks requested" if rates else f.why("peer", "nccl"))
        f.kept("injection_gbps", "datasheet peaks requested" if rates else f.why("peer", "nccl"))
    peer_scale = base.peer_link_gbps / f.v["peer_link_gbps"]
    if fig.get("peer_store_gbps"):
        f.measured("p2p_efficiency", f.fraction(fig["peer_store_gbps"], f.v["peer_link_gbps"], "p2p_efficiency"),
                   f"Triton kernel storing to a peer, {fig['peer_store_gbps']:.0f} GB/s")
    else:
        f.rescaled("p2p_efficiency", min(1.0, base.p2p_efficiency * peer_scale), "its achieved rate",
                   f.why("peer store", "peer"))
    inbound = min(f.v["injection_gbps"], max(world - 1, 1) * f.v["peer_link_gbps"])
    base_inbound = min(base.injection_gbps, max(world - 1, 1) * base.peer_link_gbps)
    if fig.get("nccl_gbps"):
        f.measured("collective_efficiency", f.fraction(fig["nccl_gbps"], inbound, "collective_efficiency"),
                   f"NCCL all-gather fit, {fig['nccl_gbps']:.0f} GB/s received per rank")
        f.measured("collective_base_us", fig["nccl_base_us"], "NCCL all-gather fit's latency (device time, launch hidden)")
    else:
        f.rescaled("collective_efficiency", min(1.0, base.collective_efficiency * base_inbound / inbound),
                   "its achieved rate", f.why("nccl"))
        f.kept("collective_base_us", f.why("nccl"))


def _combine(f: _Fields, fig: dict) -> None:
    """The combine kernel's loop: base + sets x per set."""
    if fig.get("combine_per_set_us") is not None:
        f.v["combine_us"] = {"base": fig["combine_base_us"], "per_set": fig["combine_per_set_us"]}
        f.how["combine_us"] = "measured: flash decode's combine kernel, 4 programs, 4 and 64 sets per row"
    else:
        f.v["combine_us"] = dict(f.base.combine_us)
        f.how["combine_us"] = f"kept from {f.base.name}: {f.why('combine')}"


def _latencies(f: _Fields, fig: dict) -> None:
    """Latencies and launch costs, each straight from its figure."""
    for field, key, what, src in (
        ("link_latency_us", "link_latency_us", "half a relaxed flag ping-pong's round trip", "pingpong"),
        ("flag_round_trip_us", "flag_round_trip_us", "ping-pong with the fused kernels' release/acquire flags", "pingpong"),
        ("launch_eager_us", "launch_eager_us", "host time per eager launch, mean of the kinds measured", "launch"),
        ("launch_graph_us", "launch_graph_us", "device time per kernel in a CUDA graph minus the floor", "launch"),
        ("kernel_floor_us", "kernel_floor_us", "device time per empty kernel back to back (the less of eager, host ahead, and in a graph)",
         "launch"),
        ("rank_skew_us", "rank_skew_us", fig.get("rank_skew_method", ""), "skew"),
    ):
        if fig.get(key) is not None:
            f.measured(field, fig[key], what)
        else:
            f.kept(field, f.why(src))


def assemble_profile(ranks: list[dict], base: HardwareProfile, meta: dict, *, name: str, peaks: str = "measured",
                     run_error: str | None = None) -> tuple[HardwareProfile, dict]:
    """The calibrated profile from every rank's readings, and the raw record kept beside it.

    meta: date (ISO), tool_version, git_commit, gpu_names, quick. Each field is measured or kept from
    `base` with the reason (raw["fields"]); see the module docstring for the peaks rule."""
    if peaks not in ("measured", "datasheet"):
        raise TaxesError(f"peaks={peaks!r}: choose measured or datasheet")
    world = max([int(r.get("world", 1)) for r in ranks] or [1])
    fig, failed = derive_figures(ranks, run_error)
    f = _Fields(base, failed, world)
    _device(f, ranks)
    _matrix(f, fig, peaks)
    _hbm(f, fig, peaks)
    _links(f, fig, peaks)
    _combine(f, fig)
    _latencies(f, fig)

    notes = f.notes
    for what in failed:
        notes.append(f"{what}: {failed[what]}")
    if fig.get("nccl_fit_rel_rms", 0) > 0.25:
        notes.append(f"the NCCL curve is far from latency + size / bandwidth (rms {fig['nccl_fit_rel_rms']:.0%}); "
                     "see nccl_curve")
    gpus = list(meta.get("gpu_names") or [r.get("device", {}).get("name", "?") for r in ranks])
    commit = (meta.get("git_commit") or "unknown-commit")[:12]
    date = str(meta.get("date") or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    source = f"calibrated on {gpu_summary(gpus)}, {date[:10]}, taxes {meta.get('tool_version', VERSION)} {commit}"
    kept_fields = {k: h for k, h in f.how.items() if h.startswith("kept")}
    curve = fig.pop("nccl_curve", [])
    curves = fig.pop("collective_curves", [])
    raw = {"world": world, "base_profile": base.name, "peaks": peaks, "quick": bool(meta.get("quick")),
           "metadata": json_clean(meta), "figures": json_clean(fig), "fields": f.how, "kept_from_base": kept_fields,
           "failed": failed, "notes": notes, "nccl_curve": json_clean(curve), "collective_curves": json_clean(curves),
           "readings": json_clean(ranks)}
    if run_error:
        raw["run_error"] = run_error
    desc = f"{gpu_summary(gpus)} calibrated by taxes calibrate{' --quick' if raw['quick'] else ''} from {base.name}"
    prof = HardwareProfile(name=name, description=desc[:200], source=source[:200], extra={"calibration": raw},
                           launch_host_us=dict(fig.get("launch_host_us") or {}), **f.v)
    return profile_from_dict(profile_to_dict(prof), origin=f"calibrated profile {name}"), raw


# ---- persistence -----------------------------------------------------------------------------------


def json_clean(x):
    """A JSON-safe copy: non-finite numbers become None, tuples lists, keys strings."""
    if isinstance(x, dict):
        return {str(k): json_clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_clean(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, (np.floating, np.integer)):
        return json_clean(x.item())
    return x


def save_profile(profile: HardwareProfile, path: str | Path | None = None) -> Path:
    """Write the profile as JSON (atomically): to `path`, or as NAME.json in the first saved-profile
    directory (TAXES_PROFILE_DIR, else ~/.config/taxes/profiles), where it then loads by name."""
    d = profile_to_dict(profile_from_dict(profile_to_dict(profile), origin=f"profile {profile.name}"))
    target = Path(path) if path else profile_dirs()[0] / f"{profile.name}.json"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, json.dumps(d, indent=1, allow_nan=False) + "\n")
    except OSError as e:
        raise TaxesError(f"{target}: cannot write the profile ({e.strerror or e})") from None
    return target


def read_progress(directory: str | Path, world: int) -> list[dict]:
    """The readings each rank saved as it went (after a run that did not finish)."""
    out = []
    for r in range(world):
        p = Path(directory) / f"rank{r}.json"
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return out


def run_metadata(quick: bool, gpu_names: list[str] | None = None, base_name: str = "") -> dict:
    """Versions, commit and date of this calibration (taxes.provenance.collect_metadata)."""
    meta = collect_metadata("calibrate", len(gpu_names or []), base_name, quick=quick)
    if gpu_names:
        meta["gpu_names"] = gpu_names
    return meta
