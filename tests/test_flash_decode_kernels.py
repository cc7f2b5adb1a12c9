"""Flash decode kernels under Triton's interpreter with emulated ranks (and on GPUs when present).

Each variant is checked against float32 softmax(q k^T / sqrt(D)) v over every rank's KV, outputs
poisoned with NaN first, three calls in a row (both inbox parities, and the sentinel written back)."""

from __future__ import annotations

import json
import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import triton
from rank_jobs import flash_decode_job

from taxes.kernels import flash_decode as fd
from taxes.kernels.decode_local import (
    LOG2E,
    TUNED_FILE,
    Config,
    LocalDecode,
    attention_partial_f32,
    load_tuned,
    resolve,
    split_count,
)
from taxes.kernels.device import interpreting
from taxes.kernels.runtime import launch

pytestmark = pytest.mark.skipif(not interpreting(), reason="triton was imported before TRITON_INTERPRET was set")


CASES = [("bsp", "flag"), ("bsp-graph", "flag"), ("fused-push", "flag"), ("fused-push", "data"),
         ("fused-push-graph", "flag"), ("bsp-sdpa", "flag"), ("bsp-sdpa-graph", "flag")]


@pytest.mark.parametrize("variant,signal", [("bsp", "flag"), ("fused-push", "flag"), ("fused-push", "data")])
def test_one_split_per_group_pushes_and_packs_without_a_merge(variant, signal):
    # one split per (batch, KV head): each program writes its group's rows itself (packed for bsp, pushed
    # into both ranks' inboxes with a flag or as data for fused); both inbox parities, three calls
    results = launch(flash_decode_job, 2, variant, signal, 2, 8, 2, 64, 40, "fp16", 3, 1.0, 1, timeout_s=300)
    for errors, splits in results:
        assert splits == 1
        assert len(errors) == 3 and all(e < 1e-2 for e in errors), errors


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("variant,signal", CASES)
def test_variant_matches_float32_reference(variant, signal, world):
    # S = 40 is not a multiple of the 16-token block; 2 splits of 32 and 8 tokens (bsp-sdpa: PyTorch's
    # attention, on emulated ranks its float32 math path, then our all-gather and global combine)
    results = launch(flash_decode_job, world, variant, signal, 2, 8, 2, 64, 40, "bf16" if world == 1 else "fp16",
                     timeout_s=300)
    for errors, splits in results:
        assert splits >= 2 or variant.startswith("bsp-sdpa")
        assert len(errors) == 3 and all(e < 1e-2 for e in errors), errors


# ---- the local decode alone: one launch, the last arriver of each group merges -----------------------


def _inputs(B, Hq, Hkv, D, S, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, Hq, D, generator=g) * scale).to(torch.bfloat16)
    k = torch.randn(B, Hkv, S, D, generator=g).to(torch.bfloat16)
    v = torch.randn(B, Hkv, S, D, generator=g).to(torch.bfloat16)
    return q, k, v


LOCAL = [  # B, Hq, Hkv, D, S, config: GQA groups of 4 and 8, S not a multiple of the block, 1 to 7 splits
    (2, 8, 2, 64, 70, Config(block_n=16, splits=3)),
    (1, 16, 2, 128, 100, Config(block_n=16, splits=7)),
    (3, 8, 1, 64, 33, Config(block_n=16, splits=1)),
    (1, 16, 2, 128, 160, Config(block_n=16, splits=5, num_warps=8, evict_first=True)),
    (2, 8, 2, 64, 64, Config(block_n=16, splits=4, tma=True)),  # TMA needs S % block_n == 0
]


