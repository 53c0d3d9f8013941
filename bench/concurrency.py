"""Wall time of whole `servesweep estimate` processes as a closed loop's clients grow (median of N runs):
work bounded by what the engine runs at once (simulator/standin.py), not by the clients.

    python bench/concurrency.py [--runs 3] [--clients 1000 10000 1000000 100000000]

Qwen3-8B on one H200 under vLLM's profile, 1000/200 tokens: the engine seats 1024, its KV pool ~700.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

ARGS = ["estimate", "Qwen/Qwen3-8B", "--device", "H200_SXM", "--num-devices", "1", "--engine", "vllm",
        "--arrival", "closed", "--input-length", "1000", "--output-length", "200"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs a case (the median is reported)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1000, 10**4, 10**6, 10**8], help="concurrencies")
    a = ap.parse_args()
    print(f"{'clients':>11} {'median s':>9} {'min s':>7} {'max s':>7} {'TTFT mean ms':>15} {'x 10^4 time':>12}")
    medians = {}
    for clients in a.clients:
        walls, out = [], ""
        for _ in range(a.runs):
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "orchestrator", *ARGS, "--concurrency", str(clients)],
                                 check=True, capture_output=True, text=True).stdout
            walls.append(time.perf_counter() - t0)
        medians[clients] = statistics.median(walls)
        ttft = next(line.split()[2] for line in out.splitlines() if line.lstrip().startswith("TTFT ms"))
        ratio = f"{medians[clients] / medians[10**4]:.2f}" if 10**4 in medians else ""
        print(f"{clients:>11} {medians[clients]:>9.2f} {min(walls):>7.2f} {max(walls):>7.2f} {ttft:>15} {ratio:>12}")


if __name__ == "__main__":
    main()
