"""The front end between client and scheduler, and benchmark protocols: hand-computed cases, and
timed closed loops and Poisson streams behind a front end against the per-request reference."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from simulator import Frontend, StepPricer, TokenBudget, Workload, per_request, plan, replay, simulate
from simulator.benchmarks import PROTOCOLS, protocol
from simulator.scheduler import PrefillFirst
from tests.conftest import examples
from tests.simulator.reference import reference
from tests.simulator.test_timeline import _request_times, affine, one_ms, policies, workloads


def test_one_request_loop_hand_computed():
    # C=1, 3 prompts of 4 tokens, output 2, one 1 ms step each: prefill (1 ms), decode (1 ms).
    # The API server takes 0.5 ms a request; a token reaches the client 0.25 ms after its step.
    # Request 0: at the scheduler 0.5, steps 0.5-1.5 (first token), 1.5-2.5; the client has the
    # first token at 1.75 (TTFT 1.75) and the last at 2.75, sends request 1, at the scheduler 3.25.
    fe = Frontend(request_ms=0.5, return_ms=0.25)
    w = Workload(4, 2, 8, 1, arrival="closed", num_prompts=3, measure="all", frontend=fe)
    p = plan(w, TokenBudget(), step_ms=StepPricer(one_ms, TokenBudget()))
    rows = per_request(p, np.ones(p.num_steps))
    assert rows["arrival_ms"].tolist() == [0.0, 2.75, 5.5]
    assert rows["first_token_ms"].tolist() == [1.75, 4.5, 7.25]
    assert rows["ttft_ms"].tolist() == [1.75, 1.75, 1.75]
    assert rows["tpot_ms"].tolist() == [1.0, 1.0, 1.0]


def test_streamed_chunks_pace_the_client_hand_computed():
    # C=3, 3 prompts of 4 tokens, output 3, budget 16, 1 ms steps; the API server sends a response chunk
    # in 0.6 ms, so a step's 3 chunks take 1.8 ms, longer than the step. Step 0 (0-1) prefills all three:
    # chunks out at 1 + 1.8 = 2.8; step 1 (1-2) decodes: out at 2.8 + 1.8 = 4.6; step 2 (2-3): 6.4.
    # TTFT 2.8 for each, TPOT (6.4 - 2.8) / 2 = 1.8: the server's pace, not the engine's 1 ms.
    w = Workload(4, 3, 16, 3, arrival="closed", num_prompts=3, measure="all", frontend=Frontend(stream_us=600.0))
    p = plan(w, TokenBudget(), step_ms=StepPricer(one_ms, TokenBudget()))
    assert p.step_end_ms.tolist() == [1.0, 2.0, 3.0]
    assert p.step_delivered_ms.tolist() == pytest.approx([2.8, 4.6, 6.4])
    rows = per_request(p, np.ones(p.num_steps))
    assert rows["ttft_ms"].tolist() == pytest.approx([2.8] * 3)
    assert rows["tpot_ms"].tolist() == pytest.approx([1.8] * 3)


def test_a_request_waits_for_the_chunks_ahead_of_it_hand_computed():
    # C=1, output 2, 1 ms steps, chunks 0.6 ms, the API server 0.5 ms a request. Request 0: at the
    # scheduler 0.5; step 0.5-1.5 gives its first token (out 2.1), step 1.5-2.5 its last (out 3.1). The
    # client sends request 1 at 3.1; the server takes it to 3.6, steps 3.6-4.6 (out 5.2) and 4.6-5.6 (6.2).
    fe = Frontend(request_ms=0.5, stream_us=600.0)
    w = Workload(4, 2, 8, 1, arrival="closed", num_prompts=2, measure="all", frontend=fe)
    p = plan(w, TokenBudget(), step_ms=StepPricer(one_ms, TokenBudget()))
    rows = per_request(p, np.ones(p.num_steps))
    assert rows["arrival_ms"].tolist() == pytest.approx([0.0, 3.1])
    assert rows["first_token_ms"].tolist() == pytest.approx([2.1, 5.2])
    assert rows["ttft_ms"].tolist() == pytest.approx([2.1, 2.1])
    assert rows["tpot_ms"].tolist() == pytest.approx([1.0, 1.0])


def test_a_front_end_streaming_at_its_rate_holds_requests_back():
    """The mark of a front end near its streaming rate in a closed loop (bench/littles_law.py): at one
    concurrency, TTFT grows with the output length (requests wait for others to finish) and fewer
    requests decode than the clients hold. With chunks at no cost, TTFT does not grow with the output."""
    def loop(output, stream_us):
        w = Workload(64, output, 4096, 32, arrival="closed", num_prompts=32 * 12, measure="steady",
                     frontend=Frontend(stream_us=stream_us, client_ms=5.0))
        return simulate(w, one_ms, TokenBudget())
    free = [loop(n, 0.0) for n in (16, 256)]
    capped = [loop(n, 40.0) for n in (16, 64, 256)]
    assert free[1].ttft_ms == pytest.approx(free[0].ttft_ms, rel=0.05)
    assert capped[0].ttft_ms < capped[1].ttft_ms < capped[2].ttft_ms
    # 16 times the output, 16 times the decode a waiting request waits out (k x decode): more than 3x the TTFT
    assert capped[2].ttft_ms > 3 * capped[0].ttft_ms
    # 1 ms steps and 25 chunks a ms out: at most 25 of the 32 clients' requests decode, 0.78 of them
    assert capped[2].decoding_requests < 0.8 * free[1].decoding_requests


def test_lookahead_waits_a_step_while_the_engine_is_busy():
    # C=2, prompt 2, output 3, budget 2 (one prefill a step), 1 ms steps, no front-end times.
    # A replacement sent when its predecessor finishes is scheduled from the next step on (sync), or
    # from the one after (async: the next step was scheduled while the last one ran).
    sync = Workload(2, 3, 2, 2, arrival="closed", num_prompts=4, measure="all", frontend=Frontend())
    lookahead = dataclasses.replace(sync, frontend=Frontend(lookahead_steps=1))
    assert not sync.timed and lookahead.timed
    a = simulate(sync, one_ms, TokenBudget())
    b = simulate(lookahead, one_ms, TokenBudget())
    assert b.ttft_ms > a.ttft_ms  # replacements reach a step later while others run


fronts = st.builds(Frontend, request_ms=st.sampled_from([0.0, 0.25, 1.0, 3.0]),
                   prompt_token_us=st.sampled_from([0.0, 20.0]), return_ms=st.sampled_from([0.0, 0.5, 2.0]),
                   lookahead_steps=st.integers(0, 1), client_ms=st.sampled_from([0.0, 0.0, 1.0, 10.0]),
                   stream_us=st.sampled_from([0.0, 0.0, 50.0, 400.0]))


#: found by the property: a Poisson arrival while the server streams the step before's chunks (the reference
#: kept a time it had computed, when idle, before those chunks were known)
STREAMED_ARRIVAL = Workload(3, 3, 3, 1, mtp_tokens=1, mtp_acceptance_rates=(0.5,), arrival="poisson", num_prompts=12,
                            request_rate=50.0, measure="steady")


@settings(max_examples=examples(300), deadline=None)
@given(w=workloads(("closed", "poisson")), fe=fronts, policy=policies)
@example(w=STREAMED_ARRIVAL, fe=Frontend(stream_us=400.0), policy=PrefillFirst())
def test_timed_loops_behind_a_front_end_equal_the_reference(w, fe, policy):
    w = dataclasses.replace(w, frontend=fe)
    reqs, _, _, step_keys, _ = reference(w, policy, affine)
    pricer = StepPricer(affine, policy) if w.timed else None
    p = plan(w, policy, step_ms=pricer)
    assert [p.shapes[i] for i in p.step_shape] == step_keys
    if pricer is None:
        return
    out = p.step_end_ms if p.step_delivered_ms is None else p.step_delivered_ms  # when each step's tokens went out
    ends = np.concatenate(([0.0], out))
    ours = [(a, f + p.token_delay_ms, e + p.token_delay_ms) for a, f, e in _request_times(p, ends)]
    assert np.allclose(ours, sorted((r.arrival, r.first, r.finish) for r in reqs))


@pytest.mark.parametrize(("name", "arrival", "c", "asked", "expect"), [
    ("steady", "closed", 8, 0, (0, 0, "steady")),
    ("aiperf", "closed", 8, 0, (160, 0, "all")),  # its warm-up drains before it measures: not played
    ("aiperf", "closed", 8, 100, (100, 0, "all")),
    ("vllm-bench", "closed", 8, 0, (1000, 0, "all")),
    ("vllm-bench", "closed", 8, 64, (64, 0, "all")),
    ("aiperf", "poisson", 1, 0, (0, 0, "all")),
    ("aiperf", "burst", 8, 0, (0, 0, "steady")),
])
def test_protocols_send_and_measure_as_their_clients(name, arrival, c, asked, expect):
    assert protocol(name).load(arrival, c, asked, "steady") == expect


def test_aiperf_measures_from_an_idle_engine():
    """aiperf drains its warm-up before measuring: the measured phase is a closed loop of 20C whose C
    first requests arrive at once at an idle engine, each of them counted."""
    prompts, warmup, measure = protocol("aiperf").load("closed", 4, 0, "steady")
    w = Workload(64, 8, 128, 4, arrival="closed", num_prompts=prompts, measure=measure, warmup_requests=warmup)
    p = plan(w, TokenBudget())
    m = replay(p, np.ones(p.num_steps), 1)  # every step 1 ms
    assert m.measured_requests == 80
    reqs = per_request(p, np.ones(p.num_steps))
    # the first wave at 0, measured; the first replacement when request 1 (prefilled in step 1, 7 decodes)
    # has its last token, at the end of step 8
    assert np.sort(reqs["arrival_ms"])[:5].tolist() == [0.0, 0.0, 0.0, 0.0, 8.0]
    assert m.ttft_ms == pytest.approx(np.mean(reqs["ttft_ms"]))


def test_warm_up_requests_are_not_measured():
    w = Workload(4, 3, 8, 2, arrival="closed", num_prompts=10, measure="all", warmup_requests=4)
    m = simulate(w, one_ms, TokenBudget())
    assert m.measured_requests == 6
    with pytest.raises(ValueError, match="warmup_requests=4 is a benchmark protocol's"):
        Workload(4, 3, 8, 2, arrival="closed", num_prompts=10, warmup_requests=4)
    assert set(PROTOCOLS) == {"steady", "aiperf", "vllm-bench"}
    with pytest.raises(ValueError, match="benchmark must be one of"):
        protocol("genai")
