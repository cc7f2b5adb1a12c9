"""Hardware profiles: built-in ones, JSON files, saved profiles, and validation of bad files."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from _util import assert_one_line
from hypothesis import given
from hypothesis import strategies as st

from taxes.errors import TaxesError
from taxes.model.hardware import (
    BUILTIN,
    PROFILE_SCHEMA,
    PROFILE_VERSION,
    HardwareProfile,
    all_profiles,
    get_profile,
    load_profile_file,
    profile_from_dict,
    profile_to_dict,
)


@pytest.mark.parametrize("name", list(BUILTIN))
def test_builtin_by_name(name):
    p = get_profile(name)
    assert p is BUILTIN[name] and p.name == name
    # sane datasheet figures: efficiencies are fractions, bandwidths and peaks positive
    for f in dataclasses.fields(HardwareProfile):
        v = getattr(p, f.name)
        if f.name.endswith("_efficiency"):
            assert 0 < v <= 1
    assert p.hbm_gbps > 0 and p.peer_link_gbps > 0 and p.injection_gbps >= p.peer_link_gbps
    assert p.peak_flops("bf16") == p.matrix_tflops["bf16"] * 1e12
    assert p.hbm_bytes_per_us() == p.hbm_gbps * 1e3
    assert p.inbound_bytes_per_us(1) == math.inf
    assert p.inbound_bytes_per_us(2) == min(p.injection_gbps, p.peer_link_gbps) * 1e3


def test_peak_flops_unknown_dtype():
    with pytest.raises(TaxesError) as e:
        BUILTIN["h100-sxm"].peak_flops("fp8")
    assert_one_line(str(e.value))


def _custom_profile(**changes) -> HardwareProfile:
    fields = {"name": "my-box", "source": "calibrated here", "hbm_gbps": 4321.5,
              "extra": {"curve": [[1, 2.5], [2, 3.5]], "note": "x"}, **changes}
    return dataclasses.replace(BUILTIN["h200-sxm"], **fields)


@pytest.mark.parametrize("base", list(BUILTIN))
def test_profile_json_roundtrip_by_path(tmp_path, base):
    prof = dataclasses.replace(BUILTIN[base], name=f"{base}-copy", extra={"k": [1, 2]})
    path = tmp_path / f"{base}-copy.json"
    path.write_text(json.dumps(profile_to_dict(prof)))
    assert get_profile(str(path)) == prof
    assert load_profile_file(path) == prof
    d = profile_to_dict(prof)
    assert d["schema"] == PROFILE_SCHEMA and d["schema_version"] == PROFILE_VERSION


def test_profile_dir_env_makes_saved_profiles_loadable_by_name(tmp_path, monkeypatch):
    prof = _custom_profile()
    (tmp_path / "my-box.json").write_text(json.dumps(profile_to_dict(prof)))
    with pytest.raises(TaxesError):
        get_profile("my-box")  # not yet visible
    monkeypatch.setenv("TAXES_PROFILE_DIR", str(tmp_path))
    assert get_profile("my-box") == prof
    listed = all_profiles()
    assert listed["my-box"] == (prof, str(tmp_path / "my-box.json"))
    assert all(listed[n] == (BUILTIN[n], "built-in") for n in BUILTIN)


def test_builtin_names_win_over_saved_files(tmp_path, monkeypatch):
    fake = dataclasses.replace(BUILTIN["h100-sxm"], hbm_gbps=1.0)
    (tmp_path / "h100-sxm.json").write_text(json.dumps(profile_to_dict(fake)))
    monkeypatch.setenv("TAXES_PROFILE_DIR", str(tmp_path))
    assert get_profile("h100-sxm") is BUILTIN["h100-sxm"]


def test_saved_profile_in_home_config(tmp_path, monkeypatch):
    d = tmp_path / ".config" / "taxes" / "profiles"
    d.mkdir(parents=True)
    prof = _custom_profile(name="homebox")
    (d / "homebox.json").write_text(json.dumps(profile_to_dict(prof)))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert get_profile("homebox") == prof


def test_broken_saved_profile_is_listed_not_fatal(tmp_path, monkeypatch):
    (tmp_path / "broken.json").write_text("{not json")
    monkeypatch.setenv("TAXES_PROFILE_DIR", str(tmp_path))
    prof, origin = all_profiles()["broken"]
    assert prof is None and "does not load" in origin
    with pytest.raises(TaxesError) as e:
        get_profile("broken")
    assert_one_line(str(e.value))


def test_unknown_profile_name():
    with pytest.raises(TaxesError) as e:
        get_profile("a100")
    msg = str(e.value)
    assert_one_line(msg)
    assert "a100" in msg and all(n in msg for n in BUILTIN)


def _valid() -> dict:
    return json.loads(json.dumps(profile_to_dict(_custom_profile())))


def _with(**kv) -> str:
    d = _valid()
    d.update(kv)
    return json.dumps(d)


def _without(key) -> str:
    d = _valid()
    del d[key]
    return json.dumps(d)


BAD_PROFILES = {
    "not json": ("{'name': 'x'}", "JSON"),
    "empty file": ("", "JSON"),
    "NaN constant": (json.dumps(_valid()).replace('"hbm_gbps": 4321.5', '"hbm_gbps": NaN'), "NaN"),
    "Infinity constant": (json.dumps(_valid()).replace('"hbm_gbps": 4321.5', '"hbm_gbps": Infinity'), "Infinity"),
    "overflowing literal": (json.dumps(_valid()).replace('"hbm_gbps": 4321.5', '"hbm_gbps": 1e999'), "hbm_gbps"),
    "missing field": (_without("peer_link_gbps"), "peer_link_gbps"),
    "missing name": (_without("name"), "name"),
    "negative bandwidth": (_with(injection_gbps=-450.0), "injection_gbps"),
    "zero bandwidth": (_with(hbm_gbps=0), "hbm_gbps"),
    "efficiency above 1": (_with(matmul_efficiency=1.2), "matmul_efficiency"),
    "efficiency zero": (_with(p2p_efficiency=0), "p2p_efficiency"),
    "wrong schema_version": (_with(schema_version=2), "version"),
    "wrong schema": (_with(schema="taxes.result"), "schema"),
    "string number": (_with(hbm_gbps="4800"), "hbm_gbps"),
    "bool number": (_with(link_latency_us=True), "link_latency_us"),
    "fractional sm_count": (_with(sm_count=131.5), "sm_count"),
    "zero sm_count": (_with(sm_count=0), "sm_count"),
    "name not a string": (_with(name=["h200"]), "name"),
    "tflops a list": (_with(matrix_tflops=[989.4]), "matrix_tflops"),
    "tflops empty": (_with(matrix_tflops={}), "matrix_tflops"),
    "tflops negative": (_with(matrix_tflops={"bf16": -1}), "matrix_tflops"),
    "extra a list": (_with(extra=[1]), "extra"),
    "a JSON list": (json.dumps([_valid()]), "object"),
    "a JSON number": ("42", "object"),
    "deeply nested": ("[" * 100000, "JSON"),
}


@pytest.mark.parametrize("case", list(BAD_PROFILES))
def test_invalid_profile_files(tmp_path, case):
    text, word = BAD_PROFILES[case]
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(TaxesError) as e:
        get_profile(str(path))
    msg = str(e.value)
    assert_one_line(msg)
    assert str(path) in msg and word in msg


def test_missing_profile_file(tmp_path):
    with pytest.raises(TaxesError) as e:
        get_profile(str(tmp_path / "nope.json"))
    assert_one_line(str(e.value))
    assert "nope.json" in str(e.value)


def test_binary_profile_file_is_a_taxes_error(tmp_path):
    path = tmp_path / "bin.json"
    path.write_bytes(b"\xff\xfe\x00\x89PNG\x00\x01")
    with pytest.raises(TaxesError):
        get_profile(str(path))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@given(st.sampled_from(sorted(_valid())), JSON_VALUES)
def test_profile_field_mutations_validate_or_fail_cleanly(key, value):
    """Any value in any field: a profile that keeps its invariants, or one TaxesError line."""
    d = _valid()
    d[key] = value
    try:
        p = profile_from_dict(d, origin="mutated")
    except TaxesError as e:
        assert_one_line(str(e))
        assert str(e).startswith("mutated: ")
    else:
        assert p.sm_count >= 1 and isinstance(p.sm_count, int)
        assert all(0 < getattr(p, f) <= 1 for f in ("matmul_efficiency", "triton_matmul_efficiency", "hbm_efficiency",
                                                      "collective_efficiency", "p2p_efficiency"))
        assert p.hbm_gbps > 0 and p.peer_link_gbps > 0 and p.injection_gbps > 0
        assert p.matrix_tflops and all(v > 0 for v in p.matrix_tflops.values())
        assert isinstance(p.extra, dict)


def test_per_launcher_host_costs_must_name_known_kinds():
    from taxes.model.hardware import BUILTIN, profile_from_dict, profile_to_dict

    d = profile_to_dict(BUILTIN["h200-sxm"])
    ok = profile_from_dict(d | {"launch_host_us": {"nccl": 25.0, "graph": 8.0}})
    assert ok.launch_us("nccl") == 25.0 and ok.launch_us("torch") == ok.launch_eager_us
    for bad in ({"cudnn": 3.0}, {"nccl": -1.0}, {"nccl": float("nan")}, ["nccl"]):
        with pytest.raises(TaxesError, match="launch_host_us must map launcher kinds"):
            profile_from_dict(d | {"launch_host_us": bad})
