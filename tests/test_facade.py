"""The facade: taxes.predict / taxes.analyze / taxes.profile / taxes.step, each a thin call into its stage,
and `import taxes` loading none of the stages' heavy libraries."""

from __future__ import annotations

import subprocess
import sys

import pytest

import taxes


def test_import_taxes_loads_no_torch_pandas_or_matplotlib():
    code = ("import sys, taxes; heavy = [m for m in ('torch', 'pandas', 'matplotlib', 'numpy') if m in sys.modules];"
            " print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", out


def test_predict_matches_the_model_stage_and_the_shape_spellings_agree():
    from taxes.model.hardware import get_profile
    from taxes.model.predict import predict_all
    from taxes.workloads import make_workload

    a = taxes.predict("ag-gemm", "M=4096,N=8192,K=8192", gpus=4, hardware="h100-sxm")
    b = taxes.predict("ag-gemm", {"M": 4096, "N": 8192, "K": 8192}, gpus=4, hardware="h100-sxm")
    ref = predict_all(make_workload("ag-gemm", {"M": 4096, "N": 8192, "K": 8192}, 4), get_profile("h100-sxm"))
    assert [p.variant for p in a] == [p.variant for p in ref] and len(a) > 1
    assert [p.e2e_us for p in a] == [p.e2e_us for p in b] == [p.e2e_us for p in ref]


def test_predict_refuses_a_shape_that_does_not_divide_in_one_line():
    from taxes.errors import TaxesError

    with pytest.raises(TaxesError) as e:
        taxes.predict("ag-gemm", "M=1000", gpus=3)
    assert "\n" not in str(e.value)


def test_analyze_is_the_attribution_stage(tmp_path):
    from kineto_build import MM, Op, Program, add_step, new_trace, write_trace

    p = Program(new_trace(0, 1, distributed=False))
    for s in range(3):
        t0 = p.t
        p.run(Op(name="aten::mm", kernel=MM, dur_us=50.0))
        add_step(p.tr, s, t0, p.t)
        p.t += 5.0
    path = write_trace(p.tr, tmp_path / "rank0.json")
    an = taxes.analyze([path])
    assert sorted(an.ranks) == [0] and len(an.kept_steps) >= 1

