"""The tensor-parallel all-reduce against our ring model, from NVIDIA AIConfigurator's measured tables.

    python bench/allreduce.py

`custom_allreduce_perf.parquet` (bf16, the engines' own all-reduce in CUDA-graph mode, what a decode step
runs; `message_size` is an element count, per the collector) beside what our estimator prices for the
same message (`estimator._ring` over `RooflineModel._link`: an alpha-beta ring at the device's NVLink
bandwidth x [efficiency] communication and its latency a hop). For each GPU of the measured runs, each
engine (the newest table) and 2, 4 and 8 GPUs: the measured and priced microseconds at three decode-sized
messages, and over every message of a decode step's range (1-256 tokens of a 4,096- to 8,192-wide model)
the median measured / priced and the median difference. Needs servesweep[kernels].
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # bench/ would shadow the packages

from latency import build_latency_model, kernel_tables  # noqa: E402
from latency.estimator import ACT_BYTES, _ring  # noqa: E402

GPUS = {"H100_SXM": "h100_sxm", "H200_SXM": "h200_sxm", "B200": "b200_sxm"}
ENGINES = ("vllm", "sglang", "trtllm")
GROUPS = (2, 4, 8)
DECODE_ELEMENTS = (4096, 256 * 8192)  # 1 token of a 4,096-wide model to 256 of an 8,192-wide one
SHOWN = (65536, 524288, 2097152)      # 16 / 128 / 512 tokens of 4,096 wide: 128 KB, 1 MB, 4 MB in bf16
PRICER_MODEL = "Qwen/Qwen3-8B"        # any shipped model: it carries the device whose links price a message


def newest(root: Path, gpu: str, engine: str) -> Path | None:
    found = kernel_tables.tables(root, gpu, "comm", engine, "custom_allreduce_perf.parquet")
    return found[0] if found else None


def measured(path: Path) -> pd.DataFrame:
    """(num_gpus, message_size) -> microseconds, the graph-mode kernel where the table has both."""
    t = pd.read_parquet(path)
    if "kernel_source" in t and t.kernel_source.str.contains("graph").any():
        t = t[t.kernel_source.str.contains("graph")]
    t = t[(t.allreduce_dtype == "bfloat16") & t.num_gpus.isin(GROUPS)]
    return t.groupby(["num_gpus", "message_size"], as_index=False).latency.min().assign(us=lambda d: d.latency * 1e3)


def compare(device: str, t: pd.DataFrame) -> list[dict]:
    rows = []
    for n in GROUPS:
        s = t[t.num_gpus == n]
        if s.empty:
            continue
        lm = build_latency_model(PRICER_MODEL, device, tp=n)
        priced = _ring(n, s.message_size * ACT_BYTES, *lm._link(n)) * 1e6
        row = {"GPUs": n}
        for size in SHOWN:
            at = s.message_size == size
            if at.any():
                row[f"{size * ACT_BYTES / 2**20:g} MB measured / ours us"] = \
                    f"{s.us[at].iloc[0]:.1f} / {priced[at].iloc[0]:.1f}"
        decode = s.message_size.between(*DECODE_ELEMENTS)
        row["decode range: measured / ours"] = round((s.us / priced)[decode].median(), 2)
        row["median difference us"] = round((s.us - priced)[decode].median(), 1)
        rows.append(row)
    return rows


def main() -> None:
    root = kernel_tables.tables_root()
    for device, gpu in GPUS.items():
        for engine in ENGINES:
            path = newest(root, gpu, engine)
            if path is None:
                continue
            print(f"\n{device} {engine} {path.parent.name}")
            print(pd.DataFrame(compare(device, measured(path))).to_string(index=False))


if __name__ == "__main__":
    main()
