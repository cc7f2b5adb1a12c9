"""Workloads: shape parsing and validation, and the per-rank work each workload must do."""

from __future__ import annotations

import pytest
from _util import assert_one_line
from hypothesis import given
from hypothesis import strategies as st

from taxes.errors import TaxesError
from taxes.variants import model_names
from taxes.workloads import (
    DEFAULT_SHAPES,
    WORKLOADS,
    AgGemm,
    FlashDecode,
    GemmRs,
    make_workload,
    parse_int,
    parse_shape,
    replace_dim,
    shape_of,
    shape_text,
    workload_dict,
    workload_from_dict,
)

MODEL_VARIANTS = model_names("ag-gemm")

# ---- parsing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("M=8192,N=4096,K=1024", {"M": 8192, "N": 4096, "K": 1024}),
    ("M=8K,N=8k,K=2K", {"M": 8 * 1024, "N": 8 * 1024, "K": 2 * 1024}),
    (" M = 1M , K=3 ", {"M": 1 << 20, "K": 3}),
    ("B=1,Hq=64,Hkv=8,D=128,S=32K", {"B": 1, "Hq": 64, "Hkv": 8, "D": 128, "S": 32 * 1024}),
    ("", {}),
    ("M=16,,N=32,", {"M": 16, "N": 32}),
])
def test_parse_shape_valid(text, expected):
    assert parse_shape(text) == expected


@given(st.dictionaries(st.sampled_from(["M", "N", "K", "B", "Hq", "Hkv", "D", "S"]),
                       st.tuples(st.integers(0, 10**6), st.sampled_from(["", "k", "K", "m", "M"])), min_size=1))
def test_parse_shape_random_roundtrip(items):
    mult = {"": 1, "k": 1024, "K": 1024, "m": 1 << 20, "M": 1 << 20}
    text = ",".join(f"{k}={n}{s}" for k, (n, s) in items.items())
    assert parse_shape(text) == {k: n * mult[s] for k, (n, s) in items.items()}


@pytest.mark.parametrize("text, field", [
    ("M", "M"),  # no '='
    ("M=abc", "M"),
    ("M=1.5K", "M"),
    ("M=8G", "M"),
    ("N=", "N"),
    ("M=8,M=16", "M"),  # given twice
    ("K=8 192", "K"),
])
def test_parse_shape_malformed(text, field):
    with pytest.raises(TaxesError) as e:
        parse_shape(text)
    msg = str(e.value)
    assert_one_line(msg)
    assert msg.startswith("shape:") and field in msg


def test_parse_int_suffixes():
    assert parse_int("8K", "M") == parse_int("8k", "M") == parse_int("8192", "M") == 8 * 1024
    assert parse_int("2M", "S") == 2 * 1024 * 1024
    with pytest.raises(TaxesError, match="S"):
        parse_int("two", "S")


# ---- validation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_defaults_are_valid(name):
    w = make_workload(name, {}, 2)
    assert shape_of(w) == DEFAULT_SHAPES[name]
    assert w.world == 2 and w.dtype == "bf16"


def test_make_workload_from_parsed_suffix_shape():
    w = make_workload("ag-gemm", parse_shape("M=8K,N=4K,K=2K"), 4, "fp16")
    assert isinstance(w, AgGemm)
    assert (w.M, w.N, w.K, w.world, w.dtype) == (8192, 4096, 2048, 4, "fp16")


def test_unset_dimensions_take_defaults():
    w = make_workload("gemm-rs", {"N": 512}, 2)
    assert (w.M, w.N, w.K) == (DEFAULT_SHAPES["gemm-rs"]["M"], 512, DEFAULT_SHAPES["gemm-rs"]["K"])


