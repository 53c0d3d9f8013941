"""The throughput optimizer: best concurrency per job (instance layout, role, budget) under every
limit pair; the search mode (orchestrator.modes) decides the jobs and assembles the answer."""

from __future__ import annotations

import logging
from collections.abc import Callable

from orchestrator.evaluate import evaluate_point, limit_margin, meets, timed, workload
from orchestrator.forked import can_fork, count_evaluated, forked_map
from orchestrator.jobs import Job, JobResult, OptimizeResult
from orchestrator.modes import Aggregated, Mode
from orchestrator.progress import SearchProgress
from orchestrator.scenario import Scenario
from orchestrator.search import drive, search

log = logging.getLogger(__name__)
#: evaluate a batch of concurrencies of one job -> rows (inline here; orchestrator.runner on Ray)
BatchEvaluator = Callable[[Scenario, Job, list[int]], list[dict]]


def inline_evaluator(s: Scenario, job: Job, ns: list[int]) -> list[dict]:
    return [evaluate_point(s, job, n) for n in ns]


def memory_bound(s: Scenario, job: Job) -> int | None:
    """A concurrency above which the KV cache cannot fit, where one is provable: a decode instance
    holds every prompt from the start; under a breadth-first policy with >= 2 chunks every request
    holds its first chunk (and cached prefix) before any request leaves. None where no bound holds
    (and for a Poisson search, whose points are rates)."""
    if s.arrival == "poisson":
        return None
    mem = s.latency_model(job.layout).memory_for(job.max_batched_tokens)
    w = workload(s, job.max_batched_tokens, 1)
    if job.role == "decode":
        held = s.length_bounds("input_length")[0] + 1
    elif s.make_scheduler().requeue and w.prefill_num_chunks >= 2 and s.request_mix is None:
        held = w.cached_prefix_tokens + w.chunk_plan()[0].query_len
    else:
        return None
    return max(1, mem.kv_capacity_tokens // (held + mem.state_tokens))  # each request's state beside its KV


def job_search(s: Scenario, job: Job, width: int = 1):
    """Search generator for one job over every limit pair (see orchestrator.search); the probe
    stops at the memory bound where one exists. A timed search aims at the limits instead of
    doubling past them: its plans are its own, priced with its layout. An untimed one doubles, so
    the scenarios of a plan family probe the same concurrencies and share their plans. Both narrow
    their bracket where the limits' lines cross (orchestrator.search)."""
    rows: dict[int, dict] = {}
    best = []
    bound = memory_bound(s, job)
    cap = s.max_concurrency if bound is None else min(s.max_concurrency, bound)
    aims = timed(s)
    for ttft, tpot in s.limit_pairs():
        found = yield from search(lambda r, a=ttft, b=tpot: meets(r, a, b), cap, width, rows,
                                  margin=lambda r, a=ttft, b=tpot: limit_margin(r, a, b), aim=aims)
        if found.best is not None:
            best.append({**found.best, "ttft_limit_ms": ttft, "tpot_limit_ms": tpot})
    return JobResult(job, [rows[n] for n in sorted(rows)], best)


def optimize(s: Scenario, mode: Mode | None = None, evaluator: BatchEvaluator = inline_evaluator,
             width: int = 1, processes: int = 1, progress: SearchProgress | None = None) -> OptimizeResult:
    """Search every job of the scenario, then let the mode assemble the answer. With `processes` > 1
    (and the inline evaluator) the jobs are shared out over forked processes, those of one budget
    together (they share plans); the answer is the same, job for job. `progress` hears of every point
    evaluated and every job done."""
    mode = mode or Aggregated()
    s.validate()
    mode.validate(s)
    jobs = list(mode.jobs(s))
    groups = _groups(s, jobs)
    progress = progress or SearchProgress(enabled=False)
    progress.begin(len(jobs))
    if processes > 1 and evaluator is inline_evaluator and len(groups) > 1 and can_fork():
        results = _search_in_processes(s, jobs, groups, width, processes, progress)
    else:
        results = []
        for job in jobs:
            results.append(search_job(s, job, evaluator, width, progress.update))
            progress.update(jobs=1)
    for job, result in zip(jobs, results, strict=True):
        log.info("%s tp%d B=%d: %d points, best concurrency per limit pair %s", job.role, job.layout.tp,
                 job.max_batched_tokens, len(result.points), [b["concurrency"] for b in result.best])
    return mode.assemble(s, results)


def _groups(s: Scenario, jobs: list[Job]) -> list[list[int]]:
    """Jobs searched in one process: those of one budget share their untimed plans; a timed plan
    (priced while planned, so it depends on the job's layout) is its job's alone, so timed jobs go one
    to a group and spread over the processes."""
    if timed(s):
        return [[i] for i in range(len(jobs))]
    groups: dict[int, list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault(job.max_batched_tokens, []).append(i)
    return list(groups.values())


def search_job(s: Scenario, job: Job, evaluator: BatchEvaluator = inline_evaluator, width: int = 1,
               evaluated: Callable[[int], None] | None = None) -> JobResult:
    """One job's search, `evaluated` told how many points each batch evaluated."""

    def evaluate(ns: list[int]) -> list[dict]:
        rows = evaluator(s, job, ns)
        if evaluated is not None:
            evaluated(len(ns))
        return rows

    return drive(job_search(s, job, width), evaluate)


def _search_group(s: Scenario, jobs: list[Job], width: int) -> list[JobResult]:
    return [search_job(s, job, width=width, evaluated=count_evaluated) for job in jobs]


def _search_in_processes(s: Scenario, jobs: list[Job], groups: list[list[int]], width: int,
                         processes: int, progress: SearchProgress) -> list[JobResult]:
    """The groups searched in forked processes, largest first."""
    results: list[JobResult | None] = [None] * len(jobs)
    largest_first = sorted(groups, key=lambda g: -sum(_reach(s, jobs[i]) for i in g))
    found = forked_map(_search_group, [(s, [jobs[i] for i in g], width) for g in largest_first], processes, progress,
                       [len(g) for g in largest_first])
    for g, group_results in zip(largest_first, found, strict=True):
        for i, result in zip(g, group_results, strict=True):
            results[i] = result
    return results


def _reach(s: Scenario, job: Job) -> int:
    """The KV tokens an instance of the job holds: how far its search climbs in concurrency, so how
    much work it is (the groups are handed out largest first, so no large one starts last)."""
    return s.latency_model(job.layout).memory_for(job.max_batched_tokens).kv_capacity_tokens
