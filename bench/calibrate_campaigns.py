"""Calibration validated by campaign: for each campaign of the measured files, `servesweep calibrate` on 5
of its runs, then the campaign's other runs predicted with the profile it wrote, beside the shipped profile.

    python bench/calibrate_campaigns.py [--calibration-runs 5] [--every 1] [--min-runs 8] [--num-cpus 2]
                                        [--only REGEX] [--seed S] [--left-out] [--leave-one-out] [--by-launch]
                                        [--output CSV]

A campaign is one model, GPU, engine, release and precision (its rows share a launch script, a client
and an engine build: what a fit on some of its rows learns). The 5 calibration runs are spread evenly
over the campaign's loads (sorted by prompt, output, concurrency, layout), or drawn at random (`--seed`);
every `--every`-th other run is predicted, not counting the exact copies of a calibration run (the MoE file lists
many of its measurements two to four times). The table gives, per campaign and per engine, the median |error|
of TTFT and TPOT on the runs left out of the calibration: uncalibrated (the shipped profile of the campaign's
engine) and calibrated.
Campaigns run as Ray tasks (one each, on the machine's cores).

`--left-out` leaves whole campaigns out instead: each campaign's runs are predicted by a profile calibrated
on `--calibration-runs` runs of EACH of its engine's other campaigns, which is what a shipped profile made
by `calibrate` faces on a campaign nobody fitted. `--ship` (with `--left-out`) then makes the shipped
profiles: for each engine whose left-out figure the calibration lowers (neither median |error|, TTFT nor
TPOT, rises and one falls), `calibrate` on as many runs of every one of its campaigns, written in place
into latency/data/engines/ENGINE.toml; an engine whose figure it does not lower keeps its profile.

`simulations` counts the runs each calibration simulated under a candidate profile (what calibrate_s pays for,
whatever this machine's speed that day). `--leave-one-out` calibrates as `servesweep calibrate` does by default,
its leave-one-out fits included (in calibrate_s and simulations), and adds what it prints of its own runs
(median |error| with the base profile, fitted and left one out: base_*, fit_*, loo_*) beside what the profile does
on the runs it did not see: how well the warning it prints foretells them.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # bench/ would shadow the packages

from orchestrator.run_copies import measurement  # noqa: E402
from orchestrator.runs import launch_set  # noqa: E402

REFERENCE = Path(__file__).resolve().parent.parent.parent / "shared" / "reference"
FILES = ("measured_serving.csv", "measured_serving_moe.csv")
CAMPAIGN = ["model_path", "system", "backend", "backend_version", "precision"]
LOAD_ORDER = ["isl", "osl", "batch_size", "tp_size"]


def campaigns(min_runs: int, by_launch: bool = False) -> list[tuple[str, pd.DataFrame]]:
    """(name, rows) of every campaign with at least `min_runs` runs, both files; with `by_launch`, each
    campaign's runs of one launch script apart (`launch_set`)."""
    out = []
    for name in FILES:
        table = pd.read_csv(REFERENCE / name, dtype=str, keep_default_na=False)
        keys = CAMPAIGN + (["launch"] if by_launch else [])
        for key, rows in table.assign(launch=table["id"].map(launch_set)).groupby(keys, sort=True):
            if len(rows) >= min_runs:
                label = " ".join(part for part in key[:len(CAMPAIGN)] if part) + ("" if key[3] else " (no release)")
                out.append((label + (f" [{key[-1] or 'other ids'}]" if by_launch else ""), rows.drop(columns="launch")))
    return out


