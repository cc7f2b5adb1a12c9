"""What each part of a CUPTI record costs a host-bound program, part by part.

The eager forward of benchmarks/programs/llama.py (a transformers Llama with random weights: about 340
launches a step, the host the bottleneck) runs blocks of steps under each record configuration in turn,
the order mirrored every round (plain, A, B, ..., then ..., B, A, plain) so that a host whose speed drifts
moves every configuration alike. A step's time is the device time between CUDA events at step ends, as
`taxes trace` times its plain steps; each block's first step (after the switch) is left out.

    kernels          kernel activity records (CONCURRENT_KERNEL)
    +latency         and each kernel's queued and submitted times (latency timestamps), and copy and memset
                     records: what `taxes trace --record timing` records
    +calls           and the graph-launch, copy, memset and synchronisation calls as API records (the
                     other calls switched off)
    launch calls     kernel, copy and memset records and every launch, graph-launch and synchronisation call
                     (what a record with API calls in every step costs)
    callbacks        +latency, copy and memset records, and the graph-launch, copy, memset and
                     synchronisation calls taken by CUPTI callbacks on those calls alone (no API records)

    python benchmarks/record_cost.py --out reports/record_cost/h100.json

Prints a table; writes per-configuration step times (us), their interquartile means and the cost against
the plain steps of the same rounds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from taxes.attribution.attribute import iqm

CONFIGS = ("plain", "kernels", "+latency", "+calls", "launch calls", "callbacks")


def recorded_call_kind(cbid_name: str, api: str) -> str | None:
    """Which calls a configuration records: api "all", every launch, graph-launch and synchronisation call;
    "queued", those but the kernel launches (copies, memsets, graph launches, synchronisations)."""
    from taxes.traces.timeline import api_kind, api_name

    kind = api_kind(cbid_name)
    if api == "queued" and kind == "launch" and "Launch" in api_name(cbid_name):
        return None
    return kind


class Cupti:
    """cupti-python switched between configurations (one registration per process)."""

    def __init__(self):
        from cupti import cupti

        self.c = cupti
        self.records = 0
        cupti.activity_register_callbacks(lambda: (8 << 20, 0), self._take)
        self.on: list = []
        self.calls: list = []
        self.sub = cupti.subscribe(self._call, None)
        self.cbids = [int(m) for m in cupti.runtime_api_trace_cbid if recorded_call_kind(m.name, "queued")]
        self.callbacks = False

    def _call(self, userdata, domain, cbid, cbdata) -> None:
        self.calls.append((cbid, cbdata.callback_site, self.c.get_timestamp(), cbdata.correlation_id))

    def _take(self, activities) -> None:
        self.records += len(activities)

    def set(self, config: str) -> None:
        c, K = self.c, self.c.ActivityKind
        for kind in self.on:
            c.activity_disable(kind)
        self.on = []
        if self.callbacks:
            for cbid in self.cbids:
                c.enable_callback(0, self.sub, c.CallbackDomain.RUNTIME_API, cbid)
            self.callbacks = False
        if config == "plain":
            return
        c.activity_enable_latency_timestamps(1 if config in ("+latency", "+calls", "callbacks") else 0)
        kinds = [K.CONCURRENT_KERNEL]
        if config == "+latency":
            kinds += [K.MEMCPY, K.MEMSET]
        if config in ("+calls", "launch calls"):
            kinds += [K.MEMCPY, K.MEMSET, K.RUNTIME, K.DRIVER]
        if config == "callbacks":
            kinds += [K.MEMCPY, K.MEMSET]
            for cbid in self.cbids:
                c.enable_callback(1, self.sub, c.CallbackDomain.RUNTIME_API, cbid)
            self.callbacks = True
        for kind in kinds:
            c.activity_enable(kind)
        if config in ("+calls", "launch calls"):  # after the kinds are on, as taxes.run.cupti.Recorder does
            api = "queued" if config == "+calls" else "all"
            for enum, enable in ((c.runtime_api_trace_cbid, c.activity_enable_runtime_api),
                                 (c.driver_api_trace_cbid, c.activity_enable_driver_api)):
                for member in enum:
                    try:
                        enable(int(member), 1 if recorded_call_kind(member.name, api) else 0)
                    except Exception:  # ids this driver does not know
                        pass
        self.on = kinds

    def flush(self) -> None:
        self.c.activity_flush_all(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--block", type=int, default=10, help="steps per block (the first of each left out)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds, each every configuration twice, mirrored")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("record_cost: needs a CUDA GPU", file=sys.stderr)
        return 2
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                      num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096, use_cache=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 64), device="cuda")
    rec = Cupti()
    times: dict = {c: [] for c in CONFIGS}
    with torch.no_grad():
        for _ in range(10):  # warm-up
            model(ids)
        torch.cuda.synchronize()
        order = list(CONFIGS) + list(reversed(CONFIGS))
        for _ in range(args.rounds):
            for config in order:
                rec.set(config)
                evs = []
                for _ in range(args.block + 1):
                    model(ids)
                    ev = torch.cuda.Event(enable_timing=True)
                    ev.record()
                    evs.append(ev)
                    torch.cuda.synchronize()
                times[config] += [a.elapsed_time(b) * 1e3 for a, b in zip(evs, evs[1:])]
                rec.set("plain")
        rec.flush()
    plain = iqm(times["plain"])
    rows = [{"config": c, "steps": len(times[c]), "iqm_us": iqm(times[c]),
             "cost_pct": 100 * (iqm(times[c]) - plain) / plain} for c in CONFIGS]
    doc = {"program": "transformers Llama eager forward, 8 layers, hidden 1024, 64 tokens, bf16",
           "gpu": torch.cuda.get_device_name(), "torch_version": str(torch.__version__),
           "statistic": "interquartile mean of step times (CUDA events), blocks mirrored every round",
           "block": args.block, "rounds": args.rounds, "records_seen": rec.records,
           "callbacks_seen": len(rec.calls), "rows": rows,
           "step_times_us": times}
    try:
        from taxes.provenance import collect

        doc.update(collect())
    except Exception:
        pass
    if args.out:
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{'record':<14} {'steps':>5} {'step us':>9} {'cost':>7}")
    for r in rows:
        print(f"{r['config']:<14} {r['steps']:>5} {r['iqm_us']:>9.1f} {r['cost_pct']:>+6.1f}%")
    return 0


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print(f"({time.time() - t0:.0f} s)", file=sys.stderr)
    sys.exit(rc)
