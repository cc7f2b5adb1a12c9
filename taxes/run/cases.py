"""What `taxes profile` runs for each workload: inputs, the float32 reference, and the variants.

One function per workload returns a Case: input sets (rotated so small problems are not served from
L2), a reference of the first set, and build(variant) -> a runner with `phases(*inputs, traced=...)`
(the eager steps, for per-phase timing) and, for fused variants, a per-CTA trace of the last traced
call. Inputs are random; outputs are poisoned with NaN before the checked run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from taxes.method import TOLERANCE  # noqa: F401  (its callers read it from here too)
from taxes.variants import get
from taxes.workloads import AgGemm, FlashDecode, GemmRs, TpMlp, Workload

L2_BYTES = 60 << 20  # H100/H200 L2 is 50-60 MiB: three times that rotates out of it
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
@dataclass
class Case:
    inputs: list[tuple]  # input sets; run(*inputs[i]) writes the set's last tensor (the output)
    reference: torch.Tensor  # float32, of inputs[0]
    build: object  # build(variant, overrides=None) -> runner; overrides go on top of the case's configuration
    extra: dict  # facts worth recording (splits, input sets, bytes per set)


def _sets_for(bytes_per_set: float, on_gpu: bool) -> int:
    return max(1, min(4, math.ceil(3 * L2_BYTES / max(bytes_per_set, 1)))) if on_gpu else 1


def _own_rows(ctx, rows_total: int, cols: int, dtype, g: torch.Generator):
    """A symmetric rows_total x cols buffer: this rank's shard of rows random (from g), the peers' rows
    workspace, poisoned with NaN until a variant fills them."""
    buf = ctx.heap.alloc((rows_total, cols), dtype)
    buf.local.fill_(float("nan"))
    rows = rows_total // ctx.world
    buf.local[ctx.rank * rows:(ctx.rank + 1) * rows] = torch.randn(rows, cols, generator=g, device=ctx.device).to(dtype)
    return buf


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||; a NaN left in the (poisoned) output gives inf."""
    diff = (out.float() - ref).norm().item()
    return diff / max(ref.norm().item(), 1e-30) if math.isfinite(diff) else math.inf


def ag_gemm_case(ctx, w: AgGemm, wait_s: float, config_overrides: dict | None = None) -> Case:
    from taxes.kernels import ag_gemm as ag

    dtype = TORCH_DTYPES[w.dtype]
    M, N_local, K, p = w.M, w.N // w.world, w.K, w.world
    rows = M // p
    n_sets = _sets_for((M * K + K * N_local + M * N_local) * w.elt, ctx.device.type == "cuda")
    sets = []
    for s in range(n_sets):
        g = torch.Generator(device=ctx.device).manual_seed(1000 * s + 10 * ctx.rank + M + N_local + K)
        a_full = _own_rows(ctx, M, K, dtype, g)
        wl = (torch.randn(K, N_local, generator=g, device=ctx.device) / K ** 0.5).to(dtype)
        sets.append((a_full, wl, torch.empty(M, N_local, dtype=dtype, device=ctx.device)))
    ctx.barrier()
    a0, w0, _ = sets[0]
    ref = ag.reference([a0.peers[r][r * rows:(r + 1) * rows] for r in range(p)], w0)

    def build(variant: str, overrides: dict | None = None):
        cfg = None
        if get(w.name, variant).fused:
            cfg = replace(ag.tuned_config(M, w.N, K, p, variant), **{**(config_overrides or {}), **(overrides or {})})
        return ag.make_variant(ctx, variant, M, N_local, K, dtype, cfg, wait_s=wait_s)

    return Case(sets, ref, build, {"input_sets": n_sets})


