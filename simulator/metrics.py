"""What a simulation reports (RFC 3.1.5), computed from planned steps and their durations."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Metrics:
    """Times in ms, throughputs per second. `peak_kv_tokens` counts every token held in KV at the
    fullest step (cached prefix included)."""

    concurrency: int
    ttft_ms: float
    tpot_ms: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p90_ms: float
    tpot_p99_ms: float
    makespan_ms: float
    request_throughput: float
    output_throughput: float
    output_throughput_per_device: float
    num_devices: int
    num_steps: int
    prefill_num_chunks: int
    effective_input_length: int
    max_batched_tokens: int
    peak_kv_tokens: float

    def as_dict(self) -> dict:
        return asdict(self)


def _weighted_percentiles(values: np.ndarray, counts: np.ndarray) -> list[float]:
    order = np.argsort(values, kind="stable")
    v, c = values[order], np.cumsum(counts[order])
    total = c[-1]
    # nearest-rank percentile over the per-request sample: the ceil(p * n / 100)-th smallest value
    return [float(v[np.searchsorted(c, -(-p * int(total) // 100), side="left")]) for p in PERCENTILES]


def replay(plan, durations: np.ndarray, num_devices: int = 1) -> Metrics:
    """Times from step durations: a group's first token / finish is the end of its step."""
    w = plan.workload
    ends = np.concatenate(([0.0], np.cumsum(durations)))
    first = ends[plan.first_step + 1]
    finish = ends[plan.finish_step + 1]
    counts = plan.counts
    n = int(counts.sum())
    ttft = first if plan.phase != "decode" else np.zeros_like(first)
    r = w.decode_tokens if plan.phase != "prefill" else 0
    tpot = (finish - first) / r if r else np.zeros_like(first)
    makespan = float(ends[-1])
    req_tput = 1000.0 * n / makespan if makespan > 0 else float("inf")
    out_tokens = w.output_length if plan.phase != "prefill" else 1
    out_tput = req_tput * out_tokens
    tp = _weighted_percentiles(ttft, counts)
    dp = _weighted_percentiles(tpot, counts)
    return Metrics(
        concurrency=w.concurrency,
        ttft_ms=float((ttft * counts).sum() / n),
        tpot_ms=float((tpot * counts).sum() / n),
        ttft_p50_ms=tp[0], ttft_p90_ms=tp[1], ttft_p99_ms=tp[2],
        tpot_p50_ms=dp[0], tpot_p90_ms=dp[1], tpot_p99_ms=dp[2],
        makespan_ms=makespan,
        request_throughput=req_tput,
        output_throughput=out_tput,
        output_throughput_per_device=out_tput / num_devices,
        num_devices=num_devices,
        num_steps=plan.num_steps,
        prefill_num_chunks=w.prefill_num_chunks,
        effective_input_length=w.effective_input_length,
        max_batched_tokens=w.max_batched_tokens,
        peak_kv_tokens=plan.peak_kv_tokens,
    )