@pytest.mark.parametrize("B,Hq,Hkv,D,S,cfg", LOCAL, ids=[f"B{c[0]}-Hq{c[1]}-Hkv{c[2]}-D{c[3]}-S{c[4]}" for c in LOCAL])
def test_local_decode_matches_float32_reference_call_after_call(B, Hq, Hkv, D, S, cfg):
    q, k, v = _inputs(B, Hq, Hkv, D, S, seed=S + D)
    o_ref, lse_ref = attention_partial_f32(q, k, v)
    dec = LocalDecode(B, Hq, Hkv, D, S, torch.device("cpu"), cfg)
    assert dec.n_splits == cfg.splits and (dec.n_splits - 1) * dec.split_len < S <= dec.n_splits * dec.split_len
    assert dec.tma == bool(cfg.tma)
    for call in range(3):  # the arrival counters keep growing: every call must still find its last arriver
        out = torch.full((B, Hq, D), float("nan"), dtype=torch.bfloat16)
        dec(q, k, v, out)
        err = ((out.float() - o_ref).norm() / o_ref.norm()).item()
        assert err < 1e-2, (call, err)
        packed = torch.full((B * Hq, D + 1), float("nan"))
        dec.packed(q, k, v, packed)
        assert torch.allclose(packed[:, :D], o_ref.view(-1, D), atol=1e-5, rtol=1e-4)
        assert torch.allclose(packed[:, D], lse_ref.view(-1) * LOG2E, atol=1e-4)  # base 2
        # a group of one split writes its rows at once and takes no ticket
        tickets = 2 * (call + 1) * dec.n_splits if dec.n_splits > 1 else 0
        assert dec.counts.tolist() == [tickets] * (B * Hkv)


def test_local_decode_binds_one_launch_per_set_of_buffers_and_stays_right_across_them():
    B, Hq, Hkv, D, S = 1, 8, 2, 64, 64
    sets = [_inputs(B, Hq, Hkv, D, S, seed=s) for s in (1, 2)]
    dec = LocalDecode(B, Hq, Hkv, D, S, torch.device("cpu"), Config(block_n=16, splits=2, tma=True))
    outs = [torch.empty(B, Hq, D, dtype=torch.bfloat16) for _ in sets]
    for call in range(4):  # rotate the input sets, as a benchmark does
        (q, k, v), out = sets[call % 2], outs[call % 2]
        out.fill_(float("nan"))
        dec(q, k, v, out)
        o_ref, _ = attention_partial_f32(q, k, v)
        assert ((out.float() - o_ref).norm() / o_ref.norm()).item() < 1e-2, call
    assert len(dec._bound) == 2 and dec._descs.made == 4  # one binding per set; K and V descriptors per set
    k2 = sets[0][1].clone()  # new contents at a new address: a new binding, the right answer
    out = torch.full((B, Hq, D), float("nan"), dtype=torch.bfloat16)
    dec(sets[0][0], k2, sets[0][2], out)
    assert len(dec._bound) == 3
    o_ref, _ = attention_partial_f32(sets[0][0], k2, sets[0][2])
    assert ((out.float() - o_ref).norm() / o_ref.norm()).item() < 1e-2


def test_local_decode_merge_is_exact_when_one_token_dominates():
    # a query scaled up so each head's softmax is nearly one-hot, and splits whose lse differ by far more than
    # float32's exp range: the merge must rescale, not add raw exponentials
    B, Hq, Hkv, D, S = 1, 8, 1, 64, 128
    q, k, v = _inputs(B, Hq, Hkv, D, S, seed=3, scale=30.0)
    o_ref, _ = attention_partial_f32(q, k, v)
    out = torch.full((B, Hq, D), float("nan"), dtype=torch.bfloat16)
    LocalDecode(B, Hq, Hkv, D, S, torch.device("cpu"), Config(block_n=16, splits=8))(q, k, v, out)
    assert ((out.float() - o_ref).norm() / o_ref.norm()).item() < 1e-2


def test_local_decode_refuses_what_it_was_not_built_for():
    dec = LocalDecode(1, 8, 2, 64, 32, torch.device("cpu"), Config(block_n=16))
    q, k, v = _inputs(1, 8, 2, 64, 48, seed=1)
    with pytest.raises(ValueError, match="built for"):
        dec(q, k, v, torch.empty(1, 8, 64, dtype=torch.bfloat16))
    q, k, v = _inputs(1, 8, 2, 64, 32, seed=1)
    with pytest.raises(ValueError, match="contiguous"):
        dec(q, k.transpose(2, 3).contiguous().transpose(2, 3), v, torch.empty(1, 8, 64, dtype=torch.bfloat16))


