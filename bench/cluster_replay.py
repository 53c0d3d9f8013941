"""Cluster scale on paper: what a sweep's dispatch policy would do on 8 to 512 workers.

    python bench/cluster_replay.py record [--spec examples/cluster_scale.toml] [--limit N]
    python bench/cluster_replay.py replay [--workers 2 8 32 128 512] [--repeat K] [--writers workers]
    python bench/cluster_replay.py calibrate
    python bench/cluster_replay.py check [--limit 400]

`record` searches every scenario of the spec inline, in the sweep's order (by plan family), and
writes what each cost to bench/data/<spec>_costs.parquet: its family, its seconds, the seconds of it
that made plans, the plans it used (their signatures; a plan is made once per process and memoised),
the same of each of its jobs (a scenario the runner places job by job is replayed from them),
its points and the bytes of its assembled result (what a worker sends the driver); and what each
plan cost to make to bench/data/<spec>_plans.parquet.

`replay` plays the runner's policy (`orchestrator.placement.Placement`, one part in flight per
worker) as a small discrete-event model over W workers, with Ray's costs as measured here:

- a worker pays its parts' recorded seconds without their plan seconds, plus the cost of every plan
  its scenarios use that it has not made before (its memo is taken to keep every plan), or FETCH_S
  for one another worker made in SHARE_PLAN_S or more (read from the object store: `PlanShelf`);
- parts are cut as the runner cuts them (`placement.part_ms`), a scenario of more work than a part
  placed job by job, each job with its own recorded seconds and plans;
- every part costs ACTOR_CALL_S of dispatch; every worker ACTOR_START_S once, in parallel;
- who writes: the workers themselves (an object-store output on a cluster, or a local one on one
  machine), DRIVER_WRITE_S a scenario added to their work, or the driver, one scenario after another,
  DRIVER_WRITE_S each plus its result's bytes at DRIVER_MB_S (a local output on a cluster, whose other
  nodes cannot reach the driver's disk); a scenario placed job by job is the driver's to write.

It prints the predicted wall time and efficiency (busy / (workers x wall)) per worker count, the
efficiency counted from when the workers are up (busy / (workers x (wall - ACTOR_START_S))): the
start is paid once per sweep, whatever its size, so it bounds a short sweep on many workers; and the
inline work over the workers' time (inline seconds / (workers x wall)): busy seconds count plans made
again as work, this figure does not.

`check` records the spec's first `--limit` scenarios inline, then sweeps them for real with Ray on 1
and then 2 CPUs of this machine (each in a fresh process: `init_ray(num_cpus=...)`, `run_sweep`) and
prints the model's prediction from that recording beside what was measured: wall seconds, efficiency,
and the searchers' busy seconds over the inline recording's (what the model takes as 1: on 2 cores,
Ray's processes and the driver share them with the searchers).
"""

from __future__ import annotations

import argparse
import heapq
import pickle
import sys
import time
from pathlib import Path

import pandas as pd

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # bench/ would shadow the packages

#: measured here (bench/cluster_replay.py calibrate, 2026-12-04; a day before, on a slower day of this
#: machine: 3.3 ms, 1.7 s, 14.5 ms, 52 MB/s): an actor method call's round trip, an actor's start (its
#: process imports numpy, pandas, pyarrow and our packages), the write of one scenario's Parquet files
#: (a worker's or the driver's) and the driver's reading of a result sent to it
ACTOR_CALL_S, ACTOR_START_S, DRIVER_WRITE_S, DRIVER_MB_S = 0.0011, 0.66, 0.0077, 109.0
DATA = Path(__file__).resolve().parent / "data"
#: what reading a shared plan from the object store costs (0.2 ms from this node's store for a 147 kB
#: plan; another node's, more)
FETCH_S = 0.001


