"""A closed loop of more clients than the engine seats, planned as a stand-in loop (simulator.standin):
it answers as the loop planned client by client, its work does not grow with the clients, and it stands
in only where its claim holds."""

import numpy as np
import pytest

from simulator import TokenBudget, Workload, plan
from simulator.frontend import Frontend
from simulator.metrics import replay
from simulator.pricing import StepPricer, price, step_times
from simulator.scheduler import DecodeFirstWithSlack
from simulator.standin import STAND_IN_SEATS, StandIn
from tests.simulator.test_timeline import affine


def run(w: Workload, scheduler, jumps=None):
    """(metrics, plan) of `w`, priced by the affine fake."""
    if w.timed:
        pricer = StepPricer(affine, scheduler)
        p = plan(w, scheduler, step_ms=pricer, jumps=jumps)
        return replay(p, step_times(p, pricer.prices(p))), p
    p = plan(w, scheduler, jumps=jumps)
    return replay(p, step_times(p, price(affine, p.price_keys, scheduler.fused))), p


@pytest.mark.parametrize("clients, seats, frontend, kv_blocks", [
    (64, 8, None, 0),                                      # the seats bind, every client replaced at once
    (200, 8, None, 0),
    (64, 8, Frontend(client_ms=3.0, request_ms=0.5), 0),   # timed: clients come back after a while
    (96, 16, Frontend(client_ms=3.0), 40),                 # the KV pool binds below the seats, with preemptions
])
def test_a_stand_in_answers_as_the_loop_planned_client_by_client(clients, seats, frontend, kv_blocks):
    """TPOT exactly; throughput, TTFT and E2E (mean and p99) within what the two steady windows' edges allow:
    each may gain or lose one step's finishes (at most the seats) at either end, of the requests it measures
    (the queue's wait is the clients over the throughput, so it carries the same share)."""
    w = Workload(300, 40, 128, clients, arrival="closed", frontend=frontend, kv_blocks=kv_blocks)
    scheduler = TokenBudget(max_num_seqs=seats)
    fast, p = run(w, scheduler)
    plain, q = run(w, scheduler, jumps=())
    assert p.stand_in == StandIn(clients, STAND_IN_SEATS * seats) and q.stand_in is None
    assert fast.concurrency == plain.concurrency == clients and fast.num_prompts == plain.num_prompts
    assert fast.tpot_ms == pytest.approx(plain.tpot_ms, rel=1e-9)
    edges = 2 * seats / min(fast.measured_requests, plain.measured_requests)
    assert fast.request_throughput == pytest.approx(plain.request_throughput, rel=edges)
    for metric in ("ttft_ms", "ttft_p99_ms", "e2e_ms", "e2e_p99_ms"):
        assert getattr(fast, metric) == pytest.approx(getattr(plain, metric), rel=edges), metric
    assert fast.ttft_ms > 10 * fast.tpot_ms  # the queue is most of TTFT: there was something to add


def test_a_hundred_million_clients_cost_what_the_stand_in_costs_and_keep_little_s_law():
    """10^8 and 10^4 clients plan the same stand-in (the same steps); each answers N = X x E2E (Little's law;
    no client time), the queue in every request's TTFT."""
    scheduler = TokenBudget(max_num_seqs=64)
    answers = {}
    for clients in (10**4, 10**8):
        m, p = run(Workload(500, 30, 256, clients, arrival="closed"), scheduler)
        answers[clients] = m, p.num_steps
        assert m.request_throughput * m.e2e_ms / 1000 == pytest.approx(clients, rel=1e-3)
    (small, steps), (huge, same_steps) = answers[10**4], answers[10**8]
    assert steps == same_steps and huge.tpot_ms == small.tpot_ms
    assert huge.ttft_ms - small.ttft_ms == pytest.approx((10**8 - 10**4) / huge.request_throughput * 1000, rel=1e-9)


@pytest.mark.parametrize("w, scheduler", [
    (Workload(300, 40, 128, 64, arrival="closed", measure="all"), TokenBudget(max_num_seqs=8)),  # warm-up counts
    (Workload(300, 40, 128, 64, arrival="closed", num_prompts=100), TokenBudget(max_num_seqs=8)),  # a fixed run
    (Workload(300, 40, 128, 64), TokenBudget(max_num_seqs=8)),                             # a burst
    (Workload(300, 40, 128, 64, arrival="poisson", request_rate=5.0), TokenBudget(max_num_seqs=8)),
    (Workload(300, 40, 128, 16, arrival="closed"), TokenBudget(max_num_seqs=8)),           # no more than 2 a seat
    (Workload(300, 40, 128, 64, arrival="closed"), TokenBudget()),                         # no seat limit
    (Workload(300, 40, 128, 64, arrival="closed"), DecodeFirstWithSlack()),
])
def test_no_stand_in_where_its_claim_does_not_hold(w, scheduler):
    assert StandIn.make(w, scheduler) is None
    assert run(w, scheduler)[1].stand_in is None


def test_per_request_rows_of_a_stand_in_carry_the_queue():
    """Each request's row is sent earlier by the others' wait: its TTFT is the metrics' (mean over the
    measured rows), and E2E - TTFT is unchanged."""
    from simulator.metrics import per_request

    w, scheduler = Workload(300, 40, 128, 1000, arrival="closed"), TokenBudget(max_num_seqs=8)
    m, p = run(w, scheduler)
    rows = per_request(p, step_times(p, price(affine, p.price_keys, scheduler.fused)))
    measured = rows["measured"]
    assert np.mean(rows["ttft_ms"][measured]) == pytest.approx(m.ttft_ms, rel=1e-9)
    assert np.mean(rows["e2e_ms"][measured]) == pytest.approx(m.e2e_ms, rel=1e-9)
