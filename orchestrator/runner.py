"""Drivers that run many scenarios' searches: inline (one process) or fanned out as Ray tasks.

Both drive the same search generators (orchestrator.search) and hand each finished scenario's
job results to `on_done`; only where a point is evaluated differs.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from functools import lru_cache

from orchestrator.evaluate import (
    collect_rarely,
    evaluate_point,
    finish_point,
    measured_before,
    plan_point,
    point_key,
    take_plans_made,
    workload,
)
from orchestrator.jobs import Job, JobResult, SweepItem
from orchestrator.optimize import job_search
from orchestrator.pricer import CachedPricer, shared_backend
from orchestrator.scenario import Scenario
from simulator.workload import sent_prompts

log = logging.getLogger(__name__)

#: estimated work a Ray task carries: far above the ~2 ms a task costs, and large enough that the points
#: of one plan family meet in one task, so two workers plan the same schedule less often (576-scenario
#: sweep on 2 CPUs: 50 ms tasks planned 3,950 schedules in 19.7 s, 800 ms tasks 2,970 in 15.1 s; inline
#: plans 2,541); larger tasks leave workers idle at the end of a sweep
TARGET_TASK_MS = 800.0
#: rough cost of one simulated step plus a fixed cost per point, for packing tasks
MS_PER_STEP, MS_PER_POINT = 0.008, 0.3
POISSON_IN_FLIGHT = 16
#: keys a point prices itself with an expensive backend (a guess: what the caches miss). Without it a
#: 5 ms-a-key backend packed a sweep's points into a few long tasks, and searches waited on them
#: (96 scenarios, slow-roofline, Ray on 2 CPUs: 57 s, no faster than inline)
PRICED_KEYS_PER_POINT = 10
#: times the driver re-runs a task whose worker, node or result was lost (a failure in our code is not retried)
TASK_RETRIES = 3
#: tasks in flight per CPU, and points queued per CPU before more scenarios are admitted
IN_FLIGHT_PER_CPU, QUEUED_PER_CPU = 2, 4

OnDone = Callable[[SweepItem, list[JobResult]], None]


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
    """What a job's point estimates share, whatever its load (the driver estimates every point it
    queues): arrival, num_prompts, a trace's requests, decode steps a request, prefill steps a
    prompt, pricing ms."""
    w = workload(s, job.max_batched_tokens, 1)
    trace = w.mix.trace if w.mix is not None else None
    lm = s.latency_model(job.layout)
    return (w.arrival, w.num_prompts, None if trace is None else len(trace),
            w.decode_steps if job.role != "prefill" else 0, w.effective_input_length / w.max_batched_tokens,
            lm.cost_per_key_ms * PRICED_KEYS_PER_POINT if shared_backend(lm) else 0.0)


class _Active:
    """The running searches of the admitted scenarios."""

    def __init__(self):
        self.gens, self.waiting, self.results, self.left = {}, {}, {}, {}

    def start(self, item: SweepItem, queue: deque) -> list:
        self.results[item.id] = [None] * len(item.jobs)
        self.left[item.id] = len(item.jobs)
        finished = []
        for j, job in enumerate(item.jobs):
            gen = job_search(item.scenario, job)
            self.gens[(item.id, j)] = (item, gen)
            finished += self._advance((item.id, j), None, queue)
        return finished

    def answer(self, key, n, row, queue: deque) -> list:
        pending = self.waiting[key]
        pending["rows"][n] = row
        if len(pending["rows"]) < len(pending["ns"]):
            return []
        return self._advance(key, pending["rows"], queue)

    def _advance(self, key, rows, queue) -> list:
        item, gen = self.gens[key]
        try:
            ns = next(gen) if rows is None else gen.send(rows)
        except StopIteration as stop:
            del self.gens[key]
            self.waiting.pop(key, None)
            self.results[item.id][key[1]] = stop.value
            self.left[item.id] -= 1
            if self.left[item.id] == 0:
                del self.left[item.id]
                return [(item, self.results.pop(item.id))]
            return []
        self.waiting[key] = {"ns": ns, "rows": {}}
        queue.extend((key, item, n) for n in ns)
        return []


class _Queue(deque):
    """Points waiting for a task, with their estimated work in ms kept as a running total (each
    point's estimate computed once, when it is queued)."""

    ms = 0.0

    def extend(self, entries) -> None:
        for key, item, n in entries:
            job = item.jobs[key[1]]
            ms = estimate_ms(item.scenario, job, n)
            self.append((key, item, n, ms, (item.family, job.max_batched_tokens, job.role, n)))
            self.ms += ms

    def take(self, target_ms: float) -> list:
        """The points of one task, >= `target_ms` of work unless the queue runs out: the oldest point
        with every queued point that shares its plan, then the next oldest... Points of one plan in
        one task are planned once; split over tasks, two workers may both plan it."""
        by_plan: dict[tuple, list] = {}
        for entry in self:
            by_plan.setdefault(entry[4], []).append(entry)
        chunk, ms, taken = [], 0.0, set()
        for plan_key, entries in by_plan.items():
            if ms >= target_ms:
                break
            chunk += entries
            ms += sum(e[3] for e in entries)
            taken.add(plan_key)
        rest = [e for e in self if e[4] not in taken]
        self.clear()
        self.ms = 0.0
        for e in rest:
            self.append(e)
            self.ms += e[3]
        return chunk


def run_inline(items: Iterable[SweepItem], on_done: OnDone, progress=None) -> dict:
    """Every point evaluated in this process, with a local latency cache."""
    collect_rarely()
    pricer = CachedPricer(None)
    active, queue = _Active(), deque()
    started, work = time.perf_counter(), Work()
    take_plans_made()
    for item in items:
        done = active.start(item, queue)
        while queue:
            key, it, n = queue.popleft()
            job = it.jobs[key[1]]
            row = evaluate_point(it.scenario, job, n, pricer)
            done += active.answer(key, n, row, queue)
            if progress:
                progress.point(pricer.take_stats())
        for finished in done:
            on_done(*finished)
    work.add("inline", time.perf_counter() - started, take_plans_made())
    return {"nodes": {"inline": 1}, "retried": 0, "work": work}


class Work:
    """What the workers did: busy seconds per worker, plans made (every one) and distinct plans."""

    def __init__(self):
        self.busy: dict[str, float] = {}
        self.plans_made = 0
        self.distinct: set[str] = set()

    def add(self, worker: str, seconds: float, plans: list[str]) -> None:
        self.busy[worker] = self.busy.get(worker, 0.0) + seconds
        self.plans_made += len(plans)
        self.distinct.update(plans)

    def efficiency(self, wall: float, workers: int) -> float:
        """Busy time over the workers' time: busy / (workers x wall)."""
        return sum(self.busy.values()) / (workers * wall) if wall > 0 and workers else 0.0


def _evaluate_chunk(items, cache):
    """Ray task body: evaluate (key, scenario, job, n) items with the worker's cached pricer."""
    import ray

    global _WORKER_PRICER
    started = time.perf_counter()
    collect_rarely()
    if _WORKER_PRICER is None or _WORKER_PRICER.cache != cache:
        _WORKER_PRICER = CachedPricer(cache)
    fresh: dict[tuple, int] = {}  # a point not measured in this process -> its first item
    for i, (_, s, job, n) in enumerate(items):
        k = point_key(s, job, n)
        if k not in fresh and not measured_before(k):
            fresh[k] = i
    planned = {i: plan_point(*items[i][1:]) for i in fresh.values()}
    _WORKER_PRICER.prefetch([(lm, p.price_keys, p.scheduler.fused) for lm, p in planned.values()])
    rows = []
    for i, (key, s, job, n) in enumerate(items):
        if i in planned:
            lm, p = planned[i]
            row = finish_point(s, job, p, _WORKER_PRICER.lookup(lm, p.price_keys), n)
        else:  # measured here before, or by an item above (of another limit pair)
            row = evaluate_point(s, job, n, _WORKER_PRICER)
        rows.append((key, n, row))
    context = ray.get_runtime_context()
    work = (context.get_worker_id(), time.perf_counter() - started, take_plans_made())
    return rows, _WORKER_PRICER.take_stats(), context.get_node_id(), work


_WORKER_PRICER: CachedPricer | None = None


def _lost_errors() -> tuple:
    """Ray errors that say a task's worker, node or result copy was lost, not that the task failed."""
    from ray import exceptions as e

    return (e.WorkerCrashedError, e.NodeDiedError, e.LocalRayletDiedError, e.ObjectLostError, e.OutOfMemoryError)


def run_ray(items: Iterable[SweepItem], on_done: OnDone, cache, progress=None,
            max_in_flight: int | None = None) -> dict:
    """Fan the points out as Ray tasks of >= TARGET_TASK_MS estimated work, a bounded number in
    flight; admit scenarios while the queue is short. The driver re-runs lost tasks itself (Ray's
    own retries are invisible to it) and counts them: `retried` in the result."""
    import ray

    # SPREAD: a cluster's nodes share the tasks from the start (the default packs a node before using the next)
    task = ray.remote(max_retries=0, scheduling_strategy="SPREAD")(_evaluate_chunk)
    lost_errors = _lost_errors()
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    max_in_flight = max_in_flight or IN_FLIGHT_PER_CPU * cpus
    log.info("Ray: %d CPUs, up to %d tasks in flight", cpus, max_in_flight)
    items = iter(items)
    active, queue, in_flight, nodes = _Active(), _Queue(), {}, {}
    exhausted, retried, work = False, 0, Work()

    while True:
        while not exhausted and (len(queue) < QUEUED_PER_CPU * cpus or queue.ms < 2 * TARGET_TASK_MS * cpus):
            item = next(items, None)
            if item is None:
                exhausted = True
                break
            for finished in active.start(item, queue):
                on_done(*finished)
        while queue and len(in_flight) < max_in_flight:
            if in_flight and not exhausted and queue.ms < TARGET_TASK_MS:
                break  # let work accumulate: a task should carry >= TARGET_TASK_MS
            chunk = [(key, it.scenario, it.jobs[key[1]], n) for key, it, n, _, _ in queue.take(TARGET_TASK_MS)]
            in_flight[task.remote(chunk, cache)] = (chunk, 0)
        if not in_flight:
            if exhausted and not queue:
                break
            continue
        ready, _ = ray.wait(list(in_flight), num_returns=1)
        for ref in ready:
            chunk, attempt = in_flight.pop(ref)
            try:
                rows, stats, node, (worker, busy, plans) = ray.get(ref)
            except lost_errors as lost:
                if attempt == TASK_RETRIES:
                    raise RuntimeError(f"a task of {len(chunk)} points was lost {attempt + 1} times; "
                                       f"last: {type(lost).__name__}") from lost
                log.warning("task lost (%s); running it again", type(lost).__name__)
                in_flight[task.remote(chunk, cache)] = (chunk, attempt + 1)
                retried += 1
                continue
            nodes[node] = nodes.get(node, 0) + 1
            work.add(worker, busy, plans)
            for key, n, row in rows:
                for finished in active.answer(key, n, row, queue):
                    on_done(*finished)
            if progress:
                progress.point(stats, len(rows))
    return {"nodes": nodes, "retried": retried, "work": work, "workers": cpus}