def record(spec_path: Path, limit: int, data: Path = DATA) -> Path:
    from orchestrator import evaluate
    from orchestrator.collector import collect_rarely
    from orchestrator.pricer import CachedPricer
    from orchestrator.runner import assemble, search_job
    from orchestrator.spec import expand, load_spec

    planning, used, plan_cost = {"s": 0.0}, set(), {}
    plain = evaluate._planned

    def timed(w, scheduler, role, decode_context, lm, peak_limit=None):
        made, t0 = len(evaluate.PLANS_MADE), time.perf_counter()
        out = plain(w, scheduler, role, decode_context, lm, peak_limit)
        signature = evaluate._plan_signature(w, scheduler, role, decode_context, lm.fingerprint if w.timed else "")
        used.add(signature)
        if len(evaluate.PLANS_MADE) > made:
            seconds = time.perf_counter() - t0
            planning["s"] += seconds
            plan_cost[signature] = plan_cost.get(signature, 0.0) + seconds
        return out

    evaluate._planned = timed
    collect_rarely()
    items = sorted(expand(load_spec(spec_path))[: limit or None], key=lambda it: it.family)
    pricer, rows = CachedPricer(None), []
    started = time.perf_counter()
    for i, item in enumerate(items):
        jobs = []  # (result, seconds, plan seconds, plans used) of each job, searched as search_item searches it
        for j in range(len(item.jobs)):
            planning["s"], t0 = 0.0, time.perf_counter()
            used.clear()
            jobs.append((search_job(item, j, pricer), time.perf_counter() - t0, planning["s"], sorted(used)))
        t0 = time.perf_counter()
        result = assemble(item, [job[0] for job in jobs])
        _, seconds, plan_seconds, plans = zip(*jobs, strict=True)
        rows.append({"scenario_id": item.id, "family": item.family,
                     "seconds": sum(seconds) + time.perf_counter() - t0, "plan_seconds": sum(plan_seconds),
                     "plans": sorted(set().union(*plans)), "points": len(result.points),
                     "result_bytes": len(pickle.dumps(result)), "job_seconds": list(seconds),
                     "job_plan_seconds": list(plan_seconds), "job_plans": list(plans)})
        if i % 200 == 0:
            print(f"{i}/{len(items)} scenarios, {time.perf_counter() - started:.0f} s", file=sys.stderr)
    out = data / f"{spec_path.stem}_costs.parquet"
    data.mkdir(exist_ok=True)
    pd.DataFrame(rows).to_parquet(out, index=False)
    pd.DataFrame({"plan": list(plan_cost), "seconds": list(plan_cost.values())}).to_parquet(
        data / f"{spec_path.stem}_plans.parquet", index=False)
    print(f"{len(rows)} scenarios in {time.perf_counter() - started:.1f} s -> {out}", file=sys.stderr)
    return out


class _Costed:
    """A recorded scenario as Placement sees it (an id and a family)."""

    def __init__(self, r):
        self.id, self.family, self.r = r.scenario_id, r.family, r


def replay(costs: pd.DataFrame, plan_cost: dict, workers: int, driver_writes: bool, shared: bool = True) -> dict:
    """Predicted wall seconds, efficiency and seconds of plans made again of the policy on `workers`
    workers; `driver_writes`: the driver writes every scenario, one after another; `shared`: a plan
    that took SHARE_PLAN_S or more to make is read by the others from the object store (FETCH_S each),
    as the runner's searchers do (`PlanShelf`) where they outnumber the plan families, by a part that
    starts once the part that made it has returned (its reference reaches the driver with the part)."""
    from orchestrator.placement import Placement
    from orchestrator.runner import SHARE_PLAN_S

    items = [_Costed(r) for r in costs.itertuples()]
    shared = shared and workers > len({it.family for it in items})  # as the runner decides (shares_plans)
    placement = Placement(items, workers, cost=lambda it: 1000 * it.r.seconds)
    memo = [set() for _ in range(workers)]
    made: dict = {}  # plan -> when the first part that made it returned
    busy = [0.0] * workers
    events = [(ACTOR_START_S, w) for w in range(workers)]  # (time the worker is free, worker)
    driver_free, end, replanned = 0.0, 0.0, 0.0
    while events:
        now, w = heapq.heappop(events)
        taken = placement.take(w)
        if taken is None:
            end = max(end, now)
            continue
        _, part, _ = taken
        work, making = sum(it.r.seconds - it.r.plan_seconds for it in part), []
        for it in part:
            for p in it.r.plans:
                if p not in memo[w]:
                    memo[w].add(p)
                    if shared and made.get(p, now + 1) <= now and plan_cost.get(p, 0.0) >= SHARE_PLAN_S:
                        work += FETCH_S
                        continue
                    work += plan_cost.get(p, 0.0)  # a plan the recording found memoised costs nothing
                    replanned += plan_cost.get(p, 0.0) if p in made else 0.0
                    making.append(p)
        if not driver_writes:  # the worker writes the whole scenarios it searched (as the driver would)
            work += sum(DRIVER_WRITE_S for it in part if getattr(it.r, "job", -1) < 0)
        busy[w] += work
        done = now + ACTOR_CALL_S + work
        for p in making:
            made[p] = min(made.get(p, done), done)
        if driver_writes:  # the driver writes the part's scenarios when it gets them, one after another
            write = sum(DRIVER_WRITE_S * (getattr(it.r, "job", -1) <= 0) + it.r.result_bytes / (DRIVER_MB_S * 1e6)
                        for it in part)  # a scenario placed job by job is written once
            driver_free = max(driver_free, done) + write
            end = max(end, driver_free)
        heapq.heappush(events, (done, w))
    return {"wall": end, "efficiency": sum(busy) / (workers * end), "replanned_s": replanned}


