"""Result documents: building, validation, atomic save, and load errors (bad, huge, mutated, truncated)."""

from __future__ import annotations

import copy
import json
import math
import os

import pytest
from _util import assert_one_line
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from taxes.documents import results
from taxes.errors import TaxesError
from taxes.model.predict import COMPONENTS as MODEL_COMPONENTS


# ---- building and round trips ----------------------------------------------------------------------


def test_model_document_shape(model_doc, model_predictions):
    doc = results.validate(model_doc)
    assert doc["schema"] == results.SCHEMA and doc["schema_version"] == results.SCHEMA_VERSION
    meta = doc["metadata"]
    assert meta["kind"] == "model" and meta["world_size"] == 2 and meta["hardware_profile"] == "h200-sxm"
    assert meta["tool_version"] and meta["date"]
    assert len(doc["cases"]) == len(model_predictions)
    for case, preds in zip(doc["cases"], model_predictions):
        assert case["workload"] == preds[0].workload.name and case["world"] == 2
        assert [v["variant"] for v in case["variants"]] == [p.variant for p in preds]
        for var, pred in zip(case["variants"], preds):
            assert var["e2e_us"]["median"] == pred.e2e_us and var["e2e_us"]["label"] == "predicted"
            assert var["samples_us"] == []
            comps = {c["name"]: c["value_us"] for c in var["components"]}
            assert list(comps) == list(MODEL_COMPONENTS)
            assert math.fsum(comps.values()) == var["e2e_us"]["median"]
            assert all(c["label"] == "predicted" and c["rank"] is None for c in var["components"])
            assert len(var["phases"]) == len(pred.phases)
            assert var["phases"][-1]["end_us"] == pytest.approx(pred.e2e_us, rel=1e-9)


def test_save_load_roundtrip(model_doc, tmp_path):
    path = tmp_path / "doc.json"
    results.save(model_doc, path)
    assert results.load(path) == model_doc
    assert results.loads(results.dumps(model_doc)) == model_doc
    assert sorted(os.listdir(tmp_path)) == ["doc.json"]  # no temporary file left


def test_save_replaces_an_existing_file_whole(model_doc, tmp_path):
    path = tmp_path / "doc.json"
    path.write_text("x" * (len(results.dumps(model_doc)) * 3))  # longer than the new document
    small = copy.deepcopy(model_doc)
    small["cases"] = small["cases"][:1]
    results.save(small, path)
    assert path.read_text() == results.dumps(small)
    assert results.load(path) == small
    assert sorted(os.listdir(tmp_path)) == ["doc.json"]


