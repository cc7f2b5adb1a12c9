"""What benchmarks/gpu_world.sh runs on a GPU machine is checked here first, where a mistake costs no device
time: the held-out stage's shapes are in no test and no tuning table (so the validation it writes is of shapes
the model and the kernels' tuning never saw), each is a valid shape of its workload at 2 and 4 GPUs, the model
predicts every variant there, and every variant the script names exists. The shapes are read from the script,
never written here: a shape this file named would no longer be held out."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from taxes import variants
from taxes.documents.validation import held_out
from taxes.model.hardware import get_profile
from taxes.model.predict import predict
from taxes.workloads import make_workload, parse_shape

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_world.sh"
HELD = re.compile(r"^\s*\w+\)\s+held\s+(\S+)\s+(\S+)\s+\S+\s+(\S+)\s*((?:\S+=\S+\s*)+)")


def heldout_stage() -> list[tuple[str, str, list[str]]]:
    """(workload, variants or 'all', shapes) of each `held` line of the script, continuation lines joined."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        m = HELD.match(line)
        if m:
            out.append((m.group(2), m.group(3), m.group(4).split()))
    return out


STAGE = heldout_stage()
CASES = [(wl, sh) for wl, _, shapes in STAGE for sh in shapes]


def test_the_stage_covers_every_workload():
    assert {wl for wl, _, _ in STAGE} == {"ag-gemm", "gemm-rs", "flash-decode", "tp-mlp"}, STAGE


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_every_held_out_shape_is_in_no_test_and_no_tuning_table():
    found = held_out([(wl, parse_shape(sh)) for wl, sh in CASES])
    assert all(f["known"] for f in found)
    assert [f for f in found if not f["held_out"]] == []


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("workload,shape", CASES, ids=[f"{wl}:{sh}" for wl, sh in CASES])
def test_every_held_out_shape_is_valid_and_predicted_at_2_and_4_gpus(workload, shape, world):
    w = make_workload(workload, parse_shape(shape), world)
    for name in variants.model_names(workload):
        p = predict(w, name, get_profile("h200-sxm"))
        assert p.e2e_us > 0


@pytest.mark.parametrize("workload,names", [(wl, v) for wl, v, _ in STAGE if v != "all"])
def test_the_variants_the_script_names_exist(workload, names):
    known = set(variants.names(workload))
    assert set(names.split(",")) <= known, set(names.split(",")) - known


def test_the_pattern_sees_a_held_line():
    line = "            ag) held ag_gemm ag-gemm ${HELDOUT_S:-160} all M=1,N=2,K=3 M=4,N=5,K=6 ;;"
    m = HELD.match(line)
    assert m and m.group(2) == "ag-gemm" and m.group(3) == "all" and m.group(4).split() == ["M=1,N=2,K=3", "M=4,N=5,K=6"]
