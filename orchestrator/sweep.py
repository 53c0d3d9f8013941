"""Run a sweep: expand the spec, skip finished scenarios, drive the searches inline or on Ray,
write each finished scenario to the dataset."""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.dataset import Dataset
from orchestrator.jobs import SweepItem
from orchestrator.progress import Progress
from orchestrator.runner import run_inline, run_ray

log = logging.getLogger(__name__)
#: infeasible results the summary keeps to print (all of them are in best/)
MAX_INFEASIBLE = 20


@dataclass
class SweepSummary:
    output: str
    run_id: str
    total: int
    skipped: int
    written: int
    infeasible: list[dict] = field(default_factory=list)  # the first MAX_INFEASIBLE of this run (rows stay on disk)
    nodes: dict = field(default_factory=dict)
    retried: int = 0  # Ray tasks run again after their worker, node or result was lost
    points: int = 0
    priced: int = 0
    lookups: int = 0
    round_trips: int = 0  # calls to the shared latency cache
    cache: list = field(default_factory=list)  # its shards' stats after a Ray sweep
    seconds: float = 0.0
    plans_made: int = 0      # schedules planned, by every worker
    distinct_plans: int = 0  # of them distinct: made > distinct is work done twice
    busy: dict = field(default_factory=dict)  # busy seconds per worker
    workers: int = 1
    efficiency: float = 0.0  # busy / (workers x wall)
    idle_tail: float = 0.0  # seconds from the first worker running out of work to the end


class _Sink:
    """Where finished scenarios go: the dataset (written here, or by a worker that reached it) and the
    summary's counts. The driver keeps no row it does not need: flat memory."""

    def __init__(self, data: Dataset, per_request: bool, summary: SweepSummary, bar: Progress, lock):
        self.data, self.per_request, self.summary, self.bar, self.lock = data, per_request, summary, bar, lock
        # where workers write themselves (orchestrator.runner.Searcher): a local output resolved (their
        # working directory is not ours), an object store by its URI
        self.root = data.root if "://" in data.root else data.base

    def write(self, item: SweepItem, result) -> None:
        best = self.data.write(item, result, self.per_request)
        self.written(item, [b for b in best if not b["feasible"]])

    def written(self, item: SweepItem, infeasible: list[dict]) -> None:
        room = MAX_INFEASIBLE - len(self.summary.infeasible)
        self.summary.infeasible += infeasible[: max(room, 0)]
        self.summary.written += 1
        self.bar.scenario_done()
        self.lock.beat()


def default_output() -> Path:
    return Path("results") / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def init_ray(address: str | None = None, num_cpus: int | None = None):
    """Join `address` (or RAY_ADDRESS), else start Ray embedded on this machine; reuse a running one."""
    import ray

    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    return ray


def run_sweep(items: list[SweepItem], output: str | Path, resume: bool = False, backend: str = "ray",
              progress: bool = True, spec: dict | None = None, per_request: bool = False) -> SweepSummary:
    """Evaluate every item not finished in `output`; each finished scenario is written at once
    (with `per_request`, also the requests of its best points)."""
    data = Dataset(output)
    lock = data.lock()
    lock.acquire(resume)
    try:
        return _run(items, data, lock, resume, backend, progress, spec, per_request)
    finally:
        lock.release()


def _run(items, data: Dataset, lock, resume: bool, backend: str, progress: bool, spec,
         per_request: bool = False) -> SweepSummary:
    output = data.root
    finished = data.finished_ids()
    if finished and not resume:
        raise FileExistsError(f"{output} already holds {len(finished)} finished scenarios; "
                              "pass --resume to continue it, or choose another --output")
    # scenarios of one plan family share their plans: run them together so the per-process plan memo hits
    todo = sorted((it for it in items if it.id not in finished), key=lambda it: it.family)
    summary = SweepSummary(str(output), uuid.uuid4().hex[:12], len(items), len(items) - len(todo), 0)
    bar = Progress(len(items), enabled=progress)
    bar.bar.update(summary.skipped)
    started = time.perf_counter()

    log.info("sweep %s: %d scenarios, %d already finished, backend %s", output, len(items), summary.skipped, backend)

    sink = _Sink(data, per_request, summary, bar, lock)
    try:
        if backend == "inline":
            info = run_inline(todo, sink, progress=bar)
        else:
            from orchestrator.cache import get_cache

            cache = get_cache()
            info = run_ray(todo, sink, cache, progress=bar)
            summary.cache = cache.stats()
        summary.nodes, summary.retried = info["nodes"], info["retried"]
        work, summary.workers = info["work"], info.get("workers", 1)
        summary.plans_made, summary.distinct_plans = work.plans_made, len(work.distinct)
        summary.busy = {w[:12]: round(b, 3) for w, b in sorted(work.busy.items())}
        summary.efficiency = work.efficiency(time.perf_counter() - started, summary.workers)
        summary.idle_tail = work.tail
    finally:
        bar.close()
        summary.points, summary.priced, summary.lookups = bar.points, bar.priced, bar.lookups
        summary.round_trips = bar.round_trips
        summary.seconds = time.perf_counter() - started
        data.write_manifest({"run_id": summary.run_id, "spec": spec, "backend": backend, "total": summary.total,
                             "skipped": summary.skipped, "written": summary.written, "nodes": summary.nodes,
                             "tasks_retried": summary.retried,
                             "points": summary.points, "keys_priced": summary.priced,
                             "cache_round_trips": summary.round_trips, "seconds": summary.seconds,
                             "plans_made": summary.plans_made, "distinct_plans": summary.distinct_plans,
                             "workers": summary.workers, "busy_seconds": summary.busy,
                             "efficiency": summary.efficiency, "idle_tail_seconds": summary.idle_tail})
    return summary
