"""The committed result set, as reports/README.md lists it: tests that read a committed document name it
through here, so a document that moved or went missing fails with a message instead of skipping."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INDEX = ROOT / "reports" / "README.md"
LISTED = re.compile(r"`(reports/[^`\s]+\.[a-z]+)`")  # a file: a name with an extension


def listed() -> list[str]:
    """Every file the index names (`reports/NAME.EXT` in backquotes), in order, each once."""
    assert INDEX.exists(), f"{INDEX.relative_to(ROOT)} is missing: it indexes the committed results"
    return list(dict.fromkeys(LISTED.findall(INDEX.read_text())))


def committed(path: str) -> Path:
    """A committed file by its path from the repository root: listed in the index and present."""
    assert path in listed(), f"{path} is not listed in reports/README.md (moved? update the index and the test)"
    full = ROOT / path
    assert full.is_file(), f"{path} is listed in reports/README.md but missing from the tree"
    return full


def result_documents() -> list[Path]:
    """Every listed result document (schema taxes.result), compressed or not; the list is never empty."""
    out = []
    for path in listed():
        if path.endswith((".json", ".json.gz")):
            full = committed(path)
            data = full.read_bytes()
            head = (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)[:400]
            if b'"taxes.result"' in head:
                out.append(full)
    assert out, "reports/README.md lists no result document"
    return out
