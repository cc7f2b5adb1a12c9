"""A row the traces cannot support reads "not measured", never 0.0, in every view (table, Markdown, JSON,
HTML), and the report names what to record to get it: locality without tensor identity or shapes (or
without a hardware profile to price bytes), the floor and kernel inefficiency without a floor.
"""

from __future__ import annotations

import json

import pytest
from kineto_build import Op, Program, new_trace, write_trace

from taxes.attribution import analyze as A
from taxes.documents import analysis_document as D
from taxes.documents import results

TITLE = "data-locality tax"


def chain_trace(tmp_path, shapes: bool, rank: int = 0):
    """An unfused elementwise chain: add -> mul -> relu per step, recorded with or without shapes."""
    tr = new_trace(rank, 1)
    p = Program(tr)
    dims = {"Input Dims": [[1024, 1024], [1024, 1024]], "Input type": ["float", "float"]} if shapes else {}
    for step in range(4):
        p.step(step, [Op(name=f"aten::{n}", kernel=f"{n}_kernel", dur_us=30.0, op_args=dims, pre_us=2.0)
                      for n in ("add", "mul", "relu")])
    return write_trace(tr, tmp_path / f"rank{rank}.json")


def run(args, capsys) -> tuple[int, str, str]:
    from taxes.cli.analyze_cmd import analyze
    from taxes.cli.main import TaxesGroup

    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        TaxesGroup(name="taxes", commands={"analyze": analyze}).main(args)
    out, err = capsys.readouterr()
    return exc.value.code or 0, out, err


def test_locality_without_tensor_identity_or_shapes_is_not_measured_in_every_view(tmp_path, capsys):
    trace = chain_trace(tmp_path, shapes=False)
    an = A.analyze([trace])
    assert an.decomposition["locality"].isna().all()
    assert "execution trace" in an.not_measured["locality"] and "record_shapes" in an.not_measured["locality"]
    doc = D.analysis_document(an)
    results.validate(doc, "analyze")
    v = doc["cases"][0]["variants"][0]
    names = {c["name"] for c in v["components"]}
    assert not names & {"locality", "ideal", "inefficiency"}, names  # left out, never written as 0
    assert set(v["not_measured"]) == {"locality", "ideal", "inefficiency"}
    # the rows still add up: what is not measured stays inside compute
    overall = sum(c["value_us"] for c in v["components"] if c["rank"] is None)
    assert overall == pytest.approx(v["attributed_e2e_us"], abs=1e-6)
    for fmt in ("json", "md", "html", "table"):
        out = tmp_path / f"report.{fmt}"
        code, _, err = run(["analyze", str(trace), "--format", fmt, "-o", str(out)], capsys)
        assert code == 0, err
        text = out.read_text()
        if fmt == "json":
            d = json.loads(text)
            assert all(r["locality"] is None for r in d["trace_analysis"]["decomposition"])
            assert "execution trace" in d["trace_analysis"]["not_measured"]["locality"]
            continue
        assert "NOT MEASURED" in text and "ExecutionTraceObserver" in text, fmt  # what to record, named
        lines = [ln for ln in text.splitlines() if TITLE in ln and "NOT MEASURED" not in ln
                 and "variant" not in ln and "<th" not in ln]  # table headers name the row, they hold no value
        assert lines, fmt
        for ln in lines:
            assert "not measured" in ln and " 0.0 " not in ln and "0.0 d" not in ln, (fmt, ln)


def test_locality_from_shapes_is_measured_and_a_number(tmp_path):
    an = A.analyze([chain_trace(tmp_path, shapes=True)], hardware="h100-sxm")
    assert "locality" not in an.not_measured
    assert an.decomposition["locality"].notna().all() and (an.decomposition["locality"] > 0).all()
    v = D.analysis_document(an)["cases"][0]["variants"][0]
    assert any(c["name"] == "locality" and c["rank"] is None for c in v["components"])


def test_an_unknown_gpu_leaves_locality_unpriced_and_says_how_to_price_it(tmp_path):
    tr = new_trace(0, 1, gpu="Some Future GPU")
    p = Program(tr)
    dims = {"Input Dims": [[64, 64], [64, 64]], "Input type": ["float", "float"]}
    for step in range(3):
        p.step(step, [Op(name=f"aten::{n}", kernel=f"{n}_kernel", dur_us=10.0, op_args=dims) for n in ("add", "mul")])
    an = A.analyze([write_trace(tr, tmp_path / "rank0.json")])
    assert an.decomposition["locality"].isna().all() and "--hardware" in an.not_measured["locality"]
