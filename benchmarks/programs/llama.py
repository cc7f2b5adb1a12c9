"""A small Llama (transformers, random weights from a config: nothing downloaded) run step by step, for
`taxes trace`: code nobody here wrote, in the ways users run it.

    python benchmarks/programs/llama.py --mode forward            # eager forward of 64 tokens per step
    python benchmarks/programs/llama.py --mode graph              # the same forward replayed from a CUDA graph
    python benchmarks/programs/llama.py --mode alternate          # eager in even steps, the graph in odd ones
    python benchmarks/programs/llama.py --mode forward --spin-us 50   # + a host spin before every decoder layer
    python benchmarks/programs/llama.py --mode forward --spin-us 200 --spin-every 2   # ... in every other step
    python benchmarks/programs/llama.py --mode forward --spin-us 200 --sync-spin   # the device synchronised before
                                                                                   # each spin: the spin stalls it
    python benchmarks/programs/llama.py --mode alternate --tokens 2048 --hidden 4096   # device-bound steps
    python benchmarks/programs/llama.py --mode train              # forward, backward, AdamW step

Every step ends with taxes.step() (train: optimizer.step() ends it). Prints the plain step time of the last
steps (CUDA events) and, with --spin-us, the spins' own median length.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import taxes


def spin_us(us: float) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < us * 1e-6:
        pass
    return (time.perf_counter() - t0) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("forward", "graph", "alternate", "train"), default="forward")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--spin-us", type=float, default=0.0)
    ap.add_argument("--spin-every", type=int, default=1,
                    help="spin in step i only when i %% N == N - 1 (0-based): 2 spins in the odd steps")
    ap.add_argument("--sync-spin", action="store_true", help="synchronise the device before each spin")
    args = ap.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=int(args.hidden * 2.75), num_hidden_layers=args.layers,
                      num_attention_heads=16, num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096,
                      use_cache=False)
    torch.manual_seed(0)
    with torch.device(dev):  # random weights made where they run (a 1.7B-parameter model inits in seconds)
        model = LlamaForCausalLM(cfg)
    model = model.to(dtype)
    ids = torch.randint(0, cfg.vocab_size, (1, args.tokens), device=dev)
    spins, step_no = [], [0]
    if args.spin_us:
        def pre_hook(*a):
            if step_no[0] % args.spin_every == args.spin_every - 1:
                if args.sync_spin and dev == "cuda":
                    torch.cuda.synchronize()  # the device idles for the whole spin
                spins.append(spin_us(args.spin_us))

        for layer in model.model.layers:
            layer.register_forward_pre_hook(pre_hook)
    times = []
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    if args.mode == "train":
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        for _ in range(args.steps):
            t0 = time.perf_counter()
            loss = model(ids, labels=ids).loss
            loss.backward()
            opt.step()  # ends the step for taxes trace
            opt.zero_grad(set_to_none=True)
            sync()
            times.append((time.perf_counter() - t0) * 1e6)
    else:
        model.eval()
        eager = run = lambda: model(ids).logits  # noqa: E731
        if args.mode in ("graph", "alternate"):
            with torch.no_grad():
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        run()
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    run()
            run = g.replay
        with torch.no_grad():
            for i in range(args.steps):
                t0 = time.perf_counter()
                (eager if args.mode == "alternate" and i % 2 == 0 else run)()
                taxes.step()
                sync()
                times.append((time.perf_counter() - t0) * 1e6)
                step_no[0] += 1
    tail = times[len(times) // 2:]
    print(f"llama {args.mode}: host-timed step {statistics.median(tail):.1f} us (median of the last {len(tail)})"
          + (f"; spins {statistics.median(spins):.1f} us x {len(model.model.layers)} per step"
             + (f", in every step i with i % {args.spin_every} == {args.spin_every - 1}" if args.spin_every > 1 else "")
             if spins else ""))


if __name__ == "__main__":
    main()
