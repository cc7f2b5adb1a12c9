"""Hardware profiles: the figures the cost model needs, from datasheets or from calibration.

Built-in profiles hold datasheet peaks. Figures no datasheet gives (launch costs, collective base
latency, achievable fractions of peak) are marked in the comments as measured (on a 2 x H200 node,
2026-11-22, or on one H100) or as assumed; `taxes calibrate` measures all of them on the machine at hand
and saves a profile JSON that loads here by name or path.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from taxes.errors import TaxesError
from taxes.sanitize import json_type, one_line, reject_constant

PROFILE_SCHEMA = "taxes.hardware"
PROFILE_VERSION = 1
# Launcher kinds with their own host cost: a torch op, a plain Triton kernel, a Triton kernel whose
# launcher also builds TMA descriptors (our fused GEMMs), an NCCL collective, one CUDA graph replay.
LAUNCHERS = ("torch", "triton", "triton_tma", "nccl", "graph", "sdpa")  # sdpa: PyTorch's attention call (lse op)
COMBINE_KEYS = ("base", "per_set")
MAX_PROFILE_BYTES = 16 * 1024 * 1024  # a profile with calibration curves is tens of KiB; refuse more than this
# The slowest rates a profile may state: far below any GPU's, yet high enough that a time divided by them
# stays a finite number of microseconds (1e-308 GB/s would price a GEMM at infinity).
MIN_GBPS = 0.1
MIN_TFLOPS = 0.01


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    description: str
    source: str  # "datasheet" or "calibrated ..." with where and when
    sm_count: int
    matrix_tflops: dict  # dense peak per dtype, 1e12 FLOP/s
    hbm_gbps: float  # device memory, bytes read + written per second, 1e9 B/s
    peer_link_gbps: float  # one direction, from one GPU to one peer, 1e9 B/s
    injection_gbps: float  # one direction, from one GPU to all peers together, 1e9 B/s
    link_latency_us: float  # a peer store becoming visible to the peer
    collective_base_us: float  # fixed device-side cost of one NCCL collective
    launch_eager_us: float  # host time of one eager launch (kernel or collective) from Python
    launch_graph_us: float  # per-kernel gap inside a replayed CUDA graph
    flag_round_trip_us: float  # cross-GPU flag ping-pong (signal, peer sees it, signals back)
    kernel_floor_us: float  # device duration of a kernel that does almost nothing
    rank_skew_us: float  # spread of ranks' arrival at a collective after a barrier-aligned start
    matmul_efficiency: float  # fraction of matrix peak a large vendor GEMM reaches
    triton_matmul_efficiency: float  # fraction of matrix peak our fused Triton GEMM reaches
    hbm_efficiency: float  # fraction of HBM bandwidth a large copy reaches
    collective_efficiency: float  # fraction of link bandwidth a large NCCL collective reaches
    p2p_efficiency: float  # fraction of link bandwidth a kernel's peer stores/loads reach
    extra: dict = field(default_factory=dict)  # calibration detail (curves, raw readings)
    # host time of one eager launch per launcher kind (LAUNCHERS), us; a kind not measured costs
    # launch_eager_us (profiles calibrated before this field existed have none)
    launch_host_us: dict = field(default_factory=dict)
    # device time of a combine kernel whose few programs each merge n partial sets in a loop:
    # {"base": us, "per_set": us per set} (COMBINE_KEYS); empty: unmeasured, the model charges kernel_floor_us
    combine_us: dict = field(default_factory=dict)

    def launch_us(self, kind: str) -> float:
        """Host time of one launch of this kind from Python (kinds: LAUNCHERS)."""
        return float(self.launch_host_us.get(kind, self.launch_eager_us))

    def combine_kernel_us(self, n_sets: int) -> float:
        """Device time of a combine kernel whose programs each merge n_sets partials in a loop (few
        programs: latency, not bandwidth); kernel_floor_us where the profile has no such reading."""
        if not self.combine_us:
            return self.kernel_floor_us
        return self.combine_us["base"] + n_sets * self.combine_us["per_set"]

    def peak_flops(self, dtype: str) -> float:
        if dtype not in self.matrix_tflops:
            raise TaxesError(f"hardware {self.name}: no matrix peak for dtype {dtype}")
        return self.matrix_tflops[dtype] * 1e12

    def hbm_bytes_per_us(self) -> float:
        return self.hbm_gbps * 1e3

    def inbound_bytes_per_us(self, world: int) -> float:
        """Bytes per us a rank can receive when all world-1 peers send to it at once."""
        if world <= 1:
            return math.inf
        return min(self.injection_gbps, (world - 1) * self.peer_link_gbps) * 1e3


# NVIDIA H100 Tensor Core GPU datasheet (SXM5, 2023): BF16/FP16 tensor 1,979 TFLOPS with sparsity
# (989.4 dense); HBM3 3.35 TB/s; NVLink 4 900 GB/s bidirectional per GPU (450 GB/s each way),
# reaching any peer through NVSwitch. 132 SMs: "NVIDIA H100 Tensor Core GPU Architecture" whitepaper.
H100_SXM = HardwareProfile(
    name="h100-sxm",
    description="NVIDIA H100 SXM5 80GB, NVLink 4 through NVSwitch",
    source="datasheet",
    sm_count=132,
    matrix_tflops={"bf16": 989.4, "fp16": 989.4},
    hbm_gbps=3350.0,
    peer_link_gbps=450.0,
    injection_gbps=450.0,
    link_latency_us=2.0,  # assumed: order of one NVLink store-to-visibility; calibrate measures it
    collective_base_us=27.0,  # measured (2 x H200): 32-byte NCCL all-gather 50 us minus ~23 us launch
    launch_eager_us=20.0,  # measured (2 x H200): 16 us Triton kernel, 23 us torch op
    launch_graph_us=0.9,  # measured (2 x H200): per kernel inside a CUDA graph
    flag_round_trip_us=5.0,  # assumed: two link latencies plus polling (a 32.6 us one-probe reading on H200 is suspect)
    kernel_floor_us=2.0,  # assumed: device time of a near-empty kernel
    rank_skew_us=5.0,  # assumed: launch jitter between ranks after a barrier
    matmul_efficiency=0.80,  # measured (H100): 8192^3 bf16 at 798 TFLOP/s
    triton_matmul_efficiency=0.76,  # assumed: 95% of cuBLAS, until our kernel is measured
    hbm_efficiency=0.90,  # measured (H100): device copy 3.0 TB/s
    collective_efficiency=0.63,  # measured on H200 NVLink: NCCL all-gather 1 GiB/rank, 283 GB/s
    p2p_efficiency=0.70,  # measured on H200 NVLink: Triton peer store 313 GB/s
)

# NVIDIA H200 datasheet (SXM, 2024): BF16/FP16 tensor 1,979 TFLOPS with sparsity (989.4 dense),
# HBM3e 4.8 TB/s, 141 GB, NVLink 900 GB/s bidirectional (450 GB/s each way). Same GH100 die: 132 SMs.
H200_SXM = HardwareProfile(
    name="h200-sxm",
    description="NVIDIA H200 SXM 141GB, NVLink 4",
    source="datasheet",
    sm_count=132,
    matrix_tflops={"bf16": 989.4, "fp16": 989.4},
    hbm_gbps=4800.0,
    peer_link_gbps=450.0,
    injection_gbps=450.0,
    link_latency_us=2.0,  # assumed: order of one NVLink store-to-visibility; calibrate measures it
    collective_base_us=27.0,  # measured (2 x H200): 32-byte NCCL all-gather 50 us minus ~23 us launch
    launch_eager_us=20.0,  # measured (2 x H200): 16 us Triton kernel, 23 us torch op
    launch_graph_us=0.9,  # measured (2 x H200): per kernel inside a CUDA graph
    flag_round_trip_us=5.0,  # assumed (a 32.6 us one-probe reading is suspect)
    kernel_floor_us=2.0,  # assumed: device time of a near-empty kernel
    rank_skew_us=5.0,  # assumed: launch jitter between ranks after a barrier
    matmul_efficiency=0.79,  # measured (2 x H200): cuBLAS bf16 8192^3 at 779 TFLOP/s
    triton_matmul_efficiency=0.75,  # assumed: 95% of cuBLAS, until our kernel is measured
    hbm_efficiency=0.875,  # measured (2 x H200): device-to-device copy 4200 GB/s
    collective_efficiency=0.63,  # measured (2 x H200): NCCL all-gather 1 GiB/rank in 3.8 ms, 283 GB/s received
    p2p_efficiency=0.70,  # measured (2 x H200): Triton kernel storing to a peer, 313 GB/s
)

# AMD Instinct MI300X data sheet and CDNA 3 white paper (2023): BF16/FP16 dense 1,307.4 TFLOPS,
# HBM3 5.3 TB/s, 304 CUs; 7 Infinity Fabric links of 128 GB/s bidirectional, one to each peer of an
# 8-GPU platform: 64 GB/s each way to one peer, 448 GB/s each way to all seven.
MI300X = HardwareProfile(
    name="mi300x",
    description="AMD Instinct MI300X 192GB, Infinity Fabric full mesh of 8",
    source="datasheet",
    sm_count=304,
    matrix_tflops={"bf16": 1307.4, "fp16": 1307.4},
    hbm_gbps=5300.0,
    peer_link_gbps=64.0,
    injection_gbps=448.0,
    link_latency_us=2.0,  # assumed
    collective_base_us=30.0,  # assumed: RCCL small-message all-gather of the same order as NCCL's
    launch_eager_us=20.0,  # assumed: as measured on NVIDIA H200
    launch_graph_us=1.5,  # assumed: HIP graphs replay somewhat slower per node than CUDA graphs
    flag_round_trip_us=5.0,  # assumed
    kernel_floor_us=3.0,  # assumed
    rank_skew_us=5.0,  # assumed
    matmul_efficiency=0.55,  # assumed: hipBLASLt large bf16 GEMMs reach about half of peak
    triton_matmul_efficiency=0.50,  # assumed
    hbm_efficiency=0.80,  # assumed
    collective_efficiency=0.60,  # assumed
    p2p_efficiency=0.60,  # assumed
)

# What the datasheet NVIDIA profiles below (A100, H800, B200) take from the H100 and H200 we measured, for
# want of their own measurements: latencies, launch costs and the efficiencies no datasheet states.
NVIDIA_ASSUMED = dict(
    link_latency_us=2.0,  # assumed, as for H100
    collective_base_us=27.0,  # assumed, as measured for H100/H200
    launch_eager_us=20.0,  # assumed, as measured for H100/H200
    launch_graph_us=0.9,  # assumed, as measured for H100/H200
    flag_round_trip_us=5.0,  # assumed
    kernel_floor_us=2.0,  # assumed
    rank_skew_us=5.0,  # assumed
    hbm_efficiency=0.90,  # assumed, as measured for H100
    collective_efficiency=0.63,  # assumed, as measured for H200
    p2p_efficiency=0.70,  # assumed, as measured for H200
)

# NVIDIA A100 Tensor Core GPU datasheet (2021), SXM4 80GB: BF16/FP16 tensor 312 TFLOPS dense (624 with
# sparsity), HBM2e 2,039 GB/s, NVLink 3 600 GB/s bidirectional (300 GB/s each way); 108 SMs (A100 whitepaper).
A100_SXM = HardwareProfile(
    name="a100-sxm",
    description="NVIDIA A100 SXM4 80GB, NVLink 3 through NVSwitch",
    source="datasheet",
    sm_count=108,
    matrix_tflops={"bf16": 312.0, "fp16": 312.0},
    hbm_gbps=2039.0,
    peer_link_gbps=300.0,
    injection_gbps=300.0,
    **NVIDIA_ASSUMED,
    matmul_efficiency=0.80,  # assumed, as measured for H100
    triton_matmul_efficiency=0.75,  # assumed
)

# NVIDIA H800 SXM5 (the H100 die with NVLink limited to 400 GB/s bidirectional, 200 GB/s each way): BF16/FP16
# tensor 989.4 TFLOPS dense, HBM3 3.35 TB/s, 132 SMs (NVIDIA H800 product brief, 2023).
H800_SXM = HardwareProfile(
    name="h800-sxm",
    description="NVIDIA H800 SXM5 80GB, NVLink 400 GB/s",
    source="datasheet",
    sm_count=132,
    matrix_tflops={"bf16": 989.4, "fp16": 989.4},
    hbm_gbps=3350.0,
    peer_link_gbps=200.0,
    injection_gbps=200.0,
    **NVIDIA_ASSUMED,
    matmul_efficiency=0.80,  # assumed, as measured for H100
    triton_matmul_efficiency=0.76,  # assumed, as for H100
)

# NVIDIA DGX B200 datasheet (2024), per GPU (the system's figures / 8): FP16/BF16 tensor 4.5 PFLOPS with
# sparsity (2,250 dense), HBM3e 8 TB/s (64 TB/s per system), NVLink 5 1.8 TB/s bidirectional (900 GB/s each
# way); 148 SMs.
B200 = HardwareProfile(
    name="b200",
    description="NVIDIA B200 180GB, NVLink 5 through NVSwitch",
    source="datasheet",
    sm_count=148,
    matrix_tflops={"bf16": 2250.0, "fp16": 2250.0},
    hbm_gbps=8000.0,
    peer_link_gbps=900.0,
    injection_gbps=900.0,
    **NVIDIA_ASSUMED,
    matmul_efficiency=0.75,  # assumed
    triton_matmul_efficiency=0.70,  # assumed
)

BUILTIN = {p.name: p for p in (A100_SXM, H100_SXM, H800_SXM, H200_SXM, B200, MI300X)}
# A GPU's name as drivers report it (and traces record it) -> the built-in profile that describes it; names
# this table does not know (PCIe and NVL boards, other memory sizes) get no profile: the caller asks for one.
GPU_PROFILES = (
    (r"\bA100[- ](SXM4?[- ]80GB|PG509)", "a100-sxm"),
    (r"\bH100 80GB HBM3\b|\bH100[- ]SXM", "h100-sxm"),
    (r"\bH800\b(?!.*PCIe)", "h800-sxm"),
    (r"\bH200\b(?!.*NVL)", "h200-sxm"),
    (r"\bB200\b", "b200"),
    (r"\bMI300X\b", "mi300x"),
)


def profile_for_gpu(gpu_name: str) -> str | None:
    """The built-in profile for a GPU name a trace or driver reports, None when none fits."""
    import re

    for pattern, name in GPU_PROFILES:
        if re.search(pattern, gpu_name or ""):
            return name
    return None
def gpu_kind(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100': the name of a GPU kind in file and profile names."""
    import re

    for kind in ("H100", "H200", "H800", "H20", "A100", "B200", "B100", "GB200", "MI300X", "MI325X", "L40S"):
        if kind in (name or "").upper().replace(" ", ""):
            return kind.lower()
    return re.sub(r"[^a-z0-9]+", "-", (name or "").lower()).strip("-")[:32] or "gpu"


