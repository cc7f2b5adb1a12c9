"""benchmarks/ holds only what reproduces a committed result: every script there is named by README.md,
docs/ or reports/README.md (the document it made, or how to reproduce a number), or is used by a script
that is (a shared helper, a program a stage runs)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def cited_text() -> str:
    docs = [ROOT / "README.md", ROOT / "reports" / "README.md", *sorted((ROOT / "docs").iterdir())]
    return "\n".join(p.read_text() for p in docs if p.is_file())


def uncited(scripts: list[Path], text: str) -> list[str]:
    """The scripts that neither the text nor a cited script names (by file name, or module name for an import)."""
    cited = {p for p in scripts if p.name in text}
    while True:
        used = "\n".join(p.read_text() for p in cited)
        more = {p for p in scripts if p not in cited and (p.name in used or f"import {p.stem}" in used
                                                         or f"from {p.stem} import" in used)}
        if not more:
            return sorted(p.name for p in scripts if p not in cited)
        cited |= more


def test_every_benchmark_script_is_cited():
    scripts = sorted(p for p in BENCHMARKS.rglob("*") if p.is_file() and p.suffix in (".py", ".sh"))
    assert len(scripts) >= 5
    assert uncited(scripts, cited_text()) == []


def test_a_script_nothing_names_is_found(tmp_path):
    a, b, c = (tmp_path / n for n in ("a.py", "helper.py", "orphan.py"))
    a.write_text("from helper import x\n")
    b.write_text("x = 1\n")
    c.write_text("print(2)\n")
    assert uncited([a, b, c], "run benchmarks/a.py") == ["orphan.py"]
