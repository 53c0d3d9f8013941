"""Drivers that run many scenarios' searches: inline (one process) or on Ray actors, one per CPU.

A scenario is searched where it is placed (orchestrator.optimize.job_search driven inline), whole or,
when it alone is more than a part, job by job (`orchestrator.placement`), so the driver does no
per-point work: it hands out parts of plan families, collects finished scenarios and assembles the
ones placed job by job. Plans depend only on a scenario's plan family (`Scenario.plan_family`) and are
memoised per process, so a family's parts go to the worker that started it (`Placement`), and the
plans worth it are shared through Ray's object store (`PlanShelf`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import NamedTuple

from orchestrator.collector import collect_rarely, freeze_survivors
from orchestrator.evaluate import evaluate_point, take_plans_made, use_shelf
from orchestrator.jobs import JobResult, OptimizeResult, SweepItem
from orchestrator.optimize import job_search
from orchestrator.placement import Piece, Placement, pieces
from orchestrator.pricer import CachedPricer
from orchestrator.search import drive

log = logging.getLogger(__name__)

#: a plan that took at least this long to make is shared with the other searchers through Ray's object
#: store (putting a 147 kB plan costs ~1.5 ms, reading it on the same node ~0.2 ms; most plans take ~1 ms)
SHARE_PLAN_S = 0.005
#: times the driver re-runs a part whose worker, node or result was lost (a failure in our code is not retried)
TASK_RETRIES = 3
#: how long an interrupted driver waits for the searchers it killed to be gone (their writes cut short then removed)
KILL_WAIT_S = 10.0
#: infeasible best rows a worker sends back per scenario it wrote (the summary prints a few; all are on disk)
INFEASIBLE_BACK = 20


def search_job(item: SweepItem, index: int, pricer, progress=None) -> JobResult:
    """Job `index` of a scenario searched in this process, its points evaluated inline."""
    s, job = item.scenario, item.jobs[index]

    def evaluate(ns):
        rows = [evaluate_point(s, job, n, pricer) for n in ns]
        if progress is not None:
            progress.point(pricer.take_stats(), len(rows))
        return rows
    result = drive(job_search(s, job), evaluate)
    freeze_survivors()
    return result


def search_item(item: SweepItem, pricer, progress=None) -> OptimizeResult:
    """One scenario searched in this process: every job's search, then assembled."""
    return assemble(item, [search_job(item, j, pricer, progress) for j in range(len(item.jobs))])


def assemble(item: SweepItem, results: list[JobResult]) -> OptimizeResult:
    """The scenario's answer from its jobs' results, in job order (where or whenever they were searched)."""
    return item.mode.assemble(item.scenario, results)


def run_inline(items: Iterable[SweepItem], sink, progress=None) -> dict:
    """Every scenario searched in this process, with a local latency cache; each written by `sink`."""
    collect_rarely()
    pricer = CachedPricer(None)
    started, work = time.perf_counter(), Work()
    take_plans_made()
    for item in items:
        sink.write(item, search_item(item, pricer, progress))
    work.add("inline", time.perf_counter() - started, take_plans_made())
    return {"nodes": {"inline": 1}, "retried": 0, "work": work}


class Work:
    """What the workers did: busy seconds per worker, plans made (every one) and distinct plans."""

    def __init__(self):
        self.busy: dict[str, float] = {}
        self.plans_made = 0
        self.distinct: set[str] = set()
        self.tail = 0.0  # seconds from the first worker running out of work to the end of the sweep

    def add(self, worker: str, seconds: float, plans: list[str]) -> None:
        self.busy[worker] = self.busy.get(worker, 0.0) + seconds
        self.plans_made += len(plans)
        self.distinct.update(plans)

    def efficiency(self, wall: float, workers: int) -> float:
        """Busy time over the workers' time: busy / (workers x wall)."""
        return sum(self.busy.values()) / (workers * wall) if wall > 0 and workers else 0.0