def calibrated_name(gpu_name: str, world: int) -> str:
    """The name a calibration of `world` GPUs named gpu_name is saved and loaded under: KIND-xWORLD-calibrated."""
    return f"{gpu_kind(gpu_name)}-x{world}-calibrated"


def profile_kind(profile: "HardwareProfile") -> str | None:
    """The GPU kind a profile describes (h100, h200, ...), from its name or description; None when unknown."""
    import re

    for text in (profile.name, profile.description):
        m = re.match(r"(?:nvidia |amd )?([a-z]+\d+[a-z]*)", (text or "").lower())
        if m and gpu_kind(m.group(1)) == m.group(1):
            return m.group(1)
    return None


def machine_profile(gpu_name: str | None, world: int, given: str | None = None) -> tuple["HardwareProfile", str, str | None]:
    """The hardware profile for a run on `world` GPUs named gpu_name: `given` when the user named one (a
    warning when it describes another GPU), else a calibration saved for this GPU kind and world
    (calibrated_name), else the built-in profile for the GPU's name, else h200-sxm with a warning.
    Returns (profile, why it was chosen, warning or None); the profile's name loads it again."""
    kind = gpu_kind(gpu_name) if gpu_name else None
    if given:
        hw = get_profile(given)
        pk = profile_kind(hw)
        warn = None
        if kind and pk and pk != kind:
            warn = f"hardware profile {hw.name} describes {pk.upper()}, but this machine's GPU is {gpu_name}"
        return hw, "given (--hardware)", warn
    if not gpu_name:
        return BUILTIN["h200-sxm"], "no GPU: the default h200-sxm", None
    cal = calibrated_name(gpu_name, world)
    if cal in saved_profiles():
        return get_profile(cal), f"calibrated for {world} x {kind.upper()} ({cal})", None
    builtin = profile_for_gpu(gpu_name)
    if builtin:
        return BUILTIN[builtin], f"built-in for {gpu_name} (no {cal} saved)", None
    return BUILTIN["h200-sxm"], "unknown GPU: the default h200-sxm", \
        f"no profile describes {gpu_name}: priced as h200-sxm; calibrate one with `taxes calibrate`"


