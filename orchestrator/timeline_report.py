"""`servesweep report RUN.parquet`: one run at a glance, from `estimate --per-request`: every
request's wait and decode over time, each step's tokens against the budget, and the TTFT and TPOT
distributions."""

from __future__ import annotations

import html
from pathlib import Path

from orchestrator.results import write_bytes, write_png

#: requests drawn one per row at most; a longer run draws an evenly spaced sample of them
MAX_REQUEST_ROWS = 400


def write_run_report(requests_path: str, steps_path: str, out: str | Path) -> list[Path]:
    """Write timeline.png, cdf.png and index.html into `out`; returns the files."""
    import matplotlib
    import pandas as pd

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    requests, steps = pd.read_parquet(requests_path), pd.read_parquet(steps_path)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _timeline(requests, steps, out / "timeline.png", plt)
    _cdfs(requests, out / "cdf.png", plt)
    write_bytes(_html(requests_path, requests, steps).encode(), out / "index.html")
    return [out / "timeline.png", out / "cdf.png", out / "index.html"]


def _timeline(requests, steps, path: Path, plt) -> None:
    """Top: one row per request (sent order): waiting and prefilling (light) until its first token,
    then decoding (dark). Bottom: tokens per step, prefill stacked on decode, against the budget."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, height_ratios=(3, 1))
    shown = requests.iloc[:: max(1, len(requests) // MAX_REQUEST_ROWS)].reset_index(drop=True)
    top.barh(shown.index, shown["first_token_ms"] - shown["arrival_ms"], left=shown["arrival_ms"], height=0.8,
             color="#9ecae1", label="waiting + prefill (TTFT)")
    top.barh(shown.index, shown["finish_ms"] - shown["first_token_ms"], left=shown["first_token_ms"], height=0.8,
             color="#08519c", label="decode")
    top.invert_yaxis()
    top.set_ylabel("request (sent order)" + (f", 1 in {len(requests) // len(shown)}" if len(shown) < len(requests)
                                            else ""))
    top.legend(loc="upper right", fontsize=8)
    width = (steps["end_ms"] - steps["start_ms"]).clip(lower=1e-9)
    decode = steps["tokens"] - steps["prefill_tokens"]
    bottom.bar(steps["start_ms"], decode, width=width, align="edge", color="#08519c", label="decode tokens")
    bottom.bar(steps["start_ms"], steps["prefill_tokens"], width=width, bottom=decode, align="edge", color="#fd8d3c",
               label="prefill tokens")
    bottom.plot([steps["start_ms"].min(), steps["end_ms"].max()], [steps["budget"].iloc[0]] * 2, "k--", lw=1,
                label=f"budget {steps['budget'].iloc[0]}")
    bottom.set_xlabel("time (ms)")
    bottom.set_ylabel("tokens per step")
    bottom.legend(loc="upper right", fontsize=8)
    fig.suptitle(f"{len(requests)} requests, {len(steps)} steps", fontsize=9)
    fig.tight_layout()
    write_png(fig, path)
    plt.close(fig)


def _cdfs(requests, path: Path, plt) -> None:
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, column, label in ((axes[0], "ttft_ms", "TTFT (ms)"), (axes[1], "tpot_ms", "TPOT (ms)")):
        values = np.sort(requests[column].to_numpy())
        ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post")
        ax.set_xlabel(label)
        ax.set_ylabel("share of requests")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    write_png(fig, path)
    plt.close(fig)


def _html(source, requests, steps) -> str:
    summary = requests[["ttft_ms", "tpot_ms", "e2e_ms", "input_length", "output_length"]].describe(
        percentiles=[0.5, 0.9, 0.99]).T
    return "\n".join([
        "<!doctype html><html><head><meta charset='utf-8'><title>servesweep run</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}img{max-width:100%}</style></head><body>",
        f"<h1>One run</h1><p>{html.escape(str(source))}: {len(requests)} requests, {len(steps)} steps, "
        f"{steps['end_ms'].max():.1f} ms</p>",
        summary.to_html(float_format=lambda v: f"{v:.4g}"),
        "<h2>Requests and steps over time</h2><img src='timeline.png' alt='timeline'>",
        "<h2>TTFT and TPOT distributions</h2><img src='cdf.png' alt='CDFs'>",
        "</body></html>"])