def split(rows: pd.DataFrame, k: int, every: int, seed: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """k runs spread evenly over the campaign's loads (or drawn at random with `seed`: a team measures the
    loads it measures), and every `every`-th of the others."""
    ordered = rows.assign(**{c: rows[c].astype(int) for c in LOAD_ORDER}).sort_values(LOAD_ORDER, kind="stable")
    ordered = rows.loc[ordered.index]
    if seed is None:
        picks = np.unique(np.linspace(0, len(ordered) - 1, k).round().astype(int))
    else:
        picks = np.sort(np.random.default_rng(seed).choice(len(ordered), size=min(k, len(ordered)), replace=False))
    fit = ordered.iloc[picks]
    rest = without_copies(ordered.drop(index=fit.index), fit).iloc[::every]
    return fit, rest


def without_copies(rows: pd.DataFrame, seen: pd.DataFrame) -> pd.DataFrame:
    """`rows` less the copies of a run in `seen` (`run_copies.measurement`: every cell alike but the id): the MoE file
    lists many of its measurements two to four times, and a copy of a run calibrate saw is not one it predicts."""
    known = {measurement(cells) for cells in seen.to_dict("records")}
    return rows[[measurement(cells) not in known for cells in rows.to_dict("records")]]


def from_campaigns(campaigns: list[pd.DataFrame], k: int) -> pd.DataFrame:
    """k runs of each campaign at its interior load quantiles (1/(k+1), ..., k/(k+1)): its lightest and heaviest
    loads left out (the heaviest is the slowest to simulate, and many campaigns' runs are calibrated on at once)."""
    picks = []
    for c in campaigns:
        ordered = c.assign(**{col: c[col].astype(int) for col in LOAD_ORDER}).sort_values(LOAD_ORDER, kind="stable")
        at = np.unique(np.round(np.arange(1, k + 1) / (k + 1) * (len(c) - 1)).astype(int))
        picks.append(c.loc[ordered.index[at]])
    return pd.concat(picks)


def from_others(rows: pd.DataFrame, others: list[pd.DataFrame], k: int,
                every: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """k runs of each of the engine's other campaigns, and every `every`-th run of this one: a profile that
    never saw the campaign it is judged on (more of each where k of each would be fewer than calibrate takes)."""
    from orchestrator.calibrate import MIN_RUNS

    return from_campaigns(others, max(k, -(-MIN_RUNS // len(others)))), rows.iloc[::every]


def one_campaign(label: str, rows: pd.DataFrame, k: int, every: int, others: list | None = None,
                 seed: int | None = None, leave_one_out: bool = False) -> dict:
    """Calibrate on k runs (of this campaign, or with `others` of the engine's other campaigns), then predict
    the campaign's runs calibrate did not see with the shipped and the calibrated profile."""
    from orchestrator.calibrate import calibrate, profile_data
    from orchestrator.estimate import configure, estimate
    from orchestrator.profile_files import write_profile
    from orchestrator.runs import read_runs

    fit, rest = from_others(rows, others, k, every) if others else split(rows, k, every, seed)
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        fit.to_csv(folder / "fit.csv", index=False)
        rest.to_csv(folder / "rest.csv", index=False)
        started = time.perf_counter()
        runs = read_runs([folder / "fit.csv"], {})
        engine = rows["backend"].iloc[0]
        c = calibrate(runs, engine, leave_one_out=leave_one_out, progress=False)
        profile = folder / "campaign.toml"
        write_profile(str(profile), profile_data(c, "campaign", ["fit.csv"]))
        seconds = time.perf_counter() - started
        errors = {"shipped": [], "calibrated": []}
        for run in read_runs([folder / "rest.csv"], {}):
            measured = np.array([run.ttft_ms, run.tpot_ms])
            for which, values in (("shipped", dict(run.values, engine=engine)),
                                  ("calibrated", run.under(str(profile)))):  # the launch it leaves open: the profile's
                row = estimate(configure(values))
                errors[which].append(np.array([row["ttft_ms"], row["tpot_ms"]]) / measured - 1)
    out = {"campaign": label, "engine": engine, "fit_runs": len(fit), "predicted": len(rest),
           "calibrate_s": seconds, "simulations": c.simulations}
    for which, values in errors.items():
        values = np.array(values) if values else np.full((1, 2), np.nan)
        out[f"{which}_ttft"], out[f"{which}_tpot"] = np.median(np.abs(values), axis=0)
        out[f"{which}_ttft_signed"], out[f"{which}_tpot_signed"] = np.median(values, axis=0)  # a systematic error
    for which, values in (("base", c.base_errors), ("fit", c.fit_errors), ("loo", c.loo_errors)):
        if values is not None:  # what calibrate prints of its own runs
            out[f"{which}_ttft"], out[f"{which}_tpot"] = np.median(np.abs(values), axis=0)
    out["fitted"] = "; ".join(f"{what} {new}" for what, old, new in c.changes() if old != new)
    return out


def ship(engine: str, campaigns: list[pd.DataFrame], k: int) -> str:
    """The shipped profile of `engine` calibrated in place on k runs of each of its campaigns (each run named
    by its row's id): what changed."""
    from dataclasses import replace

    from orchestrator.calibrate import calibrate, profile_file, update_profile
    from orchestrator.runs import read_runs

    fit = from_campaigns(campaigns, k)
    with tempfile.TemporaryDirectory() as folder:
        fit.to_csv(Path(folder) / "fit.csv", index=False)
        runs = [replace(r, where=run_id) for r, run_id in zip(read_runs([Path(folder) / "fit.csv"], {}), fit["id"],
                                                                strict=True)]
    c = calibrate(runs, engine, leave_one_out=False, progress=False)
    update_profile(str(profile_file(engine)), c, [f"{k} of each of its {len(campaigns)} campaigns in "
                                                  f"{' and '.join(FILES)}"])
    return "; ".join(f"{what} {old} -> {new}" for what, old, new in c.changes() if old != new) or "nothing"


def lowers(per: pd.Series) -> bool:
    """Whether the calibrated left-out figure beats the shipped one: neither TTFT nor TPOT rises, one falls."""
    ttft, tpot = per.calibrated_ttft - per.shipped_ttft, per.calibrated_tpot - per.shipped_tpot
    return max(ttft, tpot) <= 0 and min(ttft, tpot) < 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calibration-runs", type=int, default=5, help="runs of each campaign calibrate sees (>= 3)")
    p.add_argument("--every", type=int, default=1, help="predict every k-th of the other runs (>= 1)")
    p.add_argument("--min-runs", type=int, default=8, help="campaigns with fewer runs are left out")
    p.add_argument("--num-cpus", type=int, default=2, help="Ray workers")
    p.add_argument("--only", default="", help="campaigns whose name matches this regular expression (with "
                   "--left-out: the campaigns left out in turn; each is still predicted from all the others)")
    p.add_argument("--left-out", action="store_true", help="calibrate on runs of the engine's OTHER campaigns "
                   "(--calibration-runs of each, >= 2) and predict the campaign's runs: leave one campaign out")
    p.add_argument("--ship", action="store_true", help="with --left-out: calibrate in place the shipped profile "
                   "of each engine whose left-out figure calibration lowers (--calibration-runs of each campaign)")
    p.add_argument("--seed", type=int, help="draw each campaign's calibration runs at random with this seed "
                   "(>= 0) instead of spreading them over its loads: how much the figure owes to which runs")
    p.add_argument("--leave-one-out", action="store_true", help="calibrate with its leave-one-out fits, as "
                   "servesweep calibrate does by default, and report its own runs' errors beside the unseen ones")
    p.add_argument("--by-launch", action="store_true", help="each campaign's runs of one launch script apart (the "
                   "date its ids start with, or its cfg sets): a campaign as one launch, as calibrate fits one")
    p.add_argument("--output", help="also write the per-campaign table here (.csv)")
    a = p.parse_args(argv)
    least = 2 if a.left_out else 3
    if (a.calibration_runs < least or a.every < 1 or a.num_cpus < 1 or (a.ship and not a.left_out)
            or (a.seed is not None and (a.seed < 0 or a.left_out))):
        print(f"calibrate_campaigns: --calibration-runs >= {least}, --every >= 1, --num-cpus >= 1, --seed >= 0; "
              "--ship needs --left-out; --seed does not go with it", file=sys.stderr)
        return 2
    import ray

    ray.init(num_cpus=a.num_cpus, include_dashboard=False, log_to_driver=False)
    task = ray.remote(one_campaign)
    every = campaigns(a.min_runs, a.by_launch)
    jobs = []
    for label, rows in every:
        if not re.search(a.only, label):
            continue
        engine = rows["backend"].iloc[0]
        others = [r for other, r in every if other != label and r["backend"].iloc[0] == engine] if a.left_out \
            else None
        if a.left_out and not others:
            continue  # the engine's only campaign: nothing to leave it out of
        jobs.append(task.remote(label, rows, a.calibration_runs, a.every, others, a.seed, a.leave_one_out))
    table = pd.DataFrame(ray.get(jobs))
    per = table.groupby("engine")[["shipped_ttft", "shipped_tpot", "calibrated_ttft", "calibrated_tpot"]].median()
    made = {}
    if a.ship:
        engines = [e for e in per.index if lowers(per.loc[e])]
        chosen = {e: [r for _, r in every if r["backend"].iloc[0] == e] for e in engines}  # all its campaigns
        made = dict(zip(engines, ray.get([ray.remote(ship).remote(e, chosen[e], a.calibration_runs)
                                             for e in engines]), strict=True))
    ray.shutdown()
    pd.set_option("display.width", 250)
    pct = "{:.1%}".format
    shown = table.drop(columns="fitted")
    print(shown.to_string(index=False, formatters={c: pct for c in shown.columns if c.endswith(("_ttft", "_tpot",
                                                                                                 "_signed"))}
                          | {"calibrate_s": "{:.1f}".format}))
    print("\nper engine (median over its campaigns of the left-out runs' median |error|):")
    print(per.to_string(formatters={c: pct for c in per.columns}))
    if a.ship:
        for engine in per.index:
            print(f"{engine}: " + (f"shipped, calibrated in place: {made[engine]}" if engine in made else
                                   "kept (calibration does not lower its left-out figure)"))
    shipped = f"TTFT {pct(table.shipped_ttft.median())} / TPOT {pct(table.shipped_tpot.median())}"
    print(f"\nall campaigns: shipped {shipped}, "
          f"calibrated on {a.calibration_runs} runs TTFT {pct(table.calibrated_ttft.median())} / TPOT "
          f"{pct(table.calibrated_tpot.median())}; worst calibrated campaign TTFT {pct(table.calibrated_ttft.max())}; "
          f"calibrate took {table.calibrate_s.median():.1f} s a campaign (median, its leave-one-out fits "
          f"{'included' if a.leave_one_out else 'not run'}; {table.simulations.median():,.0f} simulations, "
          f"{table.simulations.max():,} at most)")
    print("\nwhat each calibration changed:")
    for r in table.itertuples():
        print(f"  {r.campaign}: {r.fitted or 'nothing'}")
    if a.output:
        table.to_csv(a.output, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
