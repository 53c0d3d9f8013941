"""`servesweep sweep`: every scenario of a spec, on Ray or inline, into a results dataset."""

from __future__ import annotations

import sys

from orchestrator.cli.common import BURST_NOTE, result_table
from orchestrator.fields import InputError


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="run every scenario of a TOML spec; results to a Parquet dataset")
    p.add_argument("spec", help="sweep spec (TOML); see examples/")
    p.add_argument("--output", help="results directory (default results/<run-id>/)")
    p.add_argument("--resume", action="store_true", help="continue a run in --output; finished scenarios are kept")
    p.add_argument("--address", help="join this Ray cluster (or set RAY_ADDRESS); default: embedded Ray")
    p.add_argument("--num-cpus", type=int, help="CPUs of the embedded Ray (default: all)")
    p.add_argument("--inline", action="store_true", help="no Ray: evaluate in this process")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--top-n", type=int, default=20)
    p.add_argument("--per-request", action="store_true", help="also write the requests of each scenario's best "
                   "points (table requests/: arrival, first token, finish, lengths, TTFT, TPOT), re-simulated on "
                   "the driver")
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(a) -> int:
    from orchestrator.spec import SpecError, expand, load_spec
    from orchestrator.sweep import default_output, init_ray, run_sweep

    if a.resume and not a.output:
        raise InputError("--resume", True, "together with --output DIR of the run to continue")
    if a.num_cpus is not None and a.num_cpus < 1:
        raise InputError("--num-cpus", a.num_cpus, "an integer >= 1")
    try:
        spec = load_spec(a.spec)
        items = expand(spec)
    except SpecError as err:
        print(f"servesweep sweep: error: {err}", file=sys.stderr)
        return 2
    output = str(a.output or default_output())
    from orchestrator.dataset import Dataset

    try:
        Dataset(output).files("best")
    except (OSError, ValueError) as err:
        raise InputError("--output", output, f"a writable directory or URI ({str(err).splitlines()[0]})") from None
    if not a.inline:
        init_ray(a.address, a.num_cpus)
    try:
        summary = run_sweep(items, output, resume=a.resume, backend="inline" if a.inline else "ray",
                            progress=not a.no_progress, spec=spec, per_request=a.per_request)
    except FileExistsError as err:
        print(f"servesweep sweep: error: --output: {err}", file=sys.stderr)
        return 2
    from orchestrator.dataset import read_table

    table = read_table(summary.output, "best")
    best = _best_per_scenario(table.to_dict("records") if len(table) else [])
    print(f"{summary.total} scenarios: {summary.written} run, {summary.skipped} already finished; "
          f"{summary.points} points, {summary.priced} keys priced, {summary.seconds:.1f} s; "
          f"{summary.plans_made} plans made of {summary.distinct_plans} distinct, "
          f"workers {summary.workers}, {100 * summary.efficiency:.0f} % busy"
          + (f", idle tail {summary.idle_tail:.1f} s" if summary.workers > 1 else "")
          + (f"; {summary.retried} parts run again after a lost worker or node" if summary.retried else ""))
    if best:
        print(f"best configuration per scenario (top {min(a.top_n, len(best))} by output tok/s/device):")
        print(result_table(best[: a.top_n], scenario=True))
        if any(b.get("arrival") == "burst" for b in best):
            print(f"note: {BURST_NOTE}")
    for b in summary.infeasible[:5]:  # of this run
        print(f"{b['scenario_id']}: {b['message']}")
    print(f"results: {summary.output}/ (points/, best/, manifest.json)")
    return 0


def _best_per_scenario(rows: list[dict]) -> list[dict]:
    best: dict[str, dict] = {}
    for r in rows:
        if r["feasible"] and (r["scenario_id"] not in best
                              or r["output_throughput"] > best[r["scenario_id"]]["output_throughput"]):
            best[r["scenario_id"]] = r
    return sorted(best.values(), key=lambda r: -r["output_throughput_per_device"])