# ---- the tuned table -------------------------------------------------------------------------------


def _entry(B, S, D, **kw):
    e = {"B": B, "Hkv": 8, "S": S, "D": D, "block_n": 64, "num_warps": 4, "num_stages": 3, "tma": False,
         "evict_first": False, "splits": 5, "programs_per_sm": 2, "sm_count": 132}
    return e | kw


def test_tuned_table_lookup_takes_the_nearest_shape_of_the_same_head_dim():
    table = {"entries": [_entry(1, 8192, 128, block_n=128, splits=16, programs_per_sm=1),
                         _entry(16, 131072, 128, block_n=32, splits=2),
                         _entry(4, 32768, 64, block_n=256, splits=9)]}
    cfg, splits, per = resolve(Config(), 1, 8, 8192, 128, 132, True, table)  # measured shape: its splits
    assert (cfg.block_n, splits, per) == (128, 16, 512)
    cfg, splits, per = resolve(Config(), 2, 8, 4608, 128, 132, True, table)  # between: the small entry's rule
    assert cfg.block_n == 128 and (splits, per) == (8, 640)  # one program per SM: 8 x 16 = 128 <= 132 programs
    cfg, _, _ = resolve(Config(), 8, 8, 65536, 128, 132, True, table)
    assert cfg.block_n == 32  # nearer to B=16, S=128K than to B=1, S=8K
    cfg, _, _ = resolve(Config(), 16, 8, 131072, 64, 132, True, table)
    assert cfg.block_n == 256  # the only D=64 entry, however far
    cfg, splits, _ = resolve(Config(block_n=16, splits=3), 1, 8, 8192, 128, 132, True, table)
    assert (cfg.block_n, splits) == (16, 3)  # what the caller sets wins
    cfg, splits, _ = resolve(Config(), 1, 8, 8192, 128, 4, False, table)
    assert cfg.tma is False and splits == 1  # off a GPU: no table (4 stand-in SMs, 2 per SM, 8 groups)


def test_tuned_tables_are_per_gpu_kind_and_an_unknown_gpu_takes_the_first(tmp_path):
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"tables": [{"gpu": "GPU A", "entries": [_entry(1, 8192, 128, block_n=32)]},
                                           {"gpu": "GPU B", "entries": [_entry(1, 8192, 128, block_n=128)]}]}))
    assert load_tuned(path, "GPU B")["entries"][0]["block_n"] == 128
    assert load_tuned(path, "GPU A")["entries"][0]["block_n"] == 32
    assert load_tuned(path, "GPU C")["gpu"] == "GPU A" and load_tuned(path)["gpu"] == "GPU A"
    path.write_text("not json")
    assert load_tuned(path, "GPU A") == {}


def test_committed_tuned_tables_cover_the_benchmark_shapes_with_valid_configs():
    tables = json.loads(TUNED_FILE.read_text())["tables"]
    assert len({t["gpu"] for t in tables}) == len(tables) >= 2
    for t in tables:
        assert load_tuned(gpu=t["gpu"]) == t
        entries = t["entries"]
        shapes = {(e["B"], e["S"], e["D"]) for e in entries}
        assert shapes == {(B, S, D) for B in (1, 4, 16) for S in (8192, 32768, 131072) for D in (64, 128)}
        _check_entries(entries)


def _check_entries(entries):
    for e in entries:
        assert e["block_n"] in (16, 32, 64, 128, 256) and e["num_warps"] in (2, 4, 8) and e["num_stages"] >= 1
        assert 1 <= e["splits"] <= math.ceil(e["S"] / e["block_n"]) and e["Hkv"] == 8
        assert split_count(e["S"], e["B"], e["Hkv"], e["sm_count"], e["block_n"], e["splits"])[0] == e["splits"]


@pytest.mark.slow
def test_long_sequence_head_dim_128_and_peaked_scores():
    # many splits and a query scaled up so one token dominates: the rescaling must stay exact
    results = launch(flash_decode_job, 2, "fused-push", "flag", 1, 16, 2, 128, 200, "bf16", 2, 8.0, timeout_s=300)
    for errors, splits in results:
        assert splits > 2
        assert all(e < 1e-2 for e in errors), errors


