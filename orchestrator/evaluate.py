"""One evaluated point: a scenario's instance at one concurrency, simulated and checked for memory."""

from __future__ import annotations

from latency.memory import GIB
from orchestrator.jobs import Job
from orchestrator.scenario import Layout, Scenario
from simulator import Workload, plan, price, replay, step_times

PHASE = {"agg": "both", "prefill": "prefill", "decode": "decode"}


def workload(s: Scenario, max_batched_tokens: int, concurrency: int) -> Workload:
    return Workload(s.input_length, s.output_length, max_batched_tokens, concurrency, s.prefix_cache_hit_rate,
                    s.mtp_tokens, s.mtp_acceptance_rates)


def direct_pricer(lm, keys, fused: bool):
    """Price a plan's keys with the latency model itself, in one call."""
    return price(lm, keys, fused)


def plan_point(s: Scenario, job: Job, concurrency: int):
    """Phase one of a point: the latency model and the planned schedule (no prices yet)."""
    w = workload(s, job.max_batched_tokens, concurrency)
    return s.latency_model(job.layout), plan(w, s.make_scheduler(), phase=PHASE[job.role],
                                             decode_context=s.decode_context)


def finish_point(s: Scenario, job: Job, lm, planned, prices) -> dict:
    """Phase two: replay the plan with its prices; the row of the point."""
    m = replay(planned, step_times(planned, prices), job.layout.devices)
    return point_row(s, job.layout, job.role, m, lm.memory_for(planned.workload.max_batched_tokens))


def evaluate_point(s: Scenario, job: Job, concurrency: int, pricer=direct_pricer) -> dict:
    """Simulate one instance of `job` at `concurrency`; throughputs in the row are for all dp instances.
    `pricer(lm, keys, fused)` prices the plan's distinct keys (a cache may stand in front)."""
    lm, planned = plan_point(s, job, concurrency)
    return finish_point(s, job, lm, planned, pricer(lm, planned.price_keys, planned.scheduler.fused))


def point_row(s: Scenario, layout: Layout, role: str, m, mem) -> dict:
    dp = s.num_devices // layout.devices
    kv_gib = m.peak_kv_tokens * mem.kv_bytes_per_token / GIB
    return {
        "role": role, "tp": layout.tp, "pp": layout.pp, "dp": dp, "ep": layout.ep,
        "concurrency": m.concurrency, "max_batched_tokens": m.max_batched_tokens,
        "ttft_ms": m.ttft_ms, "tpot_ms": m.tpot_ms,
        "ttft_p50_ms": m.ttft_p50_ms, "ttft_p90_ms": m.ttft_p90_ms, "ttft_p99_ms": m.ttft_p99_ms,
        "tpot_p50_ms": m.tpot_p50_ms, "tpot_p90_ms": m.tpot_p90_ms, "tpot_p99_ms": m.tpot_p99_ms,
        "makespan_ms": m.makespan_ms,
        "request_throughput": m.request_throughput * dp,
        "output_throughput": m.output_throughput * dp,
        "output_throughput_per_device": m.output_throughput_per_device,
        "num_steps": m.num_steps, "prefill_num_chunks": m.prefill_num_chunks,
        "effective_input_length": m.effective_input_length,
        "peak_kv_tokens": m.peak_kv_tokens, "kv_capacity_tokens": mem.kv_capacity_tokens,
        "weights_gib": mem.weights_gib, "kv_gib": kv_gib, "activation_gib": mem.activation_gib,
        "available_gib": mem.hbm_gib - mem.reserved_gib - mem.weights_gib - mem.activation_gib - kv_gib,
        "fits_memory": m.peak_kv_tokens <= mem.kv_capacity_tokens,
    }


def meets(row: dict, ttft_limit: float | None, tpot_limit: float | None) -> bool:
    """Memory, then the limits that apply to the row's role (prefill: TTFT; decode: TPOT; agg: both)."""
    return first_failure(row, ttft_limit, tpot_limit) is None


def first_failure(row: dict, ttft_limit: float | None, tpot_limit: float | None) -> str | None:
    if not row["fits_memory"]:
        return "memory"
    if ttft_limit is not None and row["role"] != "decode" and row["ttft_ms"] > ttft_limit:
        return "TTFT"
    if tpot_limit is not None and row["role"] != "prefill" and row["tpot_ms"] > tpot_limit:
        return "TPOT"
    return None
