"""Sweep throughput: scenarios per second inline vs Ray with 1 and 2 CPUs, and the cache hit rate.

    python bench/sweep.py [--runs 3]

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
import json, os, sys, tempfile, time
os.environ["RAY_AUTH_MODE"] = "disabled"
from orchestrator.spec import expand
from orchestrator.sweep import run_sweep
spec, warm, backend, cpus = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
t0 = time.perf_counter()
if backend == "ray":
    import ray
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
startup = time.perf_counter() - t0
with tempfile.TemporaryDirectory() as d:
    if backend == "ray":
        run_sweep(expand(warm), d + "/warm", backend=backend, progress=False)
    items = expand(spec)
    s = run_sweep(items, d + "/run", backend=backend, progress=False)
print(json.dumps({"scenarios": s.total, "seconds": s.seconds, "startup": startup, "points": s.points,
                  "hit": 1 - s.priced / max(s.lookups, 1)}))
"""


def run(backend: str, cpus: int) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(SPEC), json.dumps(WARMUP), backend, str(cpus)],
                       capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for name, backend, cpus in (("inline", "inline", 1), ("ray, 1 CPU", "ray", 1), ("ray, 2 CPUs", "ray", 2)):
        results = [run(backend, cpus) for _ in range(args.runs)]
        secs = statistics.median(r["seconds"] for r in results)
        rows.append((name, results[0]["scenarios"], results[0]["points"], secs, results[0]["scenarios"] / secs,
                     statistics.median(r["startup"] for r in results), results[0]["hit"]))
    base = {r[0]: r[4] for r in rows}
    print(f"{'backend':<12} {'scenarios':>9} {'points':>7} {'median s':>9} {'scen/s':>8} {'vs 1 CPU':>9} "
          f"{'start s':>8} {'cache hit':>9}")
    for name, n, pts, secs, rate, start, hit in rows:
        ratio = rate / base["ray, 1 CPU"]
        print(f"{name:<12} {n:>9} {pts:>7} {secs:>9.2f} {rate:>8.1f} {ratio:>8.2f}x {start:>8.1f} {100 * hit:>8.1f}%")


if __name__ == "__main__":
    main()
