"""One grammar on every command (README, "Command-line grammar"): walks the click group, subcommands
included, so that a command added later is held to it too."""

from __future__ import annotations

import json

import click
import pytest
from _util import assert_one_line, run_cli

from taxes.cli.main import cli

# What each command takes, besides -o, --format and --force, which every command takes.
TAKES_A_WORLD = {"model", "profile", "validate", "calibrate"}
TAKES_VARIANTS = {"model", "profile", "compare"}
WRITES_SEVERAL_FILES = {"validate", "trace"}
HIDDEN_ALIASES = {"--world": TAKES_A_WORLD, "--variant": TAKES_VARIANTS - {"compare"}, "--out": {"trace"}}


def _commands(group: click.Group = cli, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    out = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            out += _commands(command, prefix + (name,))
        else:
            out.append((prefix + (name,), command))
    return out


COMMANDS = _commands()
IDS = [" ".join(path) for path, _ in COMMANDS]


def _option(command: click.Command, name: str) -> click.Option | None:
    return next((p for p in command.params if isinstance(p, click.Option) and name in p.opts), None)


def test_the_walk_finds_every_command_and_subcommand():
    names = set(IDS)
    assert {"model", "hardware list", "hardware show", "report", "profile", "validate", "compare", "analyze",
            "calibrate", "check", "trace"} <= names
    assert TAKES_A_WORLD | TAKES_VARIANTS | WRITES_SEVERAL_FILES <= names


@pytest.mark.parametrize("path,command", COMMANDS, ids=IDS)
def test_every_command_takes_the_shared_options(path, command):
    name = " ".join(path)
    output = _option(command, "-o")
    assert output is not None and "--output" in output.opts, f"{name}: no -o/--output"
    fmt = _option(command, "--format")
    assert fmt is not None and isinstance(fmt.type, click.Choice), f"{name}: no --format"
    assert set(fmt.type.choices) & {"table", "md", "json", "csv", "html"}, fmt.type.choices
    assert _option(command, "--force") is not None, f"{name}: writes -o but takes no --force"
    assert (_option(command, "--gpus") is not None) == (name in TAKES_A_WORLD), name
    assert (_option(command, "--variants") is not None) == (name in TAKES_VARIANTS), name
    assert (_option(command, "--out-dir") is not None) == (name in WRITES_SEVERAL_FILES), name


@pytest.mark.parametrize("path,command", COMMANDS, ids=IDS)
def test_older_spellings_are_hidden_aliases(path, command):
    name = " ".join(path)
    for alias, commands in HIDDEN_ALIASES.items():
        option = _option(command, alias)
        if name in commands:
            assert option is not None and option.hidden, f"{name}: {alias} should be a hidden alias"
        else:
            assert option is None or option.hidden, f"{name}: {alias} is shown"


@pytest.mark.parametrize("path,command", COMMANDS, ids=IDS)
def test_help_works_and_shows_the_grammar_only(path, command, capsys):
    code, out, err = run_cli([*path, "--help"], capsys)
    assert code == 0, err
    assert out.startswith("Usage: taxes " + " ".join(path))
    assert "-o, --output" in out and "--format" in out
    for alias in HIDDEN_ALIASES:
        assert f"{alias} " not in out, f"{' '.join(path)}: the hidden {alias} shows in --help"
    assert "median" not in out.lower(), "the statistic is the interquartile mean"


@pytest.mark.parametrize("path,command", COMMANDS, ids=IDS)
def test_an_unknown_option_is_one_line_and_exit_2(path, command, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing the command might start writes into the checkout
    code, out, err = run_cli([*path, "--no-such-option"], capsys)
    assert code == 2, (code, out, err)
    assert out == ""
    assert err.startswith("taxes: error: ")
    assert_one_line(err.rstrip("\n"))


def test_gpus_and_its_hidden_alias_world_are_the_same_option(capsys):
    worlds = []
    for flag in ("--gpus", "--world"):
        code, out, err = run_cli(["model", "ag-gemm", flag, "4", "--format", "json"], capsys)
        assert code == 0, err
        worlds.append(json.loads(out)["metadata"]["world_size"])
    assert worlds == [4, 4]


def test_variants_and_its_hidden_alias_variant_add_up_in_order(capsys):
    code, out, err = run_cli(["model", "ag-gemm", "--variants", "fused-pull,bsp", "--variant", "bsp-graph",
                              "--variant", "bsp", "--format", "json"], capsys)
    assert code == 0, err
    assert [v["variant"] for v in json.loads(out)["cases"][0]["variants"]] == ["fused-pull", "bsp", "bsp-graph"]


@pytest.mark.parametrize("fmt", ["table", "md", "json", "csv"])
def test_hardware_list_writes_every_format_to_o_and_force_replaces(fmt, capsys, tmp_path):
    target = tmp_path / f"profiles.{fmt}"
    code, out, err = run_cli(["hardware", "list", "--format", fmt, "-o", str(target)], capsys)
    assert code == 0, err
    text = target.read_text()
    assert "h100-sxm" in text and "h200-sxm" in text
    if fmt == "json":
        assert {"name", "source", "HBM GB/s"} <= set(json.loads(text)[0])
    code, out, err = run_cli(["hardware", "list", "--format", fmt, "-o", str(target)], capsys)
    assert code == 2 and "already exists" in err
    code, out, err = run_cli(["hardware", "list", "--format", fmt, "-o", str(target), "--force"], capsys)
    assert code == 0, err


def test_validate_writes_its_table_to_o_and_its_files_to_out_dir(capsys, tmp_path):
    """-o is the rendered result, --out-dir the files; --force replaces both, and the older -o DIR still
    means the directory."""
    from pathlib import Path

    doc = str(Path(__file__).parent / "data" / "documents" / "emulated_ag_gemm.json.gz")
    table, out_dir = tmp_path / "validation.md", tmp_path / "val"
    args = ["validate", "--from", doc, "--format", "md", "-o", str(table), "--out-dir", str(out_dir)]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    assert out == "" and table.read_text().startswith("## the model against measurement")
    assert json.loads((out_dir / "validation.json").read_text())["rows"]
    code, out, err = run_cli(args, capsys)
    assert code == 2 and "already exists" in err
    code, out, err = run_cli([*args, "--force"], capsys)
    assert code == 0, err
    code, out, err = run_cli(["validate", "--from", doc, "-o", str(out_dir), "--force"], capsys)  # the older spelling
    assert code == 0, err
    assert "the model against measurement" in out and f"wrote {out_dir}" in err.replace("\n", " ")