def split_jobs(costs: pd.DataFrame, jobs: dict, part_s: float) -> pd.DataFrame:
    """The scenarios the runner places job by job (`placement.pieces`: more work than a part alone,
    here by their recorded seconds) as a piece a job: its own seconds, plan seconds and plans as recorded."""
    rows = []
    for r in costs.itertuples(index=False):
        k = jobs[r.scenario_id]
        if r.seconds <= part_s or k == 1:
            rows.append({**r._asdict(), "job": -1})  # whole
            continue
        rows += [{**r._asdict(), "scenario_id": f"{r.scenario_id}/{j}", "job": j, "seconds": r.job_seconds[j],
                  "plan_seconds": r.job_plan_seconds[j], "plans": list(r.job_plans[j]),
                  "result_bytes": r.result_bytes / k}
                 for j in range(k)]  # the driver writes it once, in either mode
    return pd.DataFrame(rows)


def repeated(costs: pd.DataFrame, plan_cost: dict, jobs: dict, k: int) -> tuple[pd.DataFrame, dict, dict]:
    """The recorded sweep k times over, as a sweep of k times the deployments would be: each copy's scenarios,
    plan families and plans its own (nothing a copy made serves another, the bound on sharing)."""
    def own(plans, i: int) -> list:
        return [f"{p}#{i}" for p in plans]

    copies = [costs.assign(scenario_id=costs["scenario_id"] + f"#{i}", family=costs["family"].astype(str) + f"#{i}",
                           plans=[own(plans, i) for plans in costs["plans"]],
                           job_plans=[[own(plans, i) for plans in jobs] for jobs in costs["job_plans"]])
              for i in range(k)]
    return (pd.concat(copies, ignore_index=True), {f"{p}#{i}": s for p, s in plan_cost.items() for i in range(k)},
            {f"{sid}#{i}": n for sid, n in jobs.items() for i in range(k)})


def up_efficiency(r: dict) -> float:
    """Busy over the workers' time once they are up (the actors' start left out)."""
    return r["efficiency"] * r["wall"] / (r["wall"] - ACTOR_START_S)


#: a real sweep of the scenarios named in a file, on this machine's Ray with `num_cpus`; prints its summary
MEASURE = ("import json, sys; from orchestrator.spec import expand, load_spec; "
           "from orchestrator.sweep import init_ray, run_sweep; init_ray(num_cpus=int(sys.argv[3])); "
           "ids = set(json.load(open(sys.argv[2]))); "
           "items = [i for i in expand(load_spec(sys.argv[1])) if i.id in ids]; "
           "s = run_sweep(items, sys.argv[4], progress=False); "
           "print(json.dumps({'seconds': s.seconds, 'efficiency': s.efficiency, 'workers': s.workers}))")


