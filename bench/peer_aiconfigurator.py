"""servesweep against NVIDIA AIConfigurator's `cli estimate` on the same measured runs.

    python bench/peer_aiconfigurator.py --aiconfigurator /path/to/venv/bin/aiconfigurator [--every 10]
    python bench/peer_aiconfigurator.py --aiconfigurator ... --grid [--release 0.12.0]

AIConfigurator is not a dependency: install it in a scratch virtualenv (`pip install
aiconfigurator==0.12.0`) and name its command. Every k-th row of both measured files is given to
it as one `cli estimate` (agg mode: the row's model, system, engine, lengths, batch size per rank,
layout and quantisation) and to `servesweep estimate --from-csv` as it is. The table is the median
|error| of TTFT and TPOT per engine and family, for each tool, on the rows both answered; the rows
the peer refused are counted apart.

`--grid` asks both tools about deployments nobody measured here: Llama-3.1-70B (bf16 and FP8) on
H100, H200 and B200 with vLLM, at every tp that fits, four length pairs and concurrency 1 to 128,
read as `estimate --from-csv` reads a silicon row of that release. It prints the median ratio of our
TTFT and TPOT to the peer's per GPU and precision, and per concurrency: where the two tools differ
on a deployment neither was fitted on (docs/fidelity.md).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # bench/ would shadow the packages

from latency import load_model  # noqa: E402
from orchestrator import measured_runs  # noqa: E402

REFERENCE = Path(__file__).resolve().parent.parent.parent / "shared" / "reference"
FILES = ("measured_serving.csv", "measured_serving_moe.csv")
MODELS = Path(__file__).resolve().parent.parent / "latency" / "data" / "models"
#: the measured file's precision -> the peer's gemm quant mode, for files without quant-mode columns
PEER_GEMM = {"fp8": "fp8", "bf16": "bfloat16", "": "bfloat16"}
METRIC = re.compile(r"(TTFT|TPOT):\s+([\d.]+) ms")
#: checkpoints whose experts are MXFP4 whatever the file's label says (measured_runs.SAME_CHECKPOINT)
MXFP4_CHECKPOINTS = ("openai/gpt-oss-120b",)
#: the grid of deployments nobody measured: GPU -> tensor-parallel sizes 70B fits at in bf16
GRID_TP = {"h100_sxm": (4, 8), "h200_sxm": (2, 4, 8), "b200_sxm": (2, 4, 8)}
GRID_LENGTHS = ((1000, 200), (4000, 500), (1000, 1000), (8000, 256))
GRID_CONCURRENCY = (1, 8, 32, 128)
#: the grid's checkpoints: (the silicon row's model_path, precision, its original's shipped config)
GRID_MODELS = (("meta-llama/Llama-3.1-70B-Instruct", "", "meta-llama/Llama-3.1-70B-Instruct"),
               ("nvidia/Llama-3.1-70B-Instruct-FP8", "fp8", "meta-llama/Llama-3.1-70B-Instruct"))


def peer_args(r, configs: dict | None = None) -> list[str]:
    """The `cli estimate` arguments of measured run `r` (a row of the measured format); `configs`
    maps a model_path to a local folder holding its config.json (the peer cannot download one here)."""
    args = ["--model-path", (configs or {}).get(r.model_path, r.model_path), "--system", r.system,
            "--backend", r.backend, "--isl", str(r.isl),
            "--osl", str(r.osl), "--batch-size", str(r.batch_size), "--tp-size", str(r.tp_size),
            "--pp-size", str(int(r.pp_size) if pd.notna(r.pp_size) else 1)]
    if pd.notna(r.attention_dp_size) and int(r.attention_dp_size) > 1:
        args += ["--attention-dp-size", str(int(r.attention_dp_size))]
    if pd.notna(r.moe_ep_size) and pd.notna(r.moe_tp_size) and r.family != "dense":
        args += ["--moe-tp-size", str(int(r.moe_tp_size)), "--moe-ep-size", str(int(r.moe_ep_size))]
    gemm = r.gemm_quant_mode if isinstance(getattr(r, "gemm_quant_mode", None), str) else PEER_GEMM.get(
        r.precision if isinstance(r.precision, str) else "", "bfloat16")
    moe = getattr(r, "moe_quant_mode", None)
    if r.model_path in MXFP4_CHECKPOINTS:  # the file's nvfp4 label, the checkpoint's MXFP4 experts (as we read it)
        gemm, moe = "bfloat16", "w4a16_mxfp4"
    args += ["--gemm-quant-mode", gemm]
    if isinstance(moe, str):
        args += ["--moe-quant-mode", moe]
    return args


def run_peer(command: str, args: list[str]) -> tuple[float, float] | str:
    """(TTFT, TPOT) the peer estimates, or the last line it said when it gave none."""
    with tempfile.TemporaryDirectory() as out:
        p = subprocess.run([command, "cli", "estimate", *args, "--save-dir", out], capture_output=True, text=True,
                           timeout=300)
    found = dict(METRIC.findall(p.stdout))
    if "TTFT" in found and "TPOT" in found:
        return float(found["TTFT"]), float(found["TPOT"])
    said = [line for line in (p.stderr + p.stdout).splitlines() if line.strip() and "eprecat" not in line
            and "aisimulate" not in line.lower()]
    errors = [line for line in said if "rror" in line or "not support" in line.lower()]
    return (errors or said or [f"exit {p.returncode}"])[-1][-200:]


def ours(rows: pd.DataFrame) -> pd.DataFrame:
    """servesweep's figures for the same runs, as `estimate --from-csv` gives them (a silicon file's reading takes
    its own columns: a caller's labels beside them are ignored)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "runs.csv", Path(tmp) / "out.csv"
        rows.to_csv(src, index=False)
        subprocess.run([sys.executable, "-m", "orchestrator", "estimate", "--from-csv", str(src), "--output",
                        str(out), "--no-progress"], check=True, capture_output=True)
        return pd.read_csv(out)


