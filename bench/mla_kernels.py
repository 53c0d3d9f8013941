"""MLA decode attention against our roofline, from NVIDIA AIConfigurator's measured tables: DeepSeek-V3's whole
attention module of a decode step (its q/kv LoRA projections, the absorbed attention over the latent KV cache,
the output projection), measured per layer by each engine, over what we price for the same step.

    python bench/mla_kernels.py

For H100, H200 and B200 and each engine with a `mla_generation_module_perf` table (the newest), bf16 weights and
KV, 128 / tp heads a rank (tp 1, 4, 8), 8-256 requests a step at 1,024-16,384 tokens of context: the median of
measured over priced, where priced is our `qkv_proj + attention + o_proj` of the step (`RooflineModel.breakdown`)
over the model's 61 layers, with the engine's profile; and by requests a step. `attention alone` takes the
projections as priced and charges the rest of the measured time to attention: the factor attention's price
would need: its median over the GPUs and tp is what vLLM's profile's `mla_decode_attention` says. `extra us` is
the same gap read as a fixed time a layer instead.

SGLang's and TensorRT-LLM's tables also time the attention kernel alone (`generation_mla_perf`): `kernel alone`
is its median over our attention price, per tp. Where it is near 1 the module's gap lies in its other
kernels, most of them launches the collector times outside the CUDA graphs an engine decodes in; so
TensorRT-LLM's and SGLang's profiles keep attention as priced, and vLLM's factor stands only as far as
Kimi-K2.5's runs bear it out (docs/fidelity.md). Needs servesweep[kernels].
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # bench/ would shadow the packages

from latency import build_latency_model, kernel_tables, load_engine  # noqa: E402
from latency.keys import ForwardKey  # noqa: E402

MODEL, HEADS, LAYERS = "deepseek-ai/DeepSeek-V3", 128, 61
GPUS = {"H100_SXM": "h100_sxm", "H200_SXM": "h200_sxm", "B200": "b200_sxm"}
TPS = (1, 4, 8)
BATCHES, CONTEXT = (8, 256), (1024, 16384)
MODULE = ("qkv_proj", "attention", "o_proj")


def measured(path: Path) -> pd.DataFrame:
    """The table's bf16 decode steps in range: requests a step (`batch_size`), context (`step`: the table
    keeps isl at 1 and names the KV length so), heads a rank, ms a layer."""
    t = pd.read_parquet(path)
    t = t[(t.mla_dtype == "bfloat16") & (t.kv_cache_dtype == "bfloat16") & (t.gemm_type == "bfloat16")]
    t = t[t.batch_size.between(*BATCHES) & t.step.between(*CONTEXT)]
    return t.groupby(["num_heads", "batch_size", "step"], as_index=False).latency.min()


def priced(gpu: str, engine: str, tp: int, t: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(the module's ms a layer, attention's) of each row, as our roofline prices the decode step (without the
    profile's own mla_decode_attention: the factor this measures)."""
    lm = build_latency_model(MODEL, gpu, tp=tp, engine=engine)
    own = lm.engine.mla_decode_attention or 1.0
    keys = [ForwardKey(True, int(b), 1, int(s)) for b, s in zip(t.batch_size, t.step, strict=True)]
    ops = lm.breakdown(keys)
    entry = {k: i for i, k in enumerate(keys)}  # keys are unique: `measured` keeps one row a step
    ops = ops[ops.op.isin(MODULE)]
    ops = ops.assign(entry=ops.key.map(entry))
    module = ops.groupby("entry").ms.sum().reindex(range(len(keys))).to_numpy() / LAYERS
    attention = ops[ops.op == "attention"].groupby("entry").ms.sum().reindex(range(len(keys))).to_numpy() / LAYERS
    return module - attention + attention / own, attention / own


def kernel_alone(root: Path, gpu: str, folder: str, engine: str) -> dict:
    """{tp: median measured / priced} of the attention kernel alone, where the engine's tables time it (heads a
    rank as DeepSeek-V3's 128 / tp; the table's `step` is the context less one)."""
    found = kernel_tables.tables(root, folder, "mla", engine, "generation_mla_perf.parquet")
    if not found:
        return {}
    t = pd.read_parquet(found[0])
    t = t[(t.mla_dtype == "bfloat16") & (t.kv_cache_dtype == "bfloat16") & t.batch_size.between(*BATCHES)
          & (t.step + 1).between(*CONTEXT)]
    t = t.groupby(["num_heads", "batch_size", "step"], as_index=False).latency.min()  # its fastest kernel
    out = {}
    for tp in TPS:
        s = t[t.num_heads == HEADS // tp].assign(step=lambda f: f.step + 1)
        _, attention = priced(gpu, "none", tp, s)
        out[tp] = float(np.median(s.latency.to_numpy() / attention))
    return out


def main() -> None:
    root = kernel_tables.tables_root()
    rows = []
    for gpu, folder in GPUS.items():
        for engine in kernel_tables.ENGINE_DIRS.values():
            found = kernel_tables.tables(root, folder, "mla", engine, "mla_generation_module_perf.parquet")
            if not found:
                continue
            table, alone_kernel = measured(found[0]), kernel_alone(root, gpu, folder, engine)
            for tp in TPS:
                t = table[table.num_heads == HEADS // tp]
                module, attention = priced(gpu, engine, tp, t)
                ratio = t.latency.to_numpy() / module
                alone = (t.latency.to_numpy() - (module - attention)) / attention
                row = {"gpu": gpu, "engine": f"{engine} {found[0].parent.name}", "tp": tp, "steps": len(t),
                       "module": np.median(ratio), "attention alone": np.median(alone),
                       "extra us": np.median(t.latency.to_numpy() - module) * 1e3,
                       "kernel alone": alone_kernel.get(tp, np.nan)}
                row |= {f"b={b}": np.median(ratio[t.batch_size.to_numpy() == b]) for b in (8, 32, 128, 256)}
                rows.append(row)
    pd.set_option("display.width", 200)
    table = pd.DataFrame(rows)
    print("measured / priced, DeepSeek-V3's MLA decode module a layer (medians):")
    print(table.round(2).to_string(index=False))
    print("\nattention alone, median over GPUs and tp (the profiles' mla_decode_attention in brackets):")
    for engine, rows_ in table.groupby(table.engine.str.split().str[0]):
        print(f"  {engine}: {rows_['attention alone'].median():.2f} [{load_engine(engine).mla_decode_attention:g}]")
    # SGLang has no module table: its attention kernel alone
    alone = [r for gpu, folder in GPUS.items() for r in kernel_alone(root, gpu, folder, "sglang").values()]
    print(f"  sglang: the kernel alone {np.median(alone):.2f} (median over GPUs and tp) "
          f"[{load_engine('sglang').mla_decode_attention:g}]")


if __name__ == "__main__":
    main()
