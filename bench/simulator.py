"""Simulator speed: steps, wall ms and µs per step for a table of workloads (median of 5 runs).

    python bench/simulator.py [--runs 5] [--growth]

`plan ms` is `plan` alone (the schedule, its steps' shapes and finish records; the median of 4 x runs,
at least 21): what the per-plan aims are about. The other timings are of the whole `simulate` (plan +
one batched pricing call + replay): `wall ms` with a cheap latency, a plain function of its keys (so
every shape is made a tuple), `roofline ms` priced by the real roofline model of
Qwen3-32B on one H200. Steady-state rows: a closed loop of N in flight and P prompts, and a Poisson
stream of P prompts at R req/s (priced shape by shape while planned, so its roofline column
includes that pricing). Then request mixes, and aiperf's loop drawing its 100 reused prompts on an
engine without and with a prefix cache.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

# run as a script, bench/ is sys.path[0] and this file would shadow the `simulator` package
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from latency import build_latency_model  # noqa: E402
from simulator import StepPricer, Workload, plan, simulate  # noqa: E402
from simulator.scheduler import DecodeFirstWithSlack, TokenBudget  # noqa: E402

#: request mixes (1,000 requests each): prompt and output distributions, closed loop at C=64
MIXES = [("lognormal:2000:0.8:64:16000", "uniform:16:1024"), ("bins:64-512@3,2048-8192@1", "bins:16-128@3,512-2048@1")]

WORKLOADS = [  # input, output, B, N, arrival, prompts, rate
    (2048, 256, 8192, 2, "burst", 0, 0.0),
    (8000, 600, 4000, 600, "burst", 0, 0.0),
    (128000, 512, 2048, 16, "burst", 0, 0.0),
    (32768, 1024, 8192, 16, "burst", 0, 0.0),
    (4096, 1024, 512, 64, "burst", 0, 0.0),
    (2048, 256, 16384, 1024, "burst", 0, 0.0),
    (128000, 128, 16384, 64, "burst", 0, 0.0),
    (1024, 1024, 8192, 128, "closed", 1024, 0.0),
    (4096, 512, 8192, 64, "closed", 512, 0.0),
    (1024, 1024, 8192, 1, "poisson", 1024, 5.0),
]


def cheap_latency(keys):
    q = np.array([k.concurrency * k.query_len for k in keys], dtype=float)
    s = np.array([k.seq_len for k in keys], dtype=float)
    return 5.0 + 0.01 * q + 1e-4 * s


#: --growth: how the cost of one point grows with concurrency and output length (input 2048, B 8192)
GROWTH_CONCURRENCY, GROWTH_OUTPUT = (1, 16, 64, 256, 1024), (128, 512, 2048)


def growth(runs: int, latency) -> None:
    """ms per point (plan + pricing + replay, roofline prices) for a burst and a closed loop."""
    print(f"{'arrival':>8} {'output':>6} " + " ".join(f"{'C=' + str(c):>9}" for c in GROWTH_CONCURRENCY))
    for arrival in ("burst", "closed"):
        for o in GROWTH_OUTPUT:
            cells = []
            for c in GROWTH_CONCURRENCY:
                w = Workload(2048, o, 8192, c, arrival=arrival)
                walls = []
                for _ in range(runs):
                    t0 = time.perf_counter()
                    simulate(w, latency)
                    walls.append((time.perf_counter() - t0) * 1000)
                cells.append(f"{statistics.median(walls):>9.2f}")
            print(f"{arrival:>8} {o:>6} " + " ".join(cells))


def plan_ms(w, policy, runs: int) -> float:
    """The median ms of `plan` alone."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        plan(w, policy)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--growth", action="store_true", help="ms per point against concurrency and output length")
    args = ap.parse_args()
    if args.growth:
        growth(args.runs, build_latency_model("Qwen/Qwen3-32B", "H200_SXM"))
        return
    roofline = build_latency_model("Qwen/Qwen3-32B", "H200_SXM")
    print(f"{'input':>7} {'output':>6} {'B':>6} {'N':>5} {'arrival':>8} {'P':>5} {'R':>4} {'policy':>13} "
          f"{'steps':>6} {'keys':>6} {'plan ms':>8} {'wall ms':>8} {'us/step':>8} {'roofline ms':>12}")
    for i, o, b, n, arrival, prompts, rate in WORKLOADS:
        w = Workload(i, o, b, n, arrival=arrival, num_prompts=prompts, request_rate=rate)
        for policy in (DecodeFirstWithSlack(), TokenBudget()):
            walls = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                m = simulate(w, cheap_latency, policy)
                walls.append((time.perf_counter() - t0) * 1000)
            wall = statistics.median(walls)
            priced = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                simulate(w, roofline, policy)
                priced.append((time.perf_counter() - t0) * 1000)
            step_ms = StepPricer(cheap_latency, policy) if arrival == "poisson" else None
            keys = len(plan(w, policy, step_ms=step_ms).price_keys)
            planning = "" if step_ms else f"{plan_ms(w, policy, max(4 * args.runs, 21)):.2f}"  # a Poisson plan prices
            print(f"{i:>7} {o:>6} {b:>6} {n:>5} {arrival:>8} {w.prompts if arrival != 'burst' else '':>5} "
                  f"{rate or '':>4} {policy.name:>13} {m.num_steps:>6} {keys:>6} {planning:>8} "
                  f"{wall:>8.2f} {1000 * wall / m.num_steps:>8.2f} {statistics.median(priced):>12.2f}")
    print()
    mixes(args.runs, roofline)
    print()
    prompt_reuse(args.runs, roofline)


