"""`taxes analyze` is bounded on every trace input: sizes read from the input are checked before use, reads
are limited, non-regular files refused unless asked for, user patterns guarded. Each case runs the command
in a fresh process under an address-space limit, with a generous time and memory bound (the fixed
command refuses each in well under a second and a few hundred MB; before, each hung, or took GBs).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _util import assert_one_line
from kineto_build import MM, add_launch, add_op, add_step, new_trace, write_trace

from taxes.attribution import analyze as A
from taxes.traces import kineto
from taxes.traces import classify
from taxes.errors import TaxesError

TAXES = str(Path(sys.executable).with_name("taxes"))
WALL_S = 10.0  # per case; the fixed command takes about one
RSS_MB = 2048
# Runs the command with its address space capped (a regression fails here instead of taking the machine
# down) and reports the children's peak resident memory.
BOUNDED = """
import resource, subprocess, sys
cap = 6 << 30
def limit():
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
try:
    p = subprocess.run(sys.argv[1:], preexec_fn=limit, capture_output=True, text=True, timeout=25)
    rc, err = p.returncode, p.stderr
except subprocess.TimeoutExpired:
    rc, err = 124, "timed out"
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024, rc, file=sys.stdout)
sys.stdout.write(err)
"""


def bounded(*args, **kw) -> tuple[int, str]:
    """Run `taxes analyze ARGS`: (exit code, stderr), asserting the time and memory bounds."""
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-c", BOUNDED, TAXES, "analyze", *map(str, args)], capture_output=True,
                       text=True, timeout=60, **kw)
    took = time.monotonic() - t
    head, _, err = p.stdout.partition("\n")
    rss_mb, rc = (int(x) for x in head.split())
    assert took < WALL_S, (args, took, err)
    assert rss_mb < RSS_MB, (args, rss_mb, err)
    return rc, err


def refused(*args, words: str, **kw) -> str:
    rc, err = bounded(*args, **kw)
    assert rc == 2, (rc, err)
    line = err.strip()
    assert_one_line(line)
    assert words in line, line
    return line


def small_trace(path: Path, rank: int = 0, world: int = 2, distributed: bool = True, **fields) -> Path:
    tr = new_trace(rank, world, distributed=distributed)
    if distributed:
        tr["doc"]["distributedInfo"].update(fields)
    for i in range(3):
        add_step(tr, i, 100.0 * i, 100.0 * i + 90)
        add_op(tr, "aten::mm", 100.0 * i + 1, 100.0 * i + 6)
        add_launch(tr, 100.0 * i + 2, [(MM, 7, 100.0 * i + 10, 100.0 * i + 60)])
    return write_trace(tr, path)


# ---- sizes read from the input ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rank100000000.json.gz", "rank65536.json", "rank" + "9" * 30 + ".json",
                                  "rank" + "1" * 5000 + ".json"])
def test_a_rank_number_in_a_file_name_is_bounded(tmp_path, name):
    """Before: rank100000000.json.gz took 3.9 GB and exited 0 (range(world) over the rank); 10^20 hung."""
    path = small_trace(tmp_path / "t.json", distributed=False)
    target = tmp_path / name[:200]
    path.rename(target)
    refused(target, words="in the file name is not a rank (0 to 65535)")
    t = time.monotonic()
    with pytest.raises(TaxesError):
        kineto.load_trace(target)
    assert time.monotonic() - t < 1.0


@pytest.mark.parametrize("field,value,words", [("world_size", 2_000_000_000, "world_size 2000000000 is not a world size"),
                                               ("world_size", 65537, "is not a world size (1 to 65536)"),
                                               ("rank", 10**20, "is not a rank (0 to 65535)"),
                                               ("rank", 70000, "is not a rank")])
def test_distributed_info_is_bounded(tmp_path, field, value, words):
    """Before: world_size 2e9 passed the < 2^31 check and took 10 GiB in 28 s."""
    refused(small_trace(tmp_path / "t.json", **{field: value}), words=words)


def test_a_world_at_the_bound_lists_only_the_first_missing_ranks(tmp_path):
    an = A.analyze([small_trace(tmp_path / "rank3.json", rank=3, world=65536)])
    (w,) = [w for w in an.warnings if "are missing" in w]
    assert "rank(s) 0, 1, 2, 4, 5," in w and "(65515 more)" in w and an.world_size == 65536


# ---- what is read ---------------------------------------------------------------------------------------


def test_dev_zero_and_fifos_are_refused_unless_asked_for(tmp_path):
    """Before: `analyze /dev/zero` hung (the reader re-copied its window while nothing parsed); a FIFO blocked
    forever, as a trace or as --plain / --comm-patterns."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    good = small_trace(tmp_path / "rank0.json")
    refused("/dev/zero", words="a character device, not a regular file; pass --allow-special-files")
    refused(fifo, words="a FIFO, not a regular file")
    refused(good, "--plain", fifo, words="a FIFO, not a regular file")
    refused(good, "--comm-patterns", fifo, words="a FIFO, not a regular file")
    refused(good, "--plain", "/dev/zero", words="a character device")
    refused(good, "--comm-patterns", "/dev/zero", words="a character device")
    # asked for: read, and still bounded (NUL bytes are refused at the first one; the side files by size)
    refused("--allow-special-files", "/dev/zero", words="not a trace (it starts with '\\x00'")
    refused("--allow-special-files", good, "--plain", "/dev/zero", words="larger than 64 MiB")
    refused("--allow-special-files", good, "--comm-patterns", "/dev/zero", words="larger than 1 MiB")


