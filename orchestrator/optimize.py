"""The throughput optimizer: best concurrency per layout and budget, aggregated or disaggregated,
and the prefill/decode instance split (RFC 3.1.6)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.evaluate import evaluate_point, first_failure, meets, workload
from orchestrator.scenario import Layout, Scenario
from orchestrator.search import drive, search
from simulator import decode_qps, make_scheduler, prefill_qps


@dataclass(frozen=True)
class Job:
    """One instance type to search: every limit pair of the scenario shares its evaluated points."""

    role: str
    layout: Layout
    max_batched_tokens: int


@dataclass
class JobResult:
    job: Job
    points: list[dict]
    best: list[dict]


#: evaluate a batch of concurrencies of one job -> rows (inline here; orchestrator.distributed on Ray)
BatchEvaluator = Callable[[Scenario, Job, list[int]], list[dict]]


def inline_evaluator(s: Scenario, job: Job, ns: list[int]) -> list[dict]:
    return [evaluate_point(s, job.layout, job.role, job.max_batched_tokens, n) for n in ns]


@dataclass
class OptimizeResult:
    scenario: Scenario
    points: list[dict] = field(default_factory=list)   # every evaluated point
    best: list[dict] = field(default_factory=list)     # best point per limit pair, role, layout, budget
    splits: list[dict] = field(default_factory=list)   # PD instance splits
    infeasible: list[dict] = field(default_factory=list)  # {ttft_limit_ms, tpot_limit_ms, message}


def plan_jobs(s: Scenario, disagg: bool = False, pd_devices: tuple[int, int] | None = None) -> list[Job]:
    """Aggregated by default; `disagg` searches prefill (TTFT) and decode (TPOT) instances apart;
    `pd_devices=(P, Q)` searches a P-device prefill and a Q-device decode instance."""
    decode_budget = (max(s.max_batched_tokens),)  # chunking does not apply to a decode instance
    if pd_devices:
        plan = [("prefill", [Layout(pd_devices[0], s.pp)], s.max_batched_tokens),
                ("decode", [Layout(pd_devices[1], s.pp)], decode_budget)]
    elif disagg:
        roles = [r for r, lim in (("prefill", s.ttft_limits), ("decode", s.tpot_limits)) if lim]
        plan = [(r, s.layouts(), s.max_batched_tokens if r == "prefill" else decode_budget)
                for r in roles or ["prefill", "decode"]]
    else:
        plan = [("agg", s.layouts(), s.max_batched_tokens)]
    return [Job(role, layout, b) for role, layouts, budgets in plan for layout in layouts for b in budgets]


def memory_bound(s: Scenario, job: Job) -> int | None:
    """A concurrency above which the KV cache cannot fit, where one is provable: a decode instance
    holds every prompt from the start; under a breadth-first policy with >= 2 chunks every request
    holds its first chunk (and cached prefix) before any request leaves. None where no bound holds."""
    scheduler = make_scheduler(s.scheduler)
    mem = s.latency_model(job.layout).memory_for(job.max_batched_tokens)
    w = workload(s, job.max_batched_tokens, 1)
    if job.role == "decode":
        held = s.input_length + 1
    elif scheduler.requeue and w.prefill_num_chunks >= 2:
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


def optimize(s: Scenario, evaluator: BatchEvaluator = inline_evaluator, width: int = 1,
             disagg: bool = False, pd_devices: tuple[int, int] | None = None) -> OptimizeResult:
    """Search every job of the scenario inline, then assemble the answer."""
    s.validate()
    results = []
    for job in plan_jobs(s, disagg, pd_devices):
        results.append(drive(job_search(s, job, width), lambda ns, j=job: evaluator(s, j, ns)))
    return assemble(s, results, pd_devices)


def assemble(s: Scenario, results: list[JobResult], pd_devices: tuple[int, int] | None = None) -> OptimizeResult:
    out = OptimizeResult(s)
    for r in results:
        out.points.extend(r.points)
        out.best.extend(r.best)
    _explain_infeasible(s, out)
    if pd_devices:
        out.splits = pd_splits(s, out.best, pd_devices)
    return out


def _explain_infeasible(s: Scenario, result: OptimizeResult) -> None:
    """For a limit pair nothing meets: which limit fails first and the closest point (lowest concurrency)."""
    for ttft, tpot in s.limit_pairs():
        if any(b["ttft_limit_ms"] == ttft and b["tpot_limit_ms"] == tpot for b in result.best):
            continue
        lowest = [p for p in result.points if p["concurrency"] == 1] or result.points
        closest = min(lowest, key=lambda p: (p["ttft_ms"] if ttft else 0) + (p["tpot_ms"] if tpot else 0))
        failure = first_failure(closest, ttft, tpot) or "limits"
        limits = " and ".join(f"{n} <= {v:g} ms" for n, v in (("TTFT", ttft), ("TPOT", tpot)) if v is not None)
        result.infeasible.append({"ttft_limit_ms": ttft, "tpot_limit_ms": tpot, "message": (
            f"no configuration meets {limits or 'memory'}: {failure} fails first; closest point "
            f"{closest['role']} tp{closest['tp']} concurrency {closest['concurrency']} "
            f"B={closest['max_batched_tokens']}: "
            f"TTFT {closest['ttft_ms']:.1f} ms, TPOT {closest['tpot_ms']:.2f} ms, "
            f"KV {closest['peak_kv_tokens']:.0f} of {closest['kv_capacity_tokens']} tokens")})


def _best_of(best: list[dict], role: str, ttft, tpot) -> dict | None:
    rows = [b for b in best if b["role"] == role and b["ttft_limit_ms"] == ttft and b["tpot_limit_ms"] == tpot]
    return max(rows, key=lambda b: b["request_throughput"], default=None)


def pd_splits(s: Scenario, best: list[dict], pd_devices: tuple[int, int]) -> list[dict]:
    """For each limit pair: P QPS from the chunked-prefill TTFT, D QPS from the TPOT (RFC formulas),
    then the integer split of instances that serves the most requests per second per device."""
    p_dev, d_dev = pd_devices
    out = []
    for ttft, tpot in s.limit_pairs():
        pre, dec = (_best_of(best, role, ttft, tpot) for role in ("prefill", "decode"))
        if pre is None or dec is None:
            continue
        p_qps = prefill_qps(pre["concurrency"], pre["ttft_ms"])
        d_qps = decode_qps(dec["concurrency"], dec["tpot_ms"], s.output_length)
        choice = None
        for n_p in range(1, s.num_devices // p_dev + 1):
            n_d = (s.num_devices - n_p * p_dev) // d_dev
            if n_d < 1:
                break
            served = min(n_p * p_qps, n_d * d_qps)
            used = n_p * p_dev + n_d * d_dev
            key = (served / used, served)
            if choice is None or key > choice[0]:
                choice = (key, n_p, n_d, served, used)
        if choice is None:
            continue
        _, n_p, n_d, served, used = choice
        out.append({
            "ttft_limit_ms": ttft, "tpot_limit_ms": tpot, "prefill_tp": p_dev, "decode_tp": d_dev,
            "prefill_concurrency": pre["concurrency"], "decode_concurrency": dec["concurrency"],
            "max_batched_tokens": pre["max_batched_tokens"], "ttft_ms": pre["ttft_ms"], "tpot_ms": dec["tpot_ms"],
            "p_qps": p_qps, "d_qps": d_qps, "pd_ratio": d_qps / p_qps,
            "prefill_instances": n_p, "decode_instances": n_d, "devices_used": used,
            "served_qps": served, "served_qps_per_device": served / used,
            "output_throughput": served * s.output_length,
            "output_throughput_per_device": served * s.output_length / used,
        })
    return out
