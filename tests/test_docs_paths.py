"""The user documentation (README.md, docs/) names only what is in the tree: every file path (taxes/...,
kernels/..., cli/..., benchmarks/..., tests/..., reports/..., docs/...) and every dotted module path
(taxes.x.y, with a function or constant after it) exists, and no commit hash is cited: the docs say what
the tool does and what the committed documents show; reports/README.md keeps their history."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from taxes.documents.results import SCHEMA as RESULT_SCHEMA
from taxes.model.hardware import PROFILE_SCHEMA

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").iterdir() if p.is_file())]
FILE_PATH = re.compile(r"(?<![\w/.~-])((?:taxes|kernels|cli|benchmarks|tests|reports|docs)/[\w/.*{},\\-]*[\w*}])")
MODULE_PATH = re.compile(r"(?<![\w/.-])(taxes(?:\.[A-Za-z_]\w*)+)")
# a commit hash: 7 to 40 hex digits with a letter and a digit among them (a long number or a word is none)
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
PACKAGE_DIRS = {"taxes.cli": ROOT / "cli", "taxes.kernels": ROOT / "kernels"}  # pyproject's package-dir
SCHEMA_NAMES = {RESULT_SCHEMA, PROFILE_SCHEMA}  # the `schema` values of documents, not modules


def expanded(path: str) -> list[str]:
    """h100-x2-{1,2,3}.json -> the three names; a backslash before * (Markdown) dropped."""
    parts = re.split(r"\{([^{}]*)\}", path.replace("\\*", "*"))
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def missing_file(path: str) -> bool:
    return any(not list(ROOT.glob(p)) if "*" in p else not (ROOT / p).exists() for p in expanded(path.rstrip(".")))


def module_file(dotted: str) -> Path | None:
    """The file of a dotted module path in this tree, None when there is none."""
    parts = dotted.split(".")
    base = PACKAGE_DIRS.get(".".join(parts[:2]))
    folder = base if base is not None else ROOT / Path(*parts)
    for candidate in (folder / "__init__.py", folder.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def defines(source: Path, name: str) -> bool:
    """Whether a module's source defines NAME at its top level (a function, a class, an assignment, or a
    name it imports for its callers, as the package's facade does)."""
    return re.search(rf"^(?:def|class) {name}\b|^{name}\b[^=\n]*=|^from [\w.]+ import (?:.*[ ,])?{name}\b",
                     source.read_text(), re.M) is not None


def unresolved(dotted: str) -> str | None:
    """Why a dotted path names nothing here (None: it does): its longest module prefix, then at most one
    attribute that the module defines."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        source = module_file(".".join(parts[:n]))
        if source is None:
            continue
        rest = parts[n:]
        if not rest:
            return None
        if len(rest) == 1 and defines(source, rest[0]):
            return None
        return f"{'.'.join(parts[:n])} defines no {'.'.join(rest)}"
    return "no such module"


def mentions(pattern: re.Pattern) -> list[tuple[str, str]]:
    return [(doc.relative_to(ROOT).as_posix(), m) for doc in DOCS for m in pattern.findall(doc.read_text())]


def test_the_docs_name_paths_and_modules():
    names = {m for _, m in mentions(MODULE_PATH)}
    files = {m for _, m in mentions(FILE_PATH)}
    assert any(f.startswith("taxes/") and f.endswith(".py") for f in files) and len(names) >= 3


def test_every_file_path_the_docs_name_exists():
    bad = sorted({(doc, path) for doc, path in mentions(FILE_PATH) if missing_file(path)})
    assert not bad, f"named in the docs but not in the tree: {bad}"


def test_every_module_path_the_docs_name_exists():
    bad = sorted({(doc, name, why) for doc, name in mentions(MODULE_PATH)
                  if name not in SCHEMA_NAMES and (why := unresolved(name))})
    assert not bad, f"module paths in the docs that name nothing: {bad}"


def test_the_docs_cite_no_commit():
    found = sorted({(doc, h) for doc, h in mentions(HASH)})
    assert not found, f"commit hashes in the docs (cite the committed document; history: reports/README.md): {found}"


@pytest.mark.parametrize("text, hits", [
    ("at commit b7e4efc, before", ["b7e4efc"]),
    ("ee82aa2e0df8c6354af86d46d02a62c79ab5f6cf", ["ee82aa2e0df8c6354af86d46d02a62c79ab5f6cf"]),
    ("1048576 bytes, 16777216 elements, defaced, abc123", []),
])
def test_the_hash_pattern(text, hits):
    assert HASH.findall(text) == hits


def test_the_path_checks_tell_present_from_absent():
    assert not missing_file("reports/known_answer/h100-x2-{1,2,3}.json")
    assert missing_file("reports/known_answer/h100-x2-{1,9}.json")
    assert not missing_file("reports/profile/\\*-h100-x2.json.gz") and missing_file("taxes/harness.py")
    assert unresolved("taxes.attribution.attribute.iqm") is None and unresolved("taxes.cli.main") is None
    assert unresolved("taxes.profile") is None and unresolved("taxes.kernels") is None
    assert unresolved("taxes.harness.AlignedStart") is not None and unresolved("taxes.run.harness.AlignedStart") is None
    assert unresolved("taxes.attribution.attribute.no_such_function") is not None
