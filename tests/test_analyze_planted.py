"""`taxes analyze` recovers taxes planted in synthetic Kineto traces, each within 5%.

Each trace is written by tests/kineto_build.py's host + device simulator, so the planted amount follows
from the construction (host spins, launch paths, a dependency inside a graph, a late rank, compute
hiding part of a collective, communication launched by other libraries, an intermediate of known bytes).
Every case also checks that the rows add up to each step's span.
"""

from __future__ import annotations

import json
import math

import pytest
from kineto_build import AR, MM, SENDRECV, Op, Program, add_launch, add_step, new_trace, write_trace

from taxes.attribution import analyze as A
from taxes.documents import analysis_document as D
from taxes.attribution.attribute import ROWS
from taxes.model.hardware import get_profile

WITHIN = 0.05


def close(got, want):
    assert got == pytest.approx(want, rel=WITHIN, abs=1e-6), (got, want)


def adds_up(an):
    d = an.decomposition
    for _, r in d.iterrows():
        assert math.fsum(r[k] for k in ROWS if r[k] == r[k]) == pytest.approx(r["span_us"], abs=1e-6)  # NaN: not measured


def row(an, rank=0, step=0):
    d = an.decomposition
    return d[(d["rank"] == rank) & (d["step"] == step)].iloc[0]


def one_rank(tmp_path, build, name="rank0.json", **kw):
    tr = new_trace(0, 1)
    build(Program(tr))
    return A.analyze([write_trace(tr, tmp_path / name)], **kw)


N, CALL, API, LAT, DUR = 10, 3.0, 2.0, 1.5, 1.0


def test_launch_gaps(tmp_path):
    an = one_rank(tmp_path, lambda p: p.step(0, [Op(dur_us=DUR, call_us=CALL, api_us=API) for _ in range(N)]))
    r = row(an)
    # the device always waits on the launch path: the first launch, then each op's call, API and exit
    # (0.25 us) less the previous kernel's duration
    close(r["launch"], (CALL + API + LAT) + (N - 1) * (CALL + API + 0.25 - DUR))
    assert r["host_bound"] == pytest.approx(0.0, abs=1e-6)
    close(r["compute"], N * DUR)
    adds_up(an)


def test_host_bound_python_between_launches_and_its_frame(tmp_path):
    spin = 50.0
    ops = [Op(dur_us=DUR, call_us=CALL, api_us=API, pre_us=spin, pre_frame="train.py(12): spin") for _ in range(N)]
    an = one_rank(tmp_path, lambda p: p.step(0, ops))
    r = row(an)
    close(r["host_bound"], N * spin)
    close(r["launch"], (CALL + API + LAT) + (N - 1) * (CALL + API + 0.25 - DUR))  # as without the spin
    top = an.host_frames[an.host_frames["rank"] == 0].iloc[0]
    assert top["frame"] == "train.py(12): spin"
    close(top["us"], N * spin)
    adds_up(an)


def test_graph_internal_waits_are_not_launch_tax(tmp_path):
    gap, wait, api = 0.8, 300.0, 6.0
    an = one_rank(tmp_path, lambda p: p.graph(0, [(MM, 2.0)] * N, gap, api_us=api, waits={5: wait}))
    r = row(an)
    close(r["graph_gaps"], (N - 1) * gap + wait)
    close(r["launch"], 0.5 + api + LAT)  # only the replay's own launch
    assert r["host_bound"] == pytest.approx(0.0, abs=1e-6)
    adds_up(an)


def _collective(seq, pg="0", name="allreduce"):
    return {"Collective name": name, "Process Group Name": pg, "Seq": seq, "Group size": 2}