class PlanShelf:
    """Plans other searchers of this sweep made, by signature, as references into Ray's object store
    (the driver hands each part the ones of its plan family), and the plans this searcher made that
    took SHARE_PLAN_S or more, put there for the others. A plan whose copy was lost is made again."""

    def __init__(self):
        self.known: dict = {}   # signature -> ObjectRef
        self.new: dict = {}     # made here since `take_new`

    def get(self, signature: str):
        import ray

        ref = self.known.get(signature)
        if ref is None:
            return None
        try:
            return ray.get(ref)
        except _lost_errors():
            del self.known[signature]
            return None

    def offer(self, signature: str, planned, seconds: float) -> None:
        if seconds >= SHARE_PLAN_S and signature not in self.known:
            import ray

            self.known[signature] = self.new[signature] = ray.put(planned)

    def take_new(self) -> dict:
        new, self.new = self.new, {}
        return new


def shares_plans(workers: int, placed: list[Piece]) -> bool:
    """Whether searchers share plans (`PlanShelf`): where there are more of them than plan families, so
    families are spread over searchers from the start. With fewer, a family stays with the searcher that
    started it until the sweep's tail, and putting plans in the object store costs more than it saves
    (a 576-scenario sweep on 2 CPUs: 7.7 s without, 8.3 s with)."""
    return workers > len({piece.family for piece in placed})


class Searched(NamedTuple):
    """What a searcher sends back for a part."""

    written: list   # (scenario id, its result if the driver is to write it else None, its infeasible best rows)
    jobs: list      # (scenario id, job index, JobResult) of the scenarios placed job by job
    stats: dict     # the pricer's counts and the points evaluated
    node: str
    work: tuple     # (worker id, busy seconds, signatures of the plans made)
    made: dict      # signature -> ObjectRef of the plans made here worth sharing


class Searcher:
    """A Ray actor: searches scenarios (whole, or the jobs of one placed job by job) with one pricer
    and one plan memo for its lifetime, reading the family's shared plans (`PlanShelf`), and writes
    each whole scenario to the dataset itself where it can reach it: a local output from the driver's node; an
    object store from a node of a cluster (its nodes are given the job's storage access; the processes
    of one machine may not be: there the driver writes). Otherwise, or once a write of its fails, it
    sends the assembled result back for the driver to write."""

    def __init__(self, cache, root: str, per_request: bool, driver_node: str, cluster: bool = False,
                 share: bool = False):
        import ray

        from orchestrator.dataset import Dataset

        collect_rarely()
        take_plans_made()
        context = ray.get_runtime_context()
        self.node, self.worker = context.get_node_id(), context.get_worker_id()
        self.pricer = CachedPricer(cache)
        self.shelf = PlanShelf() if share else None  # see `shares_plans`
        writes = (cluster and self.node != driver_node) if "://" in root else self.node == driver_node
        self.data = Dataset(root) if writes else None
        self.per_request = per_request

    def search(self, part: list[Piece], shared: dict | None = None) -> Searched:
        """A part's pieces: a whole scenario written here (or sent back whole where it cannot be), a
        job's result sent back; `shared`: plans of the family the others made (signature -> ObjectRef),
        returned with the ones made here worth sharing."""
        if self.shelf is not None:
            self.shelf.known.update(shared or {})
        started, points, written, jobs = time.perf_counter(), 0, [], []
        use_shelf(self.shelf)
        try:
            for piece in part:
                item = piece.item
                if piece.jobs is not None:
                    for j in piece.jobs:
                        jobs.append((item.id, j, search_job(item, j, self.pricer)))
                        points += len(jobs[-1][2].points)
                    continue
                result = search_item(item, self.pricer)
                points += len(result.points)  # a search evaluates each of its points once
                best = self._write(item, result)
                if best is None:
                    written.append((item.id, result, None))
                else:
                    written.append((item.id, None, [b for b in best if not b["feasible"]][:INFEASIBLE_BACK]))
        finally:
            use_shelf(None)
        work = (self.worker, time.perf_counter() - started, take_plans_made())
        stats = {**self.pricer.take_stats(), "points": points}
        return Searched(written, jobs, stats, self.node, work, self.shelf.take_new() if self.shelf else {})

    def _write(self, item: SweepItem, result: OptimizeResult) -> list[dict] | None:
        """The scenario written here (its best rows), or None: the driver is to write it."""
        if self.data is None:
            return None
        try:
            return self.data.write(item, result, self.per_request)
        except OSError as err:  # whole or absent either way: the driver writes it all again
            log.warning("a searcher cannot write %s (%s); the driver writes its results", self.data.root, err)
            self.data = None
            return None