@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_failed_save_keeps_the_old_file(model_doc, tmp_path, monkeypatch, exc):
    path = tmp_path / "doc.json"
    results.save(model_doc, path)
    before = path.read_bytes()
    changed = copy.deepcopy(model_doc)
    changed["metadata"]["hardware_profile"] = "h100-sxm"

    def failing_replace(src, dst):
        assert os.path.exists(src)  # the full new text was written beside the target first
        raise exc

    monkeypatch.setattr(results.os, "replace", failing_replace)
    if isinstance(exc, OSError):
        with pytest.raises(TaxesError) as e:
            results.save(changed, path)
        assert_one_line(str(e.value))
        assert str(path) in str(e.value)
    else:
        with pytest.raises(KeyboardInterrupt):
            results.save(changed, path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["doc.json"]


def test_failed_write_keeps_the_old_file(model_doc, tmp_path, monkeypatch):
    path = tmp_path / "doc.json"
    results.save(model_doc, path)
    before = path.read_bytes()
    real_fdopen = os.fdopen

    class Broken:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def write(self, data):
            self.f.write(data[: len(data) // 2])  # half written, then the disk fills up
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(results.os, "fdopen", lambda fd, mode: Broken(real_fdopen(fd, mode)))
    with pytest.raises(TaxesError):
        results.save(model_doc, path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["doc.json"]


def test_save_refuses_invalid_document(model_doc, tmp_path):
    model_doc["cases"][0]["world"] = 0
    with pytest.raises(TaxesError) as e:
        results.save(model_doc, tmp_path / "x.json")
    assert_one_line(str(e.value))
    assert "cases[0].world" in str(e.value)
    assert os.listdir(tmp_path) == []


def test_save_into_missing_directory(model_doc, tmp_path):
    with pytest.raises(TaxesError) as e:
        results.save(model_doc, tmp_path / "missing" / "x.json")
    assert_one_line(str(e.value))


def test_save_keeps_a_normal_file_mode(model_doc, tmp_path):
    path = tmp_path / "doc.json"
    path.write_text("{}")
    os.chmod(path, 0o644)
    results.save(model_doc, path)
    assert os.stat(path).st_mode & 0o777 == 0o644


# ---- load errors -----------------------------------------------------------------------------------


def _bad_documents(doc: dict) -> dict[str, tuple[bytes, str]]:
    text = results.dumps(doc)
    out = {"malformed JSON": (b'{"schema": "taxes.result",,}', "JSON"),
           "truncated": (text[: len(text) // 2].encode(), "JSON"),
           "empty": (b"", "JSON"),
           "NaN constant": (text.replace('"median": ', '"median": NaN, "x": ', 1).encode(), "NaN"),
           "-Infinity constant": (text.replace('"start_us": ', '"start_us": -Infinity, "y": ', 1).encode(), "Infinity"),
           "overflowing number": (text.replace('"median": ', '"median": 1e999, "x": ', 1).encode(), "median"),
           "deeply nested": (b"[" * 100000, "nested"),
           "deeply nested object": (b'{"a":' * 50000 + b"1" + b"}" * 50000, "nested"),
           "binary": (bytes(range(256)) * 4, "UTF-8"),
           "a JSON list": (json.dumps([doc]).encode(), "object")}

    def mutated(f, word):
        d = copy.deepcopy(doc)
        f(d)
        return json.dumps(d).encode(), word

    case0, var0 = "cases[0]", "cases[0].variants[0]"
    out.update({
        "wrong schema": mutated(lambda d: d.update(schema="taxes.hardware"), "schema"),
        "wrong schema_version": mutated(lambda d: d.update(schema_version=2), "schema_version"),
        "missing metadata": mutated(lambda d: d.pop("metadata"), "metadata"),
        "bad kind": mutated(lambda d: d["metadata"].update(kind="guess"), "metadata.kind"),
        "cases an object": mutated(lambda d: d.update(cases={}), "cases"),
        "unknown workload": mutated(lambda d: d["cases"][0].update(workload="all-reduce"), f"{case0}.workload"),
        "shape value string": mutated(lambda d: d["cases"][0]["shape"].update(M="8192"), f"{case0}.shape.M"),
        "shape value zero": mutated(lambda d: d["cases"][0]["shape"].update(K=0), f"{case0}.shape.K"),
        "world a float": mutated(lambda d: d["cases"][0].update(world=2.5), f"{case0}.world"),
        "dtype a number": mutated(lambda d: d["cases"][0].update(dtype=16), f"{case0}.dtype"),
        "variants null": mutated(lambda d: d["cases"][0].update(variants=None), f"{case0}.variants"),
        "samples a string": mutated(lambda d: d["cases"][0]["variants"][0].update(samples_us="1,2"), f"{var0}.samples_us"),
        "sample a string": mutated(lambda d: d["cases"][0]["variants"][0].update(samples_us=[[1.0, "2"]]),
                                   f"{var0}.samples_us[0][1]"),
        "median a string": mutated(lambda d: d["cases"][0]["variants"][0]["e2e_us"].update(median="fast"),
                                   f"{var0}.e2e_us.median"),
        "bad label": mutated(lambda d: d["cases"][0]["variants"][0]["e2e_us"].update(label="guessed"),
                             f"{var0}.e2e_us.label"),
        "phase role": mutated(lambda d: d["cases"][0]["variants"][0]["phases"][0].update(role="idle"),
                              f"{var0}.phases[0].role"),
        "phase backwards": mutated(lambda d: d["cases"][0]["variants"][0]["phases"][0].update(start_us=1e6),
                                   f"{var0}.phases[0]"),
        "phase rank bool": mutated(lambda d: d["cases"][0]["variants"][0]["phases"][0].update(rank=True),
                                   f"{var0}.phases[0].rank"),
        "phase part null": mutated(lambda d: d["cases"][0]["variants"][0]["phases"][0]["parts"].update(ideal=None),
                                   f"{var0}.phases[0].parts.ideal"),
        "component value list": mutated(lambda d: d["cases"][0]["variants"][0]["components"][0].update(value_us=[1]),
                                        f"{var0}.components[0].value_us"),
        "component rank string": mutated(lambda d: d["cases"][0]["variants"][0]["components"][1].update(rank="0"),
                                         f"{var0}.components[1].rank"),
        "correctness missing": mutated(lambda d: d["cases"][0]["variants"][0].pop("correctness"), "correctness"),
        "rel_error a string": mutated(lambda d: d["cases"][0]["variants"][0]["correctness"].update(rel_error="0.1"),
                                      f"{var0}.correctness.rel_error"),
    })
    return out


# The case names, from a skeleton with just enough structure for every mutation to apply.
BAD_NAMES = list(_bad_documents({"schema": "taxes.result", "schema_version": 1, "metadata": {}, "cases": [
    {"shape": {}, "variants": [{"e2e_us": {}, "phases": [{"parts": {}}], "components": [{}, {}], "correctness": {}}]}]}))


@pytest.mark.parametrize("case", BAD_NAMES)
def test_load_rejects_with_one_line(model_doc, tmp_path, case):
    data, word = _bad_documents(model_doc)[case]
    path = tmp_path / "bad.json"
    path.write_bytes(data)
    with pytest.raises(TaxesError) as e:
        results.load(path)
    msg = str(e.value)
    assert_one_line(msg)
    assert msg.startswith(f"{path}: ")
    assert word in msg, msg


def test_load_missing_file_and_directory(tmp_path):
    for p in (tmp_path / "nope.json", tmp_path):
        with pytest.raises(TaxesError) as e:
            results.load(p)
        assert_one_line(str(e.value))
        assert "cannot read" in str(e.value)


def test_load_refuses_huge_files(tmp_path, monkeypatch, model_doc):
    path = tmp_path / "doc.json"
    results.save(model_doc, path)
    monkeypatch.setattr(results, "MAX_BYTES", 100)
    with pytest.raises(TaxesError) as e:
        results.load(path)
    assert_one_line(str(e.value))


def test_gzip_documents_roundtrip_and_are_bounded_and_checked(tmp_path, monkeypatch, model_doc):
    import gzip

    path = tmp_path / "doc.json.gz"
    results.save(model_doc, path)
    assert path.read_bytes()[:2] == b"\x1f\x8b" and len(path.read_bytes()) < len(results.dumps(model_doc))
    assert results.load(path) == model_doc
    # a broken gzip stream and one that inflates past the limit: one line each
    (tmp_path / "cut.json.gz").write_bytes(path.read_bytes()[:40])
    (tmp_path / "bomb.json.gz").write_bytes(gzip.compress(b" " * (1 << 20)))
    monkeypatch.setattr(results, "MAX_BYTES", 1 << 16)
    for name, what in (("cut.json.gz", "broken gzip"), ("bomb.json.gz", "uncompressed")):
        with pytest.raises(TaxesError) as e:
            results.load(tmp_path / name)
        assert what in str(e.value)
        assert_one_line(str(e.value))


@pytest.mark.parametrize("value", [["ag-gemm"], {"name": "ag-gemm"}])
def test_unhashable_workload_is_a_taxes_error(model_doc, value):
    model_doc["cases"][0]["workload"] = value
    with pytest.raises(TaxesError):
        results.loads(json.dumps(model_doc))


def test_overflowing_number_anywhere_is_rejected(model_doc, tmp_path):
    text = results.dumps(model_doc).replace('"kind": "model"', '"kind": "model", "clock_mhz": 1e999', 1)
    path = tmp_path / "doc.json"
    path.write_text(text)
    try:
        doc = results.load(path)
    except TaxesError:
        return
    results.save(doc, tmp_path / "copy.json")  # what was loaded must be writable again


def test_phase_label_is_validated(model_doc):
    model_doc["cases"][0]["variants"][0]["phases"][0]["label"] = "bogus"
    with pytest.raises(TaxesError):
        results.loads(json.dumps(model_doc))


# ---- mutation: load either accepts or says what is wrong in one line ----------------------------


def _leaves(node, path=()):
    """Paths to every non-container value (and every empty container) of a JSON document."""
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(node, list) and node:
        for i, v in enumerate(node):
            yield from _leaves(v, path + (i,))
    else:
        yield path


def _json_type(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(v)]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@pytest.fixture(scope="module")
def small_doc():
    from taxes.model.hardware import BUILTIN
    from taxes.model.predict import predict_all
    from taxes.workloads import make_workload

    w = make_workload("flash-decode", {"B": 1, "Hq": 8, "Hkv": 2, "D": 64, "S": 4096}, 2)
    doc = results.model_document([predict_all(w, BUILTIN["h100-sxm"], variants=("bsp", "fused-push"))], "h100-sxm", 2)
    doc["cases"][0]["variants"][0]["samples_us"] = [[10.0, 11.5], [12.0, 9.0]]
    return doc


@settings(max_examples=max(500, settings.default.max_examples))
@given(st.data())
def test_mutated_documents_load_or_fail_cleanly(small_doc, data):
    doc = copy.deepcopy(small_doc)
    # every kind of field equally likely: group leaves by their path with list indices wildcarded
    groups: dict[tuple, list[tuple]] = {}
    for leaf in _leaves(doc):
        groups.setdefault(tuple("*" if isinstance(k, int) else k for k in leaf), []).append(leaf)
    kind = data.draw(st.sampled_from(sorted(groups, key=repr)), label="field")
    path = data.draw(st.sampled_from(groups[kind]), label="leaf")
    old = doc
    for k in path[:-1]:
        old = old[k]
    old_value = old[path[-1]] if path else doc
    new = data.draw(JSON_VALUES.filter(lambda v: _json_type(v) != _json_type(old_value)), label="new value")
    # an unhashable workload name is a known bug (test_unhashable_workload_is_a_taxes_error)
    assume(not (path and path[-1] == "workload" and isinstance(new, (list, dict))))
    if not path:
        doc = new
    else:
        old[path[-1]] = new
    text = json.dumps(doc)
    try:
        loaded = results.loads(text, "mutated")
    except TaxesError as e:
        assert_one_line(str(e))
        assert str(e).startswith("mutated: ")
    else:
        assert loaded == doc
        # what loads can be written out again and read back identically
        assert results.loads(results.dumps(loaded)) == loaded


@given(st.randoms(use_true_random=False))
def test_truncated_documents_are_rejected(small_doc, rnd):
    text = results.dumps(small_doc)
    n = rnd.randrange(1, len(text) - 2)  # drop at least the closing brace
    with pytest.raises(TaxesError) as e:
        results.loads(text[:n], "cut")
    assert_one_line(str(e.value))
