"""The throughput optimizer: best concurrency per job (instance layout, role, budget) under every
limit pair; the search mode (orchestrator.modes) decides the jobs and assembles the answer."""

from __future__ import annotations

import logging
from collections.abc import Callable

from orchestrator.evaluate import evaluate_point, meets, workload
from orchestrator.jobs import Job, JobResult, OptimizeResult
from orchestrator.modes import Aggregated, Mode
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
    return max(1, mem.kv_capacity_tokens // held)


def job_search(s: Scenario, job: Job, width: int = 1):
    """Search generator for one job over every limit pair (see orchestrator.search); the probe
    stops at the memory bound where one exists."""
    rows: dict[int, dict] = {}
    best = []
    bound = memory_bound(s, job)
    cap = s.max_concurrency if bound is None else min(s.max_concurrency, bound)
    for ttft, tpot in s.limit_pairs():
        found = yield from search(lambda r, a=ttft, b=tpot: meets(r, a, b), cap, width, rows)
        if found.best is not None:
            best.append({**found.best, "ttft_limit_ms": ttft, "tpot_limit_ms": tpot})
    return JobResult(job, [rows[n] for n in sorted(rows)], best)


def optimize(s: Scenario, mode: Mode | None = None, evaluator: BatchEvaluator = inline_evaluator,
             width: int = 1) -> OptimizeResult:
    """Search every job of the scenario inline, then let the mode assemble the answer."""
    mode = mode or Aggregated()
    s.validate()
    mode.validate(s)
    results = []
    for job in mode.jobs(s):
        results.append(drive(job_search(s, job, width), lambda ns, j=job: evaluator(s, j, ns)))
        best = [b["concurrency"] for b in results[-1].best]
        log.info("%s tp%d B=%d: %d points, best concurrency per limit pair %s", job.role, job.layout.tp,
                 job.max_batched_tokens, len(results[-1].points), best)
    return mode.assemble(s, results)
