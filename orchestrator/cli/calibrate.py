"""`servesweep calibrate`: fit an engine profile to your own measured runs."""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.cli.common import add_field_flags, aligned, check_writable, field_values, processes_of
from orchestrator.fields import InputError


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="fit an engine profile to measured runs of your deployment",
                       description="Fit an engine profile (per-step time, the client's front end, memory and GEMM "
                       "efficiency multipliers, and the launch the runs leave open: token budget, async scheduling, "
                       "prefix cache) to measured runs, and write it for --engine. RUNS: a CSV in AIConfigurator's "
                       "silicon format; a CSV of spec keys (estimate --from-csv's columns) plus measured_ttft_ms "
                       "and measured_tpot_ms; or JSON files of vllm bench serve --save-result or aiperf "
                       "(profile_export_aiperf.json), the deployment given by --model, --device and the layout "
                       "flags.")
    p.add_argument("runs", nargs="+", metavar="RUNS", help="measured runs: .csv files (silicon format, or spec keys "
                   "+ measured_ttft_ms, measured_tpot_ms), .json files (vllm bench serve --save-result, or aiperf's "
                   "profile_export_aiperf.json), or folders (every profile_export_aiperf.json under one)")
    add_field_flags(p, "estimate", require=False, positional=False)
    o = p.add_argument_group("calibration")
    o.add_argument("--output", required=True, help="where the fitted profile goes (a .toml path); then --engine "
                   "PATH in every command. The base's own file (e.g. --engine my.toml --output my.toml) is calibrated "
                   "in place: its fitted keys, source and [calibration] rewritten, its comments kept")
    o.add_argument("--no-leave-one-out", action="store_true", help="skip the leave-one-out error (each run "
                   "predicted by a profile fitted without it): one fit instead of 1 + runs")
    o.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    o.add_argument("--processes", type=int, default=None, help="simulate the runs a step of the fit needs at once "
                   "(a Jacobian's, a round of launch choices) in this many processes: the same profile, sooner "
                   "(default: the CPUs this process may use); 1 = this process only")
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(a) -> int:
    from orchestrator.calibrate import calibrate, pick_base, profile_data, profile_file, update_profile
    from orchestrator.profile_files import write_profile
    from orchestrator.runs import read_runs

    if not a.output.endswith(".toml"):
        raise InputError("--output", a.output, "a path ending in .toml")
    check_writable("--output", a.output)
    processes = processes_of(a)
    flags = field_values(a, "estimate")
    runs = read_runs(a.runs, flags)
    engine = pick_base(runs, flags)
    c = calibrate(runs, engine, leave_one_out=not a.no_leave_one_out, progress=not a.no_progress,
                  processes=processes)
    if Path(a.output).resolve() == profile_file(engine).resolve():
        update_profile(a.output, c, a.runs)
    else:
        write_profile(a.output, profile_data(c, Path(a.output).stem, a.runs))
    print_calibration(c, engine, a.output)
    return 0


def print_calibration(c, engine: str, output: str) -> None:
    import numpy as np

    from orchestrator.choices import streams_ruled_out

    def median(e, column):
        return f"{np.median(np.abs(e[:, column])):.1%}"

    print(f"calibrated {engine} on {len(c.runs)} runs ({c.simulations:,} simulations) -> {output} "
          f"(use it as --engine {output})")
    print("fitted (base -> calibrated):")
    for label, old, new in c.changes():
        print(f"  {label:30}{old:>10} -> {new}{'' if old != new else '  (kept)'}")
    print(f"median |error| with the base profile: TTFT {median(c.base_errors, 0)}, TPOT {median(c.base_errors, 1)}")
    print(f"median |error| fitted:                TTFT {median(c.fit_errors, 0)}, TPOT {median(c.fit_errors, 1)}")
    if c.loo_errors is not None:
        print(f"median |error| leave-one-out:         TTFT {median(c.loo_errors, 0)}, TPOT {median(c.loo_errors, 1)}"
              "  (each run predicted by a profile fitted without it: expect this on runs you did not measure)")
    cells = [["run", "TTFT base", "fitted", "TPOT base", "fitted"]]
    cells += [[run.where[-60:], f"{b[0]:+.1%}", f"{f[0]:+.1%}", f"{b[1]:+.1%}", f"{f[1]:+.1%}"]
              for run, b, f in zip(c.runs, c.base_errors, c.fit_errors, strict=True)]
    print()
    print(aligned(cells, left=1))
    read = {}
    for run in c.runs:
        if run.note:
            read.setdefault(run.note, []).append(run.where)
    for note, wheres in read.items():  # one line for the runs read alike
        print(f"note: {', '.join(wheres)}: {note}")
    if ruled_out := streams_ruled_out(c.runs):
        print(f"note: {ruled_out}")
    if held := pool_held(c, engine, output):
        print(f"note: {held}")
    if len(c.runs) < 5:
        print(f"note: {len(c.runs)} runs; with 5 or more spread over the loads you will deploy, the fit is steadier",
              file=sys.stderr)
    launches = sorted({r.launch for r in c.runs})
    if len(launches) > 1:  # one profile is fitted to them all, and launch scripts can measure a layout 2x apart
        named = ", ".join(s or "other ids" for s in launches)
        print(f"note: the runs' ids name {len(launches)} launch scripts ({named}): one profile is fitted to all of "
              "them; calibrate each launch's runs apart where they disagree")
    deployments = sorted({(str(r.values.get("model", "")), str(r.values.get("device", ""))) for r in c.runs})
    if len(deployments) > 1:  # one profile is fitted to them all: a run of another deployment may have slipped in
        print(f"note: the runs are of {len(deployments)} deployments "
              f"({'; '.join(f'{m} on {d}' for m, d in deployments)}): one profile is fitted to all of them")


def pool_held(c, engine: str, output: str) -> str:
    """What a fitted KV share means for the first run's deployment: the KV tokens a device holds with the base and
    with the fitted profile ("" where the share is the base's)."""
    from orchestrator.choices import KV_SHARE_PLACE, value_at
    from orchestrator.estimate import configure, job_of

    share = value_at(c.data, KV_SHARE_PLACE, 1.0)
    if share == value_at(c.base_data, KV_SHARE_PLACE, 1.0):
        return ""
    run = c.runs[0]
    tokens = []
    for profile in (engine, output):
        s = configure(run.under(profile))
        job = job_of(s)
        tokens.append(s.latency_model(job.layout).memory_for(job.max_batched_tokens).kv_capacity_tokens)
    return (f"the runs held {share:g} of the KV pool {engine} gives ({run.where}'s deployment: {tokens[0]:,} -> "
            f"{tokens[1]:,} tokens a device): a launch's own memory flag, or memory the engine holds that we do not "
            "count; a plan launches the engine with its own flag")
