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

from pathlib import Path

import numpy as np
import pandas as pd

REFERENCE = Path(__file__).resolve().parent.parent.parent / "shared" / "reference"
FILES = ("measured_serving.csv", "measured_serving_moe.csv")
CAMPAIGN = ["backend", "backend_version", "model_path", "system"]
GROUP = [*CAMPAIGN, "isl", "batch_size", "tp_size", "attention_dp_size"]
HELD_BACK = 0.05  # a slope above this: requests wait about a twentieth of a decode for others to finish


def slopes(runs: pd.DataFrame) -> pd.DataFrame:
    """k per group of runs that differ only in output length (least squares of TTFT on decode ms)."""
    rows = []
    for key, g in runs.groupby(GROUP, dropna=False):
        if g.osl.nunique() >= 2:
            rows.append({**dict(zip(GROUP, key, strict=True)), "runs": len(g),
                         "k": np.polyfit(g.decode_ms, g.silicon_ttft_ms, 1)[0]})
    return pd.DataFrame(rows)


def main() -> None:
    runs = pd.concat([pd.read_csv(REFERENCE / f) for f in FILES], ignore_index=True)
    runs["backend_version"] = runs.backend_version.fillna("(none)")
    runs["decode_ms"] = (runs.osl - 1) * runs.silicon_tpot_ms
    runs["running"] = runs.batch_size * runs.decode_ms / (runs.silicon_ttft_ms + runs.decode_ms)
    k = slopes(runs)
    k["where"] = "isl " + k.isl.astype(str) + " C " + k.batch_size.astype(str) + " tp " + k.tp_size.astype(str)
    g = k.groupby(CAMPAIGN)
    table = pd.DataFrame({"groups": g.size(), "median k": g.k.median().round(3), "largest k": g.k.max().round(3),
                          "held back": g.k.apply(lambda s: int((s > HELD_BACK).sum())),
                          "largest at": g.apply(lambda s: s.loc[s.k.idxmax(), "where"], include_groups=False)})
    table = table.reset_index()
    table["model_path"] = table.model_path.str.split("/").str[-1]
    print(table.to_string(index=False))
    worst = k[k.k > HELD_BACK].sort_values("k", ascending=False).head(6)
    shown = runs.merge(worst[GROUP], on=GROUP)
    print(f"\nruns of the most held-back groups (k > {HELD_BACK:g}); running: requests decoding on average")
    print(shown[["id", "batch_size", "osl", "silicon_ttft_ms", "silicon_tpot_ms", "running"]].round(1)
          .to_string(index=False))


if __name__ == "__main__":
    main()