def check(spec_path: Path, limit: int) -> None:
    """The model against real sweeps of the spec's first `limit` scenarios on 1 and 2 CPUs here, their
    costs recorded inline just before (this machine's speed drifts over a day)."""
    import json
    import subprocess
    import tempfile

    from orchestrator.placement import part_ms
    from orchestrator.spec import expand, load_spec

    items = expand(load_spec(spec_path))[:limit]
    jobs = {it.id: len(it.jobs) for it in items}
    with tempfile.TemporaryDirectory() as fresh:
        sub = pd.read_parquet(record(spec_path, limit, Path(fresh)))
        plans = pd.read_parquet(Path(fresh) / f"{spec_path.stem}_plans.parquet")
    plan_cost = dict(zip(plans["plan"], plans["seconds"], strict=True))
    root = Path(__file__).resolve().parent.parent
    print(f"{len(items)} scenarios (recorded inline {sub['seconds'].sum():.1f} s)")
    print(f"{'CPUs':>4} {'predicted wall s':>16} {'measured wall s':>15} {'error':>7} "
          f"{'predicted eff.':>14} {'measured eff.':>13} {'searchers busy / inline':>23}")
    with tempfile.TemporaryDirectory() as work:
        ids = Path(work) / "ids.json"
        ids.write_text(json.dumps([it.id for it in items]))
        for cpus in (1, 2):
            out = subprocess.run([sys.executable, "-c", MEASURE, str(spec_path), str(ids), str(cpus),
                                  str(Path(work) / f"out{cpus}")], capture_output=True, text=True, cwd=root)
            if out.returncode:
                sys.exit(out.stderr[-3000:])
            measured = json.loads(out.stdout.strip().splitlines()[-1])
            placed = split_jobs(sub, jobs, part_ms(1000 * sub["seconds"].sum(), cpus) / 1000)
            r = replay(placed, plan_cost, cpus, driver_writes=False)
            busy = measured["efficiency"] * measured["workers"] * measured["seconds"]
            print(f"{cpus:>4} {r['wall']:>16.1f} {measured['seconds']:>15.1f} "
                  f"{r['wall'] / measured['seconds'] - 1:>+7.1%} {r['efficiency']:>14.0%} "
                  f"{measured['efficiency']:>13.0%} {busy / sub['seconds'].sum():>22.2f}x")