def mixes(runs: int, roofline) -> None:
    """Mixed lengths: 1,000 requests of a mix, closed loop at C=64, B=8192."""
    from simulator.mix import Lengths, RequestMix

    print(f"{'input':>28} {'output':>26} {'policy':>13} {'steps':>6} {'kinds':>6} {'wall ms':>8} {'roofline ms':>12}")
    for inputs, outputs in MIXES:
        mix = RequestMix(Lengths.parse(inputs), Lengths.parse(outputs))
        for policy in (DecodeFirstWithSlack(), TokenBudget()):
            walls, priced = [], []
            for _ in range(runs):
                w = Workload(2000, 500, 8192, 64, arrival="closed", num_prompts=1000, mix=mix)  # fresh: no memo
                t0 = time.perf_counter()
                m = simulate(w, cheap_latency, policy)
                walls.append((time.perf_counter() - t0) * 1000)
                w = Workload(2000, 500, 8192, 64, arrival="closed", num_prompts=1000, mix=mix)
                t0 = time.perf_counter()
                simulate(w, roofline, policy)
                priced.append((time.perf_counter() - t0) * 1000)
            print(f"{inputs:>28} {outputs:>26} {policy.name:>13} {m.num_steps:>6} {len(w.kinds.input):>6} "
                  f"{statistics.median(walls):>8.2f} {statistics.median(priced):>12.2f}")


def prompt_reuse(runs: int, roofline) -> None:
    """aiperf's closed loop (C=64, 2C drained warm-up, 20C measured, 1024 + 512 tokens, B=8192) drawing
    its 100 reused prompts, on an engine without and with a prefix cache (simulator.prompts)."""
    from simulator.prompts import PromptPool

    print(f"{'prefix cache':>12} {'policy':>13} {'steps':>6} {'hits':>6} {'wall ms':>8} {'roofline ms':>12}")
    for cached in (False, True):
        for policy in (DecodeFirstWithSlack(), TokenBudget()):
            walls, priced = [], []
            for _ in range(runs):
                for latency, out in ((cheap_latency, walls), (roofline, priced)):
                    w = Workload(1024, 512, 8192, 64, arrival="closed", num_prompts=1280, measure="all",
                                 prompt_pool=PromptPool(100, 128, cached=cached))  # fresh: no memo
                    t0 = time.perf_counter()
                    m = simulate(w, latency, policy)
                    out.append((time.perf_counter() - t0) * 1000)
            hits = (w.request_lengths()[2] > 0).mean()
            print(f"{'on' if cached else 'off':>12} {policy.name:>13} {m.num_steps:>6} {hits:>6.0%} "
                  f"{statistics.median(walls):>8.2f} {statistics.median(priced):>12.2f}")


if __name__ == "__main__":
    main()
