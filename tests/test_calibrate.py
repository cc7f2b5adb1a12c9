"""`taxes calibrate`: the command line without GPUs, the calibration kernels under Triton's interpreter with
emulated ranks, and the real thing on >= 2 GPUs.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from types import SimpleNamespace

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import pytest
import torch
from _calibrate_data import META, synthetic_ranks
from _util import assert_one_line, run_cli

from taxes.model import calibrate as cal
from taxes.model.calibrate import plan
from taxes.run import calibrate as run
from taxes.run import calibrate as measuring  # where the command finds the machine and the measuring run
from taxes.run import calibration_measurements as measurements
from taxes.cli.calibrate_cmd import calibrate as calibrate_command
from taxes.cli.main import TaxesGroup
from taxes.model.hardware import BUILTIN, get_profile, load_profile_file, profile_from_dict, profile_to_dict
from taxes.kernels import probes
from taxes.kernels.device import interpreting
from taxes.kernels.runtime import launch


def test_measure_combine_checks_the_kernel_under_the_interpreter():
    if not interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET was set")
    got = measurements.measure_combine(SimpleNamespace(device=torch.device("cpu"), rank=0), TINY, 1.0, rows=20, D=16)
    assert got["checked"] and got["sets"] == list(plan.COMBINE_SETS) and got["us"] == [[], []]


def test_hbm_read_kernel_sums_every_element_once_under_the_interpreter():
    if not interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET was set")
    for n in (1, 1000, 3 * 512 + 7):
        x = torch.randint(0, 16, (n,), dtype=torch.int32)
        got = measurements.hbm_read(x, 2, 128, TINY, 1.0)
        assert got["checked"] and got["bytes"] == 4 * n and got["us"] == []
    # each program's sum is exactly its strided blocks (a skipped or repeated block would show here)
    sums = torch.full((4,), -1, dtype=torch.int32)
    x = torch.randint(0, 16, (1000,), dtype=torch.int32)
    probes.hbm_read_kernel[(4,)](x, sums, 1000, BLOCK=64)
    blocks = x.split(64)
    want = [sum(int(b.sum()) for b in blocks[p::4]) for p in range(4)]
    assert sums.tolist() == want


# ---- the command line ----------------------------------------------------------------------------------


@pytest.fixture
def calibrate_cli():
    """The calibrate command inside the real TaxesGroup (cli/main.py may not have registered it yet)."""
    group = TaxesGroup(name="taxes", commands={"calibrate": calibrate_command})

    def run(args, capsys):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            group.main(["calibrate", *args])
        out, err = capsys.readouterr()
        return exc.value.code or 0, out, err

    return run


def test_cli_without_gpus_is_one_line_pointing_to_the_profiles(calibrate_cli, capsys, monkeypatch):
    monkeypatch.setattr(measuring, "cuda_gpu_count", lambda: 0)
    code, out, err = calibrate_cli(["--quick"], capsys)
    assert code == 2 and out == ""
    assert_one_line(err.strip())
    assert "needs CUDA GPUs" in err and "taxes hardware list" in err


def test_cli_on_this_machine_without_gpus(calibrate_cli, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code, out, err = calibrate_cli([], capsys)
    assert code == 2 and "needs CUDA GPUs" in err and "Traceback" not in err


@pytest.mark.parametrize("args,match", [
    (["--gpus", "0"], "--gpus 0"),
    (["--timeout-s", "-1"], "positive"),
    (["--name", "h200-sxm"], "built-in"),
    (["--name", "a/b"], "letters, digits"),
    (["--base", "nonesuch"], "unknown hardware profile"),
    (["-o", "/no/such/dir/p.json"], "does not exist"),
    (["-o", "profile.txt"], "JSON"),
    (["--peaks", "vendor"], "vendor"),
])
def test_cli_bad_options_are_one_line(calibrate_cli, capsys, args, match):
    code, out, err = calibrate_cli(args, capsys)
    assert code == 2 and match in err
    assert_one_line(err.strip())


def test_cli_more_gpus_than_the_machine_has(calibrate_cli, capsys, monkeypatch):
    monkeypatch.setattr(measuring, "cuda_gpu_count", lambda: 2)
    code, _, err = calibrate_cli(["--gpus", "4"], capsys)
    assert code == 2 and "has 2 CUDA GPUs" in err


def _fake_machine(monkeypatch, ranks, calls):
    """A machine whose calibration run returns the synthetic readings (the measuring needs GPUs)."""
    monkeypatch.setattr(measuring, "cuda_gpu_count", lambda: len(ranks))
    monkeypatch.setattr(measuring, "cuda_gpu_names", lambda n: ["NVIDIA H200"] * n)

    def run(world, base, quick, name, peaks="measured", timeout_s=300.0):
        calls.append((world, base.name, quick, name, peaks, timeout_s))
        return cal.assemble_profile(ranks[:world], base, META, name=name, peaks=peaks)

    monkeypatch.setattr(measuring, "run_calibration", run)


def test_cli_saves_a_profile_that_model_loads_by_name(calibrate_cli, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("TAXES_PROFILE_DIR", str(tmp_path))
    calls = []
    ranks = synthetic_ranks(random.Random(9))
    ranks[1]["errors"]["matmul"] = "RuntimeError: CUDA out of memory"
    del ranks[1]["figures"]["matmul"]
    _fake_machine(monkeypatch, ranks, calls)
    code, out, err = calibrate_cli(["--quick"], capsys)
    assert code == 0, err
    # named for the GPU kind and world, the name `taxes profile` and `validate` look for on such a machine
    assert calls == [(2, "h200-sxm", True, "h200-x2-calibrated", "measured", 150.0)]
    prof = get_profile("h200-x2-calibrated")
    assert prof.source.startswith("calibrated on 2 x NVIDIA H200")
    assert "peer_link_gbps" in out and "kept from h200-sxm" in out
    assert str(tmp_path / "h200-x2-calibrated.json") in err
    code, out, err = run_cli(["model", "ag-gemm", "--hardware", "h200-x2-calibrated", "--format", "json"], capsys)
    assert code == 0, err
    assert json.loads(out)["metadata"]["hardware_profile"] == "h200-x2-calibrated"
    from taxes.model.hardware import machine_profile

    hw, why, warn = machine_profile("NVIDIA H200", 2)
    assert hw.name == "h200-x2-calibrated" and warn is None, why


def test_cli_one_gpu_keeps_link_figures_and_writes_to_o(calibrate_cli, capsys, monkeypatch, tmp_path):
    calls = []
    _fake_machine(monkeypatch, synthetic_ranks(random.Random(10), world=1), calls)
    out_path = tmp_path / "one.json"
    code, out, err = calibrate_cli(["--base", "h100-sxm", "--name", "box", "-o", str(out_path), "--peaks",
                                    "datasheet", "--timeout-s", "99"], capsys)
    assert code == 0, err
    assert calls == [(1, "h100-sxm", False, "box", "datasheet", 99.0)]
    prof = load_profile_file(out_path)
    assert prof.name == "box" and prof.peer_link_gbps == BUILTIN["h100-sxm"].peer_link_gbps
    assert "one GPU" in err
    kept = prof.extra["calibration"]["kept_from_base"]
    assert "one GPU" in kept["link_latency_us"] and "one GPU" in kept["collective_base_us"]


def test_cli_failed_figures_are_one_line_each(calibrate_cli, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("TAXES_PROFILE_DIR", str(tmp_path))
    ranks = synthetic_ranks(random.Random(11))
    for r in ranks:
        r["figures"].pop("pingpong")
        r["errors"]["pingpong"] = "FlagTimeout: rank 0: the ping-pong kernel gave up waiting [bold]for[/bold] [Errno 2]"
    _fake_machine(monkeypatch, ranks, [])
    code, out, err = calibrate_cli([], capsys)
    assert code == 0
    lines = [line for line in err.splitlines() if line.startswith("taxes: calibrate:")]
    assert len(lines) == 1 and "pingpong" in lines[0] and "FlagTimeout" in lines[0]
    assert "[bold]for[/bold] [Errno 2]" in lines[0]  # error text is printed as it is, never as markup
    assert "[bold]for[/bold]" in out and "[Errno" in out  # the table's reason column too (cells wrap at spaces)


def test_installed_command_says_when_there_is_no_gpu_and_writes_nothing(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-m", "taxes.cli.main", "calibrate", "--quick", "-o", str(tmp_path / "p.json")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and r.stderr.strip().splitlines() == [f"taxes: error: {run.NO_GPU}"]
    assert list(tmp_path.iterdir()) == []


# ---- the kernels under Triton's interpreter (emulated ranks) --------------------------------------------


def _kernels_job(ctx, rounds, absent):
    flags = ctx.heap.zeros((ctx.world,), torch.int32)
    stamps = ctx.heap.zeros((2 * rounds + 2,), torch.int64)
    buf = ctx.heap.alloc((1000,), torch.int32)
    ctx.barrier()
    peer = 1 - ctx.rank
    out = {"flags": []}
    base = 0
    for relaxed in (True, False):
        if ctx.rank != absent:
            try:
                probes.ping_pong(ctx, flags, stamps, peer, base, rounds, relaxed, stamped=relaxed, wait_s=1.0)
            except Exception as e:
                out.setdefault("errors", []).append(f"{type(e).__name__}: {e}")
        base += rounds
        ctx.barrier()
        out["flags"].append(flags.local.tolist())
        ctx.barrier()  # read before the leader starts the next run (its first signal would show here)
    g = torch.Generator().manual_seed(ctx.rank)
    for via_bases in (True, False):
        src = torch.randint(-2 ** 31, 2 ** 31 - 1, (1000,), generator=g, dtype=torch.int32)
        buf.local.fill_(-1)
        ctx.barrier()
        probes.triton_peer_copy(ctx, buf, src, peer, push=True, via_bases=via_bases, grid=3, block=128)
        ctx.barrier()
        pushed = buf.local.clone()
        back = torch.zeros_like(src)
        probes.triton_peer_copy(ctx, buf, back, peer, push=False, via_bases=via_bases, grid=3, block=128)
        ctx.barrier()
        out.setdefault("copies", []).append({"src": src.tolist(), "pushed": pushed.tolist(), "pulled": back.tolist()})
    return out


@pytest.mark.slow
def test_ping_pong_and_peer_copies_under_the_interpreter():
    if not interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET was set")
    rounds = 5
    res = launch(_kernels_job, 2, rounds, -1, backend="emulated", heap_bytes=1 << 20, timeout_s=120)
    for r, o in enumerate(res):
        assert "errors" not in o, o["errors"]
        # each rank's flag from its peer reached the last value of each run: base + rounds
        assert [f[1 - r] for f in o["flags"]] == [rounds, 2 * rounds]
        assert [f[r] for f in o["flags"]] == [0, 0]  # nobody writes a rank's own slot
        for mine, theirs in zip(o["copies"], res[1 - r]["copies"]):  # addressed via the bases, then directly
            assert mine["pushed"] == theirs["src"]  # the peer's stores landed here
            assert mine["pulled"] == theirs["pushed"]  # our loads read the peer's buffer
            assert mine["src"] != theirs["src"]


@pytest.mark.slow
def test_ping_pong_without_a_peer_gives_up_instead_of_hanging():
    if not interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET was set")
    res = launch(_kernels_job, 2, 3, 1, backend="emulated", heap_bytes=1 << 20, timeout_s=120)
    errs = res[0]["errors"]
    assert len(errs) == 2 and all(e.startswith("FlagTimeout") and "rank 1" in e for e in errs)
    assert "errors" not in res[1]


TINY = cal.Plan(reps=1, warmup=0, launches=1, nccl_sizes=(4096,), copy_bytes=4096, peer_bytes=4096, matmul_n=128,
                matmul_reps=1, rounds=4, pingpong_reps=2, skew_reps=1)


def _pingpong_job(ctx, fail_rank):
    if fail_rank is not None:  # this rank's runs fail, the others' succeed: every rank must still stop together
        real = measurements.ping_pong

        def flaky(ctx_, *a, **k):
            if ctx_.rank == fail_rank:
                raise RuntimeError("injected failure")
            return [0] * (2 * a[4] + 2)

        measurements.ping_pong = flaky
        try:
            return measurements.measure_pingpong(ctx, TINY, 1.0)
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        finally:
            measurements.ping_pong = real
    return measurements.measure_pingpong(ctx, TINY, 1.0)


@pytest.mark.slow
def test_measure_pingpong_runs_every_pair_under_the_interpreter():
    if not interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET was set")
    res = launch(_pingpong_job, 3, None, backend="emulated", heap_bytes=1 << 20, timeout_s=300)
    pairs = res[0]["pairs"]
    assert [p["peer"] for p in pairs] == [1, 2]
    for p in pairs:
        assert len(p["relaxed_rtt_us"]) == len(p["acquire_rtt_us"]) == TINY.pingpong_reps
        assert len(p["t0"]) == len(p["t1"]) == len(p["t2"]) == TINY.rounds
    assert res[1]["pairs"] == res[2]["pairs"] == []  # the readings live on the leader


@pytest.mark.slow
@pytest.mark.parametrize("fail_rank", [0, 1])
def test_a_figure_failing_on_one_rank_fails_on_every_rank_without_a_hang(fail_rank):
    if not interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET was set")
    res = launch(_pingpong_job, 2, fail_rank, backend="emulated", heap_bytes=1 << 20, timeout_s=120)
    assert res[fail_rank] == "RuntimeError: injected failure"
    assert res[1 - fail_rank] == "RuntimeError: failed on another rank"


# ---- the real thing -------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_quick_calibration_on_gpus(tmp_path, monkeypatch):
    if interpreting() or not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs and TRITON_INTERPRET=0")
    base = cal.base_for_gpu(torch.cuda.get_device_name(0))
    prof, raw = run.run_calibration(2, base, True, "gpu-test", timeout_s=170)
    assert raw["failed"] == {}, raw["failed"]
    assert "run_error" not in raw
    d = profile_to_dict(prof)
    profile_from_dict(d)
    assert prof.source.startswith("calibrated on ")
    assert 10 < prof.matrix_tflops["bf16"] < 1e5 and 100 < prof.hbm_gbps < 1e5 and 1 < prof.peer_link_gbps < 1e4
    assert 0 < prof.link_latency_us < prof.flag_round_trip_us * 1.5 + 1 and prof.launch_eager_us > prof.launch_graph_us
    assert math.isfinite(prof.rank_skew_us) and prof.collective_base_us > 0
    monkeypatch.setenv("TAXES_PROFILE_DIR", str(tmp_path))
    cal.save_profile(prof)
    assert get_profile("gpu-test") == prof