def flash_decode_case(ctx, w: FlashDecode, wait_s: float, config_overrides: dict | None = None) -> Case:
    from taxes.kernels import flash_decode as fd
    from taxes.kernels.decode_local import Config, attention_partial_f32, merge_partials_f32

    dtype = TORCH_DTYPES[w.dtype]
    B, Hq, Hkv, D, S = w.B, w.Hq, w.Hkv, w.D, w.S
    n_sets = _sets_for(w.kv_bytes(), ctx.device.type == "cuda")
    q = torch.randn(B, Hq, D, generator=torch.Generator(device=ctx.device).manual_seed(B + S),
                    device=ctx.device).to(dtype)  # replicated: the same seed on every rank
    sets = []
    for s in range(n_sets):
        g = torch.Generator(device=ctx.device).manual_seed(1000 * ctx.rank + s + S)
        k = torch.randn(B, Hkv, S, D, generator=g, device=ctx.device).to(dtype)
        v = torch.randn(B, Hkv, S, D, generator=g, device=ctx.device).to(dtype)
        sets.append((q, k, v, torch.empty(B, Hq, D, dtype=dtype, device=ctx.device)))
    o, lse = attention_partial_f32(q, sets[0][1], sets[0][2])
    packed = torch.cat([o, lse[..., None]], dim=-1).contiguous()
    every = _gather(ctx, packed)
    ref = merge_partials_f32(every[..., :-1], every[..., -1])
    cfg = Config(**(config_overrides or {}))

    def build(variant: str, overrides: dict | None = None):
        return fd.FlashDecode(ctx, B, Hq, Hkv, D, S, dtype, variant, replace(cfg, **(overrides or {})), wait_s)

    return Case(sets, ref, build, {"input_sets": n_sets, "kv_bytes": w.kv_bytes()})


