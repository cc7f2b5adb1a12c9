"""Hostile input, bounded: every case is an input made here (a FIFO where a document belongs, a shape of
ten thousand digits, a time limit of nan, ...) given to the command line in a process of its own, and every
case is held to the same bounds: at most CPU_LIMIT_S of CPU time and RSS_LIMIT_BYTES of memory, never a hang
(WALL_LIMIT_S ends it as a failure), and, for input that is refused, one line on stderr and exit 2.
Each case names the defect it guards against."""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from taxes.documents import results

DATA = Path(__file__).parent / "data"
CPU_LIMIT_S = 10.0  # CPU time of the command: what a bound means on a machine loaded by other work
WALL_LIMIT_S = 90.0  # past this the command is taken for hung, stopped, and the case fails
RSS_LIMIT_BYTES = 2 << 30


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    cpu_s: float
    peak_rss_bytes: int


def run_bounded(args, cwd, env=None, close_stdout: bool = False) -> Outcome:
    """`python -m taxes ARGS` in a process group of its own, its exit code, output, CPU time and peak
    memory (from the kernel's accounting of that process, wait4); stopped and failed past WALL_LIMIT_S."""
    base = {k: v for k, v in os.environ.items() if k not in ("TAXES_DEBUG", "COLUMNS", "GITHUB_STEP_SUMMARY")}
    out_path, err_path = Path(cwd, ".out"), Path(cwd, ".err")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "taxes", *map(str, args)], cwd=cwd, env=base | (env or {}),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
                                preexec_fn=(lambda: os.close(1)) if close_stdout else None)
    deadline = time.monotonic() + WALL_LIMIT_S
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            os.wait4(proc.pid, 0)
            proc.returncode = -9
            pytest.fail(f"taxes {' '.join(map(str, args))[:200]}: still running after {WALL_LIMIT_S:.0f} s (hung)")
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    outcome = Outcome(proc.returncode, out_path.read_text(errors="replace"), err_path.read_text(errors="replace"),
                      usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024)
    out_path.unlink()
    err_path.unlink()
    return outcome


def assert_bounded(o: Outcome, what: str) -> None:
    assert o.cpu_s <= CPU_LIMIT_S, f"{what}: {o.cpu_s:.1f} s of CPU, over {CPU_LIMIT_S:.0f} s"
    assert o.peak_rss_bytes <= RSS_LIMIT_BYTES, f"{what}: {o.peak_rss_bytes / 2**30:.2f} GiB, over {RSS_LIMIT_BYTES >> 30} GiB"


def assert_refused(o: Outcome, words: str) -> None:
    """Exit 2 with one error line (after any notes), no traceback, no internal error, and the words."""
    lines = o.stderr.rstrip("\n").splitlines()
    errors = [line for line in lines if line.startswith("taxes: error: ")]
    assert o.code == 2, (o.code, o.stderr[-2000:])
    assert len(errors) == 1 and lines[-1] == errors[0], o.stderr[-2000:]
    assert "Traceback" not in o.stderr and "internal error" not in o.stderr, o.stderr[-2000:]
    assert words in errors[0], (words, errors[0])


# ---- generated inputs ------------------------------------------------------------------------------


def _measured_doc(tmp: Path) -> Path:
    path = tmp / "measured.json"
    path.write_bytes(gzip.decompress((DATA / "documents" / "emulated_ag_gemm.json.gz").read_bytes()))
    return path


def _model_doc(tmp: Path) -> Path:
    from taxes.model import predict as model
    from taxes.model.hardware import BUILTIN
    from taxes.workloads import make_workload

    path = tmp / "model.json"
    hw = BUILTIN["h200-sxm"]
    results.save(results.model_document([model.predict_all(make_workload("ag-gemm", {"M": 1024}, 2), hw)], hw.name, 2),
                 path)
    return path


def _fifo(tmp: Path, name: str = "pipe.json") -> Path:
    path = tmp / name
    os.mkfifo(path)
    return path


def _socket(tmp: Path) -> Path:
    path = tmp / "sock.json"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))  # the file stays after close
    s.close()
    return path


