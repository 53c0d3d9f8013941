"""One point's tables: its requests and its steps, as simulated (what `estimate`'s per-request table and a
sweep's request tables show), and the point a result row was evaluated at."""

from __future__ import annotations

from orchestrator.evaluate import plan_point, planned_prices
from orchestrator.jobs import Job
from orchestrator.scenario import Layout, Scenario
from simulator import per_request, per_step, step_times


def point_tables(s: Scenario, job: Job, n: int, rate: float | None = None) -> tuple[dict, dict]:
    """One point request by request and step by step (columns of arrays; see simulator.per_request)."""
    lm, planned = plan_point(s, job, n, rate)
    durations = step_times(planned, planned_prices(lm, planned))
    return per_request(planned, durations), per_step(planned, durations)


def row_point(row: dict) -> tuple[Job, int, float | None]:
    """The job and search point (concurrency or rate per attention rank) a point row was evaluated at."""
    layout = Layout(row["tp"], row["pp"], row["ep"], row.get("attention_dp", 1))
    ranks = layout.attention_dp
    rate = row["request_rate"] / ranks if row["arrival"] == "poisson" else None
    return Job(row["role"], layout, row["max_batched_tokens"]), row["concurrency"] // ranks, rate
