"""DeepSeek-V3 FP8 on 8 x H200 in a TP and an EP layout, each engine, beside NVIDIA AIConfigurator's `cli estimate`:
where our MoE decode prices part from the peer's kernel tables on a model no measured run of ours checks.

    python bench/peer_moe_layouts.py --aiconfigurator /path/to/venv/bin/aiconfigurator [--jobs 2]
    python bench/peer_moe_layouts.py --aiconfigurator CMD --gpt-oss     # gpt-oss-120b, EP on 1-8 GPUs, 3 GPUs

Each (engine, layout, load) is one silicon-format row (the engine release of the reference campaigns: vLLM 0.12,
SGLang 0.5.6.post2, TensorRT-LLM 1.0.0rc3; the peer prices each with its own newest tables), given to the peer as
`bench/peer_aiconfigurator.py` gives a measured run and to `servesweep estimate --from-csv` as a measured run is
read. TP is the experts split by moe_tp 8, EP by moe_ep 8, attention at tp 8 in both. Neither figure is a
measurement; `python bench/moe_kernels.py` sets the engines' expert kernels side by side (docs/fidelity.md).

`--gpt-oss`: gpt-oss-120b (MXFP4 experts) on TensorRT-LLM 1.0.0rc3 and vLLM 0.18 (whose campaigns of it we measured),
experts by EP over tp = 1-8 GPUs of H100, H200 and B200, and the median ratio per engine and GPU: vLLM's side says
how far the peer is from profiles that measured runs check, TensorRT-LLM's what we price where none does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # bench/ would shadow the packages
sys.path.insert(1, str(Path(__file__).resolve().parent))

from peer_aiconfigurator import side_by_side  # noqa: E402

RELEASES = {"trtllm": "1.0.0rc3", "sglang": "0.5.6.post2", "vllm": "0.12.0"}
#: (moe_tp, moe_ep) of 8 GPUs
LAYOUTS = {"TP": (8, 1), "EP": (1, 8)}
#: (input, output, requests in flight): decode-dominated, at a low and a high concurrency, and a longer prompt
LOADS = [(1024, 1024, 8), (1024, 1024, 64), (4096, 1024, 32)]


def rows() -> pd.DataFrame:
    """The silicon-format rows of every (engine, layout, load), unmeasured (1 ms each: our errors are not read)."""
    out = []
    for engine, release in RELEASES.items():
        for layout, (moe_tp, moe_ep) in LAYOUTS.items():
            for isl, osl, batch in LOADS:
                out.append({"id": f"{engine}:{layout}:{isl}x{osl}c{batch}", "backend": engine,
                            "backend_version": release, "model_path": "deepseek-ai/DeepSeek-V3",
                            "system": "h200_sxm", "precision": "fp8",
                            "isl": isl, "osl": osl, "batch_size": batch, "tp_size": 8, "pp_size": 1,
                            "moe_tp_size": moe_tp, "moe_ep_size": moe_ep, "attention_dp_size": None,
                            "silicon_ttft_ms": 1.0, "silicon_tpot_ms": 1.0, "layout": layout, "family": "MoE"})
    return pd.DataFrame(out)


GPT_OSS_RELEASES = {"trtllm": "1.0.0rc3", "vllm": "0.18.0"}
GPT_OSS_SYSTEMS = {"h100_sxm": (2, 4, 8), "h200_sxm": (1, 2, 4, 8), "b200_sxm": (1, 2, 4, 8)}


def gpt_oss_rows() -> pd.DataFrame:
    """gpt-oss-120b's silicon-format rows: each engine, GPU, tp = ep and load (unmeasured)."""
    return pd.DataFrame([
        {"id": f"{engine}:{system}:tp{tp}:{isl}x{osl}c{batch}", "backend": engine, "backend_version": release,
         "model_path": "openai/gpt-oss-120b", "system": system, "precision": "fp4", "isl": isl, "osl": osl,
         "batch_size": batch, "tp_size": tp, "pp_size": 1, "moe_tp_size": 1, "moe_ep_size": tp,
         "attention_dp_size": None, "silicon_ttft_ms": 1.0, "silicon_tpot_ms": 1.0, "layout": "EP", "family": "MoE"}
        for engine, release in GPT_OSS_RELEASES.items() for system, tps in GPT_OSS_SYSTEMS.items() for tp in tps
        for isl, osl, batch in LOADS])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiconfigurator", required=True, help="the peer's command (aiconfigurator in its own venv)")
    ap.add_argument("--jobs", type=int, default=2, help="the peer's estimates at once (default 2)")
    ap.add_argument("--gpt-oss", action="store_true", help="gpt-oss-120b with EP on H100, H200 and B200 instead")
    a = ap.parse_args()
    table = side_by_side(gpt_oss_rows() if a.gpt_oss else rows(), a.aiconfigurator, a.jobs)
    pd.set_option("display.width", 200)
    print(table[["backend", "system", "tp_size", "layout", "isl", "osl", "batch_size", "ours_ttft", "peer_ttft",
                 "ttft_ratio", "ours_tpot", "peer_tpot", "tpot_ratio", "peer_said"]].round(2).to_string(index=False))
    if a.gpt_oss:
        print("\nours over the peer's, median per engine and GPU:")
        print(table.groupby(["backend", "system"])[["ttft_ratio", "tpot_ratio"]].median().round(2).to_string())


if __name__ == "__main__":
    main()
