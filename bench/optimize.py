"""Wall time of whole `servesweep optimize` processes (median of N runs).

    python bench/optimize.py [--runs 5]

The reference tool needs 45-55 s (RFC example) and 160-170 s (PD-ratio search on 8 devices) here.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CASES = {
    "RFC example (agg, 1 device)": [
        "Qwen/Qwen3-32B", "--device", "TEST_DEVICE", "--num-devices", "1", "--input-length", "32768",
        "--output-length", "1024", "--tpot-limits", "1000", "--max-batched-tokens", "8192"],
    "PD-ratio search, 8 devices": [
        "Qwen/Qwen3-32B", "--device", "TEST_DEVICE", "--num-devices", "8", "--input-length", "32768",
        "--output-length", "1024", "--ttft-limits", "30000", "--tpot-limits", "100", "--max-batched-tokens", "8192",
        "--enable-optimize-prefill-decode-ratio", "--prefill-devices-per-instance", "2",
        "--decode-devices-per-instance", "2"],
    "auto B, all tp, 8 x H200": [
        "Qwen/Qwen3-32B", "--device", "H200_SXM", "--num-devices", "8", "--input-length", "4096",
        "--output-length", "512", "--ttft-limits", "2000", "--tpot-limits", "50"],
    "every tp and budget, 8 x H200 (burst)": [
        "Qwen/Qwen3-32B", "--device", "H200_SXM", "--num-devices", "8", "--input-length", "4000",
        "--output-length", "500", "--ttft-limits", "1000", "--tpot-limits", "50"],
    "the same, closed loop": [
        "Qwen/Qwen3-32B", "--device", "H200_SXM", "--num-devices", "8", "--input-length", "4000",
        "--output-length", "500", "--ttft-limits", "1000", "--tpot-limits", "50", "--arrival", "closed"],
    "closed loop, token-budget, 2 x H100": [
        "Qwen/Qwen3-32B", "--device", "H100_SXM", "--num-devices", "2", "--tp-sizes", "2", "--input-length", "1024",
        "--output-length", "512", "--ttft-limits", "1000", "--tpot-limits", "50", "--scheduler", "token-budget",
        "--arrival", "closed", "--engine", "vllm"],
    "Poisson capacity, p90, 2 x H100": [
        "Qwen/Qwen3-32B", "--device", "H100_SXM", "--num-devices", "2", "--tp-sizes", "2", "--input-length", "1024",
        "--output-length", "512", "--ttft-limits", "1000", "--tpot-limits", "50", "--scheduler", "token-budget",
        "--arrival", "poisson", "--num-prompts", "300", "--slo-percentile", "90", "--engine", "vllm"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print(f"{'case':<32} {'median s':>9} {'min s':>7} {'max s':>7}")
    for name, argv in CASES.items():
        walls = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "orchestrator", "optimize", *argv], check=True,
                           capture_output=True)
            walls.append(time.perf_counter() - t0)
        print(f"{name:<32} {statistics.median(walls):>9.3f} {min(walls):>7.3f} {max(walls):>7.3f}")


if __name__ == "__main__":
    main()