@pytest.mark.parametrize("name, shape, world, dtype, field", [
    # the split dimensions must divide by the world size
    ("ag-gemm", {"M": 8190}, 4, "bf16", "M"),
    ("ag-gemm", {"N": 8190}, 4, "bf16", "N"),
    ("gemm-rs", {"M": 1023}, 2, "bf16", "M"),
    ("gemm-rs", {"K": 1023}, 2, "bf16", "K"),
    # zero / negative / not whole
    ("ag-gemm", {"M": 0}, 1, "bf16", "M"),
    ("gemm-rs", {"N": -8}, 1, "bf16", "N"),
    ("flash-decode", {"S": 0}, 2, "bf16", "S"),
    ("flash-decode", {"B": -1}, 2, "bf16", "B"),
    ("ag-gemm", {"K": 8192.0}, 2, "bf16", "K"),
    ("ag-gemm", {"K": True}, 1, "bf16", "K"),
    ("ag-gemm", {"K": (1 << 40) + 2}, 2, "bf16", "K"),
    # GQA
    ("flash-decode", {"Hq": 12, "Hkv": 8}, 2, "bf16", "Hq"),
    ("flash-decode", {"Hq": 4, "Hkv": 8}, 2, "bf16", "Hkv"),
    # dtype / world / names
    ("ag-gemm", {}, 2, "fp32", "dtype"),
    ("ag-gemm", {}, 0, "bf16", "world"),
    ("flash-decode", {}, -2, "bf16", "world"),
    ("flash-decode", {}, 2.0, "bf16", "world"),
    ("ag-gemm", {"Q": 8}, 2, "bf16", "Q"),
    ("flash-decode", {"M": 8}, 2, "bf16", "M"),
    ("all-reduce", {}, 2, "bf16", "all-reduce"),
])
def test_make_workload_rejects(name, shape, world, dtype, field):
    with pytest.raises(TaxesError) as e:
        make_workload(name, shape, world, dtype)
    msg = str(e.value)
    assert_one_line(msg)
    assert field in msg


def test_non_split_dimensions_need_not_divide():
    # ag-gemm splits M and N, never K; gemm-rs splits M and K, never N; flash-decode splits nothing.
    assert make_workload("ag-gemm", {"K": 1001}, 4).K == 1001
    assert make_workload("gemm-rs", {"N": 1001}, 4).N == 1001
    assert make_workload("flash-decode", {"B": 3, "S": 1001}, 7).S == 1001


def test_unknown_workload_lists_choices():
    with pytest.raises(TaxesError) as e:
        make_workload("agemm", {}, 2)
    for name in WORKLOADS:
        assert name in str(e.value)


@pytest.mark.parametrize("which", ["make_workload", "parse_sweep"])
def test_unknown_dimension_message_is_one_line_even_for_odd_names(which):
    from taxes.model.predict import parse_sweep

    with pytest.raises(TaxesError) as e:
        if which == "make_workload":
            make_workload("ag-gemm", parse_shape("M\nK=8"), 2)
        else:
            parse_sweep("M\nX=1:4", make_workload("ag-gemm", {}, 2))
    assert_one_line(str(e.value))


@given(st.text(max_size=40))
def test_random_shape_text_is_parsed_or_rejected_cleanly(text):
    """Any text: parse_shape + make_workload either gives a workload or a TaxesError, nothing else."""
    try:
        w = make_workload("ag-gemm", parse_shape(text), 2)
    except TaxesError as e:
        assert_one_line(str(e))
    else:
        assert w.M % 2 == 0 and w.N % 2 == 0 and min(w.M, w.N, w.K) > 0


# ---- the work per rank, against hand formulas ----------------------------------------------------


