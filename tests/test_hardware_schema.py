"""The published schema of hardware profiles (taxes/schema/hardware-v1.json): every committed
calibration and built-in profile meets it, the loader checks it, and a profile that breaks it is one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from _util import assert_one_line

from taxes import schema
from taxes.errors import TaxesError
from taxes.model.hardware import BUILTIN, load_profile_file, profile_from_dict, profile_to_dict

ROOT = Path(__file__).resolve().parent.parent
CALIBRATIONS = sorted((ROOT / "reports" / "calibration").glob("*.json"))


def test_the_schema_is_a_draft_2020_12_schema():
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(schema.schema(schema.HARDWARE_V1))


def test_calibrations_are_committed():
    assert len(CALIBRATIONS) >= 2


@pytest.mark.parametrize("path", CALIBRATIONS, ids=lambda p: p.name)
def test_a_committed_calibration_meets_the_schema_and_loads(path):
    data = json.loads(path.read_text())
    assert schema.errors(data, schema.HARDWARE_V1) == []
    assert load_profile_file(path).sm_count >= 1


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_a_builtin_profile_meets_the_schema(name):
    assert schema.errors(json.loads(json.dumps(profile_to_dict(BUILTIN[name]))), schema.HARDWARE_V1) == []


def _profile() -> dict:
    return json.loads(json.dumps(profile_to_dict(BUILTIN["h100-sxm"])))


BROKEN = {
    "a rate as text": ({"hbm_gbps": "3350"}, "hbm_gbps"),
    "an efficiency above 1": ({"p2p_efficiency": 1.5}, "p2p_efficiency"),
    "a launcher kind nobody has": ({"launch_host_us": {"cudnn": 3.0}}, "launch_host_us"),
    "half a combine cost": ({"combine_us": {"base": 3.0}}, "combine_us"),
    "no matrix peak": ({"matrix_tflops": {}}, "matrix_tflops"),
    "a fractional SM count": ({"sm_count": 131.5}, "sm_count"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_the_schema_and_the_loader_refuse_a_broken_profile_in_one_line(tmp_path, case):
    change, field = BROKEN[case]
    data = _profile() | change
    found = schema.errors(data, schema.HARDWARE_V1)
    assert found and field in found[0][0] + found[0][1]
    with pytest.raises(TaxesError) as schema_error:
        schema.check(data, "profile", schema.HARDWARE_V1)
    assert_one_line(str(schema_error.value))
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TaxesError) as loaded:
        load_profile_file(path)
    assert_one_line(str(loaded.value))
    assert str(path) in str(loaded.value) and field in str(loaded.value)


def test_the_loader_checks_the_schema_after_its_own_checks(monkeypatch):
    seen = []
    monkeypatch.setattr(schema, "check", lambda doc, origin, name=schema.RESULT_V1: seen.append((origin, name)))
    profile_from_dict(_profile(), origin="profile X")
    assert seen == [("profile X", schema.HARDWARE_V1)]
    with pytest.raises(TaxesError, match="^profile Y: p2p_efficiency=0 must be a fraction"):
        profile_from_dict(_profile() | {"p2p_efficiency": 0}, origin="profile Y")
    assert len(seen) == 1  # a fault the loader names in its own words is reported as such


def test_without_jsonschema_the_loader_keeps_its_own_checks(monkeypatch):
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # import jsonschema raises ImportError
    assert profile_from_dict(_profile()).name == "h100-sxm"
    with pytest.raises(TaxesError, match="p2p_efficiency"):
        profile_from_dict(_profile() | {"p2p_efficiency": 0}, origin="profile")
