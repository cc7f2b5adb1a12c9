"""`taxes analyze --scheduler ADDRESS`: the ranks read and attributed on a Dask cluster's workers give the same
document as the local process pool (a distributed.LocalCluster of worker processes here), and taxes works
without Dask installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _util import assert_one_line
from kineto_build import write_trace
from _analyze_data import REAL_PATHS, write_tp
from test_stragglers import lockstep

from taxes.attribution import analyze as A
from taxes.documents import analysis_document as D
from taxes.attribution import ranks
from taxes.errors import TaxesError

distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed (the dask extra)")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::ResourceWarning")
TAXES = str(Path(sys.executable).with_name("taxes"))


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        yield c.scheduler_address


def document(an) -> dict:
    doc = D.analysis_document(an)
    for k in ("date", "git_commit", "git_dirty"):
        doc["metadata"].pop(k, None)
    return json.loads(json.dumps(doc))


def trace_sets(tmp_path):
    progs, _ = lockstep(3, 1, 150.0, "host", seed=3)
    late = [str(write_trace(p.tr, tmp_path / "late" / f"rank{r}.json")) for r, p in enumerate(progs)]
    return {"tensor parallel": [str(p) for p in write_tp(tmp_path / "tp")], "a late rank": late,
            "real": [str(p) for p in REAL_PATHS]}


def test_the_cluster_gives_the_local_document(tmp_path, cluster):
    for name, paths in trace_sets(tmp_path).items():
        if not paths:
            continue
        local = A.analyze(paths, jobs=2)
        remote = A.analyze(paths, scheduler=cluster)
        assert document(remote) == document(local), name
        assert remote.timelines == {} and local.timelines  # only the per-rank tables came back


def test_the_command_takes_the_scheduler_from_the_environment(tmp_path, cluster):
    paths = write_tp(tmp_path)
    out_local, out_remote = tmp_path / "local.json", tmp_path / "remote.json"
    env = {k: v for k, v in os.environ.items() if k != ranks.SCHEDULER_ENV}
    for out, extra in ((out_local, {}), (out_remote, {ranks.SCHEDULER_ENV: cluster})):
        p = subprocess.run([TAXES, "analyze", *map(str, paths), "--format", "json", "-o", str(out)], env=env | extra,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
    a, b = (json.loads(x.read_text()) for x in (out_local, out_remote))
    for d in (a, b):
        d["metadata"].pop("date", None)
    assert a == b


def test_an_unreachable_scheduler_is_one_line(monkeypatch):
    monkeypatch.setattr(ranks, "CONNECT_TIMEOUT_S", 1)
    with pytest.raises(TaxesError, match="cannot reach a Dask scheduler") as e:
        A.analyze([str(REAL_PATHS[0]) if REAL_PATHS else "rank0.json"], scheduler="tcp://127.0.0.1:9")
    assert_one_line(str(e.value))


def test_taxes_works_without_dask(tmp_path):
    """The import stays lazy: without distributed, the local run works and --scheduler says what to install."""
    paths = [str(p) for p in write_tp(tmp_path)]
    block = "import sys; sys.modules['distributed'] = None; sys.modules['dask'] = None; from taxes.cli.main import main; main()"
    p = subprocess.run([sys.executable, "-c", block, "analyze", *paths, "--format", "json", "-o", str(tmp_path / "o.json")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([sys.executable, "-c", block, "analyze", *paths, "--scheduler", "tcp://127.0.0.1:8786"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "pip install 'taxes[dask]'" in p.stderr, p.stderr
    assert_one_line(p.stderr.strip())