_NUMBER_FIELDS = [f.name for f in fields(HardwareProfile) if f.type in ("float", "int")]
_FRACTIONS = [n for n in _NUMBER_FIELDS if n.endswith("_efficiency")]


def profile_dirs() -> list[Path]:
    """Where saved (calibrated) profiles are looked up by name, first hit wins: TAXES_PROFILE_DIR, the
    user's saved profiles, then the calibrations committed to a checkout
    (reports/calibration of the working directory, and of the checkout taxes runs from)."""
    dirs = []
    if os.environ.get("TAXES_PROFILE_DIR"):
        dirs.append(Path(os.environ["TAXES_PROFILE_DIR"]))
    dirs.append(Path.home() / ".config" / "taxes" / "profiles")
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):  # taxes/model/ -> the checkout
        if (root / "reports" / "calibration").is_dir() and root / "reports" / "calibration" not in dirs:
            dirs.append(root / "reports" / "calibration")
    return dirs


def _bad(origin: str, what: str) -> TaxesError:
    return TaxesError(one_line(f"{origin}: {what}"))


def _short(v) -> str:
    """A value for an error message: short, one line, safe for any JSON value."""
    try:
        text = json.dumps(v) if not isinstance(v, str) else repr(v)
    except (RecursionError, ValueError, TypeError):
        text = f"a {type(v).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