def test_sync_wait_at_a_late_rank_and_unmatched_instances(tmp_path):
    late, base = 40.0, 20.0
    paths = []
    for rank in (0, 1):
        tr = new_trace(rank, 2)
        p = Program(tr)
        ops = [Op(dur_us=1.0),  # short: both devices are idle when their all-reduce arrives
               Op(name="c10d::allreduce_", kernel=AR, dur_us=base + (late if rank == 0 else 0.0),
                  pre_us=late if rank == 1 else 0.0, collective=_collective(7))]
        if rank == 0:  # an instance rank 1 never ran, and one whose rank-1 twin runs much later (no overlap)
            ops += [Op(name="c10d::allreduce_", kernel=AR, dur_us=30.0, collective=_collective(8)),
                    Op(name="c10d::allreduce_", kernel=AR, dur_us=25.0, collective=_collective(9))]
        p.step(0, ops)
        if rank == 1:
            p.t += 5000.0
            p.step(1, [Op(name="c10d::allreduce_", kernel=AR, dur_us=25.0, collective=_collective(9))])
        paths.append(write_trace(tr, tmp_path / f"rank{rank}.json"))
    an = A.analyze(paths)
    close(row(an, 0)["sync_wait"], late)
    assert row(an, 1)["sync_wait"] == pytest.approx(0.0, abs=1e-6)
    close(row(an, 1)["host_bound"], late)  # the late rank's device waited on its host
    inst = an.instances.set_index("key")
    assert inst.loc["0:7", "matched"] and inst.loc["0:7", "slowest_rank"] == 1
    close(inst.loc["0:7", "skew_us"], late)
    assert not inst.loc["0:8", "matched"] and not inst.loc["0:9", "matched"]
    # the unmatched instances are exposed transfer on rank 0, never sync wait
    close(row(an, 0)["exposed_transfer"], base + 30.0 + 25.0)
    st = an.stragglers.set_index("rank")
    assert st.loc[1, "times_last"] == 1 and st.loc[1, "caused_wait_us"] == pytest.approx(late, rel=WITHIN)
    assert any("could not be matched" in w for w in an.warnings)
    adds_up(an)


def test_kernels_of_one_name_on_two_streams_are_matched_by_group_and_sequence(tmp_path):
    """Every collective is an ncclDevKernel_SendRecv on one of two streams; in order by name, rank 0's
    first would pair with rank 1's first though they serve different collectives."""
    paths = []
    late = 60.0
    skew = late + CALL + API + 0.25  # the second collective waits the spin and the first op's host time
    for rank in (0, 1):
        tr = new_trace(rank, 2)
        p = Program(tr)
        a2a = Op(name="c10d::alltoall_base_", kernel=SENDRECV, stream=13, dur_us=15.0 + (skew if rank == 1 else 0.0),
                 collective=_collective(3, pg="1", name="all_to_all"), call_us=CALL, api_us=API)
        ar = Op(name="c10d::allreduce_", kernel=SENDRECV, stream=7, dur_us=15.0 + (skew if rank == 0 else 0.0),
                collective=_collective(5, pg="0"), call_us=CALL, api_us=API)
        # rank 0 issues the all-reduce first, rank 1 the all-to-all first: each waits for the other
        first, second = (ar, a2a) if rank == 0 else (a2a, ar)
        second.pre_us = late
        p.step(0, [first, second])
        paths.append(write_trace(tr, tmp_path / f"rank{rank}.json"))
    an = A.analyze(paths)
    inst = an.instances.set_index("key")
    assert set(inst.index) == {"0:5", "1:3"} and inst["matched"].all()
    assert (inst["source"] == "seq").all()
    close(row(an, 0)["sync_wait"], skew)
    close(row(an, 1)["sync_wait"], skew)


def test_collectives_without_sequence_numbers_match_by_order_in_their_group(tmp_path):
    paths = []
    for rank in (0, 1):
        tr = new_trace(rank, 2)
        p = Program(tr)
        coll = {"Collective name": "allreduce", "Process Group Name": "0"}
        p.step(0, [Op(name="c10d::allreduce_", kernel=AR, dur_us=20.0 + (10.0 if rank == 0 else 0.0),
                      pre_us=10.0 if rank == 1 else 0.0, collective=coll)])
        paths.append(write_trace(tr, tmp_path / f"rank{rank}.json"))
    an = A.analyze(paths)
    assert list(an.instances["source"]) == ["group-order"] and an.instances["matched"].all()
    close(row(an, 0)["sync_wait"], 10.0)


def test_exposed_transfer_is_what_compute_did_not_hide(tmp_path):
    def build(p):
        p.step(0, [Op(name="c10d::allreduce_", kernel=AR, dur_us=100.0, collective=_collective(1)),
                   Op(dur_us=30.0, stream=20)])
    an = one_rank(tmp_path, build)
    r = row(an)
    close(r["exposed_transfer"], 70.0)
    assert r["sync_wait"] == 0.0
    close(r["comm_us"], 100.0)
    adds_up(an)