def test_ag_gemm_quantities_by_hand():
    M, N, K, p = 8192, 4096, 2048, 4
    w = make_workload("ag-gemm", {"M": M, "N": N, "K": K}, p)
    # Each rank produces an M x (N/p) block of C, each element a K-long dot product: 2 FLOPs per MAC.
    assert w.flops() == 2 * M * (N / p) * K == 2 * 8192 * 1024 * 2048
    # Essential HBM: its A shard (M/p x K), its W columns (K x N/p), its C block (M x N/p), 2 B each.
    assert w.hbm_bytes() == 2 * (2048 * 2048 + 2048 * 1024 + 8192 * 1024)
    # Over the link arrive the other 3 ranks' A shards: 3 x 2048 x 2048 x 2 B.
    assert w.link_bytes() == 3 * 2048 * 2048 * 2
    # bsp: the gathered A (8192 x 2048 bf16 = 32 MiB) is written once and read once.
    assert w.intermediate_bytes("bsp") == w.intermediate_bytes("bsp-graph") == 2 * 32 * 2**20
    # fused: only the 3 peer shards land in HBM (written by the transfer, read by the GEMM).
    assert w.intermediate_bytes("fused-pull") == w.intermediate_bytes("fused-push") == 2 * 24 * 2**20
    assert [w.kernel_count(v) for v in MODEL_VARIANTS] == [2, 2, 1, 1, 1]


def test_gemm_rs_quantities_by_hand():
    M, N, K, p = 4096, 3000, 8192, 2
    w = make_workload("gemm-rs", {"M": M, "N": N, "K": K}, p, "fp16")
    assert w.flops() == 2 * 4096 * 3000 * 4096  # the full M x N partial over a K/2 slice
    # A slice 4096 x 4096, W slice 4096 x 3000, the owned 2048 x 3000 block of C; 2 B each
    assert w.hbm_bytes() == 2 * (4096 * 4096 + 4096 * 3000 + 2048 * 3000)
    # the one peer sends this rank its partial of the owned rows: 2048 x 3000 x 2 B
    assert w.link_bytes() == 2048 * 3000 * 2
    assert w.intermediate_bytes("bsp") == 2 * (4096 * 3000 * 2)  # the whole partial written + read
    assert w.intermediate_bytes("fused-push") == 2 * (2048 * 3000 * 2)
    assert [w.kernel_count(v) for v in MODEL_VARIANTS] == [2, 2, 1, 1, 1]


def test_flash_decode_quantities_by_hand():
    B, Hq, Hkv, D, S, p = 4, 32, 8, 128, 1000, 4
    w = make_workload("flash-decode", {"B": B, "Hq": Hq, "Hkv": Hkv, "D": D, "S": S}, p)
    # q.k^T and p.v: 2 matrix-vector products of S x D per (b, query head), 2 FLOPs per MAC
    assert w.flops() == 2 * 2 * 4 * 32 * 1000 * 128
    kv = 2 * 4 * 8 * 1000 * 128 * 2  # K and V, bf16
    assert w.kv_bytes() == kv
    assert w.hbm_bytes() == kv + 2 * (4 * 32 * 128 * 2)  # + the query read and the output written
    part = 4 * 32 * (128 + 1) * 4  # fp32 output and log-sum-exp per (b, query head)
    assert w.partial_bytes() == part
    assert w.link_bytes() == 3 * part
    # bsp, one split: the split partial written + read by the local combine, the local partial written +
    # read, p partials written + read by the all-gather/combine
    assert w.intermediate_bytes("bsp") == 2 * part + 2 * part + 2 * 4 * part
    assert w.intermediate_bytes("bsp", splits=5) == 2 * 5 * part + 2 * part + 2 * 4 * part
    assert w.intermediate_bytes("fused-pull") == 2 * part + 2 * 3 * part
    assert w.intermediate_bytes("fused-push", splits=3) == 2 * 3 * part + 2 * 3 * part
    assert [w.kernel_count(v) for v in MODEL_VARIANTS] == [3, 3, 2, 2, 2]


def test_kv_splits_by_hand():
    w = make_workload("flash-decode", {"B": 1, "Hkv": 8, "Hq": 64, "S": 32768}, 2)
    assert w.kv_splits(132) == 33  # ceil(2 * 132 / 8): fill 132 SMs about twice
    assert make_workload("flash-decode", {"B": 1, "Hkv": 8, "Hq": 8, "S": 100}, 2).kv_splits(132) == 2  # ceil(100/64)
    assert make_workload("flash-decode", {"B": 64, "Hkv": 8, "Hq": 64, "S": 8192}, 2).kv_splits(132) == 1


