"""The chunked-prefill timeline: workload + scheduler + latency -> TTFT / TPOT / throughput."""

from __future__ import annotations

from simulator.disagg import PDRatio, decode_qps, pd_ratio, prefill_qps
from simulator.frontend import Frontend
from simulator.metrics import Metrics, per_request, per_step, replay
from simulator.pricing import PRICERS, StepPricer, price, step_times
from simulator.scheduler import (
    SCHEDULERS,
    DecodeFirstWithSlack,
    PrefillFirst,
    Scheduler,
    SchedulerState,
    StepDecision,
    TokenBudget,
    make_scheduler,
)
from simulator.timeline import Plan, plan
from simulator.workload import PrefillChunk, Workload, chunk_plan

__all__ = [
    "PRICERS", "SCHEDULERS", "DecodeFirstWithSlack", "Frontend", "Metrics", "PDRatio", "Plan", "PrefillChunk",
    "PrefillFirst", "Scheduler", "SchedulerState", "StepDecision", "StepPricer", "TokenBudget", "Workload",
    "chunk_plan", "decode_qps", "make_scheduler", "pd_ratio", "per_request", "per_step", "plan", "prefill_qps", "price",
    "replay", "simulate", "step_times",
]


def simulate(workload: Workload, latency, scheduler: Scheduler | None = None, *, phase: str = "both",
             decode_context: str = "mean", num_devices: int | None = None, slo_percentile: float | None = None,
             limits: tuple = (None, None)) -> Metrics:
    """Plan the schedule, price its distinct keys in ONE batched call, replay to get the metrics.
    A Poisson workload depends on time, so its steps are priced (once per distinct shape) as planned.

    `latency` is a latency model (`latency_ms(keys)`) or a callable `keys -> ms`.
    """
    scheduler = scheduler or DecodeFirstWithSlack()
    devices = num_devices if num_devices is not None else getattr(latency, "num_devices", 1)
    if workload.timed:
        pricer = StepPricer(latency, scheduler)
        p = plan(workload, scheduler, phase=phase, decode_context=decode_context, step_ms=pricer)
        prices = pricer.prices(p)
    else:
        p = plan(workload, scheduler, phase=phase, decode_context=decode_context)
        prices = price(latency, p.price_keys, p.scheduler.fused)
    return replay(p, step_times(p, prices), devices, slo_percentile, limits)
