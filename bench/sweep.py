"""Sweep throughput: scenarios per second inline vs Ray with 1 and 2 CPUs, the cache hit rate, the
driver's peak memory and the Ray tasks run again (lost workers; bench/cluster.py loses a whole node).

    python bench/sweep.py [--runs 3] [--spec examples/cluster_scale.toml --limit 1000] [--backends ray2]

Each configuration runs in a fresh process (a fresh Ray for the Ray ones). A small warm-up sweep
of another model first starts the Ray workers and imports the code in them, so the timed sweep
measures steady state; Ray start-up itself is reported apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # bench/latency.py would shadow the package

SPEC = {
    "sweep": {"name": "bench"},
    "grid": {"model": ["Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B-Instruct"], "device": ["H200_SXM", "H100_SXM"],
             "num_devices": [1, 2, 4], "input_length": [1024, 4096, 16384], "output_length": [128, 512],
             "max_batched_tokens": [2048, 8192], "prefix_cache_hit_rate": [0.0, 0.5], "ttft_limit_ms": [5000],
             "tpot_limit_ms": [30, 60]},
}
WARMUP = {**SPEC, "grid": {**SPEC["grid"], "model": "Qwen/Qwen3-32B", "device": "B200", "num_devices": 1,
                           "input_length": 1024, "output_length": 64}}

CHILD = r"""
import json, resource, sys, tempfile, time
from orchestrator.spec import expand
from orchestrator.sweep import run_sweep
spec, warm, backend, cpus = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
limit = int(sys.argv[5])
t0 = time.perf_counter()
if backend == "ray":
    import ray
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
startup = time.perf_counter() - t0
with tempfile.TemporaryDirectory() as d:
    if backend == "ray":
        run_sweep(expand(warm), d + "/warm", backend=backend, progress=False)
    items = expand(spec)[: limit or None]
    s = run_sweep(items, d + "/run", backend=backend, progress=False)
print(json.dumps({"scenarios": s.total, "seconds": s.seconds, "startup": startup, "points": s.points,
                  "hit": 1 - s.priced / max(s.lookups, 1), "round_trips": s.round_trips, "retried": s.retried,
                  "plans_made": s.plans_made, "distinct_plans": s.distinct_plans, "efficiency": s.efficiency,
                  "tail": s.idle_tail,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""
BACKENDS = {"inline": ("inline", "inline", 1), "ray1": ("ray, 1 CPU", "ray", 1), "ray2": ("ray, 2 CPUs", "ray", 2)}


def run(spec: dict, backend: str, cpus: int, limit: int) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec), json.dumps(WARMUP), backend, str(cpus),
                        str(limit)], capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--spec", help="a sweep spec (TOML) instead of the built-in 576-scenario grid")
    ap.add_argument("--limit", type=int, default=0, help="only the first N scenarios of the spec (0: all)")
    ap.add_argument("--backends", nargs="+", choices=list(BACKENDS), default=list(BACKENDS))
    ap.add_argument("--latency-backend", default="roofline",
                    help="e.g. slow-roofline: 5 ms a key, what the shared cache is for")
    args = ap.parse_args()
    spec = SPEC
    if args.spec:
        from orchestrator.spec import load_spec

        spec = load_spec(args.spec)
    spec = {**spec, "options": {**spec.get("options", {}), "latency_backend": args.latency_backend}}
    rows = []
    for key in args.backends:
        name, backend, cpus = BACKENDS[key]
        results = [run(spec, backend, cpus, args.limit) for _ in range(args.runs)]
        secs = statistics.median(r["seconds"] for r in results)
        rows.append((name, results[0]["scenarios"], results[0]["points"], secs, results[0]["scenarios"] / secs,
                     statistics.median(r["startup"] for r in results), results[0]["hit"],
                     max(r["peak_mib"] for r in results), sum(r["retried"] for r in results),
                     results[0]["plans_made"] / max(results[0]["distinct_plans"], 1),
                     statistics.median(r["efficiency"] for r in results),
                     statistics.median(r["tail"] for r in results)))
    base = {r[0]: r[4] for r in rows}
    print(f"latency backend {args.latency_backend}")
    print(f"{'backend':<12} {'scenarios':>9} {'points':>7} {'median s':>9} {'scen/s':>8} {'vs inline':>9} "
          f"{'start s':>8} {'cache hit':>9} {'driver MiB':>10} {'retried':>7} {'plans/distinct':>14} {'busy':>6} "
          f"{'idle tail s':>11}")
    for name, n, pts, secs, rate, start, hit, peak, retried, plans, busy, tail in rows:
        ratio = f"{rate / base['inline']:>8.2f}x" if "inline" in base else f"{'-':>9}"
        print(f"{name:<12} {n:>9} {pts:>7} {secs:>9.2f} {rate:>8.1f} {ratio} {start:>8.1f} {100 * hit:>8.1f}% "
              f"{peak:>10.0f} {retried:>7} {plans:>14.2f} {100 * busy:>5.0f}% {tail:>11.1f}")


if __name__ == "__main__":
    main()