@pytest.mark.parametrize("variant", ["bsp-graphs", "fused", ""])
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_unknown_variant_rejected(name, variant):
    w = make_workload(name, {}, 2)
    for f in (w.intermediate_bytes, w.kernel_count):
        with pytest.raises(TaxesError) as e:
            f(variant)
        assert_one_line(str(e.value))


world_st = st.integers(1, 8)


@st.composite
def gemm_shapes(draw):
    p = draw(world_st)
    return p, {d: p * draw(st.integers(1, 4096)) for d in ("M", "N", "K")}


@given(gemm_shapes(), st.sampled_from(["bf16", "fp16"]))
def test_gemm_work_is_conserved_across_ranks(ps, dtype):
    """Summed over the p ranks, the per-rank work is the whole operation's work."""
    p, s = ps
    M, N, K = s["M"], s["N"], s["K"]
    ag = make_workload("ag-gemm", s, p, dtype)
    rs = make_workload("gemm-rs", s, p, dtype)
    assert p * ag.flops() == p * rs.flops() == 2 * M * N * K
    # every rank receives every other rank's shard of A (ag) / partial of its own rows (rs)
    assert p * ag.link_bytes() == (p - 1) * M * K * 2
    assert p * rs.link_bytes() == (p - 1) * M * N * 2
    # A, W and C each appear once across ranks for ag-gemm: A sharded, W sharded, C sharded
    assert p * ag.hbm_bytes() == 2 * (M * K + K * N + M * N)
    # gemm-rs: A and W sharded along K, C sharded along M
    assert p * rs.hbm_bytes() == 2 * (M * K + K * N + M * N)
    for w in (ag, rs):
        assert w.intermediate_bytes("fused-pull") <= w.intermediate_bytes("bsp")
        assert (w.intermediate_bytes("fused-pull") == 0) == (p == 1)


@given(st.integers(1, 64), st.integers(1, 16), st.integers(1, 8), st.integers(1, 256), st.integers(1, 1 << 18),
       world_st, st.integers(1, 64))
def test_flash_decode_random(B, Hkv, g, D, S, p, splits):
    w = make_workload("flash-decode", {"B": B, "Hq": Hkv * g, "Hkv": Hkv, "D": D, "S": S}, p)
    assert isinstance(w, FlashDecode)
    assert w.flops() == 4 * B * Hkv * g * S * D
    assert w.kv_bytes() == 4 * B * Hkv * S * D  # two tensors, two bytes per element
    part = 4 * B * Hkv * g * (D + 1)
    assert w.link_bytes() == (p - 1) * part
    split_rt = 2 * splits * part
    assert w.intermediate_bytes("bsp", splits) == split_rt + 2 * (p + 1) * part
    assert w.intermediate_bytes("fused-pull", splits) == split_rt + 2 * (p - 1) * part
    assert 1 <= w.kv_splits(132) <= max(1, -(-S // 64))


@given(gemm_shapes())
def test_workload_dict_roundtrip(ps):
    p, s = ps
    for name in ("ag-gemm", "gemm-rs"):
        w = make_workload(name, s, p, "fp16")
        d = workload_dict(w)
        assert d == {"workload": name, "shape": s, "world": p, "dtype": "fp16"}
        assert workload_from_dict(d) == w
        assert parse_shape(shape_text(w)) == s


def test_replace_dim_validates():
    w = make_workload("ag-gemm", {}, 4)
    assert replace_dim(w, "M", 1024).M == 1024
    with pytest.raises(TaxesError, match="M"):
        replace_dim(w, "M", 1022)
    assert isinstance(make_workload("gemm-rs", {}, 1), GemmRs)
