"""Latency model: keys priced per second, and fidelity against public reference figures.

    python bench/latency.py [--runs 5] [--reference ../shared/reference/peer_steps_h200_qwen3_8b.csv]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # bench/latency.py would shadow the package

from latency import ForwardKey, build_latency_model, calibrate  # noqa: E402
from orchestrator.optimize import optimize  # noqa: E402
from orchestrator.scenario import Scenario  # noqa: E402

PEER = Path(__file__).resolve().parent.parent.parent / "shared" / "reference" / "peer_steps_h200_qwen3_8b.csv"
# The Ascend tool's analytic model, TEST_DEVICE, Qwen3-32B W8A8, 1 device, reserved 10 GB, TPOT <= 1000 ms
ASCEND = [
    dict(input=32768, output=1024, conc=2, ttft=25813, tpot=59.47, tput=23.63, kv_gb=16.28),
    dict(input=2048, output=256, conc=41, ttft=10745, tpot=108.74, tput=377.04, kv_gb=None),
]


def keys_per_second(runs: int) -> None:
    lm = build_latency_model("Qwen/Qwen3-32B", "H200_SXM", tp=2)
    rng = np.random.default_rng(0)
    keys = [ForwardKey(bool(d), int(c), 1 if d else int(q), int(s) + (1 if d else int(q)))
            for d, c, q, s in zip(rng.integers(0, 2, 100_000), rng.integers(1, 512, 100_000),
                                  rng.integers(1, 8192, 100_000), rng.integers(0, 32768, 100_000), strict=True)]
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        lm.latency_ms(keys)
        walls.append(time.perf_counter() - t0)
    print(f"keys priced per second (100,000 keys, median of {runs}): {len(keys) / statistics.median(walls):,.0f}\n")


def backend_costs(runs: int) -> None:
    """The measured-kernel backend against the roofline on a MoE model: what a key costs, what building
    the backend costs (its table read), and a whole search with each (needs servesweep[kernels])."""
    from latency import kernel_tables
    from latency.backends import make_backend

    try:
        kernel_tables.tables_root()
    except ValueError as err:
        print(f"(skipping the kernel-table backend: {err})\n")
        return
    model, device = "MiniMaxAI/MiniMax-M2.5", "H200_SXM"
    rng = np.random.default_rng(0)
    keys = [ForwardKey(bool(d), int(c), 1 if d else int(q), int(s) + (1 if d else int(q)))
            for d, c, q, s in zip(rng.integers(0, 2, 100_000), rng.integers(1, 512, 100_000),
                                  rng.integers(1, 8192, 100_000), rng.integers(0, 32768, 100_000), strict=True)]
    rows = []
    for name in ("roofline", kernel_tables.NAME):
        build, price, search = [], [], []
        for _ in range(runs):
            kernel_tables._read.cache_clear()
            t0 = time.perf_counter()
            lm = make_backend(name, model, device, tp=4, quantization="fp8", engine="vllm")
            build.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            lm.latency_ms(keys)
            price.append(time.perf_counter() - t0)
            t0 = time.perf_counter()  # a whole process: nothing cached from the run before
            subprocess.run([sys.executable, "-m", "orchestrator", "optimize", model, "--device", device,
                            "--num-devices", "4", "--tp-sizes", "4", "--input-length", "4096", "--output-length", "512",
                            "--ttft-limits", "2000", "--tpot-limits", "50", "--quantize-linear-action", "fp8",
                            "--engine", "vllm", "--arrival", "closed", "--latency-backend", name],
                           check=True, capture_output=True)
            search.append(time.perf_counter() - t0)
        rows.append({"backend": name, "build ms": 1e3 * statistics.median(build),
                     "us per key": 1e6 * statistics.median(price) / len(keys),
                     "search s": statistics.median(search)})
    out = pd.DataFrame(rows)
    out["search vs roofline"] = out["search s"] / out["search s"].iloc[0]
    print(f"Latency backends on {model}, 4 x {device}, vLLM (median of {runs}; 100,000 keys; a closed-loop "
          "`servesweep optimize` process, 4096/512 under TTFT 2 s, TPOT 50 ms):")
    print(out.to_string(index=False, float_format="{:.3f}".format) + "\n")


def peer_fidelity(path: Path) -> None:
    df = pd.read_csv(path)
    rows = []
    for (model, device, tp), g in df.groupby(["model", "device", "tp"]):
        lm = build_latency_model(model, device, tp=int(tp))
        dec = g["phase"] == "decode"
        keys = [ForwardKey(bool(d), int(b), 1 if d else int(n), int(n) + 1 if d else int(n))
                for d, b, n in zip(dec, g["batch"], g["isl_or_context"], strict=True)]
        pred = lm.latency_ms(keys)
        for (_, r), p in zip(g.iterrows(), pred, strict=True):
            rows.append({"tp": tp, "phase": r.phase, "batch": r.batch, "isl/ctx": r.isl_or_context,
                         "measured_ms": r.latency_ms, "servesweep_ms": round(p, 2),
                         "error_%": round(100 * (p / r.latency_ms - 1), 1)})
    out = pd.DataFrame(rows)
    print(f"Fidelity vs {path.name} (AIConfigurator, measured H200 kernels):")
    print(out.to_string(index=False))
    err = out["error_%"].abs()
    print(f"median |error| {err.median():.1f} %, p90 {err.quantile(0.9):.1f} %, max {err.max():.1f} %")
    print(out.assign(abs_err=err).groupby(["tp", "phase"])["abs_err"].median().rename("median |error| %").to_string())
    print()


def calibration_holdout(path: Path) -> None:
    """Fit the efficiencies on the tp=1 rows only, then judge them on the tp=2 and tp=4 rows."""
    df = pd.read_csv(path)
    dec = df["phase"] == "decode"
    table = pd.DataFrame({"is_decode": dec, "concurrency": df["batch"],
                          "query_len": np.where(dec, 1, df["isl_or_context"]),
                          "seq_len": np.where(dec, df["isl_or_context"] + 1, df["isl_or_context"]),
                          "latency_ms": df["latency_ms"], "tp": df["tp"]})
    base = build_latency_model("Qwen/Qwen3-8B", "H200_SXM", tp=1)
    cal = calibrate(base, table[table["tp"] == 1])
    print("Calibration held out: fit on tp=1 rows, judged on tp=2 and tp=4 rows")
    print("  fitted: " + ", ".join(f"{k}={v:.3g}" for k, v in cal.params.items()))
    print(f"  tp=1 (fitted) median |error|: {100 * cal.median_error_before:.1f} % -> "
          f"{100 * cal.median_error_after:.1f} %")
    device = cal.model.device
    for tp in (2, 4):
        rows = table[table["tp"] == tp]
        keys = [ForwardKey(bool(r.is_decode), int(r.concurrency), int(r.query_len), int(r.seq_len))
                for r in rows.itertuples()]
        before = build_latency_model("Qwen/Qwen3-8B", "H200_SXM", tp=tp).latency_ms(keys)
        after = build_latency_model("Qwen/Qwen3-8B", device, tp=tp).latency_ms(keys)
        meas = rows["latency_ms"].to_numpy()
        print(f"  tp={tp} (held out) median |error|: {100 * np.median(abs(before / meas - 1)):.1f} % -> "
              f"{100 * np.median(abs(after / meas - 1)):.1f} %")
    print()


def ascend_fidelity() -> None:
    print("Fidelity vs the Ascend tool's analytic model (Qwen3-32B W8A8, TEST_DEVICE, B=8192, TPOT <= 1000 ms):")
    print(f"{'input/output':>13} {'':>11} {'conc':>5} {'TTFT ms':>9} {'TPOT ms':>8} {'tok/s':>8} {'KV GiB':>7}")
    for ref in ASCEND:
        s = Scenario("Qwen/Qwen3-32B", "TEST_DEVICE", 1, ref["input"], ref["output"], (8192,), tpot_limits=(1000.0,),
                     quantization="W8A8_DYNAMIC")
        (best,) = optimize(s).best
        kv = f"{ref['kv_gb']:.2f}" if ref["kv_gb"] else "-"
        io = f"{ref['input']}/{ref['output']}"
        print(f"{io:>13} {'reference':>11} {ref['conc']:>5} {ref['ttft']:>9.0f} {ref['tpot']:>8.2f} "
              f"{ref['tput']:>8.2f} {kv:>7}")
        print(f"{'':>13} {'servesweep':>11} {best['concurrency']:>5} {best['ttft_ms']:>9.0f} {best['tpot_ms']:>8.2f} "
              f"{best['output_throughput']:>8.2f} {best['kv_gib']:>7.2f}")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--reference", type=Path, default=PEER)
    args = ap.parse_args()
    keys_per_second(args.runs)
    backend_costs(args.runs)
    if args.reference.is_file():
        peer_fidelity(args.reference)
        calibration_holdout(args.reference)
    else:
        print(f"(no {args.reference}: skipping the measured-kernel comparison)\n")
    ascend_fidelity()


if __name__ == "__main__":
    main()
