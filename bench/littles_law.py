"""Which measured campaigns held requests back from the engine: TTFT that grows with the output length.

    python bench/littles_law.py

A closed loop of C clients whose engine admits every request at once has a TTFT of a prefill queue,
whatever the output length. Where something ahead of the engine's steps holds requests back (a KV cache
that binds; a front end that streams no more than some tokens a second), a request waits for others to
finish, and by Little's law

    TTFT = decode x (C / running - 1),   decode = (output - 1) x TPOT,

where `running` is how many requests decode on average. So for runs of one campaign, prompt length,
concurrency and layout that differ only in output length, the slope k of TTFT over the decode time says
it: 0 for an engine that admits everything, C / running - 1 for one held back. The table gives per
campaign (both files of ../shared/reference/) the groups of runs with at least two output lengths, the
median and largest k, and the group with the largest; then the runs of the most held-back groups with
their `running`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from calibrate_campaigns import campaigns  # one definition of a campaign for every bench

from orchestrator.held_back import decoding  # one formula for the requests decoding, here and in estimate

GROUP = ["isl", "batch_size", "tp_size", "attention_dp_size"]  # within a campaign: all but the output length
NUMBERS = ["isl", "osl", "batch_size", "tp_size", "silicon_ttft_ms", "silicon_tpot_ms"]
HELD_BACK = 0.05  # a slope above this: requests wait about a twentieth of a decode for others to finish


def slopes(runs: pd.DataFrame) -> pd.DataFrame:
    """k per group of one campaign's runs that differ only in output length (least squares of TTFT on
    decode ms)."""
    rows = []
    for key, g in runs.groupby(GROUP):
        if g.osl.nunique() >= 2:
            rows.append({**dict(zip(GROUP, key, strict=True)), "runs": len(g),
                         "k": np.polyfit(g.decode_ms, g.silicon_ttft_ms, 1)[0]})
    return pd.DataFrame(rows, columns=[*GROUP, "runs", "k"])


def main() -> None:
    table, held = [], []
    for label, runs in campaigns(min_runs=1):
        runs = runs.assign(**{c: pd.to_numeric(runs[c]) for c in NUMBERS})
        runs["decode_ms"] = (runs.osl - 1) * runs.silicon_tpot_ms
        runs["running"] = decoding(runs.batch_size, runs.osl, runs.silicon_ttft_ms, runs.silicon_tpot_ms)
        k = slopes(runs)
        if k.empty:
            continue
        top = k.loc[k.k.idxmax()]
        table.append({"campaign": label, "groups": len(k), "median k": round(k.k.median(), 3),
                      "largest k": round(top.k, 3), "held back": int((k.k > HELD_BACK).sum()),
                      "largest at": f"isl {top.isl} C {top.batch_size} tp {top.tp_size}"})
        held.append(runs.merge(k[k.k > HELD_BACK].assign(label=label), on=GROUP))
    print(pd.DataFrame(table).to_string(index=False))
    shown = pd.concat(held).sort_values("k", ascending=False)
    worst = shown.drop_duplicates([*GROUP, "label"]).head(6)[[*GROUP, "label"]]
    print(f"\nruns of the most held-back groups (k > {HELD_BACK:g}); running: requests decoding on average")
    print(shown.merge(worst, on=[*GROUP, "label"])[["id", "batch_size", "osl", "silicon_ttft_ms", "silicon_tpot_ms",
                                                     "running"]].round(1).to_string(index=False))


if __name__ == "__main__":
    main()
