"""The data flows one way (README, Layout): ground -> traces -> workloads -> kernels -> model -> attribution ->
documents -> run -> reports -> the facade -> the command line. Every import in taxes/, kernels/ and cli/, the
lazy ones inside functions too, names a module of its own stage or of one below it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Lowest first. What every stage shares stands on the ground: files, errors, provenance, schemas, the console.
STAGES = (
    ("ground", ("taxes.errors", "taxes.method", "taxes.sanitize", "taxes.files", "taxes.provenance", "taxes.schema",
                "taxes.console")),
    ("traces", ("taxes.traces",)),
    ("workloads", ("taxes.variants", "taxes.workloads")),
    ("kernels", ("taxes.kernels",)),
    ("model", ("taxes.model",)),
    ("attribution", ("taxes.attribution",)),
    ("documents", ("taxes.documents",)),
    ("run", ("taxes.run",)),
    ("reports", ("taxes.reports",)),
    ("facade", ("taxes",)),
    ("cli", ("taxes.cli", "taxes.__main__")),
)


def stage(module: str) -> int | None:
    """The index of the stage whose longest prefix names the module; None outside taxes."""
    best = None
    for i, (_, prefixes) in enumerate(STAGES):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return best[0] if best else None


def module_of(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[0] in ("kernels", "cli"):  # installed as taxes.kernels and taxes.cli (pyproject's package-dir)
        parts = ["taxes", *parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_up(root: Path, tops=("taxes", "kernels", "cli")) -> list[str]:
    """'module (stage) imports target (stage) at line N' for every import that reaches a higher stage."""
    found = []
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            here = stage(module_of(path, root))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    # `from taxes import files` names taxes.files, not the facade
                    targets = [f"{node.module}.{a.name}" for a in node.names] if node.module == "taxes" else [node.module]
                else:
                    continue
                for target in targets:
                    there = stage(target)
                    if here is not None and there is not None and there > here:
                        found.append(f"{module_of(path, root)} ({STAGES[here][0]}) imports {target} "
                                     f"({STAGES[there][0]}) at line {node.lineno}")
    return found


def test_no_module_imports_a_later_stage():
    assert imports_up(ROOT) == []


def test_the_scan_sees_an_import_that_runs_back_up(tmp_path):
    """A lazy import from the model into the documents, and one from the files into the reports, are found."""
    (tmp_path / "taxes" / "model").mkdir(parents=True)
    (tmp_path / "taxes" / "model" / "x.py").write_text("def f():\n    from taxes.documents.results import load\n")
    (tmp_path / "taxes" / "files.py").write_text("from taxes import reports\nfrom taxes import errors\n")
    found = imports_up(tmp_path, tops=("taxes",))
    assert found == ["taxes.files (ground) imports taxes.reports (reports) at line 1",
                     "taxes.model.x (model) imports taxes.documents.results (documents) at line 2"], found


def test_every_module_belongs_to_a_stage():
    for top in ("taxes", "kernels", "cli"):
        for path in (ROOT / top).rglob("*.py"):
            assert stage(module_of(path, ROOT)) is not None, path