def _finite(v, high: float = 1e9) -> bool:
    """A JSON number within [0, high] (ints compared exactly: math.isfinite(10**400) would raise)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return 0 <= v <= high if isinstance(v, int) else math.isfinite(v) and 0 <= v <= high


def _depth(v) -> int:
    """How deeply a JSON value nests (without recursion)."""
    deepest, stack = 0, [(v, 0)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(node, dict):
            stack.extend((x, d + 1) for x in node.values())
        elif isinstance(node, list):
            stack.extend((x, d + 1) for x in node)
    return deepest


def profile_from_dict(d: dict, origin: str = "profile") -> HardwareProfile:
    """Validate a profile dictionary (from JSON); every problem is one TaxesError line."""
    if not isinstance(d, dict):
        raise _bad(origin, f"a hardware profile must be a JSON object, not {json_type(d)}")
    if d.get("schema", PROFILE_SCHEMA) != PROFILE_SCHEMA:
        raise _bad(origin, f"not a hardware profile (schema {_short(d.get('schema'))})")
    version = d.get("schema_version", PROFILE_VERSION)
    if type(version) is not int or version != PROFILE_VERSION:
        raise _bad(origin, f"hardware profile version {_short(version)} is not supported (this taxes reads version {PROFILE_VERSION})")
    names = {f.name for f in fields(HardwareProfile)}
    missing = sorted(names - set(d) - {"extra", "description", "source", "launch_host_us", "combine_us"})
    if missing:
        raise _bad(origin, f"hardware profile lacks {missing[0]}")
    for key in ("name", "description", "source"):
        if key in d and not isinstance(d[key], str):
            raise _bad(origin, f"{key} must be a string")
        if key in d and (len(d[key]) > 200 or not d[key].isprintable()):
            raise _bad(origin, f"{key} must be printable text of at most 200 characters")
    values = {}
    for name in _NUMBER_FIELDS:
        v = d[name]
        if not _finite(v):
            raise _bad(origin, f"{name}={_short(v)} must be a finite non-negative number (at most 1e9)")
        if name in _FRACTIONS and not 0 < v <= 1:
            raise _bad(origin, f"{name}={_short(v)} must be a fraction in (0, 1]")
        values[name] = v
    if values["sm_count"] < 1 or int(values["sm_count"]) != values["sm_count"]:
        raise _bad(origin, "sm_count must be a positive whole number")
    for name in ("hbm_gbps", "peer_link_gbps", "injection_gbps"):
        if values[name] < MIN_GBPS:
            raise _bad(origin, f"{name}={_short(values[name])} is too slow for a GPU's memory or link: at least "
                               f"{MIN_GBPS:g} GB/s")
    tf = d["matrix_tflops"]
    if not isinstance(tf, dict) or not tf or not all(
        isinstance(k, str) and k.isprintable() and len(k) <= 40 and _finite(v) and v >= MIN_TFLOPS for k, v in tf.items()
    ):
        raise _bad(origin, f"matrix_tflops must map dtype names to numbers from {MIN_TFLOPS:g} to 1e9 (TFLOP/s)")
    extra = d.get("extra", {})
    if not isinstance(extra, dict):
        raise _bad(origin, "extra must be an object")
    if _depth(extra) > 32:
        raise _bad(origin, "extra is nested deeper than 32 levels")
    try:
        json.dumps(extra, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        raise _bad(origin, "extra holds a value JSON cannot keep (a non-finite number, or nested too deeply?)") from None
    hosts = d.get("launch_host_us", {})
    if not isinstance(hosts, dict) or not all(k in LAUNCHERS and _finite(v) for k, v in hosts.items()):
        raise _bad(origin, f"launch_host_us must map launcher kinds ({', '.join(LAUNCHERS)}) to finite non-negative numbers")
    combine = d.get("combine_us", {})
    if not isinstance(combine, dict) or not all(k in COMBINE_KEYS and _finite(v) for k, v in combine.items()) \
            or (combine and set(combine) != set(COMBINE_KEYS)):
        raise _bad(origin, f"combine_us must be empty or map {' and '.join(COMBINE_KEYS)} to finite non-negative numbers")
    _check_schema(d, origin)
    return HardwareProfile(
        name=d["name"] if isinstance(d["name"], str) and d["name"] else "unnamed",
        launch_host_us={k: float(v) for k, v in hosts.items()},
        combine_us={k: float(v) for k, v in combine.items()},
        description=d.get("description", ""),
        source=d.get("source", "file"),
        matrix_tflops={k: float(v) for k, v in tf.items()},
        extra=extra,
        **{k: (int(v) if k == "sm_count" else float(v)) for k, v in values.items()},
    )


def _check_schema(d: dict, origin: str) -> None:
    """The published schema (taxes/schema/hardware-v1.json) after the checks above, which name the
    common faults in their own words; without jsonschema installed those checks stand alone."""
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        return
    from taxes import schema

    schema.check(d, origin, schema.HARDWARE_V1)


def profile_to_dict(profile: HardwareProfile) -> dict:
    return {"schema": PROFILE_SCHEMA, "schema_version": PROFILE_VERSION, **asdict(profile)}


def load_profile_file(path: str | Path) -> HardwareProfile:
    """Read and validate a profile JSON file (at most MAX_PROFILE_BYTES, UTF-8, no NaN/Infinity)."""
    from taxes.files import NotARegularFile, open_regular

    path = Path(path)
    origin = f"hardware profile {path}"
    try:
        if path.is_dir():
            raise _bad(origin, "cannot read it (a directory, not a profile file)")
        with open_regular(path) as f:  # a FIFO or a device is refused, never read
            raw = f.read(MAX_PROFILE_BYTES + 1)
    except NotARegularFile as e:
        raise _bad(origin, f"{e.strerror}; a hardware profile is a regular file") from None
    except OSError as e:
        raise _bad(origin, f"cannot read it ({e.strerror or e})") from None
    if len(raw) > MAX_PROFILE_BYTES:
        raise _bad(origin, f"larger than {MAX_PROFILE_BYTES >> 20} MiB; not a hardware profile")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(origin, "not a hardware profile (not UTF-8 text)") from None
    try:
        data = json.loads(text, parse_constant=reject_constant)
    except RecursionError:
        raise _bad(origin, "not valid JSON for a hardware profile (nested too deeply)") from None
    except ValueError as e:  # also: integers of more than 4300 digits (Python's int_max_str_digits)
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise _bad(origin, f"not valid JSON ({why})") from None
    return profile_from_dict(data, origin=origin)



def saved_profiles() -> dict[str, Path]:
    """Profile name (file stem) -> file. A calibration's raw readings (NAME_raw.json) are not profiles."""
    found: dict[str, Path] = {}
    for d in reversed(profile_dirs()):  # earlier directories take precedence
        if d.is_dir():
            for p in sorted(d.glob("*.json")):
                if not p.stem.endswith("_raw"):
                    found[p.stem] = p
    return found


def get_profile(name_or_path: str) -> HardwareProfile:
    """A built-in profile by name, a saved profile by name, or a profile JSON file by path."""
    if name_or_path in BUILTIN:
        return BUILTIN[name_or_path]
    saved = saved_profiles()
    if name_or_path in saved:  # named as it was loaded, so a document that names it loads it again
        return replace(load_profile_file(saved[name_or_path]), name=name_or_path)
    if name_or_path.endswith(".json") or os.path.sep in name_or_path:
        return load_profile_file(name_or_path)
    known = ", ".join([*BUILTIN, *saved])
    raise TaxesError(f"unknown hardware profile {name_or_path!r}: choose from {known}, or give a profile .json path")


def all_profiles() -> dict[str, tuple[HardwareProfile | None, str]]:
    """Every profile by name: (profile or None if it does not load, where it comes from)."""
    out: dict[str, tuple[HardwareProfile | None, str]] = {n: (p, "built-in") for n, p in BUILTIN.items()}
    for name, path in saved_profiles().items():
        try:
            out.setdefault(name, (load_profile_file(path), str(path)))
        except TaxesError:
            out.setdefault(name, (None, f"{path} (does not load)"))
    return out
