"""Wall time of whole `servesweep optimize` processes (median of N runs).

    python bench/optimize.py [--runs 5] [--only TEXT] [--aiconfigurator /path/to/venv/bin/aiconfigurator]
    python bench/optimize.py --runs 9 --only timed --against /tmp/before    # a before/after, interleaved

Our packages' bytecode is written first (compileall), as `pip install` leaves it: this machine sets
PYTHONDONTWRITEBYTECODE, which would otherwise have every process compile them again (~80 ms), a cost
no installed tool (the peer included) pays.

The reference tool needs 45-55 s (RFC example) and 160-170 s (PD-ratio search on 8 devices) here.
With `--aiconfigurator` (installed in a scratch virtualenv: `pip install aiconfigurator==0.12.0`), the
8-GPU questions are also put to its `cli default` (agg, vLLM, the same model, GPUs, lengths and
limits), timed the same way, and the ratio printed beside ours.
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
    "the same, closed loop, vLLM's profile (timed)": [
        "Qwen/Qwen3-32B", "--device", "H200_SXM", "--num-devices", "8", "--input-length", "4000",
        "--output-length", "500", "--ttft-limits", "1000", "--tpot-limits", "50", "--arrival", "closed",
        "--engine", "vllm"],
    "the same, timed, its answer written (--output)": [
        "Qwen/Qwen3-32B", "--device", "H200_SXM", "--num-devices", "8", "--input-length", "4000",
        "--output-length", "500", "--ttft-limits", "1000", "--tpot-limits", "50", "--arrival", "closed",
        "--engine", "vllm", "--output", "{tmp}/answer.parquet"],
    "closed loop, token-budget, 2 x H100": [
        "Qwen/Qwen3-32B", "--device", "H100_SXM", "--num-devices", "2", "--tp-sizes", "2", "--input-length", "1024",
        "--output-length", "512", "--ttft-limits", "1000", "--tpot-limits", "50", "--scheduler", "token-budget",
        "--arrival", "closed", "--engine", "vllm"],
    "Poisson capacity, p90, 2 x H100": [
        "Qwen/Qwen3-32B", "--device", "H100_SXM", "--num-devices", "2", "--tp-sizes", "2", "--input-length", "1024",
        "--output-length", "512", "--ttft-limits", "1000", "--tpot-limits", "50", "--scheduler", "token-budget",
        "--arrival", "poisson", "--num-prompts", "300", "--slo-percentile", "90", "--engine", "vllm"],
}


#: the cases the peer is asked too: its `cli default` over the same question (agg serving, vLLM)
PEER_CASES = ("every tp and budget, 8 x H200 (burst)", "the same, closed loop, vLLM's profile (timed)")
ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "latency" / "data" / "models"
PACKAGES = ("latency", "simulator", "orchestrator")
#: what the installed `servesweep` command runs. Not `python -m orchestrator`: on Python 3.11 runpy's extra
#: frames put this program's call stack on a boundary of the interpreter's frame chunks, and every call that
#: crosses it maps and unmaps one (1,000 pairs before `--help` prints, ~25 ms a process, strace -k shows
#: them in _PyThreadState_PopFrame), a cost of that way of starting, not of the tool
SERVESWEEP = "import sys; from orchestrator.cli import run; sys.exit(run())"


def wall(command: list[str], runs: int, **kwargs) -> list[float]:
    """Wall seconds of `runs` whole processes of `command`."""
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, **kwargs)
        walls.append(time.perf_counter() - t0)
    return walls


def peer_command(peer: str, argv: list[str], config_dir: str) -> list[str]:
    """The peer's `cli default` for one of our questions (the model's config.json from a local folder)."""
    flag = dict(zip(argv[1::2], argv[2::2], strict=True))
    return [peer, "cli", "default", "--model-path", config_dir, "--total-gpus", flag["--num-devices"],
            "--system", flag["--device"].lower(), "--backend", "vllm", "--serving-mode", "agg", "--isl",
            flag["--input-length"], "--osl", flag["--output-length"], "--ttft", flag["--ttft-limits"], "--tpot",
            flag["--tpot-limits"]]


def interleaved(command: list[str], other: Path, runs: int) -> tuple[list[float], list[float]]:
    """Wall seconds of `command` here and in checkout `other`, one run of each in turn."""
    here, there = [], []
    for _ in range(runs):
        here += wall(command, 1, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
        there += wall(command, 1, env={**os.environ, "PYTHONPATH": str(other)}, cwd=other)
    return here, there


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", default="", help="only the cases whose name contains this")
    ap.add_argument("--aiconfigurator", help="the peer's command, to time its cli default beside ours")
    ap.add_argument("--against", metavar="CHECKOUT", help="another checkout of servesweep (git worktree add): "
                    "time it too, run for run interleaved with this tree, for a before/after on a drifting machine")
    args = ap.parse_args()
    for root in (ROOT, *([Path(args.against)] if args.against else [])):
        for package in PACKAGES:
            compileall.compile_dir(root / package, quiet=1)
    print(f"{'case':<48} {'median s':>9} {'min s':>7} {'max s':>7} {'peer s':>7} {'peer / ours':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv in CASES.items():
            if args.only not in name:
                continue
            command = [sys.executable, "-c", SERVESWEEP, "optimize", *(a.replace("{tmp}", tmp) for a in argv)]
            if args.against:
                walls, before = interleaved(command, Path(args.against), args.runs)
                print(f"{'  in ' + args.against:<48} {statistics.median(before):>9.3f} "
                      f"{min(before):>7.3f} {max(before):>7.3f}")
            else:
                walls = wall(command, args.runs)
            ours = statistics.median(walls)
            peer = ""
            if args.aiconfigurator and name in PEER_CASES:
                folder = Path(tmp) / argv[0].replace("/", "--")
                folder.mkdir(exist_ok=True)
                (folder / "config.json").write_text((MODELS / f"{folder.name}.json").read_text())
                theirs = statistics.median(wall(peer_command(args.aiconfigurator, argv, str(folder)), args.runs,
                                                cwd=tmp))
                peer = f"{theirs:>7.2f} {theirs / ours:>10.1f}x"
            print(f"{name:<48} {ours:>9.3f} {min(walls):>7.3f} {max(walls):>7.3f} {peer}")


if __name__ == "__main__":
    main()
