"""Drivers that run many scenarios' searches: inline (one process) or on Ray actors, one per CPU.

A scenario is searched whole where it is placed (orchestrator.optimize.job_search driven inline), so
the driver does no per-point work: it hands out parts of plan families and collects finished
scenarios. Plans depend only on a scenario's plan family (`Scenario.plan_family`) and are memoised
per process, so a family's parts go to the worker that started it (`Placement`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from functools import lru_cache

from orchestrator.evaluate import collect_rarely, evaluate_point, take_plans_made, use_shelf, workload
from orchestrator.jobs import Job, OptimizeResult, SweepItem
from orchestrator.optimize import job_search, memory_bound
from orchestrator.pricer import CachedPricer, shared_backend
from orchestrator.scenario import Scenario
from orchestrator.search import drive
from simulator.workload import sent_prompts

log = logging.getLogger(__name__)

#: the least estimated work of one part handed to a worker: far above the ~2 ms a Ray call costs
TARGET_TASK_MS = 800.0
#: parts per worker a sweep is cut into at least, so the last parts are short: the idle tail at the
#: end of a sweep is at most about one part (1 / PARTS_PER_WORKER of a worker's share)
PARTS_PER_WORKER = 20
#: a part holds less than TARGET_TASK_MS where that would leave a worker fewer than this many parts (a
#: sweep spread over hundreds of workers), but never less than MIN_TASK_MS (a Ray call costs ~3 ms)
MIN_PARTS_PER_WORKER, MIN_TASK_MS = 4, 100.0
#: a plan that took at least this long to make is shared with the other searchers through Ray's object
#: store (putting a 147 kB plan costs ~1.5 ms, reading it on the same node ~0.2 ms; most plans take ~1 ms)
SHARE_PLAN_S = 0.005
#: rough cost of one simulated step plus a fixed cost per point, for estimating a scenario's work
MS_PER_STEP, MS_PER_POINT = 0.008, 0.3
POISSON_IN_FLIGHT = 16
#: points a job's search evaluates, roughly (a bracket and a bisection over concurrency), and the
#: concurrency a point is estimated at
POINTS_PER_SEARCH, REFERENCE_LOAD = 12, 64
#: keys a point prices itself with an expensive backend (a guess: what the caches miss)
PRICED_KEYS_PER_POINT = 10
#: times the driver re-runs a part whose worker, node or result was lost (a failure in our code is not retried)
TASK_RETRIES = 3
#: infeasible best rows a worker sends back per scenario it wrote (the summary prints a few; all are on disk)
INFEASIBLE_BACK = 20


def estimate_ms(s: Scenario, job: Job, n: int) -> float:
    """Rough work of one point: decode steps plus the steps its prompt tokens fill at B per step
    (a Poisson point's requests in flight are unknown before it runs: POISSON_IN_FLIGHT is a guess),
    plus, with a backend that costs more per key than asking the shared cache, the keys it prices."""
    arrival, num_prompts, trace, decode, prefill_steps, pricing = _point_work(s, job)
    poisson = arrival == "poisson"
    prompts = sent_prompts(arrival, 1 if poisson else n, num_prompts, trace)
    rounds = prompts / (POISSON_IN_FLIGHT if poisson else n)
    return MS_PER_POINT + MS_PER_STEP * (decode * rounds + prompts * prefill_steps + 1) + pricing


@lru_cache(maxsize=4096)
def _point_work(s: Scenario, job: Job) -> tuple:
    """What a job's point estimates share, whatever its load: arrival, num_prompts, a trace's
    requests, decode steps a request, prefill steps a prompt, pricing ms."""
    w = workload(s, job.max_batched_tokens, 1)
    trace = w.mix.trace if w.mix is not None else None
    lm = s.latency_model(job.layout)
    return (w.arrival, w.num_prompts, None if trace is None else len(trace),
            w.decode_steps if job.role != "prefill" else 0, w.effective_input_length / w.max_batched_tokens,
            lm.cost_per_key_ms * PRICED_KEYS_PER_POINT if shared_backend(lm) else 0.0)


def scenario_ms(item: SweepItem) -> float:
    """Rough work of one scenario's search: POINTS_PER_SEARCH points per job at a typical load."""
    s = item.scenario
    total = 0.0
    for job in item.jobs:
        bound = memory_bound(s, job)
        n = max(1, min(REFERENCE_LOAD, s.max_concurrency, bound or REFERENCE_LOAD))
        total += POINTS_PER_SEARCH * estimate_ms(s, job, n)
    return total


def search_item(item: SweepItem, pricer, progress=None) -> OptimizeResult:
    """One scenario searched in this process: every job's search driven inline, then assembled."""
    s, results = item.scenario, []
    for job in item.jobs:
        def evaluate(ns, job=job):
            rows = [evaluate_point(s, job, n, pricer) for n in ns]
            if progress is not None:
                progress.point(pricer.take_stats(), len(rows))
            return rows
        results.append(drive(job_search(s, job), evaluate))
    return item.mode.assemble(s, results)


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


class Placement:
    """Which part of the sweep a free worker searches next. The sweep is cut by plan family, each
    family into parts of contiguous scenarios (>= `part_ms`: TARGET_TASK_MS, less on many workers;
    <= total / (workers x PARTS_PER_WORKER) where a scenario allows). A worker takes the next part
    of a family it started (its plans are in that worker's memo), else starts the largest family
    nobody has, else helps with the family that has the most work left (reading the plans of it worth
    sharing, `PlanShelf`, and making the others again)."""

    def __init__(self, items: list[SweepItem], workers: int, cost=scenario_ms):
        families: dict[str, list[tuple[SweepItem, float]]] = {}
        for item in items:
            families.setdefault(item.family, []).append((item, cost(item)))
        total = sum(ms for members in families.values() for _, ms in members)
        self.part_ms = part_ms(total, workers)
        self.parts: dict[str, deque] = {f: deque(_cut(m, self.part_ms)) for f, m in families.items()}
        self.left = {f: sum(ms for _, ms in m) for f, m in families.items()}
        self.owners: dict[str, set] = {f: set() for f in families}

    def take(self, worker) -> tuple[str, list[SweepItem], float] | None:
        """(family, scenarios, estimated ms) for `worker`, or None when nothing is left."""
        open_ = [f for f, parts in self.parts.items() if parts]
        if not open_:
            return None
        mine = [f for f in open_ if worker in self.owners[f]]
        free = [f for f in open_ if not self.owners[f]]
        family = (mine or [max(free or open_, key=self.left.__getitem__)])[0]
        self.owners[family].add(worker)
        items, ms = self.parts[family].popleft()
        self.left[family] -= ms
        return family, items, ms

    def give_back(self, family: str, items: list[SweepItem], ms: float, worker) -> None:
        """A part whose worker was lost: first in its family again; the worker owns nothing now."""
        self.parts[family].appendleft((items, ms))
        self.left[family] += ms
        for owners in self.owners.values():
            owners.discard(worker)


def part_ms(total: float, workers: int) -> float:
    """The least estimated work of a part: TARGET_TASK_MS, or less where that would leave a worker fewer
    than MIN_PARTS_PER_WORKER parts (never below MIN_TASK_MS); more where the sweep has work enough for
    PARTS_PER_WORKER parts of more each."""
    workers = max(1, workers)
    floor = max(MIN_TASK_MS, min(TARGET_TASK_MS, total / (workers * MIN_PARTS_PER_WORKER)))
    return max(floor, total / (workers * PARTS_PER_WORKER))


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


def _cut(members: list[tuple[SweepItem, float]], part_ms: float) -> list[tuple[list[SweepItem], float]]:
    """Contiguous parts of a family of >= part_ms each (the last may be less)."""
    parts, items, ms = [], [], 0.0
    for item, cost in members:
        items.append(item)
        ms += cost
        if ms >= part_ms:
            parts.append((items, ms))
            items, ms = [], 0.0
    if items:
        parts.append((items, ms))
    return parts


class Searcher:
    """A Ray actor: searches whole scenarios with one pricer and one plan memo for its lifetime, and
    writes each to the dataset itself where it can reach it: a local output from the driver's node; an
    object store from a node of a cluster (its nodes are given the job's storage access; the processes
    of one machine may not be: there the driver writes). Otherwise, or once a write of its fails, it
    sends the assembled result back for the driver to write."""

    def __init__(self, cache, root: str, per_request: bool, driver_node: str, cluster: bool = False):
        import ray

        from orchestrator.dataset import Dataset

        collect_rarely()
        take_plans_made()
        context = ray.get_runtime_context()
        self.node, self.worker = context.get_node_id(), context.get_worker_id()
        self.pricer = CachedPricer(cache)
        self.shelf = PlanShelf()
        writes = (cluster and self.node != driver_node) if "://" in root else self.node == driver_node
        self.data = Dataset(root) if writes else None
        self.per_request = per_request

    def search(self, items: list[SweepItem], shared: dict | None = None):
        """Each scenario: (id, result to write or None if written here, its infeasible best rows);
        `shared`: plans of the family the others made (signature -> ObjectRef); returned with the
        ones made here worth sharing."""
        self.shelf.known.update(shared or {})
        started, points, out = time.perf_counter(), 0, []
        use_shelf(self.shelf)
        try:
            for item in items:
                result = search_item(item, self.pricer)
                points += len(result.points)  # a search evaluates each of its points once
                best = self._write(item, result)
                if best is None:
                    out.append((item.id, result, None))
                else:
                    out.append((item.id, None, [b for b in best if not b["feasible"]][:INFEASIBLE_BACK]))
        finally:
            use_shelf(None)
        work = (self.worker, time.perf_counter() - started, take_plans_made())
        return out, {**self.pricer.take_stats(), "points": points}, self.node, work, self.shelf.take_new()


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
    (`Placement`), one part in flight per actor. A part whose actor was lost is searched again
    elsewhere, on a new actor where the cluster still has room, and counted (`retried`)."""
    import ray

    items = list(items)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    placement = Placement(items, cpus)
    actor = ray.remote(num_cpus=1, max_restarts=0, scheduling_strategy="SPREAD")(Searcher)
    driver_node = ray.get_runtime_context().get_node_id()
    cluster = sum(1 for n in ray.nodes() if n.get("Alive")) > 1
    by_id = {it.id: it for it in items}

    def start():
        return actor.remote(cache, sink.root, sink.per_request, driver_node, cluster)

    actors = [start() for _ in range(min(cpus, len(items)))]
    log.info("Ray: %d CPUs, %d searchers, parts of >= %.0f ms", cpus, len(actors), placement.part_ms)
    in_flight: dict = {}  # ref -> (actor, family, scenarios, estimated ms)
    attempts: dict[tuple, int] = {}  # a part's scenario ids -> times it was lost
    nodes, retried, work = {}, 0, Work()
    shelves: dict[str, dict] = {}  # plan family -> {signature: ObjectRef} of plans worth sharing
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
                out, stats, node, (worker, busy, plans), made = ray.get(ref)
            except lost_errors as lost:
                key = tuple(it.id for it in part)
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
            nodes[node] = nodes.get(node, 0) + 1
            work.add(worker, busy, plans)
            shelves.setdefault(family, {}).update(made)
            if progress:
                progress.point(stats, stats["points"])
            for item_id, result, infeasible in out:
                if result is None:
                    sink.written(by_id[item_id], infeasible)
                else:
                    sink.write(by_id[item_id], result)
            give(a)
    finally:
        for a in actors:
            ray.kill(a)
    work.tail = time.perf_counter() - min(idle_since.values()) if len(actors) > 1 and idle_since else 0.0
    return {"nodes": nodes, "retried": retried, "work": work, "workers": cpus}
