"""Per-GPU flash decode against PyTorch's attention, on one GPU.

    python benchmarks/decode_world1.py --out DIR --gpu h100 --commit SHA     # the benchmark (result JSON + table)
    python benchmarks/decode_world1.py --tune --out DIR --gpu h100           # the configuration sweep
    TRITON_INTERPRET=1 python benchmarks/decode_world1.py --smoke --out DIR  # CPU: the logic on tiny shapes

Shapes: B in {1, 4, 16}, S in {8K, 32K, 128K}, D in {64, 128}, Hq = 64, Hkv = 8, bf16. For each: the
output of every method is checked against a float32 reference (ours on a NaN-poisoned output, again after
the timed replays, which move the arrival counters), then timed from CUDA graphs: one graph holds calls
over KV sets rotated beyond L2 (at least 3 x L2 bytes in all), each replay is timed with events, and the
median over replays of the time per call is reported. Ours is one replay of the whole per-GPU decode
(taxes.kernels.decode_local.LocalDecode with the tuned table's config). Peers: every SDPA backend that
accepts the shape (cuDNN, flash, efficient; math excluded) with enable_gqa=True, the same backends with the
group as the query length ("-grouped": q viewed as (B, Hkv, G, D)), and the private ops that also return
the log-sum-exp ("-lse", what bsp-sdpa runs); FlexAttention (compiled) at B=1, S=32K is a row, not a peer.
The read floor is (K, V, q and out bytes) / the read bandwidth this run measures on a 1 GiB buffer
(the graph timing and the read: benchmarks/graph_timing.py).

--tune sweeps block_n, num_warps, num_stages, TMA or pointer loads, evict-first and programs per SM for
every shape, re-times the best few, and writes the best of each as this GPU's table of
kernels/flash_decode_tuned.json (one table per GPU kind; the written file holds the others as they were). With --splits-extra it times given split counts for the best kernel
variants of a --prior sweep against the table's own config, and --update-table writes the winners into
kernels/flash_decode_tuned.json (what reports/flash_decode/decode_tune2-h100.json did).

The methods: benchmarks/decode_methods.py; the sweep: benchmarks/decode_sweep.py.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch

from taxes.kernels.decode_local import Config, LocalDecode, attention_partial_f32, load_tuned, resolve
from taxes.kernels.device import sm_count_of
from taxes.reports.markdown_table import md_table

from graph_timing import read_all, read_bandwidth, time_graph, time_host
from decode_methods import HKV, HQ, TOLERANCE, check_and_time, check_variants, log, make_sets, measure_ours, sdpa_peers
from decode_sweep import compile_ahead, kernel_variants, tune_shape, update_table, with_table

SHAPES = [(B, S, D) for D in (128, 64) for B in (1, 4, 16) for S in (8192, 32768, 131072)]
SMOKE_SHAPES = [(1, 64, 64), (2, 40, 128)]  # with Hq=8, Hkv=2 under the interpreter


def run(args):
    smoke = args.smoke
    dev = torch.device("cpu" if smoke else "cuda")
    t_start = time.time()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    timer = time_host if smoke else time_graph
    l2 = 0 if smoke else torch.cuda.get_device_properties(dev).L2_cache_size
    sms = sm_count_of(dev)
    meta = metadata(args, l2, sms)
    log(json.dumps(meta))
    bw = None if smoke else read_bandwidth(dev)
    meta["read_bandwidth"] = bw
    if bw:
        log(f"read bandwidth: {bw['read_gb_per_s']:.0f} GB/s {json.dumps(bw['ways'])}")
    shapes = SMOKE_SHAPES if smoke else SHAPES
    if args.shapes:  # any BxSxD, the table's or not (a shape no table was tuned at shows the lookup's pick)
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    if args.tune and not smoke:
        compile_ahead(sorted({(D,) + v for D in {D for _, _, D in shapes} for v in kernel_variants(D)}), 150)
    elif not smoke:
        table = load_tuned(gpu=meta["gpu_name"])
        meta["tuned_table"] = {k: table.get(k) for k in ("gpu", "made_by", "date")}
        chosen = set()
        for B, S, D in shapes:
            c, _, _ = resolve(Config(), B, HKV, S, D, sms, True, table)
            chosen.add((D, c.block_n, c.num_warps, c.num_stages, bool(c.tma), bool(c.evict_first)))
        compile_ahead(sorted(chosen), 120)
    part = torch.empty(sms * 8, dtype=torch.float32, device=dev)
    rows, sweep = [], []
    for B, S, D in shapes:
        if time.time() - t_start > args.budget_s:
            log(f"budget of {args.budget_s} s spent: stopping before B={B} S={S} D={D}")
            break
        sets, kv = make_sets(B, S, D, dev, l2, smoke)
        q0, k0, v0 = sets[0][:3]
        ref = attention_partial_f32(q0, k0, v0)
        Hq, Hkv = q0.shape[1], k0.shape[1]
        io_bytes = kv + 2 * q0.numel() * 2
        floor_us = io_bytes / (bw["read_gb_per_s"] * 1e3) if bw else None
        replays, min_graph = (args.tune_replays, 1000.0) if args.tune else (args.replays, 2500.0)
        peers = {}
        if not smoke and args.peers:
            for name, fn in sdpa_peers(sets).items():
                peers[name] = check_and_time(fn, sets, ref, timer, replays, min_graph)
        ok_peers = {n: r["us"] for n, r in peers.items() if "error" not in r}
        best_peer = min(ok_peers, key=ok_peers.get) if ok_peers else None
        row = {"B": B, "S": S, "D": D, "Hq": Hq, "Hkv": Hkv, "peer": best_peer,
               "peer_us": ok_peers.get(best_peer), "floor_us": floor_us, "kv_bytes": kv, "input_sets": len(sets)}
        if not smoke:  # a plain read of the same K and V bytes: what any kernel of this size could reach
            row["read_same_bytes_us"] = timer(lambda i: read_all(sets[i][4], part), len(sets), replays,
                                              min_graph_us=min_graph)["us"]
        if args.tune:
            best, entries = tune_shape(B, S, D, Hq, Hkv, sets, ref, dev, sms, timer, args, t_start, smoke)
            sweep += entries
            row["best"] = best
            row["us"] = (best.get("refined_us") or best["us"]) if best else None
            row["peers_us"] = ok_peers
            lse = {n[:-4]: u for n, u in ok_peers.items() if n.endswith("-lse")}
            row["sdpa_lse"] = min(lse, key=lse.get) if lse else None
            with open(out_dir / "tune_sweep.jsonl", "a") as f:
                for e in entries:
                    f.write(json.dumps(e) + "\n")
        else:
            dec = LocalDecode(B, Hq, Hkv, D, S, dev, Config())
            r = measure_ours(dec, sets, ref, timer, replays, min_graph)
            row.update({"us": r.get("us"), "ours": r, "peers": peers, "peers_us": ok_peers})
            del dec
        if row.get("us") and row["peer_us"]:
            row["ratio_to_peer"] = row["us"] / row["peer_us"]
        if row.get("us") and floor_us:
            row["hbm_fraction"] = floor_us / row["us"]
        rows.append(row)
        log(f"B={B:>2} S={S:>6} D={D:>3}: ours {fmt(row.get('us'))} us, peer {best_peer} {fmt(row['peer_us'])} us, "
            f"floor {fmt(floor_us)} us, {json.dumps({n: round(u, 1) for n, u in ok_peers.items()})}")
        write(out_dir, args, rows, sweep, meta)
        del sets, ref
        if not smoke:
            torch.cuda.empty_cache()
    if args.flex and not smoke:
        for D in (128, 64):
            if time.time() - t_start > args.budget_s - 60:
                log("no time left for FlexAttention")
                break
            flex_row(rows, D, dev, l2, timer, args)
            write(out_dir, args, rows, sweep, meta)
    if args.update_table and args.tune and not smoke:
        update_table(rows, meta, out_dir)
    meta["variants_world1"] = check_variants(smoke) if args.variants else None
    log(f"variants at world 1: {json.dumps(meta['variants_world1'])}")
    meta["wall_s"] = time.time() - t_start
    write(out_dir, args, rows, sweep, meta)
    print_table(rows)


def flex_row(rows, D, dev, l2, timer, args):
    """FlexAttention (torch.compile) at B=1, S=32K: a row of its own, not a peer."""
    from torch.nn.attention.flex_attention import flex_attention

    row = next((r for r in rows if (r["B"], r["S"], r["D"]) == (1, 32768, D)), None)
    if row is None:
        return
    sets, _ = make_sets(1, 32768, D, dev, l2, False)
    ref = attention_partial_f32(*sets[0][:3])
    flex = torch.compile(flex_attention, dynamic=False)
    t0 = time.time()

    def fn(i):
        q, k, v = sets[i][:3]
        return flex(q.view(1, HQ, 1, D), k, v, enable_gqa=True).view(1, HQ, D), None

    r = check_and_time(fn, sets, ref, timer, args.replays, 2500.0)
    r["compile_and_time_s"] = time.time() - t0
    row["flex_compiled"] = r
    log(f"flex attention B=1 S=32K D={D}: {json.dumps(r)}")


def fmt(x):
    return "-" if x is None else f"{x:.1f}"


def metadata(args, l2, sms) -> dict:
    import triton

    props = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    meta = {"benchmark": "benchmarks/decode_world1.py", "command": " ".join(sys.argv),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": args.commit, "torch_version": torch.__version__, "triton_version": triton.__version__,
            "gpu_name": props.name if props else None, "sm_count": sms, "l2_bytes": l2, "Hq": HQ, "Hkv": HKV,
            "dtype": "bf16", "tolerance": TOLERANCE,
            "timing": "CUDA graph of calls over rotated input sets (>= 3 x L2 bytes of K and V); events around "
                      "each replay; median over replays of time per call",
            "floor": "(K, V, q and out bytes) / read_bandwidth.read_gb_per_s"}
    if torch.cuda.is_available():
        from taxes.run.harness import gpu_metadata

        meta.update({k: v for k, v in gpu_metadata().items() if k in ("clocks", "cuda_version")})
    return meta


def write(out_dir: Path, args, rows, sweep, meta):
    name = args.name
    if args.tune:
        (out_dir / f"{name}.json").write_text(json.dumps({"metadata": meta, "shapes": rows, "sweep": sweep}, indent=1))
        entries = []
        for r in rows:
            b = r.get("best")
            if b:
                entries.append({"B": r["B"], "Hkv": r["Hkv"], "S": r["S"], "D": r["D"], "block_n": b["block_n"],
                                "num_warps": b["num_warps"], "num_stages": b["num_stages"], "tma": b["tma"],
                                "evict_first": b["evict_first"], "splits": b["splits"],
                                "programs_per_sm": b["programs_per_sm"], "sm_count": meta["sm_count"], "us": r["us"],
                                "sdpa_lse": r.get("sdpa_lse")})
        table = {"gpu": meta["gpu_name"], "made_by": meta["command"], "date": meta["date"], "entries": entries}
        if not args.update_table:  # else update_table's merged table is the one to keep
            # the whole file with this GPU's table replaced: copied over kernels/flash_decode_tuned.json as is
            (out_dir / "flash_decode_tuned.json").write_text(json.dumps(with_table(table), indent=1) + "\n")
    else:
        (out_dir / f"{name}.json").write_text(json.dumps(rows, indent=1))
        (out_dir / f"{name}-meta.json").write_text(json.dumps(meta, indent=1))


def print_table(rows):
    header = ["B", "S", "D", "ours us", "best SDPA peer", "peer us", "ours/peer", "floor us", "hbm frac"]
    cells = []
    for r in rows:
        ratio, frac = r.get("ratio_to_peer"), r.get("hbm_fraction")
        cells.append([str(r["B"]), str(r["S"]), str(r["D"]), fmt(r.get("us")), str(r["peer"]), fmt(r["peer_us"]),
                      "-" if ratio is None else f"{ratio:.3f}", fmt(r["floor_us"]), "-" if frac is None else f"{frac:.3f}"])
    log("\n" + md_table(header, cells, numbers=[0, 1, 2, 3, 5, 6, 7, 8]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the result JSON")
    ap.add_argument("--gpu", default="gpu", help="short GPU name for the file name, e.g. h100")
    ap.add_argument("--name", default=None, help="result file name without .json (default world1-<gpu>)")
    ap.add_argument("--commit", default=None, help="the git commit that ran (the device copy has no .git)")
    ap.add_argument("--tune", action="store_true", help="sweep configurations instead of the benchmark")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes under the interpreter, no GPU")
    ap.add_argument("--shapes", default="", help="these BxSxD instead, comma-separated")
    ap.add_argument("--replays", type=int, default=40)
    ap.add_argument("--tune-replays", type=int, default=5)
    ap.add_argument("--refine", type=int, default=4, help="tune: re-time this many best configs at --replays")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new shapes after this")
    ap.add_argument("--no-flex", dest="flex", action="store_false")
    ap.add_argument("--no-peers", dest="peers", action="store_false")
    ap.add_argument("--splits-extra", default="", help="tune: 'B=n,n;B=n': these split counts for the --top "
                    "kernel variants of the --prior sweep, against the tuned table's config")
    ap.add_argument("--prior", default="", help="tune: an earlier sweep's JSON (--splits-extra)")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--update-table", action="store_true", help="tune: write the new bests into the tuned table")
    ap.add_argument("--no-variants", dest="variants", action="store_false")
    args = ap.parse_args()
    if args.smoke and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        sys.exit("--smoke runs under Triton's interpreter: set TRITON_INTERPRET=1")
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("no CUDA GPU: use --smoke with TRITON_INTERPRET=1 for the CPU path")
    args.name = args.name or (f"decode_tune-{args.gpu}" if args.tune else f"world1-{args.gpu}")
    run(args)


if __name__ == "__main__":
    main()
