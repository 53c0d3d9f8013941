"""How long a closed loop's long prompts wait, counted in our own prefill steps, measured against ours.

    python bench/prompt_trains.py [--campaign TEXT]

A closed loop of C clients whose prompts each fill most of a step's token budget settles, in our timeline,
into a train: one prompt finishes its prefill each step, its replacement arrives as another request
finishes, and every prompt waits about the same few steps whatever C is. This prints, for the measured
runs of both files of ../shared/reference/ whose prompt is at least half the token budget they are read
with and whose KV cache does not bind (vLLM's MoE campaigns at 8,192 tokens, chiefly), the measured TTFT
and our mean and median TTFT in units of our step that holds prompt tokens (its median length in the run's
own plan), per concurrency; then per campaign and layout the least-squares line `measured steps = a + C / b`.
Ours stays flat in C (the first wave's queue, 1 / 20 of an aiperf run, is what moves our mean); the measured
TTFT grows by about a step every b clients, as a first wave (every client's prompt at once, C / 2 steps each)
weighed by b / 2 requests a client would make it (aiperf's 20: b = 40; docs/fidelity.md). Each run is estimated
as `estimate --from-csv` estimates it.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from calibrate_campaigns import campaigns  # one definition of a campaign for every bench

from orchestrator.estimate import configure, estimate, job_of, run_tables
from orchestrator.runs import read_runs

#: a prompt of at least this share of the budget fills a step of its own
FILLS_A_STEP = 0.5
LAYOUT = ["tp", "ep", "attention_dp", "input_length", "output_length"]


def in_steps(run) -> dict | None:
    """The run's measured and our TTFT in our prompt steps, or None where its prompt fills no step or its KV
    cache binds (its requests wait for blocks, not in a train)."""
    s = configure(run.under(run.values.get("engine") or run.engine))
    job = job_of(s)
    if s.input_length < FILLS_A_STEP * job.max_batched_tokens or s.arrival != "closed" or estimate(s)["kv_bound"]:
        return None
    requests, steps = run_tables(s)
    prompt_steps = steps[steps.prefill_tokens > 0]
    step_ms = float(np.median(prompt_steps.end_ms - prompt_steps.start_ms))
    measured = requests[requests.measured]
    return {"input_length": s.input_length, "output_length": s.output_length, "concurrency": s.concurrency,
            "tp": job.layout.tp, "ep": job.layout.ep, "attention_dp": job.layout.attention_dp,
            "budget": job.max_batched_tokens, "step_ms": round(step_ms, 1),
            "measured": run.ttft_ms / step_ms, "ours_mean": measured.ttft_ms.mean() / step_ms,
            "ours_p50": measured.ttft_ms.median() / step_ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--campaign", default="", help="only campaigns whose name contains this")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, runs in campaigns(min_runs=1):
            if a.campaign not in label:
                continue
            path = Path(tmp) / "runs.csv"
            runs.to_csv(path, index=False)
            for run in read_runs([path], {}):
                got = in_steps(run)
                if got is not None:
                    rows.append({"campaign": label, **got})
    table = pd.DataFrame(rows).drop_duplicates().sort_values(["campaign", *LAYOUT, "concurrency"])
    pd.set_option("display.width", 200)
    print("TTFT in our prompt steps (step_ms: the median step of the run's plan that holds prompt tokens)")
    print(table.round(2).to_string(index=False))
    lines = []
    for key, g in table.groupby(["campaign", *LAYOUT]):
        if g.concurrency.nunique() >= 3:
            slope, a0 = np.polyfit(g.concurrency, g.measured, 1)
            ours, _ = np.polyfit(g.concurrency, g.ours_p50, 1)
            lines.append({"campaign": key[0], "tp": key[1], "C": f"{g.concurrency.min()}-{g.concurrency.max()}",
                          "a": round(a0, 2), "b (clients a step)": round(1 / slope, 1) if slope > 0 else np.inf,
                          "as if requests a client": round(1 / slope / 2, 1) if slope > 0 else np.inf,
                          "ours: clients a step": round(1 / ours, 1) if ours > 0 else np.inf})
    print("\nmeasured steps = a + C / b, per campaign and layout (3 or more concurrencies)")
    print(pd.DataFrame(lines).to_string(index=False))


if __name__ == "__main__":
    main()
