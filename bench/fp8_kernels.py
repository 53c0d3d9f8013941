"""FP8 kernels against our roofline, from NVIDIA AIConfigurator's measured tables: the linear layers'
GEMMs and decode attention over an FP8 KV cache, each beside its bf16 counterpart.

    python bench/fp8_kernels.py [--min-weights 16e6]

For each GPU of the measured runs and each engine (vLLM, SGLang, TensorRT-LLM; the newest table), the
measured milliseconds over what our roofline prices for the same kernel (`RooflineModel._roof`: FLOPs
at the dtype's peak x the device's efficiency, bytes at its HBM bandwidth x [efficiency] memory, plus
the kernels' overhead), as medians:

- GEMMs (`gemm_perf.parquet`, every (m, n, k) of at least `--min-weights` weights), bf16 and per-tensor
  FP8, at decode sizes (m <= 64: weights streamed) and prefill sizes (m >= 1024: compute);
- decode attention (`generation_attention_perf.parquet`, head dim 128, no window), bf16 and FP8 KV
  cache, over steps that read 8-512 MB of KV (a serving step's range).

bf16 ratios near 1 say the roofline holds; the FP8 ones give what FP8 reaches: the device's own
efficiency over the median of the three engines' FP8 ratio. latency/data/devices/*.toml carry
[efficiency] fp8_memory (the linear layers' weights); fp8_kv_memory (attention's KV reads) and fp8_gemm
(the prefill side) are printed but not set, as the measured runs do not bear them out (docs/fidelity.md).
Needs servesweep[kernels].
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # bench/ would shadow the packages

from latency import build_latency_model, kernel_tables, load_device  # noqa: E402
from latency.estimator import ACT_BYTES, KERNELS  # noqa: E402

GPUS = {"H100_SXM": "h100_sxm", "H200_SXM": "h200_sxm", "B200": "b200_sxm"}
GEMM_DTYPES = {"bfloat16": (2.0, "bf16"), "fp8": (1.0, "fp8")}  # table dtype: (bytes a weight, our peak)
DECODE_M, PREFILL_M = 64, 1024
KV_BYTES = {"bfloat16": 2.0, "fp8": 1.0}
HEAD_DIM = 128
KV_RANGE = (8e6, 512e6)  # bytes of KV a decode step's attention layer reads
PRICER_MODEL = "Qwen/Qwen3-8B"  # any shipped model: it only carries the device whose roofline prices a kernel


def newest(root: Path, gpu: str, op: str, engine: str, table: str) -> Path | None:
    found = kernel_tables.tables(root, gpu, op, engine, table)
    return found[0] if found else None


def gemm_ratios(t: pd.DataFrame, lm, min_weights: float) -> dict:
    """{(dtype, regime): median measured / priced} of GEMMs, each priced by the roofline (`lm._roof`) at
    the device's bf16 efficiencies: the ratio is what FP8 falls short of them by."""
    d = lm.device
    t = t.groupby(["gemm_dtype", "m", "n", "k"], as_index=False).latency.min()
    out = {}
    for dtype, (w_bytes, peak) in GEMM_DTYPES.items():
        s = t[(t.gemm_dtype == dtype) & (t.n * t.k >= min_weights)]
        bytes_ = (s.n * s.k * w_bytes + s.m * (s.n + s.k) * ACT_BYTES).to_numpy()  # arrays: `_roof` takes numbers too
        priced, _ = lm._roof((2 * s.m * s.n * s.k).to_numpy(), bytes_, d.peak_flops(peak), d.eff_gemm,
                             d.kernel_overhead_us * 1e-3, False, d.eff_memory)
        ratio = s.latency / priced
        out[(f"gemm {dtype}", "decode")] = float(ratio[s.m <= DECODE_M].median())
        out[(f"gemm {dtype}", "prefill")] = float(ratio[s.m >= PREFILL_M].median())
    return out


def attention_ratios(t: pd.DataFrame, lm) -> dict:
    """{(kv dtype, "decode"): median measured / priced} of decode attention layers (as `_attention_entries`
    prices a decode entry: each query against its context, the whole KV read once, at the device's
    memory efficiency)."""
    d = lm.device
    t = t[(t.head_dim == HEAD_DIM) & (t.window_size == 0) & t.kv_cache_dtype.isin(list(KV_BYTES))]
    t = t.groupby(["batch_size", "isl", "step", "num_heads", "num_key_value_heads", "kv_cache_dtype"],
                  as_index=False).latency.min()
    context, b, heads = t.isl + t.step, t.batch_size, t.num_heads
    kv = t.kv_cache_dtype.map(KV_BYTES)
    bytes_ = b * (context * 2 * t.num_key_value_heads * HEAD_DIM * kv + heads * 2 * HEAD_DIM * ACT_BYTES)
    flops = 2 * b * context * heads * 2 * HEAD_DIM
    priced, _ = lm._roof(flops.to_numpy(), bytes_.to_numpy(), d.peak_flops("bf16"), d.eff_attention,
                         KERNELS["attention"] * d.kernel_overhead_us * 1e-3, False, d.eff_memory)
    ratio = t.latency / priced
    inside = (bytes_ >= KV_RANGE[0]) & (bytes_ < KV_RANGE[1])
    return {(f"attention {dtype} KV", "decode"): float(ratio[inside & (t.kv_cache_dtype == dtype)].median())
            for dtype in KV_BYTES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-weights", type=float, default=16e6, help="GEMMs of at least this many weights (n x k)")
    a = ap.parse_args()
    root = kernel_tables.tables_root()
    rows = []
    for name, gpu in GPUS.items():
        lm = build_latency_model(PRICER_MODEL, name)  # the roofline's `_roof` reads only its device
        for engine in kernel_tables.ENGINE_DIRS.values():
            ratios = {}
            gemm = newest(root, gpu, "gemm", engine, "gemm_perf.parquet")
            if gemm is not None:
                ratios |= gemm_ratios(pd.read_parquet(gemm, columns=["gemm_dtype", "m", "n", "k", "latency"]),
                                      lm, a.min_weights)
            attention = newest(root, gpu, "attention", engine, "generation_attention_perf.parquet")
            if attention is not None:
                ratios |= attention_ratios(pd.read_parquet(attention), lm)
            rows += [{"gpu": name, "engine": engine, "kernel": k, "regime": r, "ratio": v}
                     for (k, r), v in ratios.items()]
    df = pd.DataFrame(rows)
    pd.set_option("display.width", 200)
    print("measured / priced by our roofline (medians):")
    print(df.pivot_table(index=["gpu", "engine"], columns=["kernel", "regime"], values="ratio").round(2).to_string())
    print("\nthe FP8 efficiencies that make the median of the engines 1 (device file's now in brackets):")
    for name in GPUS:
        d = load_device(name)
        med = df[df.gpu == name].groupby(["kernel", "regime"]).ratio.median()
        kv = d.eff_memory / med[("attention fp8 KV", "decode")]
        print(f"  {name}: fp8_memory {d.eff_memory / med[('gemm fp8', 'decode')]:.2f} [{d.eff_fp8_memory:g}], "
              f"fp8_gemm {d.eff_gemm / med[('gemm fp8', 'prefill')]:.2f} [{d.eff_fp8_gemm:g}, not set], "
              f"fp8_kv_memory {kv:.2f} [{d.eff_fp8_kv_memory:g}, not set]")


if __name__ == "__main__":
    main()