def test_split_count_never_leaves_a_split_empty():
    for S in (1, 15, 16, 17, 40, 1000, 131072):
        for B, Hkv in ((1, 8), (64, 8), (3, 1)):
            n, per = split_count(S, B, Hkv, 132, 64)
            assert per % 64 == 0 and n >= 1
            assert (n - 1) * per < S <= n * per  # every split has tokens, all tokens are covered


def test_split_count_never_starts_a_wave_beyond_the_rate():
    # a program past programs_per_sm x SMs runs in a wave of its own: the rate is a ceiling, met where it can be
    for B, Hkv, sms, pps in ((2, 8, 132, 1.0), (1, 8, 132, 1.0), (4, 8, 132, 0.9697), (3, 8, 132, 2.0), (1, 1, 4, 2.0)):
        n, _ = split_count(1 << 20, B, Hkv, sms, 64, 0, pps)
        assert n * B * Hkv <= pps * sms + 1e-6 * sms and (n + 1) * B * Hkv > pps * sms - 1e-6 * sms
    assert split_count(1 << 20, 200, 8, 132, 64, 0, 1.0)[0] == 1  # more groups than SMs: still one split each


def test_combine_math_is_safe_for_far_apart_log_sum_exps():
    # two partials whose lse differ by 200 (in log2): exp2 of the raw values would overflow float32
    o1, o2 = torch.randn(4), torch.randn(4)
    lse = torch.tensor([500.0, 300.0])
    m = lse.max()
    w = torch.exp2(lse - m)
    merged = (w[0] * o1 + w[1] * o2) / w.sum()
    assert torch.isfinite(merged).all() and torch.allclose(merged, o1, atol=1e-6)
    assert math.isfinite(float(m + torch.log2(w.sum())))


def test_pack_kernel_packs_attention_outputs_at_any_strides():
    """PyTorch's attention leaves o transposed (flash) and lse padded (efficient); the pack reads both by
    their strides, once per row: o as float32, lse times the given scale."""
    from taxes.kernels.flash_decode import pack_kernel

    B, Hkv, G, D = 2, 3, 4, 64
    g = torch.Generator().manual_seed(11)
    o = torch.randn(B, G, Hkv, D, generator=g).to(torch.bfloat16).transpose(1, 2)  # (B, Hkv, G, D), not contiguous
    lse = torch.randn(B, Hkv, G + 5, generator=g)[..., :G]  # padded rows
    dst = torch.full((B * Hkv * G * (D + 1),), float("nan"))
    R = B * Hkv * G
    pack_kernel[(triton.cdiv(R, 16),)](o, lse, dst, R, Hkv, G, *o.stride()[:3], *lse.stride(), 1.5, D=D, BLOCK_R=16)
    rows = dst.view(B, Hkv, G, D + 1)
    torch.testing.assert_close(rows[..., :D], o.float())
    torch.testing.assert_close(rows[..., D], lse * 1.5)


def test_bad_shapes_are_refused():
    class Ctx:
        world, rank, device, backend = 1, 0, torch.device("cpu"), "emulated"

    with pytest.raises(ValueError, match="not a multiple"):
        fd.FlashDecode(Ctx(), 1, 6, 4, 64, 32, torch.bfloat16, "bsp")
    with pytest.raises(ValueError, match="head dim"):
        fd.FlashDecode(Ctx(), 1, 8, 2, 96, 32, torch.bfloat16, "bsp")
    with pytest.raises(ValueError, match="unknown flash-decode variant"):
        fd.FlashDecode(Ctx(), 1, 8, 2, 64, 32, torch.bfloat16, "fused-pull")


@pytest.mark.gpu
@pytest.mark.skipif(interpreting() or not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs 2 CUDA GPUs and TRITON_INTERPRET unset")
def test_every_variant_on_two_gpus():
    for variant, signal in CASES:
        results = launch(flash_decode_job, 2, variant, signal, 4, 64, 8, 128, 4096, "bf16", backend="cuda",
                         timeout_s=300)
        assert all(e < 1e-2 for errors, _ in results for e in errors), (variant, signal, results)
