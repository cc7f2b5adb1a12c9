"""Every `taxes ...` command the user documentation shows as a code line (README.md, docs/) parses as the
shell would hand it over: a glob such as `results/*.json` arrives as several words, so a command that took
one path where the docs give a glob fails here. Parsing only: nothing runs."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
import pytest

from taxes.cli.main import cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documented_commands() -> list[tuple[str, str]]:
    """(where, command line) for every indented code line that starts with `taxes `, continuation lines
    joined, the comment and anything after a pipe or `&&` left out."""
    found = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        i = 0
        while i < len(lines):
            number, line = i + 1, lines[i]
            i += 1
            if not line.startswith("    ") or not line.strip().startswith("taxes "):
                continue
            while line.rstrip().endswith("\\") and i < len(lines):
                line = line.rstrip()[:-1] + " " + lines[i].strip()
                i += 1
            text = line.strip().split("  #")[0]
            for cut in (" && ", " | ", " > "):
                text = text.split(cut)[0]
            found.append((f"{doc.name}:{number}", text))
    return found


def as_the_shell_gives_it(text: str) -> list[str]:
    """The words after `taxes`; a word with `*` becomes two (the glob matched two files); a `...` left
    in prose is dropped."""
    words = []
    for word in shlex.split(text)[1:]:
        if word == "...":
            continue
        words += [word.replace("*", "a"), word.replace("*", "b")] if "*" in word else [word]
    return words


COMMANDS = documented_commands()


def test_the_docs_show_commands_of_every_kind():
    shown = {as_the_shell_gives_it(text)[0] for _, text in COMMANDS}
    assert {"model", "profile", "report", "validate", "compare", "analyze", "trace", "calibrate"} <= shown


@pytest.mark.parametrize("where,text", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_command_parses(where, text):
    command, args, name = cli, as_the_shell_gives_it(text), "taxes"
    while isinstance(command, click.Group) and args and args[0] in command.commands:
        name, command, args = args[0], command.commands[args[0]], args[1:]
    assert not isinstance(command, click.Group), f"{where}: {text!r} names no command"
    try:
        command.make_context(name, list(args))
    except click.exceptions.Exit:  # --help and the like
        pass
    except click.ClickException as e:
        pytest.fail(f"{where}: {text!r}: {e.format_message()}")


def test_validate_takes_the_documents_a_glob_gives(capsys, tmp_path):
    """`taxes validate --from results/*.json`: every document the shell lists is validated, not the first."""
    from _util import run_cli

    data = Path(__file__).parent / "data" / "documents"
    first = data / "emulated_ag_gemm.json.gz"
    second = tmp_path / "second.json.gz"
    second.write_bytes(first.read_bytes())
    out = tmp_path / "validation.json"
    code, _, err = run_cli(["validate", "--from", str(first), str(second), "--format", "json", "-o", str(out)], capsys)
    assert code == 0, err
    import json

    doc = json.loads(out.read_text())
    assert doc["documents"] == [str(first), str(second)], doc["documents"]
    code, _, err = run_cli(["validate", "--planted", str(first)], capsys)
    assert code == 2 and "--planted" in err and len(err.strip().splitlines()) == 1, err