def test_communication_by_what_it_does(tmp_path):
    comm = {"symm-mem": 20.0, "symm-mem-op": 30.0, "deepep": 25.0, "peer-copy": 10.0, "pattern:custom_a2a": 15.0}

    def build(p):
        p.step(0, [
            Op(dur_us=8.0),
            Op(name="aten::add", kernel="void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(...)",
               dur_us=comm["symm-mem"]),
            Op(name="symm_mem::one_shot_all_reduce", kernel="void some_device_kernel<float>()", dur_us=comm["symm-mem-op"]),
            Op(name="deep_ep::dispatch", kernel="void deep_ep::intranode::dispatch<8, 768, 8192>(int*)", dur_us=comm["deepep"]),
            Op(name="aten::copy_", kernel="Memcpy PtoP (Device -> Device)", api="cudaMemcpyAsync", dur_us=comm["peer-copy"]),
            Op(name="my_ext::exchange", kernel="my_custom_a2a_kernel", dur_us=comm["pattern:custom_a2a"]),
            Op(dur_us=8.0)])
    an = one_rank(tmp_path, build, comm_patterns=("custom_a2a",))
    acts = an.timelines[0].activities
    by_rule = (acts["end_us"] - acts["start_us"]).groupby(acts["comm"]).sum()
    for rule, us in comm.items():
        close(by_rule[rule], us)
    assert set(acts.loc[acts["comm"] == "", "name"]) == {MM}
    r = row(an)
    close(r["comm_us"], sum(comm.values()))
    close(r["exposed_transfer"], sum(comm.values()))  # nothing hides it, no instance identity: no sync wait
    close(r["compute"], 16.0)
    without = one_rank(tmp_path / "plain", build)
    assert "pattern:custom_a2a" not in set(without.timelines[0].activities["comm"])


def _et_node(rf, name, ins, outs):
    t = lambda s, numel: [s * 10, s, 0, numel, 2, "cuda:0"]  # noqa: E731  [tensor id, storage, offset, numel, itemsize, device]
    return {"id": rf + 1000, "name": name, "ctrl_deps": 1,
            "inputs": {"values": [t(s, n) for s, n in ins], "shapes": [], "types": []},
            "outputs": {"values": [t(s, n) for s, n in outs], "shapes": [], "types": []},
            "attrs": [{"name": "rf_id", "type": "uint64", "value": rf}]}


def test_locality_of_a_producer_consumer_chain_from_tensor_ids(tmp_path):
    """q = proj(x); k = proj(x); v = proj(x) read one input (no round trip between them); h = f(q) and
    o = g(h) are a chain of known bytes: 2 x 2 MiB and 2 x 4 MiB through memory."""
    mib = 1 << 20
    tr = new_trace(0, 1)
    p = Program(tr)
    dims = [[1024, 1024], [1024, 1024]]
    typ = ["c10::BFloat16", "c10::BFloat16"]
    names = ["q_proj", "k_proj", "v_proj", "f", "g"]
    p.step(0, [Op(name=f"aten::{n}", dur_us=10.0, op_args={"Input Dims": dims, "Input type": typ}) for n in names])
    ops = [e for e in tr["doc"]["traceEvents"] if e.get("cat") == "cpu_op"]
    rf = {e["name"].split("::")[1]: e["args"]["Record function id"] for e in ops}
    x, q, k, v, h, o = 1, 2, 3, 4, 5, 6
    nodes = [_et_node(rf["q_proj"], "aten::q_proj", [(x, mib)], [(q, mib)]),
             _et_node(rf["k_proj"], "aten::k_proj", [(x, mib)], [(k, mib)]),
             _et_node(rf["v_proj"], "aten::v_proj", [(x, mib)], [(v, mib)]),
             _et_node(rf["f"], "aten::f", [(q, mib)], [(h, 2 * mib)]),
             _et_node(rf["g"], "aten::g", [(h, 2 * mib)], [(o, mib)])]
    path = write_trace(tr, tmp_path / "rank0.json")
    (tmp_path / "rank0.et.json").write_text(json.dumps({"schema": "1.1.1-chakra.0.0.4", "nodes": nodes}))
    an = A.analyze([path])
    pairs = an.locality
    assert set(zip(pairs["producer"], pairs["consumer"])) == {("aten::q_proj", "aten::f"), ("aten::f", "aten::g")}
    assert (pairs["source"] == "tensor ids (execution trace)").all()
    moved = 2 * (2 * mib) + 2 * (4 * mib)  # bf16: 1 Mi elements are 2 MiB, 2 Mi elements 4 MiB
    close(float(pairs["moved_bytes"].sum()), moved)
    hw = get_profile("h100-sxm")
    assert an.hardware == "h100-sxm"
    close(row(an)["locality"], moved / hw.hbm_bytes_per_us())
    fused = an.what_if[(an.what_if["change"] == "fusion")].iloc[0]
    close(fused["removed_us"], moved / hw.hbm_bytes_per_us())
    adds_up(an)
    # without the execution trace: the shape rule, labelled heuristic
    (tmp_path / "rank0.et.json").unlink()
    guess = A.analyze([path])
    assert guess.locality.empty or guess.locality["source"].str.contains("heuristic").all()


