"""Disaggregated prefill/decode (RFC 3.1.6): QPS of each instance type and their ratio."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PDRatio:
    p_qps: float
    d_qps: float

    @property
    def pd_ratio(self) -> float:
        """Prefill instances needed per decode instance: D_QPS / P_QPS."""
        return self.d_qps / self.p_qps


def prefill_qps(concurrency: int, ttft_ms: float) -> float:
    """P_QPS = p_conc / ttft * 1000 (ttft from the chunked-prefill timeline)."""
    if ttft_ms <= 0:
        raise ValueError(f"ttft_ms must be > 0, got {ttft_ms}")
    return concurrency / ttft_ms * 1000.0


def decode_qps(concurrency: int, tpot_ms: float, output_length: int) -> float:
    """D_QPS = d_conc / (tpot * max(O - 1, 1)) * 1000."""
    if tpot_ms <= 0:
        raise ValueError(f"tpot_ms must be > 0, got {tpot_ms}")
    return concurrency / (tpot_ms * max(output_length - 1, 1)) * 1000.0


def pd_ratio(p_concurrency: int, ttft_ms: float, d_concurrency: int, tpot_ms: float,
             output_length: int) -> PDRatio:
    return PDRatio(prefill_qps(p_concurrency, ttft_ms), decode_qps(d_concurrency, tpot_ms, output_length))