def _profile_file(tmp: Path, **changes) -> Path:
    from taxes.model.hardware import BUILTIN, profile_to_dict

    path = tmp / "tiny.json"
    path.write_text(json.dumps(profile_to_dict(BUILTIN["h200-sxm"]) | changes))
    return path


def _ladder_a_string(tmp: Path) -> Path:
    doc = json.loads(_measured_doc(tmp).read_text())
    doc["cases"][0]["extra"]["ladder"] = "not a ladder"
    path = tmp / "ladder.json"
    path.write_text(json.dumps(doc))
    return path


def _validated_dir(tmp: Path) -> Path:
    d = tmp / "val"
    d.mkdir()
    (d / "validation.json").write_text('{"keep": true}')
    return d


# (id, args from the case's directory, environment, the words of the refusal); each defect named
REFUSED = [
    # a FIFO nobody writes blocked forever wherever a file is read or appended to
    ("report-a-fifo", lambda t: ["report", _fifo(t)], None, "a FIFO, not a regular file"),
    ("check-a-fifo", lambda t: ["check", _fifo(t)], None, "a FIFO, not a regular file"),
    ("compare-a-fifo", lambda t: ["compare", _measured_doc(t), _fifo(t)], None, "a FIFO, not a regular file"),
    ("validate-from-a-fifo", lambda t: ["validate", "--from", _fifo(t)], None, "a FIFO, not a regular file"),
    ("hardware-a-fifo", lambda t: ["model", "ag-gemm", "--hardware", _fifo(t)], None, "a FIFO, not a regular file"),
    ("step-summary-a-fifo", lambda t: ["compare", _measured_doc(t), _measured_doc(t)],
     lambda t: {"GITHUB_STEP_SUMMARY": str(_fifo(t, "summary.md"))}, "GITHUB_STEP_SUMMARY"),
    # a device was read to the size limit (256 MiB of /dev/zero) before it was refused
    ("report-dev-zero", lambda t: ["report", "/dev/zero"], None, "a character device, not a regular file"),
    ("hardware-dev-zero", lambda t: ["model", "ag-gemm", "--hardware", "/dev/zero"], None, "a character device"),
    ("report-a-socket", lambda t: ["report", _socket(t)], None, "a socket, not a regular file"),
    # shapes: an int of 10,000 digits was 'internal error: Exceeds the limit (4300 digits)'; other scripts'
    # digits were read as numbers
    ("shape-10000-digits", lambda t: ["model", "ag-gemm", "--shape", "M=" + "7" * 10000], None, "too large"),
    ("shape-full-width-digits", lambda t: ["model", "ag-gemm", "--shape", "M=\uff11\uff12\uff18"], None, "ASCII digits"),
    ("shape-arabic-indic-digits", lambda t: ["model", "ag-gemm", "--shape", "M=\u0661\u0662\u0668"], None, "ASCII digits"),
    ("sweep-10000-digits", lambda t: ["model", "ag-gemm", "--sweep", "M=1:" + "9" * 10000], None, "too large"),
    # an emulated run allocated past 10 GiB, or ended in the allocator's internal error (a shape past any
    # machine's memory here; the issue's own shape against a machine of 10 GiB below)
    ("emulate-past-host-memory", lambda t: ["profile", "ag-gemm", "--emulate", "--shape", "M=16M,N=64K,K=64K"],
     None, "of host memory"),
    ("emulate-m-1e12", lambda t: ["profile", "ag-gemm", "--emulate", "--shape", "M=1000000000000"], None, "of host memory"),
    # --timeout-s nan, -5 and inf were taken and crashed the ranks
    *[(f"profile-timeout-{v}", lambda t, v=v: ["profile", "ag-gemm", "--emulate", "--timeout-s", v], None,
       "positive number of seconds") for v in ("nan", "-5", "inf")],
    ("validate-timeout-nan", lambda t: ["validate", "--emulate", "--timeout-s", "nan"], None, "positive number"),
    ("trace-timeout-inf", lambda t: ["trace", "--timeout-s", "inf", "--", sys.executable, "-c", "pass"], None,
     "positive number"),
    # a profile with hbm_gbps 1e-308 passed and priced every variant at inf
    ("hbm-1e-308", lambda t: ["model", "ag-gemm", "--hardware", _profile_file(t, hbm_gbps=1e-308)], None,
     "hbm_gbps=1e-308 is too slow"),
    ("tflops-1e-300", lambda t: ["model", "ag-gemm", "--hardware", _profile_file(t, matrix_tflops={"bf16": 1e-300})],
     None, "matrix_tflops"),
    # extra.ladder a string: internal AttributeError in report and check
    ("report-ladder-a-string", lambda t: ["report", _ladder_a_string(t)], None, "extra.ladder: expected an object"),
    ("check-ladder-a-string", lambda t: ["check", _ladder_a_string(t)], None, "extra.ladder: expected an object"),
    # validate --from a model document: its predictions taken as measurements (MAPE 0.0%, exit 0)
    ("validate-from-a-model", lambda t: ["validate", "--from", _model_doc(t)], None, "holds predictions, not measurements"),
    # -o newdir/ wrote a file named newdir
    ("model-o-newdir-slash", lambda t: ["model", "ag-gemm", "-o", "newdir/"], None, "names a directory"),
    ("report-o-newdir-slash", lambda t: ["report", _measured_doc(t), "--format", "md", "-o", "newdir/"], None,
     "names a directory"),
    # validate -o DIR replaced DIR/validation.json without --force
    ("validate-o-replaces", lambda t: ["validate", "--from", _measured_doc(t), "-o", _validated_dir(t)], None,
     "validation.json: already exists; pass --force"),
]