def test_the_graphs_projection_matches_the_graph_twin(tmp_path):
    kernels = [(MM, 5.0)] * N
    gap = get_profile("h100-sxm").launch_graph_us
    spin = [0.0] + [20.0] * (N - 1)
    eager = one_rank(tmp_path / "eager", lambda p: p.step(0, [Op(dur_us=5.0, call_us=CALL, api_us=API, pre_us=s)
                                                              for s in spin]))
    twin = one_rank(tmp_path / "graph", lambda p: p.graph(0, kernels, gap, api_us=API))
    projected = eager.what_if[eager.what_if["change"] == "graphs"]["projected_us"].iloc[0]
    close(projected, row(twin)["span_us"])
    assert projected < row(eager)["span_us"] * 0.5


def test_compilation_and_data_loading_before_a_launch(tmp_path):
    compile_us, data_us = 13_000.0, 400.0
    ops = [Op(dur_us=DUR), Op(dur_us=DUR, pre_us=compile_us, pre_frame="torch/_inductor/compile_fx.py(1500): compile_fx"),
           Op(dur_us=DUR, pre_us=data_us, pre_frame="enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"),
           Op(dur_us=DUR, pre_us=30.0, pre_frame="train.py(40): loss_scale")]
    an = one_rank(tmp_path, lambda p: p.step(0, ops))
    r = row(an)
    close(r["compile"], compile_us)
    close(r["data_loading"], data_us)
    close(r["host_bound"], 30.0)  # the plain Python, not compilation or data loading
    adds_up(an)


def test_the_gap_after_a_host_synchronisation_is_sync(tmp_path):
    tr = new_trace(0, 1)
    p = Program(tr)
    s0 = p.t
    _, end_a = p.run(Op(dur_us=100.0, call_us=CALL, api_us=API))
    sync_end = end_a + 2.0  # the host waited in cudaStreamSynchronize until the device drained
    add_launch(tr, p.t, [], api="cudaStreamSynchronize", dur=sync_end - p.t)
    p.t = sync_end
    p.run(Op(dur_us=DUR, call_us=CALL, api_us=API))
    add_step(tr, 0, s0, p.t)
    an = A.analyze([write_trace(tr, tmp_path / "rank0.json")])
    r = row(an)
    close(r["sync"], 2.0 + CALL + API + LAT)  # the device idled from the drain until the refill arrived
    assert r["launch"] == pytest.approx(CALL + API + LAT, abs=1e-6)  # the first kernel's launch path only
    adds_up(an)


def test_a_real_unfused_chain_pays_the_locality_its_fused_twin_does_not():
    """Recorded on one H100 (tests/data/traces/README.md): the eager chain's locality row, from the execution
    trace's tensor ids, recovers the plain E2E difference to its torch.compile twin within 15%, and the
    fused twin has no locality row."""
    from pathlib import Path

    chain = Path(__file__).parent / "data" / "traces" / "chain"
    docs = {}
    for mode in ("eager", "compiled"):
        d = chain / mode
        an = A.analyze([str(d / "rank0.json.gz")], "h100-sxm", plain_steps=A.read_plain(d / "plain.json"))
        docs[mode] = D.analysis_document(an)["cases"][0]["variants"][0]
    rows = {m: {c["name"]: c["value_us"] for c in v["components"] if c["rank"] is None} for m, v in docs.items()}
    truth = docs["eager"]["plain_e2e_us"] - docs["compiled"]["plain_e2e_us"]
    assert truth > 300  # 1 GiB more traffic: the round trip of y
    assert rows["eager"]["locality"] == pytest.approx(truth, rel=0.15)
    assert abs(rows["compiled"].get("locality", 0.0)) < 0.02 * truth
    for v in docs.values():  # full record on a device-bound program: measuring cost under 3%
        assert abs(v["measurement_cost_us"]) < 0.03 * v["plain_e2e_us"]