def _lost_errors() -> tuple:
    """Ray errors that say an actor, its node or a result copy was lost, not that the search failed."""
    from ray import exceptions as e

    return (e.RayActorError, e.WorkerCrashedError, e.NodeDiedError, e.LocalRayletDiedError, e.ObjectLostError,
            e.OutOfMemoryError)


def run_ray(items: Iterable[SweepItem], sink, cache, progress=None) -> dict:
    """Search the scenarios on one Ray actor per CPU of the cluster, placed by plan family
    (`Placement`), one part in flight per actor; a scenario placed job by job is assembled and
    written here once its last job is in. A part whose actor was lost is searched again elsewhere, on
    a new actor where the cluster still has room, and counted (`retried`)."""
    import ray

    items = list(items)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    placed = pieces(items, cpus)
    placement, share = Placement(placed, cpus), shares_plans(cpus, placed)
    actor = ray.remote(num_cpus=1, max_restarts=0, scheduling_strategy="SPREAD")(Searcher)
    driver_node = ray.get_runtime_context().get_node_id()
    cluster = sum(1 for n in ray.nodes() if n.get("Alive")) > 1
    by_id = {it.id: it for it in items}

    def start():
        return actor.remote(cache, sink.root, sink.per_request, driver_node, cluster, share)

    actors = [start() for _ in range(min(cpus, len(items)))]
    log.info("Ray: %d CPUs, %d searchers, parts of >= %.0f ms", cpus, len(actors), placement.part_ms)
    in_flight: dict = {}  # ref -> (actor, family, scenarios, estimated ms)
    attempts: dict[tuple, int] = {}  # a part's scenario ids -> times it was lost
    nodes, retried, work = {}, 0, Work()
    shelves: dict[str, dict] = {}  # plan family -> {signature: ObjectRef} of plans worth sharing
    jobs_in: dict[str, dict[int, JobResult]] = {}  # scenario id -> its jobs' results so far (placed job by job)
    lost_errors = _lost_errors()

    idle_since: dict = {}  # actor -> when it first found nothing left to take

    def give(a) -> None:
        taken = placement.take(a)
        if taken is None:
            idle_since.setdefault(a, time.perf_counter())
            return
        family, part, ms = taken
        in_flight[a.search.remote(part, shelves.get(family, {}))] = (a, family, part, ms)

    try:
        for a in actors:
            give(a)
        while in_flight:
            [ref], _ = ray.wait(list(in_flight), num_returns=1)
            a, family, part, ms = in_flight.pop(ref)
            try:
                searched = ray.get(ref)
            except lost_errors as lost:
                key = tuple(piece.id for piece in part)
                attempts[key] = attempts.get(key, 0) + 1
                if attempts[key] > TASK_RETRIES:
                    raise RuntimeError(f"a part of {len(part)} scenarios was lost {attempts[key]} times; "
                                       f"last: {type(lost).__name__}") from lost
                log.warning("searcher lost (%s); its part runs again", type(lost).__name__)
                placement.give_back(family, part, ms, a)
                retried += 1
                actors.remove(a)
                if not actors or ray.available_resources().get("CPU", 0) >= 1:  # its CPU is free again
                    actors.append(start())
                for idle in set(actors) - {v[0] for v in in_flight.values()}:
                    give(idle)
                continue
            nodes[searched.node] = nodes.get(searched.node, 0) + 1
            work.add(*searched.work)
            shelves.setdefault(family, {}).update(searched.made)
            if progress:
                progress.point(searched.stats, searched.stats["points"])
            for item_id, result, infeasible in searched.written:
                if result is None:
                    sink.written(by_id[item_id], infeasible)
                else:
                    sink.write(by_id[item_id], result)
            for item_id, index, result in searched.jobs:
                item, got = by_id[item_id], jobs_in.setdefault(item_id, {})
                got[index] = result
                if len(got) == len(item.jobs):
                    sink.write(item, assemble(item, [got[j] for j in range(len(item.jobs))]))
                    del jobs_in[item_id]
            give(a)
    finally:
        for a in actors:
            ray.kill(a)
        if in_flight:  # interrupted: a killed searcher's calls resolve once it is gone; what it cut short goes
            ray.wait(list(in_flight), num_returns=len(in_flight), timeout=KILL_WAIT_S)
            sink.data.discard_temporaries()
    work.tail = time.perf_counter() - min(idle_since.values()) if len(actors) > 1 and idle_since else 0.0
    return {"nodes": nodes, "retried": retried, "work": work, "workers": cpus}