@pytest.mark.parametrize("make_args,make_env,words", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_hostile_input_is_refused_in_one_line_within_bounds(tmp_path, make_args, make_env, words):
    args = make_args(tmp_path)
    env = make_env(tmp_path) if make_env else None
    before = sorted(p.name for p in tmp_path.iterdir())
    o = run_bounded(args, tmp_path, env)
    assert_bounded(o, " ".join(map(str, args))[:200])
    assert_refused(o, words)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, nothing half-written
    if (tmp_path / "val").is_dir():
        assert (tmp_path / "val" / "validation.json").read_text() == '{"keep": true}'


def test_a_closed_stdout_is_one_line_and_exit_2(tmp_path):
    """Defect: `taxes model ... >&-` was a 45-line traceback and exit 1."""
    o = run_bounded(["model", "ag-gemm", "--format", "json"], tmp_path, close_stdout=True)
    assert_bounded(o, "model >&-")
    assert_refused(o, "cannot write the output: standard output is closed")
    o = run_bounded(["model", "ag-gemm"], tmp_path, close_stdout=True)
    assert_refused(o, "standard output is closed")
    o = run_bounded(["model", "ag-gemm", "--format", "json", "-o", "m.json"], tmp_path, close_stdout=True)
    assert o.code == 0, o.stderr  # only the data's destination was closed, not the one the data goes to
    assert results.load(tmp_path / "m.json")["metadata"]["kind"] == "model"


def test_a_long_run_ends_at_its_timeout_in_one_line_with_the_stacks_in_a_file(tmp_path):
    """Defect: a run past --timeout-s printed 60-70 lines of the ranks' thread dumps, then 'internal error:
    RankError'."""
    o = run_bounded(["profile", "ag-gemm", "--emulate", "--shape", "M=256,N=256,K=256", "--timeout-s", "2"],
                    tmp_path, env={"TMPDIR": str(tmp_path)})
    assert_bounded(o, "profile --timeout-s 2")
    assert_refused(o, "did not finish within 2 s")
    line = o.stderr.rstrip("\n").splitlines()[-1]
    stacks = Path(line.rsplit("their stacks: ", 1)[1])
    assert stacks.parent == tmp_path and stacks.name.startswith("taxes-stacks-")
    text = stacks.read_text()
    assert text.startswith("rank ") and "most recent call first" in text and 'File "' in text
    assert 'File "' not in o.stderr  # no dump on the terminal
    assert [p.name for p in tmp_path.iterdir()] == [stacks.name]  # the ranks' own files are gone


def test_check_over_many_documents_at_once(tmp_path):
    """Defect: `taxes check` over several profile documents at once was 'internal error: KeyError: None of
    [Index([-2, -2, ...])]' (a document without checks made the ok column lose its type); each alone was
    fine."""
    older = tmp_path / "older.json"  # a measured document of older rules: no rows, so no check rows
    doc = json.loads(_measured_doc(tmp_path).read_text())
    for case in doc["cases"]:
        for v in case["variants"]:
            for key in ("attributed_e2e_us", "attribution", "measurement_cost_us"):
                v.pop(key, None)
    older.write_text(json.dumps(doc))
    o = run_bounded(["check", _measured_doc(tmp_path), older, _model_doc(tmp_path)], tmp_path)
    assert_bounded(o, "check of three documents")
    assert o.code in (0, 1), o.stderr
    assert "| closure |" in o.stdout and "skipped 1 document(s) that hold no measurement" in o.stderr


def test_junit_never_carries_a_raw_escape(tmp_path):
    """Defect: `compare --format junit` wrote a document's file name with its raw ESC into the XML."""
    doc = _measured_doc(tmp_path)
    named = tmp_path / "a\x1b[31mb.json"
    named.write_bytes(doc.read_bytes())
    o = run_bounded(["compare", named, doc, "--format", "junit"], tmp_path)
    assert_bounded(o, "compare --format junit")
    assert o.code == 0, o.stderr
    assert "\x1b" not in o.stdout and "\\x1b" in o.stdout
    ET.fromstring(o.stdout.split("\n", 1)[1])  # well-formed XML 1.0


def _children_program(tmp_path: Path) -> Path:
    """A program that starts a child of its own (as torchrun starts its workers), writes its pid, sleeps."""
    script = tmp_path / "parent.py"
    script.write_text("import subprocess, sys, time\n"
                      "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
                      f"open({str(tmp_path / 'child.pid')!r}, 'w').write(str(child.pid))\n"
                      "time.sleep(300)\n")
    return script


def _gone(pid: int, within_s: float = 20.0) -> bool:
    """Whether the process has exited (a zombie nobody reaps has exited too)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def _wait_for(path: Path, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.1)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_trace_timeout_ends_the_programs_children_too(tmp_path):
    """Defect: `taxes trace --timeout-s` killed only the direct child: the program's own children (torchrun's
    workers) lived on."""
    script = _children_program(tmp_path)
    o = run_bounded(["trace", "--out", tmp_path / "out", "--timeout-s", "3", "--", script], tmp_path)
    assert_bounded(o, "trace --timeout-s 3")
    assert_refused(o, "ran past --timeout-s 3")
    child = int((tmp_path / "child.pid").read_text())
    assert _gone(child), "the program's child outlived taxes trace"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_to_trace_end_the_programs_children_too(tmp_path, sig):
    """Defect: stopping `taxes trace` left the traced program's children running."""
    script = _children_program(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "taxes", "trace", "--out", str(tmp_path / "out"), "--", str(script)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _wait_for(tmp_path / "child.pid")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == (2 if sig == signal.SIGTERM else 130), err
    assert err.strip().splitlines()[-1] in ("taxes: error: stopped by SIGTERM", "taxes: error: interrupted"), err
    assert _gone(int((tmp_path / "child.pid").read_text())), "the program's child outlived taxes trace"


def test_an_emulated_run_is_refused_before_it_outgrows_the_machine(monkeypatch):
    """Defect: `profile --emulate --shape M=262144,N=8192,K=8192` allocated past 10 GiB: on a machine with
    10 GiB available it is refused in one line, before any rank starts."""
    from click.testing import CliRunner

    from taxes.run import preflight, profile as profiling
    from taxes.cli.main import cli

    def started(*args, **kwargs):
        raise RuntimeError("the ranks were started")

    monkeypatch.setattr(profiling, "run_profile", started)
    args = ["profile", "ag-gemm", "--emulate", "--shape", "M=262144,N=8192,K=8192"]
    monkeypatch.setattr(preflight, "host_available_bytes", lambda: 10 << 30)
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2 and "but this machine has 10.0 GiB available" in res.stderr, res.stderr
    assert "started" not in res.stderr
    monkeypatch.setattr(preflight, "host_available_bytes", lambda: 1 << 40)  # where it fits, it runs
    assert "the ranks were started" in CliRunner().invoke(cli, args).stderr