def side_by_side(rows: pd.DataFrame, command: str, jobs: int, configs: dict | None = None) -> pd.DataFrame:
    """`rows` (silicon-format rows, any labels of the caller's beside) with our TTFT and TPOT (`ours`), the peer's
    (`run_peer`, `jobs` at once; empty where it gave none, and what it said instead) and ours over the peer's."""
    with ThreadPoolExecutor(jobs) as pool:
        peer = list(pool.map(lambda r: run_peer(command, peer_args(r, configs)), rows.itertuples()))
    mine, out = ours(rows), rows.copy()
    for i, metric in enumerate(("ttft", "tpot")):
        out[f"ours_{metric}"] = mine[f"{metric}_ms"].to_numpy()
        out[f"peer_{metric}"] = [p[i] if isinstance(p, tuple) else None for p in peer]
        out[f"{metric}_ratio"] = out[f"ours_{metric}"] / out[f"peer_{metric}"]
    out["peer_said"] = [p if isinstance(p, str) else "" for p in peer]
    return out


def grid_rows(release: str) -> pd.DataFrame:
    """Silicon-format rows of the grid (their measured columns empty: nobody measured them)."""
    rows = [{"id": f"grid_{path}_{system}_tp{tp}_{isl}x{osl}_c{c}", "backend": "vllm", "backend_version": release,
             "model_path": path, "system": system, "precision": precision, "isl": isl, "osl": osl,
             "batch_size": c, "tp_size": tp, "pp_size": 1, "moe_tp_size": None, "moe_ep_size": None,
             "attention_dp_size": None, "silicon_ttft_ms": None, "silicon_tpot_ms": None, "family": "dense"}
            for path, precision, _ in GRID_MODELS for system, tps in GRID_TP.items() for tp in tps
            for isl, osl in GRID_LENGTHS for c in GRID_CONCURRENCY]
    return pd.DataFrame(rows)


