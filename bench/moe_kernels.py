"""The engines' routed-expert kernels side by side, from NVIDIA AIConfigurator's measured tables.

    python bench/moe_kernels.py [--tokens 4 16 64 256] [--distribution balanced]
    python bench/moe_kernels.py --skew [--distribution power_law_1.01]
    python bench/moe_kernels.py --gap [--tokens 1 4 16 64]

For each shipped MoE model's expert shape, each layout the tables measured it in (moe_tp, ep) and
each expert format, the milliseconds of one layer's routed experts per engine at decode-sized token
counts, and each engine's time over vLLM's. It says which engines' expert kernels are alike, which
is what lets an engine without measured MoE runs of its own take another's fitted expert efficiency
(latency/data/engines/*.toml [moe]); it needs servesweep[kernels].

`--gap` sets each engine's measured expert op (the tables as `--latency-backend aiconfigurator-tables` reads them)
beside what our roofline prices for it with that engine's profile, tp = ep on 2, 4 and 8 GPUs: the median of
measured over priced, and the difference in microseconds a MoE layer. At a few tokens that difference is a time a
layer that no weight stream explains (a profile's `moe_layer_us`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # bench/ would shadow the packages

from latency import kernel_tables, load_model  # noqa: E402
from latency.estimator import RooflineModel  # noqa: E402
from latency.routing import touched_share  # noqa: E402

MODELS = ("MiniMaxAI/MiniMax-M2.5", "Qwen/Qwen3-235B-A22B", "deepseek-ai/DeepSeek-V3", "moonshotai/Kimi-K2.5",
          "openai/gpt-oss-120b", "Qwen/Qwen3-30B-A3B")
GPUS = ("h100_sxm", "h200_sxm", "b200_sxm")  # the GPUs of the measured runs (kernel_tables.GPU_DIRS has more)
ENGINES = tuple(kernel_tables.ENGINE_DIRS.values())


def tables_of(root: Path, gpu: str, engine: str) -> list[tuple[str, pd.DataFrame]]:
    """(version, table) of every MoE table of `engine` on `gpu`, newest first."""
    return [(p.parent.name, pd.read_parquet(p, columns=kernel_tables.COLUMNS))
            for p in kernel_tables.moe_tables(root, gpu, engine)]


def measured(versions: list, shape: dict, tokens: list[int], distribution: str) -> tuple[str, pd.DataFrame]:
    """(version, rows) of the newest table that measured this expert shape, as the latency backend
    reads it; ("", no rows) when none did."""
    for version, t in versions:
        rows = t[np.logical_and.reduce([t[k] == v for k, v in shape.items()])
                 & (t.distribution == distribution) & t.num_tokens.isin(tokens)]
        if len(rows):
            return version, rows
    return "", pd.DataFrame(columns=kernel_tables.COLUMNS)


def compare(root: Path, tokens: list[int], distribution: str) -> pd.DataFrame:
    rows = []
    for gpu in GPUS:
        tables = {e: tables_of(root, gpu, e) for e in ENGINES}
        for name in MODELS:
            m = load_model(name)
            shape = dict(hidden_size=m.hidden_size, inter_size=m.moe_intermediate_size, topk=m.experts_per_token,
                         num_experts=m.num_experts)
            for engine, versions in tables.items():
                version, sel = measured(versions, shape, tokens, distribution)
                for (dtype, moe_tp, ep, n), ms in sel.groupby(["moe_dtype", "moe_tp_size", "moe_ep_size",
                                                               "num_tokens"]).latency.min().items():
                    rows.append(dict(gpu=gpu, model=name.split("/")[1], dtype=dtype, moe_tp=moe_tp, ep=ep,
                                     engine=engine, version=version, tokens=n, ms=ms))
    return pd.DataFrame(rows)


#: the GPU pair whose expert kernels are compared format by format, and their HBM bandwidths (TB/s,
#: the device files'): a kernel that uses each GPU's bandwidth alike takes their ratio of its time
ACROSS = (("h200_sxm", "H200_SXM"), ("b200_sxm", "B200"))


def across_gpus(root: Path, tokens: list[int], distribution: str) -> pd.DataFrame:
    """Per engine and expert format: the median time on the second GPU of ACROSS over the first, every
    shape and layout both measured at `tokens`, and the share of its bandwidth advantage it keeps
    (1: the kernel streams as much faster as the HBM is; the device file's [efficiency]
    weight_only_experts is this share for weight-only INT4 experts)."""
    from latency import load_device

    (gpu_a, dev_a), (gpu_b, dev_b) = ACROSS
    bw = load_device(dev_a).hbm_bandwidth_tbps / load_device(dev_b).hbm_bandwidth_tbps
    keys = ["moe_dtype", "hidden_size", "inter_size", "num_experts", "topk", "moe_tp_size", "moe_ep_size", "num_tokens"]
    rows = []
    for engine in ENGINES:
        times = {}
        for gpu in (gpu_a, gpu_b):
            versions = tables_of(root, gpu, engine)
            if not versions:
                break
            t = versions[0][1]
            t = t[(t.distribution == distribution) & t.num_tokens.isin(tokens)]
            times[gpu] = t.groupby(keys).latency.min()
        if len(times) < 2:
            continue
        both = pd.concat(times, axis=1).dropna()
        for dtype, part in both.groupby(level="moe_dtype"):
            ratio = float((part[gpu_b] / part[gpu_a]).median())
            rows.append(dict(engine=engine, dtype=dtype, points=len(part), **{f"{dev_b}/{dev_a} time": ratio},
                             **{"bandwidth share kept": bw / ratio}))
    return pd.DataFrame(rows)


#: the skews tried against the tables' routing (`--skew`), and the decode sizes they are judged at
SKEWS = (0.4, 0.6, 0.7, 0.8, 0.9, 1.0)
SKEW_TOKENS = (16, 32, 64, 128)


def routing_skew(root: Path, distribution: str) -> None:
    """How far the tables' routing (`distribution`) is from balanced, against our Zipf law of each skew
    (latency.routing.ROUTING_SKEW): vLLM's expert kernels at decode sizes, experts whole and on one device,
    where their time is the weights they read, so the time ratio is the ratio of distinct experts touched."""
    keys = ["moe_dtype", "hidden_size", "inter_size", "topk", "num_experts", "num_tokens"]
    rows = []
    for gpu in GPUS:
        for _, t in tables_of(root, gpu, "vllm")[:1]:
            t = t[(t.moe_ep_size == 1) & (t.moe_tp_size == 1) & t.num_tokens.isin(SKEW_TOKENS)]
            wide = t.pivot_table(index=keys, columns="distribution", values="latency", aggfunc="median")
            if {"balanced", distribution} <= set(wide.columns):
                rows.append(wide[["balanced", distribution]].dropna().reset_index())
    d = pd.concat(rows, ignore_index=True)
    measured = d[distribution] / d["balanced"]
    print(f"vLLM's expert kernels, {distribution} over balanced routing ({len(d)} points, {', '.join(GPUS)}):")
    print("  measured   " + "  ".join(f"{n}: {measured[d.num_tokens == n].median():.3f}" for n in SKEW_TOKENS))
    for skew in SKEWS:
        ours = np.array([touched_share(k, e, n, skew) / (1 - (1 - k / e) ** n)
                         for k, e, n in zip(d.topk, d.num_experts, d.num_tokens, strict=True)])
        error = np.median(np.abs(np.log(measured.to_numpy() / ours)))
        by_size = "  ".join(f"{n}: {np.median(ours[d.num_tokens == n]):.3f}" for n in SKEW_TOKENS)
        print(f"  skew {skew:.1f}   {by_size}   median |log ratio| {error:.3f}")


#: the expert formats `--gap` prices each model in (its deployed checkpoint's)
GAP_MODELS = {"MiniMaxAI/MiniMax-M2.5": "fp8", "Qwen/Qwen3-235B-A22B": "fp8", "deepseek-ai/DeepSeek-V3": "fp8",
              "openai/gpt-oss-120b": "bf16+mxfp4"}
GAP_DEVICES = ("H100_SXM", "H200_SXM", "B200")


def gap(tokens: list[int]) -> pd.DataFrame:
    """Per engine, model, GPU and tokens: measured over priced routed experts of a layer, and measured less priced
    (us), the median over tp = ep in 2, 4, 8 where the tables hold the layout."""
    rows, routed = [], np.array(tokens, dtype=np.float64)
    for model, quant in GAP_MODELS.items():
        for device in GAP_DEVICES:
            for n in (2, 4, 8):
                for engine in ENGINES:
                    tables = kernel_tables.build(model, device, engine=engine, tp=n, ep=n, quantization=quant)
                    if tables.curve is None:
                        continue
                    peak = tables.device.peak_flops(tables.quant.experts_dtype)
                    priced = RooflineModel._moe(tables, routed, peak, False)[0] / tables.moe_layers  # the roofline's
                    measured = tables._moe(routed, peak, False)[0] / tables.moe_layers
                    rows += [dict(engine=engine, model=model.split("/")[1], gpu=device, tokens=int(t), ratio=m / p,
                                  gap_us=(m - p) * 1e3) for t, m, p in zip(routed, measured, priced, strict=True)]
    d = pd.DataFrame(rows)
    return d.groupby(["engine", "model", "gpu", "tokens"])[["ratio", "gap_us"]].median().unstack("tokens")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[4, 16, 64, 256],
                    help="tokens routed to the layer (decode-sized batches by default)")
    ap.add_argument("--distribution", default="balanced", choices=("balanced", "power_law_1.01", "power_law_1.2"),
                    help="the tables' routing of tokens to experts")
    ap.add_argument("--skew", action="store_true", help="instead: the tables' power-law routing (default "
                    "power_law_1.01) over balanced, against our routing skew's distinct experts")
    ap.add_argument("--gap", action="store_true", help="instead: each engine's measured expert op over our roofline's "
                    "price of it, and the difference a layer in us")
    a = ap.parse_args()
    try:
        root = kernel_tables.tables_root()
    except ValueError as err:
        sys.exit(f"moe_kernels: {err}")
    if a.skew:
        routing_skew(root, a.distribution if a.distribution != "balanced" else kernel_tables.DISTRIBUTION)
        return
    if a.gap:
        pd.set_option("display.width", 200)
        print(gap(a.tokens).to_string(float_format=lambda x: f"{x:.2f}"))
        return
    d = compare(root, a.tokens, a.distribution)
    if d.empty:
        sys.exit("moe_kernels: no table holds a shipped MoE model's expert shape")
    keys = ["gpu", "model", "dtype", "moe_tp", "ep", "tokens"]
    wide = d.pivot_table(index=keys, columns="engine", values="ms").reset_index()
    wide = wide[wide.get("vllm").notna()] if "vllm" in wide else wide
    for e in ENGINES:
        if e in wide and e != "vllm":
            wide[f"{e}/vllm"] = wide[e] / wide["vllm"]
    print("versions: " + ", ".join(sorted({f"{g} {e} {v}" for g, e, v in d[["gpu", "engine", "version"]]
                                                  .drop_duplicates().itertuples(index=False)})))
    print(wide.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    ratios = [c for c in wide.columns if c.endswith("/vllm")]
    summary = wide.groupby(["gpu", "dtype", wide.ep > 1])[ratios].median()
    summary.index = summary.index.set_names(["gpu", "dtype", "expert parallel"])
    print("\nmedian time over vLLM's, per GPU, expert format and whether experts are split by EP:")
    print(summary.to_string(float_format=lambda x: f"{x:.2f}"))
    print(f"\none engine's expert kernels on {ACROSS[1][1]} against {ACROSS[0][1]} (newest tables of each):")
    print(across_gpus(root, a.tokens, a.distribution).to_string(index=False, float_format=lambda x: f"{x:.2f}"))


if __name__ == "__main__":
    main()