def test_a_trace_from_a_fifo_when_asked_for(tmp_path):
    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)
    data = (small_trace(tmp_path / "t.json")).read_bytes()

    def feed():
        with open(fifo, "wb") as f:
            f.write(data)

    threading.Thread(target=feed, daemon=True).start()
    rc, err = bounded("--allow-special-files", "--format", "json", "-o", tmp_path / "out.json", fifo)
    assert rc == 0, err
    assert json.loads((tmp_path / "out.json").read_text())["trace_analysis"]["kept_steps"]


def test_a_value_that_never_completes_fails_within_its_window(tmp_path):
    """An endless unterminated string from a FIFO: before, the window grew (and was re-copied) without end."""
    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)

    def feed():
        try:
            with open(fifo, "wb") as f:
                f.write(b'{"traceEvents": [{"name": "')
                chunk = b"x" * (1 << 20)
                for _ in range(4096):
                    f.write(chunk)
        except (BrokenPipeError, OSError):
            pass

    threading.Thread(target=feed, daemon=True).start()
    refused("--allow-special-files", fifo, words="no JSON value completes within 64 MiB")


def test_gzip_bombs_are_refused_in_under_a_second(tmp_path):
    """Before: a 2 MB gzip of NUL bytes ran 120 s and reached 3.6 GB."""
    nul, blank = tmp_path / "nul.json.gz", tmp_path / "blank.json.gz"
    member = gzip.compress(b"\0" * (64 << 20), compresslevel=9)
    nul.write_bytes(member * 32)  # gzip members one after another: 2 GiB of NUL bytes in about 2 MB
    assert nul.stat().st_size < 4 << 20
    # a valid start, then only blanks: no byte is wrong, the expansion is
    blank.write_bytes(gzip.compress(b'{"traceEvents": [') + gzip.compress(b" " * (64 << 20), compresslevel=9) * 32)
    for path, words in ((nul, "not a trace (it starts with '\\x00'"), (blank, "a gzip bomb")):
        refused(path, words=words)
        t = time.monotonic()
        with pytest.raises(TaxesError):
            kineto.load_trace(path)
        assert time.monotonic() - t < 1.0, path


def test_a_missing_execution_trace_is_an_error(tmp_path):
    """Before: `--et` naming a missing file was ignored when the trace had no launching op (exit 0)."""
    tr = new_trace(0, 1)
    for i in range(3):
        add_step(tr, i, 100.0 * i, 100.0 * i + 90)
        add_launch(tr, 100.0 * i + 2, [(MM, 7, 100.0 * i + 10, 100.0 * i + 60)])  # no cpu op around it
    path = write_trace(tr, tmp_path / "rank0.json")
    refused(path, "--et", tmp_path / "rank0.et.json", words="no such file (the execution trace)")


# ---- user patterns --------------------------------------------------------------------------------------


def test_a_pattern_that_backtracks_without_end_is_refused(tmp_path):
    """Before: `--comm-pattern '^(a+)+$'` hung on 35-character kernel names."""
    tr = new_trace(0, 1)
    for i in range(3):
        add_step(tr, i, 100.0 * i, 100.0 * i + 90)
        add_launch(tr, 100.0 * i + 2, [("a" * 35 + "!", 7, 100.0 * i + 10, 100.0 * i + 60)])
    path = write_trace(tr, tmp_path / "rank0.json")
    refused(path, "--comm-pattern", "^(a+)+$", words="a repeat inside a repeat")
    for pattern, words in (("(a|a)+$", "alternation whose branches"), ("(\\w+\\s?)+$", "a repeat inside a repeat"),
                           ("(a)\\1", "back-reference"), ("(.*a){12}", "a repeat inside a repeat")):
        with pytest.raises(TaxesError, match=words.replace("(", "\\(")) as e:
            classify.user_rule(pattern)
        assert_one_line(str(e.value))
    patterns = tmp_path / "patterns.txt"
    patterns.write_text("# ours\nmy_allreduce\n^(a+)+$\n")
    refused(path, "--comm-patterns", patterns, words="a repeat inside a repeat")
    rc, err = bounded(path, "--comm-pattern", "(foo|bar)_.*kernel", "--format", "json", "-o", tmp_path / "o.json")
    assert rc == 0, err


def test_a_slow_pattern_the_guard_lets_through_meets_the_time_limit(monkeypatch):
    """Adjacent repeats backtrack polynomially (no nesting for the guard to see): the timer stops them."""
    monkeypatch.setattr(classify, "MATCH_BUDGET_S", 0.5)
    rule = classify.user_rule("a*a*a*a*a*a*a*a*a*a*a*b")
    t = time.monotonic()
    with pytest.raises(TaxesError, match="took more than") as e:
        classify.classify(["a" * 35, "a" * 36], ["kernel", "kernel"], rule_set=classify.BUILTIN_RULES + (rule,))
    assert time.monotonic() - t < 5.0
    assert_one_line(str(e.value))