def calibrate() -> None:
    """Measure the model's Ray and driver costs on this machine (the constants above)."""
    import statistics
    import tempfile

    import ray

    from orchestrator.dataset import Dataset
    from orchestrator.pricer import CachedPricer
    from orchestrator.runner import Searcher, search_item
    from orchestrator.spec import expand, load_spec

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    actor = ray.remote(num_cpus=1)(Searcher)
    node = ray.get_runtime_context().get_node_id()
    starts = []
    for _ in range(3):
        t0 = time.perf_counter()
        a = actor.remote(None, tempfile.gettempdir(), False, node)
        ray.get(a.search.remote([]))
        starts.append(time.perf_counter() - t0)
        calls = []
        for _ in range(200):
            t1 = time.perf_counter()
            ray.get(a.search.remote([]))
            calls.append(time.perf_counter() - t1)
        ray.kill(a)
    items = expand(load_spec(Path("examples/quickstart.toml")))[:16]
    results = [search_item(it, CachedPricer(None)) for it in items]
    blob = [pickle.dumps(r) for r in results]
    t0 = time.perf_counter()
    for b in blob:
        pickle.loads(b)
    mb_s = sum(map(len, blob)) / 1e6 / (time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as d:
        data, writes = Dataset(d), []
        for it, r in zip(items, results, strict=True):
            t0 = time.perf_counter()
            data.write(it, r)
            writes.append(time.perf_counter() - t0)
    print(f"ACTOR_START_S {statistics.median(starts):.3f}  ACTOR_CALL_S {statistics.median(calls):.4f}  "
          f"DRIVER_WRITE_S {statistics.median(writes):.4f}  DRIVER_MB_S {mb_s:.0f}  "
          f"(result {statistics.median(map(len, blob)) / 1e3:.0f} kB)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="search the spec inline and record each scenario's cost")
    rec.add_argument("--spec", type=Path, default=Path("examples/cluster_scale.toml"))
    rec.add_argument("--limit", type=int, default=0, help="only the first N scenarios (0: all)")
    rep = sub.add_parser("replay", help="predict wall time and efficiency per worker count")
    rep.add_argument("--costs", type=Path, default=DATA / "cluster_scale_costs.parquet")
    rep.add_argument("--workers", type=int, nargs="+", default=[1, 2, 8, 32, 128, 512])
    rep.add_argument("--part-ms", type=float, help="what-if: the least work of a part (the runner's "
                     "TARGET_TASK_MS, 800)")
    rep.add_argument("--whole", action="store_true", help="every scenario placed whole, as the runner did "
                     "before it placed the largest job by job")
    rep.add_argument("--no-shared-plans", dest="shared_plans", action="store_false", help="as the runner was "
                     "before PlanShelf: every worker makes every plan it uses")
    rep.add_argument("--spec", type=Path, default=Path("examples/cluster_scale.toml"), help="the recorded spec "
                     "(its scenarios' jobs)")
    rep.add_argument("--repeat", type=int, default=1, help="what-if: a sweep this many times the recorded one, "
                     "each copy's plans its own (default 1: the recording)")
    rep.add_argument("--writers", choices=("both", "workers", "driver"), default="both",
                     help="who writes the results: the workers, the driver, or both in turn (default)")
    sub.add_parser("calibrate", help="measure the Ray and driver costs the model uses")
    chk = sub.add_parser("check", help="the model's prediction against real 1- and 2-CPU sweeps here")
    chk.add_argument("--spec", type=Path, default=Path("examples/cluster_scale.toml"))
    chk.add_argument("--limit", type=int, default=400, help="the spec's first N scenarios (default 400)")
    a = ap.parse_args()
    if a.command == "calibrate":
        calibrate()
        return
    if a.command == "record":
        record(a.spec, a.limit)
        return
    if a.command == "check":
        check(a.spec, a.limit)
        return
    costs = pd.read_parquet(a.costs)
    plans = pd.read_parquet(a.costs.with_name(a.costs.name.replace("_costs", "_plans")))
    plan_cost = dict(zip(plans["plan"], plans["seconds"], strict=True))
    if a.part_ms is not None:
        from orchestrator import placement

        placement.TARGET_TASK_MS = a.part_ms
    from orchestrator.placement import part_ms
    from orchestrator.spec import expand, load_spec

    jobs = {it.id: len(it.jobs) for it in expand(load_spec(a.spec))}
    if a.repeat < 1:
        ap.error(f"--repeat: {a.repeat} is not allowed; expected an integer >= 1")
    if a.repeat > 1:
        costs, plan_cost, jobs = repeated(costs, plan_cost, jobs, a.repeat)
    inline = costs["seconds"].sum()
    print(f"{len(costs)} scenarios, {costs['family'].nunique()} plan families, inline {inline:.1f} s "
          f"({costs['plan_seconds'].sum():.1f} s of it planning)")
    print(f"{'workers':>7} {'who writes':>10} {'wall s':>9} {'speed-up':>9} {'efficiency':>10} "
          f"{'from up':>8} {'inline work / (workers x wall)':>30} {'planned again s':>15}")
    for w in a.workers:
        placed = costs if a.whole else split_jobs(costs, jobs, part_ms(1000 * inline, w) / 1000)
        for driver_writes in {"both": (False, True), "workers": (False,), "driver": (True,)}[a.writers]:
            r = replay(placed, plan_cost, w, driver_writes, a.shared_plans)
            who = "driver" if driver_writes else "workers"
            print(f"{w:>7} {who:>10} {r['wall']:>9.1f} {inline / r['wall']:>8.1f}x {r['efficiency']:>9.0%} "
                  f"{up_efficiency(r):>8.0%} {inline / (w * r['wall']):>30.0%} {r['replanned_s']:>15.1f}")


if __name__ == "__main__":
    main()
