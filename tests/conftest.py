"""Shared fixtures for the CPU-only test suite of `taxes`."""

from __future__ import annotations

import os

# Kernels run under Triton's interpreter with emulated ranks unless asked otherwise (TRITON_INTERPRET=0 on a
# GPU machine runs the tests marked gpu); it must be set before triton is first imported.
os.environ.setdefault("TRITON_INTERPRET", "1")


import copy
import os
import sys

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))  # make tests/_util.py importable from every test module

# No example database: the suite must not write outside tests/; deadlines off (CI machines vary).
settings.register_profile(
    "taxes", deadline=None, database=None, max_examples=100,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile("thorough", parent=settings.get_profile("taxes"), max_examples=3000)
settings.load_profile("taxes")  # `pytest --hypothesis-profile=thorough` searches harder


@pytest.fixture(autouse=True)
def _isolated_profiles(monkeypatch, tmp_path_factory):
    """Saved profiles on this machine (~/.config/taxes/profiles, TAXES_PROFILE_DIR) must not leak in."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("TAXES_PROFILE_DIR", raising=False)
    monkeypatch.delenv("TAXES_DEBUG", raising=False)


@pytest.fixture(scope="session")
def _model_doc_master():
    from taxes.model import predict as model
    from taxes.documents import results
    from taxes.model.hardware import BUILTIN
    from taxes.workloads import make_workload

    hw = BUILTIN["h200-sxm"]
    cases = [
        model.predict_all(make_workload("ag-gemm", {"M": 4096, "N": 2048, "K": 1024}, 2), hw),
        model.predict_all(make_workload("gemm-rs", {"M": 2048, "N": 1024, "K": 4096}, 2), hw),
        model.predict_all(make_workload("flash-decode", {"B": 2, "Hq": 32, "Hkv": 4, "D": 64, "S": 8192}, 2), hw),
    ]
    return results.model_document(cases, hw.name, 2), cases


@pytest.fixture
def model_doc(_model_doc_master):
    """A model document with three cases (one per workload) x four variants; a fresh copy per test."""
    return copy.deepcopy(_model_doc_master[0])


@pytest.fixture
def model_predictions(_model_doc_master):
    return _model_doc_master[1]


@pytest.fixture
def emulated_doc():
    """A real document: `taxes profile ag-gemm --emulate` (M=64,N=64,K=32, 8 iterations), with rows."""
    import gzip
    from pathlib import Path

    from taxes.documents import results

    path = Path(__file__).parent / "data" / "documents" / "emulated_ag_gemm.json.gz"
    return results.loads(gzip.decompress(path.read_bytes()).decode())
