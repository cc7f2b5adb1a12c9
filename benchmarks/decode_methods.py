"""The methods benchmarks/decode_world1.py compares (its docstring says how): input sets rotated beyond L2,
PyTorch's SDPA backends as peers, ours, each checked against float32 and then timed; and every FlashDecode
variant on one rank."""

from __future__ import annotations

import math

import torch

from taxes.run.cases import rel_error
from taxes.kernels import flash_decode as fd
from taxes.kernels.decode_local import Config

HQ, HKV = 64, 8
TOLERANCE = 1e-2


def log(*a):
    print(*a, flush=True)


# ---- methods --------------------------------------------------------------------------------------


def make_sets(B, S, D, dev, l2_bytes, smoke):
    """Input sets: enough that their K and V together exceed 3 x L2 (1 off a GPU)."""
    Hq, Hkv = (8, 2) if smoke else (HQ, HKV)
    kv = 2 * B * Hkv * S * D * 2
    n = 1 if smoke else max(1, math.ceil(3 * l2_bytes / kv))
    sets = []
    for i in range(n):
        g = torch.Generator(device=dev).manual_seed(1000 * i + B + S + D)
        q = torch.randn(B, Hq, D, generator=g, device=dev).to(torch.bfloat16)
        kv_buf = torch.empty(2, B, Hkv, S, D, dtype=torch.bfloat16, device=dev)  # K and V side by side
        for half in kv_buf:
            half.copy_(torch.randn(B, Hkv, S, D, generator=g, device=dev))
        sets.append((q, kv_buf[0], kv_buf[1], torch.empty(B, Hq, D, dtype=torch.bfloat16, device=dev), kv_buf))
    return sets, kv


def sdpa_peers(sets) -> dict:
    """name -> fn(i) returning (output viewed as B x Hq x D, natural lse or None)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    B, Hq, D = sets[0][0].shape
    Hkv = sets[0][1].shape[1]
    peers = {}
    for name, be in backends.items():
        def gqa(i, be=be):
            q, k, v = sets[i][:3]
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(q.view(B, Hq, 1, D), k, v, enable_gqa=True).view(B, Hq, D), None

        def grouped(i, be=be):
            q, k, v = sets[i][:3]
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(q.view(B, Hkv, Hq // Hkv, D), k, v).reshape(B, Hq, D), None

        def lse(i, name=name):
            q, k, v = sets[i][:3]
            o, l = fd.sdpa_lse(q, k, v, name)
            return o.reshape(B, Hq, D), l.reshape(B, Hq)

        peers[name] = gqa
        peers[f"{name}-grouped"] = grouped
        peers[f"{name}-lse"] = lse
    return peers


def check_and_time(fn, sets, ref, timer, replays, min_graph_us, poison=None) -> dict:
    """Check fn on set 0 against the float32 reference (o, natural lse), then time it."""
    o_ref, lse_ref = ref
    try:
        if poison is not None:
            poison.fill_(float("nan"))
        o, lse = fn(0)
        if o.is_cuda:
            torch.cuda.synchronize()
        err = rel_error(o, o_ref)
        lse_err = None if lse is None else (lse.float().reshape(lse_ref.shape) - lse_ref).abs().max().item()
        if not err <= TOLERANCE or (lse_err is not None and not lse_err <= 1e-2):
            return {"error": f"wrong result: rel error {err:.3g}, lse max error {lse_err}", "rel_error": err}
        r = timer(lambda i: fn(i), len(sets), replays, min_graph_us=min_graph_us)
        return {"rel_error": err, "lse_abs_error": lse_err, **r}
    except Exception as e:  # a backend refusing the shape, a config that does not compile or fit
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return {"error": " ".join(f"{type(e).__name__}: {e}".split())[:300]}


def ours_fn(dec, sets):
    def fn(i):
        q, k, v, out = sets[i][:4]
        dec(q, k, v, out)
        return out, None
    return fn


def measure_ours(dec, sets, ref, timer, replays, min_graph_us) -> dict:
    """Ours: checked on a poisoned output, timed, then checked again after the replays."""
    r = check_and_time(ours_fn(dec, sets), sets, ref, timer, replays, min_graph_us, poison=sets[0][3])
    if "error" not in r:
        sets[0][3].fill_(float("nan"))
        ours_fn(dec, sets)(0)
        r["rel_error_after"] = rel_error(sets[0][3], ref[0])
        if not r["rel_error_after"] <= TOLERANCE:
            r["error"] = f"wrong after the timed replays: rel error {r['rel_error_after']:.3g}"
    r["config"] = dec.describe()
    return r


# ---- the variants of FlashDecode on one rank --------------------------------------------------------


def variants_job(ctx, B, Hq, Hkv, D, S):
    """Every FlashDecode variant at world 1 (NCCL, symmetric memory, graphs on a GPU): three calls each
    on a poisoned output, the second traced for the fused ones; the largest relative error per variant."""
    from taxes.kernels.device import interpreting

    g = torch.Generator(device=ctx.device).manual_seed(5)
    q = torch.randn(B, Hq, D, generator=g, device=ctx.device).to(torch.bfloat16)
    k = torch.randn(B, Hkv, S, D, generator=g, device=ctx.device).to(torch.bfloat16)
    v = torch.randn(B, Hkv, S, D, generator=g, device=ctx.device).to(torch.bfloat16)
    ref = fd.reference(q, [k], [v])
    out = torch.empty(B, Hq, D, dtype=torch.bfloat16, device=ctx.device)
    res = {}
    for variant in fd.VARIANTS:
        cfg = Config(block_n=16) if interpreting() else Config()
        try:
            run = fd.FlashDecode(ctx, B, Hq, Hkv, D, S, torch.bfloat16, variant, cfg)
            errs = []
            for i in range(3):
                out.fill_(float("nan"))
                run(q, k, v, out, traced=run.fused and i == 1)
                run.check()
                errs.append(rel_error(out, ref))
            res[variant] = {"max_rel_error": max(errs), "splits": run.n_splits,
                            "sdpa_backend": run.sdpa_backend, "cta_trace_rows": len(run.cta_trace()) if run.fused else None}
        except Exception as e:
            res[variant] = {"error": " ".join(f"{type(e).__name__}: {e}".split())[:300]}
    return res


def check_variants(smoke: bool) -> dict:
    from taxes.kernels.runtime import launch

    shape = (2, 8, 2, 64, 40) if smoke else (2, HQ, HKV, 128, 4096)
    try:
        return {"shape": dict(zip(("B", "Hq", "Hkv", "D", "S"), shape)),
                "results": launch(variants_job, 1, *shape, backend="emulated" if smoke else "cuda", timeout_s=240)[0]}
    except Exception as e:
        return {"error": " ".join(str(e).split())[:400]}
