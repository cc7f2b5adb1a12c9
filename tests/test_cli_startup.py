"""Start-up: printing a prediction loads neither pandas nor matplotlib (each costs a good part of a second,
and the model's table needs neither); benchmarks/startup.py times the same command."""

from __future__ import annotations

import json
import subprocess
import sys

# The command in-process in a fresh interpreter, then the modules it left loaded, as JSON on stderr.
PROBE = """
import json, sys
from taxes.cli.main import cli
try:
    cli.main({args!r})
except SystemExit as e:
    code = e.code
sys.stderr.write("\\nMODULES " + json.dumps({{"code": code, "modules": sorted(sys.modules)}}) + "\\n")
"""


def _loaded(args: list[str]) -> tuple[int, set[str], str]:
    r = subprocess.run([sys.executable, "-c", PROBE.format(args=args)], capture_output=True, text=True, timeout=120)
    line = next(x for x in r.stderr.splitlines() if x.startswith("MODULES "))
    found = json.loads(line[len("MODULES "):])
    return found["code"], set(found["modules"]), r.stdout


def test_the_model_table_loads_neither_pandas_nor_matplotlib():
    code, modules, out = _loaded(["model", "ag-gemm", "--format", "table"])
    assert code in (0, None)
    assert "fused-pull" in out and "E2E" in out  # the table was printed
    assert "pandas" not in modules and "matplotlib" not in modules
    assert "taxes.model.predict" in modules  # the probe sees what the command loaded


def test_the_probe_sees_pandas_where_the_command_needs_it():
    code, modules, out = _loaded(["model", "ag-gemm", "--format", "csv"])
    assert code in (0, None) and out.startswith("workload,")
    assert "pandas" in modules  # the CSV is written through a DataFrame
