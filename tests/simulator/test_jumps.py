"""Each fast-forward (simulator.jumps) changes no plan: plans with it and without it are the same step
for step (shapes, finish records, arrivals, clock, KV peak), on random workloads of every arrival,
every policy, mixes and phases; and on a workload where it fires, the policy is asked less with it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import Frontend, StepPricer, TokenBudget, Workload, plan
from simulator.jumps import names
from simulator.planstate import PlanState
from simulator.scheduler import DecodeFirstWithSlack, PrefillFirst
from tests.conftest import examples
from tests.simulator.test_timeline import _counting, affine, mixes, policies

ALL = names()


@st.composite
def larger_workloads(draw):
    """Workloads big enough for the fast-forwards to fire: rounds, periods, ramps, stretches, tails."""
    mtp = draw(st.integers(0, 1))
    arrival = draw(st.sampled_from(["burst", "closed", "closed", "poisson", "frontend"]))
    concurrency = draw(st.integers(1, 40))
    timed = {}
    if arrival == "frontend":
        arrival, timed = "closed", {"frontend": Frontend(request_ms=draw(st.sampled_from([0.0, 0.5])),
                                                         return_ms=1.0, client_ms=draw(st.sampled_from([0.0, 2.0])),
                                                         stream_us=draw(st.sampled_from([0.0, 30.0, 300.0])))}
    return Workload(
        input_length=draw(st.integers(1, 300)), output_length=draw(st.integers(1, 60)),
        max_batched_tokens=draw(st.integers(1 + mtp, 128)), concurrency=concurrency,
        prefix_cache_hit_rate=draw(st.sampled_from([0.0, 0.5])), mtp_tokens=mtp, mtp_acceptance_rates=(0.5,) * mtp,
        arrival=arrival, num_prompts=0 if arrival == "burst" else draw(st.integers(1, 120)),
        request_rate=draw(st.sampled_from([5.0, 50.0, 500.0])), seed=draw(st.integers(0, 3)),
        measure=draw(st.sampled_from(["steady", "all"])), mix=draw(mixes), **timed)


#: workloads at the fast-forwards' edges (from the timeline's reference tests): ramps whose fit falls,
#: that finish requests inside, whose decodes outgrow the budget; chunk stretches; bursts settling into
#: a period; rounds beside decodes; a tail; a closed loop's period; streams
EDGES = (
    Workload(100, 300, 300, 40), Workload(100, 5, 300, 40), Workload(100, 40, 120, 30, mtp_tokens=1,
                                                                        mtp_acceptance_rates=(0.5,)),
    Workload(200, 60, 512, 25, prefix_cache_hit_rate=0.5), Workload(100, 30, 300, 6, arrival="closed", num_prompts=50),
    Workload(1000, 40, 64, 3), Workload(1000, 40, 64, 1), Workload(700, 300, 100, 4, prefix_cache_hit_rate=0.5),
    Workload(10, 20, 16, 300), Workload(100, 8, 150, 400), Workload(100, 30, 40, 12), Workload(300, 20, 64, 24),
    Workload(64, 300, 100, 12), Workload(37, 23, 16, 5, arrival="closed", num_prompts=300), Workload(80, 12, 40, 60),
)


def _plan(w, policy, jumps, **options):
    pricer = StepPricer(affine, policy) if w.timed else None
    return plan(w, policy, step_ms=pricer, jumps=jumps, **options)


def _same(a, b) -> None:
    """Two plans are the same schedule: every step's shape and decodes, every finish record, the
    arrival events, the clock and the KV peak (shape ids may be made in another order)."""
    assert [a.shapes[i] for i in a.step_shape] == [b.shapes[i] for i in b.step_shape]
    assert a.step_decode.tolist() == b.step_decode.tolist()
    records = [sorted(zip(p.counts.tolist(), p.arrival.tolist(), p.first_step.tolist(), p.finish_step.tolist(),
                          p.kind.tolist(), strict=True)) for p in (a, b)]
    assert records[0] == records[1]
    assert a.event_step.tolist() == b.event_step.tolist() and a.event_steady.tolist() == b.event_steady.tolist()
    if a.step_end_ms is not None:
        assert np.array_equal(a.step_end_ms, b.step_end_ms) and np.array_equal(a.event_ms, b.event_ms)
    if a.step_delivered_ms is not None or b.step_delivered_ms is not None:
        assert np.array_equal(a.step_delivered_ms, b.step_delivered_ms)
    assert a.peak_kv_tokens == pytest.approx(b.peak_kv_tokens, rel=1e-12)


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=examples(150), deadline=None)
@given(w=st.one_of(larger_workloads(), st.sampled_from(EDGES)), policy=policies, ctx=st.sampled_from(["mean", "mid"]),
       phase=st.sampled_from(["both", "both", "prefill", "decode"]))
def test_a_fast_forward_changes_no_plan(name, w, policy, ctx, phase):
    if phase == "decode" and min(w.kinds.output) == 1:
        return
    with_it = _plan(w, policy, None, decode_context=ctx, phase=phase)
    without = _plan(w, policy, tuple(n for n in ALL if n != name), decode_context=ctx, phase=phase)
    _same(with_it, without)


@settings(max_examples=examples(150), deadline=None)
@given(w=larger_workloads(), policy=policies, phase=st.sampled_from(["both", "prefill"]))
def test_playing_every_step_is_the_same_plan(w, policy, phase):
    _same(_plan(w, policy, None, phase=phase), _plan(w, policy, (), phase=phase))


#: a workload and policy where each fast-forward fires
FIRES = {
    "rounds": (Workload(100, 30, 40, 12), DecodeFirstWithSlack()),
    "period": (Workload(37, 23, 16, 5, arrival="closed", num_prompts=400), DecodeFirstWithSlack()),
    "tail": (Workload(64, 300, 100, 12), DecodeFirstWithSlack()),
    "ramp": (Workload(100, 300, 300, 40), DecodeFirstWithSlack()),
    "stretch": (Workload(1000, 40, 64, 1), DecodeFirstWithSlack()),
    "stream": (Workload(80, 12, 40, 60), TokenBudget()),
    "repeats": (Workload(100, 1000, 512, 4), DecodeFirstWithSlack()),
}


def test_every_fast_forward_has_a_workload_where_it_fires():
    assert set(FIRES) == set(ALL)


@pytest.mark.parametrize("name", ALL)
def test_a_fast_forward_fires_and_is_switched_off_by_name(name, monkeypatch):
    """With only this fast-forward fewer steps are played one by one (`PlanState.play`) than with none,
    and the plans agree (all of them, none, and this one alone)."""
    w, policy = FIRES[name]
    played = []
    plain = PlanState.play
    monkeypatch.setattr(PlanState, "play", lambda st, sp: played.append(1) or plain(st, sp))
    plans, steps = {"all": plan(w, policy)}, {}
    for label, jumps in (("with", (name,)), ("without", ())):
        played.clear()
        plans[label] = plan(w, policy, jumps=jumps)
        steps[label] = len(played)
    assert steps["with"] < steps["without"] == plans["without"].num_steps, steps
    _same(plans["with"], plans["without"])
    _same(plans["all"], plans["without"])


def test_every_step_played_asks_the_policy_every_step():
    counting = _counting(PrefillFirst())
    p = plan(Workload(50, 40, 64, 8, arrival="closed", num_prompts=40), counting, jumps=())
    assert type(counting).played == p.num_steps


def test_an_unknown_fast_forward_is_named():
    with pytest.raises(ValueError, match=r"unknown fast-forwards \['warp'\]; known: rounds, period"):
        plan(Workload(10, 5, 8, 2), jumps=("warp",))


def test_a_kv_bound_plan_switches_its_decode_runs_off_with_repeats():
    w = Workload(64, 40, 128, 6, arrival="closed", num_prompts=30, kv_blocks=20)
    a, b = plan(w, TokenBudget()), plan(w, TokenBudget(), jumps=())
    _same(a, b)
    assert a.preemptions == b.preemptions > 0


def test_simulator_functions_are_short_and_take_few_parameters():
    """No function in simulator/ over 60 lines or with more than 6 parameters (self, and keyword-only
    options with defaults, aside): the planner stays readable as it grows."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "simulator"
    over = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                positional = a.posonlyargs + a.args
                params = len(positional) - (positional[:1] != [] and positional[0].arg in ("self", "cls"))
                params += sum(default is None for default in a.kw_defaults)
                lines = node.end_lineno - node.lineno + 1
                if lines > 60 or params > 6:
                    over.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines, {params} params)")
    assert not over, over
