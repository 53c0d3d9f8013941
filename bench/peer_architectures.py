"""The architectures no measured run checks, beside NVIDIA AIConfigurator's `cli estimate` (whose kernel tables
time sparse, linear-attention and Mamba kernels): our TTFT and TPOT over the peer's, for each of them and for
architectures the measured runs do check, on the same GPU, engine and loads.

    python bench/peer_architectures.py --aiconfigurator /path/to/venv/bin/aiconfigurator [--backend vllm]

Each (model, load) is one silicon-format row (B200, the engine release of AIConfigurator's matrix, bf16 unless
the checkpoint says otherwise) given to the peer as `bench/peer_aiconfigurator.py` gives a measured run and to
`servesweep estimate --from-csv` as a measured run is read. Neither figure is a measurement: the table says
where the new architectures' prices stand against the peer's, beside where the checked ones stand. A ratio far
from the checked architectures' is the place to look.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pandas as pd

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # bench/ would shadow the packages
sys.path.insert(1, str(Path(__file__).resolve().parent))

from peer_aiconfigurator import side_by_side  # noqa: E402

from latency import load_model  # noqa: E402
from orchestrator import measured_runs  # noqa: E402

#: (input, output, requests in flight)
LOADS = [(1024, 512, 8), (4096, 512, 32), (16384, 1024, 16)]
#: the one load at which DeepSeek's models in bf16 leave 8 B200s the KV cache it needs (the peer has no FP8 table
#: of DeepSeek-V3.2's sparse attention: its FP8 checkpoint cannot be asked)
SMALL = [(1024, 512, 8)]
#: (model, tp, precision, loads) checked by measured runs, and priced without any
CHECKED = [("Qwen/Qwen3-32B", 2, "", LOADS), ("meta-llama/Meta-Llama-3.1-8B", 1, "", LOADS),
           ("Qwen/Qwen3-30B-A3B", 1, "", LOADS), ("deepseek-ai/DeepSeek-V3", 8, "fp8", LOADS),
           ("deepseek-ai/DeepSeek-V3", 8, "bf16", SMALL)]
NEW = [("Qwen/Qwen3.5-27B", 2, "", LOADS), ("Qwen/Qwen3.5-35B-A3B", 1, "", LOADS),
       ("deepseek-ai/DeepSeek-V3.2", 8, "bf16", SMALL), ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 4, "", LOADS),
       ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 1, "", LOADS), ("XiaomiMiMo/MiMo-7B-Base", 1, "", LOADS),
       ("google/gemma-4-26B-A4B", 1, "", LOADS), ("XiaomiMiMo/MiMo-V2-Flash", 4, "fp8", LOADS),
       ("MiniMaxAI/MiniMax-M3", 8, "", SMALL), ("deepseek-ai/DeepSeek-V4-Flash", 4, "", LOADS)]
RELEASES = {"vllm": "0.24.0", "sglang": "0.5.14"}


def rows(backend: str) -> pd.DataFrame:
    """The silicon-format rows of every (model, load), unmeasured (1 ms each: our errors are not read)."""
    out = []
    for kind, models in (("checked", CHECKED), ("new", NEW)):
        for model, tp, precision, loads in models:
            moe = load_model(measured_runs.our_model(model)).is_moe  # its experts over the tp devices
            for isl, osl, batch in loads:
                out.append({"id": f"{kind}:{model}:{isl}x{osl}c{batch}", "backend": backend,
                            "backend_version": RELEASES[backend], "model_path": model, "system": "b200_sxm",
                            "precision": precision, "isl": isl, "osl": osl, "batch_size": batch, "tp_size": tp,
                            "pp_size": 1, "moe_tp_size": tp if moe else None, "moe_ep_size": 1 if moe else None,
                            "attention_dp_size": None, "silicon_ttft_ms": 1.0, "silicon_tpot_ms": 1.0,
                            "kind": kind, "family": "MoE" if moe else "dense"})
    return pd.DataFrame(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiconfigurator", required=True, help="the peer's command (aiconfigurator in its own venv)")
    ap.add_argument("--backend", choices=sorted(RELEASES), default="vllm", help="the engine (default vllm)")
    ap.add_argument("--jobs", type=int, default=2, help="the peer's estimates at once (default 2)")
    a = ap.parse_args()
    table = side_by_side(rows(a.backend), a.aiconfigurator, a.jobs)
    pd.set_option("display.width", 200)
    print(table[["kind", "model_path", "isl", "osl", "batch_size", "tp_size", "ttft_ratio", "tpot_ratio",
                 "peer_said"]].round(2).to_string(index=False))
    print(f"\nours over the peer's ({a.backend} {RELEASES[a.backend]} on B200), median by model:")
    for (kind, model, precision), group in table.groupby(["kind", "model_path", "precision"], sort=False):
        answered, label = group.dropna(subset=["ttft_ratio"]), f"  {kind:8} {model:48} {precision or 'bf16':5}"
        if len(answered):
            print(f"{label} TTFT {statistics.median(answered['ttft_ratio']):.2f}  "
                  f"TPOT {statistics.median(answered['tpot_ratio']):.2f}  ({len(answered)} loads)")
        else:
            print(f"{label} the peer gave no figure: {group['peer_said'].iloc[0]}")


if __name__ == "__main__":
    main()
