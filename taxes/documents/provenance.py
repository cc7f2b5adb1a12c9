"""What code made a result: the commit, whether the checkout had uncommitted changes, and a hash of them.

From git when the package runs from a checkout; on a machine that got a copy of the working tree without
its .git (a lent GPU machine), from the file .taxes-provenance.json at the copy's root, written beside the
checkout before it was copied (`python -m taxes.documents.provenance`).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

VERSION = "0.1.0"  # the package version (taxes.__version__); documents record it as tool_version

ROOT = Path(__file__).resolve().parents[2]  # the checkout (taxes/documents/ is two below it)
STAMP = ".taxes-provenance.json"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def collect() -> dict:
    """{"git_commit", "git_dirty", "git_diff_sha256", "provenance"}: from git, else from the stamp file; the
    stamp first where TAXES_PROVENANCE=stamp (a copied tree whose .git, if any, is not the code's)."""
    import os

    if os.environ.get("TAXES_PROVENANCE") == "stamp":
        return _stamp()
    head = _git("rev-parse", "HEAD")
    if head:
        diff = _git("diff", "HEAD", "--no-ext-diff") or ""
        dirty = bool(diff.strip())
        return {"git_commit": head.strip(), "git_dirty": dirty,
                "git_diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if dirty else None, "provenance": "git"}
    return _stamp()


def _stamp() -> dict:
    try:
        d = json.loads((ROOT / STAMP).read_text())
        return {"git_commit": d.get("git_commit"), "git_dirty": d.get("git_dirty"),
                "git_diff_sha256": d.get("git_diff_sha256"), "provenance": STAMP}
    except (OSError, ValueError):
        return {"git_commit": None, "git_dirty": None, "git_diff_sha256": None, "provenance": None}


def main() -> int:
    """Write the stamp file at the checkout's root (before copying the working tree elsewhere)."""
    d = collect()
    (ROOT / STAMP).write_text(json.dumps(d) + "\n")
    print(f"{ROOT / STAMP}: commit {d['git_commit']}, dirty {d['git_dirty']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def require_clean_checkout(command: str) -> None:
    """--strict: a run from a checkout with uncommitted changes (or of unknown commit) is refused."""
    from taxes.errors import TaxesError

    p = collect()
    if p["git_dirty"] is not False or not p["git_commit"]:
        raise TaxesError(f"{command} --strict: " + ("the checkout has uncommitted changes; commit them first"
                                                    if p["git_dirty"] else "the code's commit is unknown"))