def gemm_rs_case(ctx, w: GemmRs, wait_s: float, config_overrides: dict | None = None) -> Case:
    """A_r (M x K/p) and W_r (K/p x N) per rank; each rank ends with its M/p rows of sum_r A_r @ W_r."""
    from taxes.kernels import gemm_rs as rs

    dtype = TORCH_DTYPES[w.dtype]
    M, N, K, p = w.M, w.N, w.K, w.world
    K_local = K // p
    n_sets = _sets_for((M * K_local + K_local * N + M * N) * w.elt, ctx.device.type == "cuda")
    sets = []
    for s in range(n_sets):
        g = torch.Generator(device=ctx.device).manual_seed(1000 * s + 10 * ctx.rank + M + N + K)
        a = ctx.heap.alloc((M, K_local), dtype)  # symmetric: the emulated reduce-scatter and torch's read peers
        a.local.copy_(torch.randn(M, K_local, generator=g, device=ctx.device).to(dtype))
        wl = (torch.randn(K_local, N, generator=g, device=ctx.device) / K ** 0.5).to(dtype)
        sets.append((a.local, wl, torch.empty(M // p, N, dtype=dtype, device=ctx.device)))
    ctx.barrier()
    parts = _gather(ctx, torch.cat([sets[0][0].flatten(), sets[0][1].flatten()]).contiguous())
    a_parts = [x[:M * K_local].view(M, K_local) for x in parts]
    w_parts = [x[M * K_local:].view(K_local, N) for x in parts]
    ref = rs.reference(a_parts, w_parts, ctx.rank)

    def build(variant: str, overrides: dict | None = None):
        # the tuned table's configuration for this shape (kernels/gemm_rs_tuned.json), overrides on top
        cfg = (replace(rs.tuned_config(M, N, K, p), **{**(config_overrides or {}), **(overrides or {})})
               if get(w.name, variant).fused else None)
        return rs.make_variant(ctx, variant, M, N, K, dtype, cfg, wait_s=wait_s)

    return Case(sets, ref, build, {"input_sets": n_sets})


def tp_mlp_case(ctx, w: TpMlp, wait_s: float, config_overrides: dict | None = None) -> Case:
    """X_r rows in an M x H symmetric buffer (the other rows workspace), W1_r (H x 2F/p: gate columns,
    then up columns) and W2_r (F/p x H) per rank; each rank ends with its M/p rows of the layer's output.
    Weights are scaled by 1/sqrt(fan-in) so Y1, Z and the output stay O(1)."""
    from taxes.kernels import ag_gemm as ag
    from taxes.kernels import gemm_rs as rs
    from taxes.kernels import tp_mlp as mlp

    dtype = TORCH_DTYPES[w.dtype]
    M, H, F, p = w.M, w.H, w.F, w.world
    rows, f_local = M // p, F // p
    mlp.split_overrides(config_overrides)  # an unknown key fails here, before any variant is built
    n_sets = _sets_for((M * H + 3 * H * f_local + rows * H) * w.elt, ctx.device.type == "cuda")
    sets = []
    for s in range(n_sets):
        g = torch.Generator(device=ctx.device).manual_seed(1000 * s + 10 * ctx.rank + M + H + F)
        x_full = _own_rows(ctx, M, H, dtype, g)
        w1 = (torch.randn(H, 2 * f_local, generator=g, device=ctx.device) / H ** 0.5).to(dtype)
        w2 = (torch.randn(f_local, H, generator=g, device=ctx.device) / F ** 0.5).to(dtype)
        sets.append((x_full, w1, w2, torch.empty(rows, H, dtype=dtype, device=ctx.device)))
    ctx.barrier()
    x0, w1_0, w2_0, _ = sets[0]
    n1 = H * 2 * f_local
    every = _gather(ctx, torch.cat([w1_0.flatten(), w2_0.flatten()]).contiguous())
    ref = mlp.reference(x0.local[ctx.rank * rows:(ctx.rank + 1) * rows], [e[:n1].view(H, 2 * f_local) for e in every],
                        [e[n1:].view(f_local, H) for e in every])
    del every

    def build(variant: str, overrides: dict | None = None):
        if not get(w.name, variant).fused:
            return mlp.make_variant(ctx, variant, M, H, F, dtype, wait_s=wait_s)
        parts = mlp.split_overrides({**(config_overrides or {}), **(overrides or {})})
        ag_cfg = replace(ag.tuned_config(M, 2 * F, H, p, "fused-push"), **parts["ag"])
        rs_cfg = replace(rs.tuned_config(M, H, F, p), **parts["rs"])  # as gemm_rs_case: the tuned table's, overridden
        return mlp.make_variant(ctx, variant, M, H, F, dtype, ag_cfg, rs_cfg, mlp.SwigluConfig(**parts["swiglu"]),
                                wait_s=wait_s)

    return Case(sets, ref, build, {"input_sets": n_sets})


def _gather(ctx, t: torch.Tensor) -> torch.Tensor:
    """Every rank's t stacked (NCCL on GPUs; the symmetric heap when emulated)."""
    if ctx.backend == "cuda":
        import torch.distributed as dist

        out = torch.empty((ctx.world,) + tuple(t.shape), dtype=t.dtype, device=t.device)
        dist.all_gather_into_tensor(out, t)
        return out
    buf = ctx.heap.alloc(tuple(t.shape), t.dtype)
    buf.local.copy_(t)
    ctx.barrier()
    out = torch.stack([b.clone() for b in buf.peers])
    ctx.barrier()
    return out


CASES = {"ag-gemm": ag_gemm_case, "flash-decode": flash_decode_case, "gemm-rs": gemm_rs_case, "tp-mlp": tp_mlp_case}


def make_case(ctx, w: Workload, wait_s: float = 5.0, config_overrides: dict | None = None) -> Case:
    return CASES[w.name](ctx, w, wait_s, config_overrides)


def checked_error(case: Case, runner) -> float:
    """One run of `runner` on the first input set, its output poisoned with NaN first: the relative error
    against the case's float32 reference (a NaN left in the output gives inf)."""
    out = case.inputs[0][-1].fill_(float("nan"))
    got = runner(*case.inputs[0][:-1], out)
    if hasattr(runner, "check"):
        runner.check()
    return rel_error(got, case.reference)


def copies_done_us(rows: list) -> tuple[int, float] | None:
    """One fused call's copiers, from its stored CTA stamps (cta_stamps' rows): (how many CTAs copied, us from
    the earliest CTA's start to the last copier's copies done); None where no CTA copied."""
    done = [r[5] for r in rows if r[5] > 0]
    if not done:
        return None
    return len(done), (max(done) - min(r[0] for r in rows)) / 1e3


def cta_stamps(runner) -> dict | None:
    """The last traced call of a fused runner, per CTA, as stored beside its waits so that any rule for the
    in-kernel wait can be read again later: {phase: [[start, end, data wait, peer wait, tiles, copies done],
    ...]} in ns, start, end and copies done from the earliest CTA's start (0: a CTA that copied nothing);
    flash decode's combine keeps [start, end, wait, 0, 0, 0]."""
    if hasattr(runner, "cta_trace_rows"):
        rows = runner.cta_trace_rows()
        name = getattr(runner, "traced_phase", "fused-gemm")
        t0 = min((r["start_ns"] for r in rows), default=0)
        return {name: [[r["start_ns"] - t0, r["end_ns"] - t0, r["data_wait_ns"], r["peer_wait_ns"], r["tiles"],
                        r["copies_done_ns"] - t0 if r["copies_done_ns"] else 0] for r in rows]}
    if hasattr(runner, "cta_trace") and getattr(runner, "fused", False):
        rows = runner.cta_trace()
        t0 = min((s for s, _, _ in rows), default=0)
        return {"fused-combine": [[s - t0, e - t0, wt, 0, 0, 0] for s, wt, e in rows]}
    return None


# ---- --config, checked before anything runs ---------------------------------------------------------

_TYPE_NAMES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,), "None": (type(None),)}
_TYPE_WORDS = {"int": "a whole number", "float": "a number", "bool": "true or false", "str": "a word"}


def config_classes(workload: str) -> dict:
    """The configuration dataclasses --config overrides for a workload: {part: class} (one part but for tp-mlp,
    whose ag., rs. and swiglu. keys go to its parts: kernels/config_keys.py)."""
    from taxes.kernels import ag_gemm as ag
    from taxes.kernels import decode_local, gemm_rs, tp_mlp

    return {"ag-gemm": {"": ag.Config}, "gemm-rs": {"": gemm_rs.Config}, "flash-decode": {"": decode_local.Config},
            "tp-mlp": dict(tp_mlp.CONFIG_PARTS)}.get(workload, {})


def check_config(workload: str, config: dict) -> None:
    """Every --config key a field of the workload's configuration and every value of the field's type (a whole
    number, a number, true/false, a word, as the field is declared): else a one-line TaxesError naming the key,
    before any rank starts."""
    from dataclasses import fields

    from taxes.errors import TaxesError
    from taxes.kernels.config_keys import route
    from taxes.sanitize import printable

    classes = config_classes(workload)
    if not config or not classes:
        return
    try:
        parts = route(workload, classes, config)
    except ValueError as e:
        raise TaxesError(printable(f"--config: {e}")) from None
    for part, values in parts.items():
        declared = {f.name: (f.type if isinstance(f.type, str) else getattr(f.type, "__name__", ""))
                    for f in fields(classes[part])}
        for key, value in values.items():
            names = declared[key].replace(" ", "").split("|")
            allowed = tuple(t for name in names for t in _TYPE_NAMES.get(name, ()))
            ok = isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)
            if allowed and not ok:
                shown = f"{part}.{key}" if part else key
                wanted = " or ".join(_TYPE_WORDS[n] for n in names if n in _TYPE_WORDS)
                raise TaxesError(f"--config {printable(shown)}={printable(str(value))}: {workload}'s {printable(shown)} "
                                 f"is {wanted}")
