"""Steady load in the optimizer: closed-loop concurrency search, Poisson capacity search, PD split."""

import pytest

from orchestrator.evaluate import evaluate_point, grid_rate
from orchestrator.jobs import Job
from orchestrator.modes import make_mode
from orchestrator.optimize import optimize
from orchestrator.scenario import Layout, Scenario
from orchestrator.spec import expand

ISSUE = Scenario("Qwen/Qwen3-32B", "H100_SXM", 2, 1024, 512, tp_sizes=(2,), ttft_limits=(1000.0,),
                 tpot_limits=(50.0,), scheduler="token-budget")


def test_closed_loop_admits_far_more_than_the_burst_window():
    """The issue's case: measured vLLM runs meet both limits at concurrency 128; a burst says 29."""
    (burst,) = optimize(ISSUE).best
    (closed,) = optimize(ISSUE.with_(arrival="closed")).best
    assert burst["concurrency"] < 40
    assert closed["concurrency"] >= 128 and closed["ttft_ms"] <= 1000 and closed["tpot_ms"] <= 50
    assert closed["output_throughput"] > 2 * burst["output_throughput"]
    assert closed["steady"] and closed["measured_requests"] == 6 * closed["concurrency"]


def test_poisson_capacity_is_the_highest_rate_within_the_limits():
    s = Scenario("Qwen/Qwen3-8B", "H200_SXM", 1, 2048, 128, ttft_limits=(500.0,), tpot_limits=(30.0,),
                 scheduler="token-budget", arrival="poisson", num_prompts=200, slo_percentile=90.0)
    r = optimize(s)
    (best,) = r.best
    assert best["ttft_p90_ms"] <= 500 and best["tpot_p90_ms"] <= 30 and best["ttft_slo_ms"] == best["ttft_p90_ms"]
    n = next(k for k in range(1, 400) if grid_rate(k) == pytest.approx(best["request_rate"]))
    above = evaluate_point(s, Job("agg", Layout(1), 8192), n + 1)
    assert above["ttft_p90_ms"] > 500 or above["tpot_p90_ms"] > 30 or not above["fits_memory"]
    assert best["request_throughput"] == pytest.approx(best["request_rate"], rel=0.25)  # it serves what comes


def test_pd_split_under_steady_load_uses_each_instance_throughput():
    s = ISSUE.with_(num_devices=4, tp_sizes=(), arrival="closed")
    r = optimize(s, make_mode("pd", prefill_devices=2, decode_devices=2))
    (split,) = r.splits
    pre = next(b for b in r.best if b["role"] == "prefill")
    dec = next(b for b in r.best if b["role"] == "decode")
    assert split["p_qps"] == pytest.approx(pre["request_throughput"] / pre["dp"])
    assert split["d_qps"] == pytest.approx(dec["request_throughput"] / dec["dp"])
    assert split["served_qps"] == pytest.approx(min(split["prefill_instances"] * split["p_qps"],
                                                    split["decode_instances"] * split["d_qps"]))


def test_sweep_spec_takes_the_steady_keys():
    (item,) = expand({"grid": {"model": "Qwen/Qwen3-8B", "device": "H200_SXM", "num_devices": 1,
                               "input_length": 1024, "output_length": 64, "arrival": "poisson",
                               "num_prompts": 100, "slo_percentile": 99.0, "burstiness": 0.5, "engine": "vllm"}})
    s = item.scenario
    assert (s.arrival, s.num_prompts, s.slo_percentile, s.burstiness, s.engine) == ("poisson", 100, 99.0, 0.5, "vllm")
