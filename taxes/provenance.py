"""What made a result: the commit, whether the checkout had uncommitted changes and a hash of them, the
versions of the tools and the machine's GPUs (collect_metadata, every document's and profile's metadata).

From git when the package runs from a checkout; on a machine that got a copy of the working tree without
its .git (a lent GPU machine), from the file .taxes-provenance.json at the copy's root, written beside the
checkout before it was copied (`python -m taxes.provenance`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import subprocess
import sys
from importlib import metadata as _md
from pathlib import Path

VERSION = "0.1.0"  # the package version (taxes.__version__); documents record it as tool_version

ROOT = Path(__file__).resolve().parents[1]  # the checkout (taxes/ is one below it)
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


def _version(dist: str) -> str | None:
    try:
        return _md.version(dist)
    except _md.PackageNotFoundError:
        return None


def collect_metadata(kind: str, world_size: int, hardware_profile: str, **extra) -> dict:
    """Versions, commit, date and (when torch is already loaded with CUDA) the GPUs and their clocks."""
    meta = {
        "kind": kind,
        "tool_version": VERSION,
        **{k: v for k, v in collect().items()},
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "torch_version": _version("torch"),
        "triton_version": _version("triton"),
        "cuda_version": None,
        "nccl_version": None,
        "gpu_names": [],
        "world_size": world_size,
        "hardware_profile": hardware_profile,
        "python": sys.version.split()[0],
    }
    torch = sys.modules.get("torch")  # never import torch just for metadata: it is slow
    if torch is not None:
        meta["cuda_version"] = torch.version.cuda
        if torch.cuda.is_available():
            meta["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            try:
                meta["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:  # NCCL absent from this build
                pass
    meta.update(extra)
    return meta


def main() -> int:
    """Write the stamp file at the checkout's root (before copying the working tree elsewhere)."""
    d = collect()
    (ROOT / STAMP).write_text(json.dumps(d) + "\n")
    print(f"{ROOT / STAMP}: commit {d['git_commit']}, dirty {d['git_dirty']}", file=sys.stderr)
    return 0



def require_clean_checkout(command: str) -> None:
    """--strict: a run from a checkout with uncommitted changes (or of unknown commit) is refused."""
    from taxes.errors import TaxesError

    p = collect()
    if p["git_dirty"] is not False or not p["git_commit"]:
        raise TaxesError(f"{command} --strict: " + ("the checkout has uncommitted changes; commit them first"
                                                    if p["git_dirty"] else "the code's commit is unknown"))


if __name__ == "__main__":
    sys.exit(main())
