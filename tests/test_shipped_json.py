"""The JSON files that install with the package (kernels/*.json, taxes/**/*.json) name no absolute path:
a path of the machine a table was made on means nothing where it is installed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# a path from the root: after the start, a blank, a quote, `=`, `:` or `(`; `//` of a URL does not count
ABSOLUTE = re.compile(r"(?:^|[\s=:'\"(,])(/[\w.~-]+(?:/[\w.~-]*)*)")
SHIPPED = sorted([*ROOT.glob("kernels/*.json"), *ROOT.glob("taxes/**/*.json")])


def strings(value):
    """Every string in a JSON value, keys included."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)
    elif isinstance(value, str):
        yield value


def absolute_paths(value) -> list[str]:
    return [m for s in strings(value) for m in ABSOLUTE.findall(s)]


def test_the_shipped_json_files_are_found():
    names = {p.name for p in SHIPPED}
    assert {"flash_decode_tuned.json", "ag_gemm_tuned.json", "result-v1.json"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_shipped_json_file_names_no_absolute_path(path):
    found = absolute_paths(json.loads(path.read_text()))
    assert not found, f"{path.relative_to(ROOT)} names absolute paths: {sorted(set(found))}"


def test_the_check_sees_an_absolute_path_and_passes_relative_ones_and_urls():
    assert absolute_paths({"made_by": "tune.py --out /scratch/out --name t"}) == ["/scratch/out"]
    assert absolute_paths(["/opt/x.json"]) == ["/opt/x.json"]
    assert absolute_paths({"source": "reports/flash_decode/decode_tune-h100.json, 1/8 of https://example.org/a",
                           "ratio": "M/N"}) == []
