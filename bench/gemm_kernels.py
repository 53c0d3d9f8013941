"""The engines' measured linear-layer GEMMs against our roofline, from NVIDIA AIConfigurator's tables.

    python bench/gemm_kernels.py [--min-weights 16e6]

For each GPU of the measured runs, engine and GEMM dtype (bf16, per-tensor FP8), every (m, n, k) the
tables measured with at least `--min-weights` weights: the measured milliseconds over what our roofline
prices for that GEMM (`RooflineModel._roof`: FLOPs at the dtype's peak x [efficiency] gemm, weights and
activations at the HBM bandwidth x [efficiency] memory, plus one kernel's overhead), as medians per
regime of m: decode (m <= 64: weight streaming) and prefill (m >= 1024: compute). A bf16 ratio near 1
says the roofline holds; the FP8 ones give the efficiencies FP8 linear layers reach
(`[efficiency] fp8_memory` and `fp8_gemm` in latency/data/devices/*.toml): the device's own over the
median FP8 ratio of the three engines. Needs servesweep[kernels].
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # bench/ would shadow the packages

from latency import kernel_tables  # noqa: E402
from latency.device import load_device  # noqa: E402

GPUS = {"H100_SXM": "h100_sxm", "H200_SXM": "h200_sxm", "B200": "b200_sxm"}
DTYPES = {"bfloat16": (2.0, "bf16"), "fp8": (1.0, "fp8")}  # table dtype: (bytes a weight, our peak)
DECODE_M, PREFILL_M = 64, 1024
ACT_BYTES = 2  # bf16 activations in and out (the estimator's ACT_BYTES)


def newest(root: Path, gpu: str, engine: str) -> Path | None:
    found = sorted((root / gpu / "gemm" / engine).glob("*/gemm_perf.parquet"),
                   key=lambda p: kernel_tables._version_key(p.parent.name), reverse=True)
    return found[0] if found else None


def ratios(table: pd.DataFrame, device, min_weights: float, fp8_eff: tuple[float, float] | None = None) -> list[dict]:
    """Measured over priced, per dtype and regime; `fp8_eff` (gemm, memory) prices FP8 with those."""
    t = table.groupby(["gemm_dtype", "m", "n", "k"], as_index=False).latency.min()
    out = []
    for dtype, (w_bytes, peak) in DTYPES.items():
        s = t[(t.gemm_dtype == dtype) & (t.n * t.k >= min_weights)]
        eff_c, eff_m = (fp8_eff if dtype == "fp8" and fp8_eff else (device.eff_gemm, device.eff_memory))
        compute = 2 * s.m * s.n * s.k / (device.peak_flops(peak) * eff_c) * 1e3
        memory = (s.n * s.k * w_bytes + s.m * (s.n + s.k) * ACT_BYTES) / (device.hbm_bytes_per_s * eff_m) * 1e3
        ratio = s.latency / (np.maximum(compute, memory) + device.kernel_overhead_us * 1e-3)
        for regime, sel in (("decode", s.m <= DECODE_M), ("prefill", s.m >= PREFILL_M)):
            out.append({"dtype": dtype, "regime": regime, "ratio": float(ratio[sel].median()), "gemms": int(sel.sum())})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-weights", type=float, default=16e6, help="GEMMs of at least this many weights (n x k)")
    a = ap.parse_args()
    root = kernel_tables.tables_root()
    rows = []
    for name, gpu in GPUS.items():
        device = load_device(name)
        for engine in kernel_tables.ENGINE_DIRS.values():
            path = newest(root, gpu, engine)
            if path is None:
                continue
            table = pd.read_parquet(path, columns=["gemm_dtype", "m", "n", "k", "latency"])
            fitted = device.linear_efficiency("fp8")
            for r in ratios(table, device, a.min_weights):
                rows.append({"gpu": name, "engine": f"{engine} {path.parent.name}", **r})
            for r in ratios(table, device, a.min_weights, fitted):
                if r["dtype"] == "fp8":
                    rows.append({"gpu": name, "engine": f"{engine} {path.parent.name}", **r,
                                 "dtype": "fp8 (device file)"})
    df = pd.DataFrame(rows)
    pd.set_option("display.width", 200)
    print(df.pivot_table(index=["gpu", "engine"], columns=["dtype", "regime"], values="ratio").round(2).to_string())
    print("\nmeasured / priced, median over the engines, and the FP8 efficiencies that make it 1:")
    for name in GPUS:
        device = load_device(name)
        fp8 = df[(df.gpu == name) & (df.dtype == "fp8")].groupby("regime").ratio.median()
        print(f"  {name}: decode {fp8['decode']:.2f}x -> fp8_memory = {device.eff_memory / fp8['decode']:.2f}; "
              f"prefill {fp8['prefill']:.2f}x -> fp8_gemm = {device.eff_gemm / fp8['prefill']:.2f} "
              f"(device file: {device.eff_fp8_memory:.2f}, {device.eff_fp8_gemm:.2f})")


if __name__ == "__main__":
    main()