def grid(a) -> None:
    """Both tools on the grid; the median ratio ours / peer per GPU and precision, and per concurrency."""
    rows = grid_rows(a.release)
    with tempfile.TemporaryDirectory() as tmp:
        configs = {}
        for path, _, shipped in GRID_MODELS:
            folder = Path(tmp) / path.replace("/", "--")
            folder.mkdir()
            (folder / "config.json").write_text((MODELS / (shipped.replace("/", "--") + ".json")).read_text())
            configs[path] = str(folder)
        print(f"{len(rows)} deployments nobody measured; asking the peer ({a.jobs} at once)", file=sys.stderr)
        rows = side_by_side(rows, a.aiconfigurator, a.jobs, configs)
    rows["precision"] = rows["precision"].replace("", "bf16")
    both = rows.dropna(subset=["ttft_ratio", "tpot_ratio"])
    for by in (["system", "precision"], ["precision", "batch_size"]):
        table = both.groupby(by).agg(rows=("ttft_ratio", "size"), ttft_ours_over_peer=("ttft_ratio", "median"),
                                     tpot_ours_over_peer=("tpot_ratio", "median")).reset_index()
        print(table.to_string(index=False, float_format="{:.2f}".format), end="\n\n")
    print(f"the peer answered {len(both)} of {len(rows)} (it refuses runs whose KV cache does not fit)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiconfigurator", required=True, help="the peer's command (aiconfigurator in its own venv)")
    ap.add_argument("--every", type=int, default=10, help="every k-th row of each measured file (default 10)")
    ap.add_argument("--jobs", type=int, default=2, help="peer processes at once (default 2)")
    ap.add_argument("--grid", action="store_true", help="deployments nobody measured (Llama-3.1-70B) instead "
                    "of the measured runs: our figures over the peer's")
    ap.add_argument("--release", default="0.12.0", help="the vLLM release the grid's rows name (default 0.12.0, "
                    "the visible dense campaigns')")
    a = ap.parse_args()
    if a.every < 1 or a.jobs < 1:
        sys.exit("peer_aiconfigurator: --every and --jobs must be >= 1")
    if a.grid:
        grid(a)
        return
    tables = []
    for name in FILES:
        d = pd.read_csv(REFERENCE / name).iloc[:: a.every].copy()
        d["family"] = [("MLA" if m.is_mla else "MoE" if m.is_moe else "dense")
                       for m in map(load_model, map(measured_runs.our_model, d["model_path"]))]
        tables.append(d)
    rows = pd.concat(tables, ignore_index=True)
    print(f"{len(rows)} measured runs; asking the peer ({a.jobs} at once)", file=sys.stderr)
    found = side_by_side(rows, a.aiconfigurator, a.jobs)
    out = pd.DataFrame({"engine": rows["backend"], "family": rows["family"], "answered": found["peer_ttft"].notna()})
    for tool in ("ours", "peer"):  # median |error| against the measured means
        for metric in ("ttft", "tpot"):
            out[f"{tool}_{metric}"] = (found[f"{tool}_{metric}"] / rows[f"silicon_{metric}_ms"] - 1).abs()
    both = out[out["answered"]]
    summary = both.groupby(["engine", "family"]).agg(
        rows=("answered", "size"), servesweep_ttft=("ours_ttft", "median"), peer_ttft=("peer_ttft", "median"),
        servesweep_tpot=("ours_tpot", "median"), peer_tpot=("peer_tpot", "median")).reset_index()
    total = pd.DataFrame([{"engine": "ALL", "family": "", "rows": len(both),
                           **{c: both[c.replace("servesweep", "ours")].median() for c in
                              ("servesweep_ttft", "servesweep_tpot")},
                           "peer_ttft": both["peer_ttft"].median(), "peer_tpot": both["peer_tpot"].median()}])
    summary = pd.concat([summary, total], ignore_index=True)
    pct = {c: "{:.1%}".format for c in summary.columns if c.endswith(("_ttft", "_tpot"))}
    print(summary.to_string(index=False, formatters=pct))
    refused = out[~out["answered"]]
    print(f"\nthe peer answered {len(both)} of {len(out)} runs; refused per engine and family: "
          f"{refused.groupby(['engine', 'family']).size().to_dict()}")
    reasons = found.loc[found["peer_said"] != "", "peer_said"].value_counts().head(5)
    for reason, n in reasons.items():
        print(f"  {n} x {reason}")


if __name__ == "__main__":
    main()
