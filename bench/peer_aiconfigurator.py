"""servesweep against NVIDIA AIConfigurator's `cli estimate` on the same measured runs.

    python bench/peer_aiconfigurator.py --aiconfigurator /path/to/venv/bin/aiconfigurator [--every 10]

AIConfigurator is not a dependency: install it in a scratch virtualenv (`pip install
aiconfigurator==0.12.0`) and name its command. Every k-th row of both measured files is given to
it as one `cli estimate` (agg mode: the row's model, system, engine, lengths, batch size per rank,
layout and quantisation) and to `servesweep estimate --from-csv` as it is. The table is the median
|error| of TTFT and TPOT per engine and family, for each tool, on the rows both answered; the rows
the peer refused are counted apart.
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
#: the measured file's precision -> the peer's gemm quant mode, for files without quant-mode columns
PEER_GEMM = {"fp8": "fp8", "bf16": "bfloat16", "": "bfloat16"}
METRIC = re.compile(r"(TTFT|TPOT):\s+([\d.]+) ms")
#: checkpoints whose experts are MXFP4 whatever the file's label says (measured_runs.SAME_CHECKPOINT)
MXFP4_CHECKPOINTS = ("openai/gpt-oss-120b",)


def peer_args(r) -> list[str]:
    """The `cli estimate` arguments of measured run `r` (a row of the measured format)."""
    args = ["--model-path", r.model_path, "--system", r.system, "--backend", r.backend, "--isl", str(r.isl),
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
    """servesweep's figures for the same runs, as `estimate --from-csv` gives them."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "runs.csv", Path(tmp) / "out.csv"
        rows.drop(columns=["family"]).to_csv(src, index=False)
        subprocess.run([sys.executable, "-m", "orchestrator", "estimate", "--from-csv", str(src), "--output",
                        str(out), "--no-progress"], check=True, capture_output=True)
        return pd.read_csv(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiconfigurator", required=True, help="the peer's command (aiconfigurator in its own venv)")
    ap.add_argument("--every", type=int, default=10, help="every k-th row of each measured file (default 10)")
    ap.add_argument("--jobs", type=int, default=2, help="peer processes at once (default 2)")
    a = ap.parse_args()
    if a.every < 1 or a.jobs < 1:
        sys.exit("peer_aiconfigurator: --every and --jobs must be >= 1")
    tables = []
    for name in FILES:
        d = pd.read_csv(REFERENCE / name).iloc[:: a.every].copy()
        d["family"] = [("MLA" if m.is_mla else "MoE" if m.is_moe else "dense")
                       for m in map(load_model, map(measured_runs.our_model, d["model_path"]))]
        tables.append(d)
    rows = pd.concat(tables, ignore_index=True)
    print(f"{len(rows)} measured runs; asking the peer ({a.jobs} at once)", file=sys.stderr)
    with ThreadPoolExecutor(a.jobs) as pool:
        peer = list(pool.map(lambda r: run_peer(a.aiconfigurator, peer_args(r)), rows.itertuples()))
    mine = ours(rows)
    answered = [isinstance(p, tuple) for p in peer]
    out = pd.DataFrame({"engine": rows["backend"], "family": rows["family"], "answered": answered,
                        "ours_ttft": (mine["ttft_error"]).abs(), "ours_tpot": mine["tpot_error"].abs()})
    out["peer_ttft"] = [abs(p[0] / m - 1) if isinstance(p, tuple) else None for p, m in
                        zip(peer, rows["silicon_ttft_ms"], strict=True)]
    out["peer_tpot"] = [abs(p[1] / m - 1) if isinstance(p, tuple) else None for p, m in
                        zip(peer, rows["silicon_tpot_ms"], strict=True)]
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
    reasons = pd.Series([p for p in peer if isinstance(p, str)]).value_counts().head(5)
    for reason, n in reasons.items():
        print(f"  {n} x {reason}")


if __name__ == "__main__":
    main()
