"""Steady load: closed loops and Poisson streams against hand-derivable cases."""

import pytest

from simulator import DecodeFirstWithSlack, TokenBudget, Workload, simulate
from tests.simulator.test_timeline import affine

POLICIES = [DecodeFirstWithSlack(), TokenBudget()]


@pytest.mark.parametrize("policy", POLICIES)
def test_closed_loop_of_one_runs_requests_one_after_another(policy):
    one = simulate(Workload(300, 20, 128, 1), affine, policy)
    loop = simulate(Workload(300, 20, 128, 1, arrival="closed", num_prompts=7), affine, policy)
    assert loop.makespan_ms == pytest.approx(7 * one.makespan_ms)
    assert loop.ttft_ms == pytest.approx(one.ttft_ms) and loop.ttft_p99_ms == pytest.approx(one.ttft_ms)
    assert loop.tpot_ms == pytest.approx(one.tpot_ms)
    assert loop.e2e_ms == pytest.approx(one.makespan_ms)
    assert loop.steady and loop.measured_requests == 5  # the first and the last request are left out
    assert loop.request_throughput == pytest.approx(1000 / one.makespan_ms)


@pytest.mark.parametrize("policy", POLICIES)
def test_closed_loop_with_as_many_prompts_as_concurrency_is_the_burst(policy):
    burst = simulate(Workload(500, 30, 256, 6), affine, policy).as_dict()
    closed = simulate(Workload(500, 30, 256, 6, arrival="closed", num_prompts=6), affine, policy).as_dict()
    for key in ("arrival", "num_prompts", "steady", "measured_requests"):
        burst.pop(key), closed.pop(key)
    assert closed == pytest.approx(burst)


@pytest.mark.parametrize("policy", POLICIES)
def test_poisson_at_a_tiny_rate_has_no_queueing(policy):
    alone = simulate(Workload(200, 40, 512, 1), affine, policy)
    stream = simulate(Workload(200, 40, 512, 1, arrival="poisson", num_prompts=50, request_rate=1e-4), affine,
                      policy)
    assert stream.ttft_p99_ms == pytest.approx(alone.ttft_ms) and stream.ttft_p50_ms == pytest.approx(alone.ttft_ms)
    assert stream.tpot_ms == pytest.approx(alone.tpot_ms)
    assert stream.request_throughput == pytest.approx(1e-4, rel=0.5)  # the offered rate, give or take the sample


def test_poisson_is_deterministic_for_a_seed_and_queues_when_loaded():
    def run(rate, seed=1):
        return simulate(Workload(200, 40, 512, 1, arrival="poisson", num_prompts=200, request_rate=rate,
                                 seed=seed), affine)

    assert run(5.0).as_dict() == run(5.0).as_dict()
    assert run(5.0).ttft_ms != run(5.0, seed=2).ttft_ms
    ttfts = [run(r).ttft_p90_ms for r in (0.01, 0.3, 3.0)]
    assert ttfts[0] < ttfts[1] < ttfts[2]


def test_steady_ttft_is_about_one_step_not_a_burst_queue():
    """Under a closed loop a request waits about a step, in a burst it waits for the prefills ahead."""
    burst = simulate(Workload(1024, 256, 8192, 64), affine)
    closed = simulate(Workload(1024, 256, 8192, 64, arrival="closed", num_prompts=512), affine)
    assert closed.ttft_ms < burst.ttft_ms / 3


def test_goodput_and_slo_percentile():
    w = Workload(2000, 40, 512, 4, arrival="closed", num_prompts=40)
    m = simulate(w, affine, slo_percentile=90, limits=(None, None))
    assert m.goodput == pytest.approx(m.request_throughput)
    assert m.ttft_slo_ms == m.ttft_p90_ms and m.tpot_slo_ms == m.tpot_p90_ms
    strict = simulate(w, affine, limits=(m.ttft_p50_ms, None))
    assert 0 < strict.goodput < m.request_throughput
    assert simulate(w, affine).ttft_slo_ms == pytest.approx(m.ttft_ms)


def test_itl_is_the_step_time_of_pure_decode():
    m = simulate(Workload(16, 9, 64, 1), lambda ks: [2.0 if k.is_decode else 5.0 for k in ks])
    assert m.itl_ms == m.itl_p99_ms == 2.0 and m.tpot_ms == 2.0 and m.e2e_ms == 5.0 + 8 * 2.0
