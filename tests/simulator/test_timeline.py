import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latency.keys import ForwardKey
from simulator import Workload, plan, price, simulate, step_times
from simulator.scheduler import (
    CountScheduler,
    DecodeFirstWithSlack,
    PrefillFirst,
    Scheduler,
    StepDecision,
    StepPlan,
    TokenBudget,
)
from tests.conftest import examples
from tests.simulator.reference import expected_metrics, reference
from tests.simulator.test_scheduler import _DecidesOtherwise


def one_ms(keys):
    return [1.0] * len(keys)


def affine(keys):
    """A fake that depends on every field: overhead + tokens + causal attention + context reads."""
    out = []
    for k in keys:
        attn = k.query_len * (k.seq_len - k.query_len) + k.query_len * (k.query_len + 1) / 2
        out.append(0.5 + 0.25 * k.concurrency * k.query_len + 0.0625 * k.concurrency * attn
                   + (1.0 + 0.03125 * k.concurrency * k.seq_len if k.is_decode else 0.0))
    return out


def test_hand_computed_two_requests_one_ms_steps():
    # E=5, B=3: chunks (3,3),(2,5). Steps: A0 | B0 | A1 -> A first @3 | B1 + A decodes -> B first @4,
    # A done @4 | B decodes -> done @5.  TTFT (3+4)/2, TPOT 1, 2*2 tokens / 5 ms.
    m = simulate(Workload(5, 2, 3, 2), one_ms)
    assert (m.ttft_ms, m.tpot_ms, m.output_throughput, m.makespan_ms) == (3.5, 1.0, 800.0, 5.0)
    assert (m.num_steps, m.prefill_num_chunks) == (5, 2)


class Scripted(CountScheduler):
    name = "scripted"

    def __init__(self, decisions):
        self.decisions = list(decisions)

    def decide(self, state):
        return StepDecision(*self.decisions.pop(0))


def test_scripted_policy_rfc_case():
    def lat(keys):
        return [5.0 if k.is_decode else {3: 10.0, 2: 20.0}[k.query_len] for k in keys]

    w = Workload(5, 3, 3, 2)
    p = plan(w, Scripted([(2, 0), (2, 0), (0, 2), (0, 2)]))
    prefill = [k for k in p.price_keys if not k.is_decode]
    decode = [k for k in p.price_keys if k.is_decode]
    assert sorted(prefill) == [ForwardKey(False, 2, 2, 5), ForwardKey(False, 2, 3, 3)]
    assert len(decode) == 1 and decode[0].concurrency == 2
    m = simulate(w, lat, Scripted([(2, 0), (2, 0), (0, 2), (0, 2)]))
    assert (m.ttft_ms, m.tpot_ms, m.output_throughput) == (30.0, 5.0, 150.0)


def test_single_chunk_is_a_full_prefill():
    w = Workload(4096, 1, 8192, 1)
    p = plan(w)
    assert p.price_keys == (ForwardKey(False, 1, 4096, 4096),)
    m = simulate(w, affine)
    assert m.ttft_ms == pytest.approx(affine([ForwardKey(False, 1, 4096, 4096)])[0])
    # several requests: every prefill key is still a full-prompt prefill
    assert all(k.query_len == k.seq_len == 4096 for k in plan(Workload(4096, 8, 8192, 5)).price_keys
               if not k.is_decode)


def test_decode_context_mid_is_the_reference_tools():
    p = plan(Workload(100, 21, 256, 3), decode_context="mid")
    assert {k.seq_len for k in p.price_keys if k.is_decode} == {100 + 21 // 2 + 1}
    p = plan(Workload(100, 21, 256, 3))
    assert {k.seq_len % 128 for k in p.price_keys if k.is_decode} == {0}


def test_prefix_cache_shortens_prefill_not_decode_context():
    full = plan(Workload(1000, 10, 256, 2), decode_context="mid")
    hit = plan(Workload(1000, 10, 256, 2, prefix_cache_hit_rate=0.5), decode_context="mid")
    assert {k for k in full.price_keys if k.is_decode} == {k for k in hit.price_keys if k.is_decode}
    assert max(k.seq_len for k in hit.price_keys if not k.is_decode) == 500
    assert hit.peak_kv_tokens == full.peak_kv_tokens  # cached prefix is held too


class Stuck(Scheduler):
    name = "stuck"

    def plan_step(self, view):
        return StepPlan((), 0)


def test_a_policy_without_progress_is_an_error():
    with pytest.raises(RuntimeError, match="stuck.*no progress"):
        plan(Workload(10, 2, 4, 2), Stuck())


def test_disaggregated_instances():
    w = Workload(5, 2, 3, 2)
    pre = simulate(w, one_ms, phase="prefill")
    assert (pre.ttft_ms, pre.tpot_ms, pre.makespan_ms) == (3.5, 0.0, 4.0)  # A0 B0 A1 B1
    dec = simulate(Workload(5, 3, 3, 2), one_ms, phase="decode")
    assert (dec.ttft_ms, dec.tpot_ms, dec.makespan_ms) == (0.0, 1.0, 2.0)
    with pytest.raises(ValueError, match="output_length >= 2"):
        plan(Workload(5, 1, 3, 2), phase="decode")


def test_pd_ratio_rfc_formulas():
    from simulator import pd_ratio

    r = pd_ratio(p_concurrency=4, ttft_ms=500.0, d_concurrency=64, tpot_ms=20.0, output_length=101)
    assert r.p_qps == pytest.approx(8.0)            # 4 / 500 ms
    assert r.d_qps == pytest.approx(32.0)           # 64 / (20 ms * 100)
    assert r.pd_ratio == pytest.approx(4.0)


def test_mtp_decode_steps_carry_draft_tokens():
    w = Workload(8, 9, 16, 1, mtp_tokens=1, mtp_acceptance_rates=(1.0,))
    p = plan(w)
    dec = [k for k in p.price_keys if k.is_decode]
    assert {k.query_len for k in dec} == {2}
    assert p.num_steps == 1 + 4  # prefill, then 8 tokens at 2 per step


policies = st.one_of(
    st.builds(DecodeFirstWithSlack, slack_ratio=st.sampled_from([1.0, 1.15, 1.5, 3.0])),
    st.builds(TokenBudget, max_num_seqs=st.one_of(st.none(), st.integers(1, 4)),
              long_prefill_token_threshold=st.one_of(st.none(), st.integers(1, 8))),
    st.just(PrefillFirst()),
)


@st.composite
def workloads(draw, arrivals=("burst",)):
    mtp = draw(st.integers(0, 1))
    arrival = draw(st.sampled_from(arrivals))
    concurrency = draw(st.integers(1, 9))
    prompts = 0 if arrival == "burst" else draw(st.integers(1, 30))
    return Workload(
        input_length=draw(st.integers(1, 40)),
        output_length=draw(st.integers(1, 7)),
        max_batched_tokens=draw(st.integers(1 + mtp, 16)),
        concurrency=concurrency,
        prefix_cache_hit_rate=draw(st.sampled_from([0.0, 0.25, 0.5])),
        mtp_tokens=mtp,
        mtp_acceptance_rates=(0.5,) * mtp,
        arrival=arrival,
        num_prompts=prompts,
        request_rate=draw(st.sampled_from([0.5, 5.0, 50.0, 500.0])),
        burstiness=draw(st.sampled_from([0.5, 1.0, 4.0])),
        seed=draw(st.integers(0, 3)),
        measure=draw(st.sampled_from(["steady", "steady", "all"])),
        mix=draw(mixes),
    )


def _mix(text_in: str, text_out: str):
    from simulator.mix import Lengths, RequestMix

    return RequestMix(Lengths.parse(text_in), Lengths.parse(text_out))


mixes = st.one_of(
    st.none(), st.none(),
    st.builds(_mix, st.sampled_from(["uniform:1:40", "bins:1-3@1,30-40@2", "normal:20:10:1:40", "7"]),
              st.sampled_from(["uniform:1:7", "bins:1-1@1,5-7@1", "lognormal:3:0.8:1:7", "4"])),
)


ARRIVALS = ("burst", "closed", "poisson")


def _request_times(p, m_ends):
    """(arrival, first token, finish) of every request of a plan, sorted."""
    arrival = p.event_ms[p.arrival] if p.event_ms is not None else m_ends[p.event_step[p.arrival] + 1]
    first = arrival if p.phase == "decode" else m_ends[p.first_step + 1]
    rows = zip(arrival, first, m_ends[p.finish_step + 1], p.counts, strict=True)
    return sorted((a, f, e) for a, f, e, n in rows for _ in range(n))


def _assert_plays_as_reference(p, w, policy, *args, **kwargs):
    """Plan `p` equals the per-request reference of `w` under `policy` step for step: its step shapes,
    every request's arrival, first token and finish, and its KV peak."""
    reqs, _, peak, step_keys, _ = reference(w, policy, affine, *args, **kwargs)
    assert [p.shapes[i] for i in p.step_shape] == step_keys
    ends = np.concatenate(([0.0], np.cumsum(step_times(p, price(affine, p.price_keys, p.scheduler.fused)))))
    assert np.allclose(_request_times(p, ends), sorted((r.arrival, r.first, r.finish) for r in reqs))
    assert p.peak_kv_tokens == pytest.approx(peak)


@settings(max_examples=examples(400), deadline=None)
@given(w=workloads(ARRIVALS), policy=policies, ctx=st.sampled_from(["mean", "mid"]),
       phase=st.sampled_from(["both", "both", "prefill", "decode"]), slo=st.sampled_from([None, 90, 37.5]),
       devices=st.sampled_from([1, 4]))
def test_group_timeline_equals_per_request_reference(w, policy, ctx, phase, slo, devices):
    if phase == "decode" and (w.kinds.output and min(w.kinds.output) == 1):
        return
    from simulator import StepPricer, step_times

    reqs, makespan, peak, step_keys, step_ends = reference(w, policy, affine, ctx, phase)
    pricer = StepPricer(affine, policy) if w.arrival == "poisson" else None
    p = plan(w, policy, decode_context=ctx, phase=phase, step_ms=pricer)
    assert [p.shapes[i] for i in p.step_shape] == step_keys
    prices = pricer.prices(p) if pricer else price(affine, p.price_keys, policy.fused)
    ends = np.concatenate(([0.0], p.step_end_ms if pricer else np.cumsum(step_times(p, prices))))
    ours = _request_times(p, ends)
    theirs = sorted((r.arrival, r.first, r.finish) for r in reqs)
    assert np.allclose(ours, theirs)
    R = max(w.decode_tokens, 1)
    limits = (float(np.median([r.first - r.arrival for r in reqs])), float(np.median([(r.finish - r.first) / R
                                                                                       for r in reqs])))
    m = simulate(w, affine, policy, decode_context=ctx, phase=phase, limits=limits, slo_percentile=slo,
                 num_devices=devices).as_dict()
    assert m["peak_kv_tokens"] == pytest.approx(peak)
    for name, value in expected_metrics(w, reqs, step_keys, step_ends, phase, limits, slo, devices).items():
        assert m[name] == pytest.approx(value), name


@settings(max_examples=examples(200), deadline=None)
@given(w=workloads(ARRIVALS), policy=policies)
def test_conservation_of_requests_and_tokens(w, policy):
    from simulator import StepPricer

    p = plan(w, policy, step_ms=StepPricer(affine, policy) if w.arrival == "poisson" else None)
    n = w.prompts
    assert p.counts.sum() == n
    steps = [p.shapes[i] for i in p.step_shape]
    prefill = sum(k.tokens for s in steps for k in s if not k.is_decode)
    decode_req_steps = sum(k.concurrency for s in steps for k in s if k.is_decode)
    prompt, output, cached = w.request_lengths()
    a = w.tokens_per_decode_step
    needed = sum(math.ceil((o - 1) / a - 1e-12) for o in output.tolist())
    assert prefill == (prompt - cached).sum()
    assert decode_req_steps == needed
    assert decode_req_steps * a >= (output - 1).sum()
    assert (p.first_step <= p.finish_step).all()
    if isinstance(policy, PrefillFirst):  # a step prefills up to B tokens or decodes, never both
        for s in steps:
            assert all(k.is_decode for k in s) or sum(k.tokens for k in s if not k.is_decode) <= w.max_batched_tokens
            assert len({k.is_decode for k in s}) == 1
        return
    limit = w.max_batched_tokens if isinstance(policy, TokenBudget) else \
        math.floor(w.max_batched_tokens * policy.slack_ratio)
    for s in steps:  # every step, pure or mixed, keeps prefill + decode tokens within the policy's limit
        assert sum(k.tokens for k in s) <= limit


@settings(max_examples=examples(100), deadline=None)
@given(e=st.integers(1, 300), b1=st.integers(1, 300), b2=st.integers(1, 300), o=st.integers(1, 4))
def test_single_request_ttft_falls_as_budget_grows(e, b1, b2, o):
    lo, hi = sorted((b1, b2))
    small = simulate(Workload(e, o, lo, 1), affine)
    large = simulate(Workload(e, o, hi, 1), affine)
    assert large.prefill_num_chunks <= small.prefill_num_chunks
    assert large.ttft_ms <= small.ttft_ms + 1e-9


@settings(max_examples=examples(100), deadline=None)
@given(w=workloads(), policy=policies, scale=st.sampled_from([0.5, 2.0, 7.0]))
def test_times_scale_with_latency(w, policy, scale):
    base = simulate(w, affine, policy)
    scaled = simulate(w, lambda ks: [scale * x for x in affine(ks)], policy)
    assert scaled.ttft_ms == pytest.approx(scale * base.ttft_ms)
    assert scaled.makespan_ms == pytest.approx(scale * base.makespan_ms)
    assert scaled.output_throughput == pytest.approx(base.output_throughput / scale)


def test_a_fused_policy_prices_whole_steps_with_the_model_fusion():
    """A model with step_latency_ms prices a step as one pass (linear layers over all its tokens),
    which costs less than its entries priced apart; a plain callable sums its entries."""
    from latency import build_latency_model
    from simulator import price

    lm = build_latency_model("Qwen/Qwen3-8B", "H200_SXM")
    shape = (ForwardKey(False, 1, 512, 512), ForwardKey(True, 32, 1, 2048))
    fused = price(lm, [shape], True)
    apart = price(lm, list(shape), False)
    assert fused[0] == pytest.approx(lm.step_latency_ms([shape])[0]) and fused[0] < apart.sum()
    assert price(affine, [shape], True)[0] == pytest.approx(sum(affine(list(shape))))
    with pytest.raises(ValueError, match="negative or non-finite"):
        price(lambda ks: [-1.0] * len(ks), list(shape), False)
    assert price(lambda ks: [0.0] * len(ks), list(shape), False).tolist() == [0.0, 0.0]  # free steps are allowed
    with pytest.raises(ValueError, match="returned shape"):
        price(lambda ks: [1.0], list(shape), False)


@pytest.mark.parametrize("arrival", ARRIVALS)
@pytest.mark.parametrize("policy", [DecodeFirstWithSlack(), TokenBudget(max_num_seqs=3)])
def test_long_decode_stretches_cross_context_boundaries_step_for_step(arrival, policy):
    """Long outputs: the timeline takes pure-decode stretches at once; the decode key's rounded context
    moves every 128 tokens, requests finish and (Poisson) arrive inside stretches."""
    from simulator import StepPricer

    w = Workload(100, 700, 64, 3, arrival=arrival, num_prompts=0 if arrival == "burst" else 7,
                 request_rate=2.0, mtp_tokens=1, mtp_acceptance_rates=(0.6,))
    reqs, makespan, peak, step_keys, step_ends = reference(w, policy, affine)
    pricer = StepPricer(affine, policy) if arrival == "poisson" else None
    p = plan(w, policy, step_ms=pricer)
    assert [p.shapes[i] for i in p.step_shape] == step_keys
    assert p.peak_kv_tokens == pytest.approx(peak)
    assert simulate(w, affine, policy).makespan_ms == pytest.approx(makespan)


@pytest.mark.parametrize("mtp", [0, 1])
@pytest.mark.parametrize("ctx", ["mean", "mid"])
def test_a_long_closed_loop_equals_the_reference_step_for_step(mtp, ctx):
    """200 prompts through 5 slots, long past the warm-up: every step, every request's times, the KV
    peak and the metrics equal the per-request reference's."""
    w = Workload(37, 23, 16, 5, arrival="closed", num_prompts=200, mtp_tokens=mtp,
                 mtp_acceptance_rates=(0.5,) * mtp)
    reqs, makespan, peak, step_keys, step_ends = reference(w, DecodeFirstWithSlack(), affine, ctx)
    p = plan(w, DecodeFirstWithSlack(), decode_context=ctx)
    assert [p.shapes[i] for i in p.step_shape] == step_keys
    ends = np.concatenate(([0.0], np.cumsum(step_times(p, price(affine, p.price_keys, False)))))
    assert np.allclose(_request_times(p, ends), sorted((r.arrival, r.first, r.finish) for r in reqs))
    assert p.peak_kv_tokens == pytest.approx(peak)
    m = simulate(w, affine, DecodeFirstWithSlack(), decode_context=ctx)
    for name, value in expected_metrics(w, reqs, step_keys, step_ends, "both").items():
        assert m.as_dict()[name] == pytest.approx(value), name


@pytest.mark.parametrize("arrival", ARRIVALS)
@pytest.mark.parametrize("policy", [DecodeFirstWithSlack(), TokenBudget(max_num_seqs=3)])
def test_a_point_mass_mix_gives_exactly_today_s_results(arrival, policy):
    from simulator import StepPricer

    w = Workload(300, 40, 64, 5, prefix_cache_hit_rate=0.25, arrival=arrival, num_prompts=0 if arrival == "burst"
                 else 23, request_rate=20.0)
    mixed = Workload(**{**w.__dict__, "mix": _mix("300", "40")})
    a, b = (plan(x, policy, step_ms=StepPricer(affine, policy) if arrival == "poisson" else None) for x in (w, mixed))
    assert [a.shapes[i] for i in a.step_shape] == [b.shapes[i] for i in b.step_shape]
    assert a.peak_kv_tokens == b.peak_kv_tokens and a.counts.tolist() == b.counts.tolist()
    assert simulate(w, affine, policy).as_dict() == simulate(mixed, affine, policy).as_dict()


def _counting(policy):
    """A policy like `policy` (same class and options) that counts the steps it is asked for, in
    `type(it).played`: what the planner plays one by one instead of in bulk."""
    from dataclasses import fields

    class Counting(type(policy)):
        played = 0

        def plan_step(self, view):
            type(self).played += 1
            return super().plan_step(view)

    return Counting(**{f.name: getattr(policy, f.name) for f in fields(policy) if f.init})


@pytest.mark.parametrize("ctx", ["mean", "mid"])
def test_a_pure_decode_stretch_is_taken_at_once_not_step_by_step(ctx):
    """4 requests decode 999 steps after one prefill: the loop plays one step per event (the decode
    key's rounded context moves every 128 tokens; "mid" never moves), not one per step; and the plan
    is the one the per-request reference plays step by step. (One decode group: too few for the
    tail's numpy, see TAIL_GROUPS.)"""
    w = Workload(100, 1000, 512, 4)
    counting = _counting(DecodeFirstWithSlack())
    p = plan(w, counting, decode_context=ctx)
    assert p.num_steps == 1 + 999
    # mean: 1 prefill, one stretch per rounded context (101..1100 rounded up to 128: 9 values), the
    # finishing step, and one spare; mid: the context never moves, so prefill, one stretch, finish
    assert type(counting).played <= (12 if ctx == "mean" else 3), type(counting).played
    _, _, _, step_keys, _ = reference(w, DecodeFirstWithSlack(), affine, ctx)
    assert [p.shapes[i] for i in p.step_shape] == step_keys


@pytest.mark.parametrize("ctx", ["mean", "mid"])
@pytest.mark.parametrize("mtp", [0, 1])
def test_the_decode_tail_is_played_at_once(ctx, mtp):
    """12 requests prefill one a step (B 100: one 64-token prompt beside the decodes), so they finish
    one a step 300 steps later: once nothing waits, the loop plays the rest (every step a new decode
    count) in one go, and it equals the per-request reference step for step, finish for finish."""
    w = Workload(64, 300, 100, 12, mtp_tokens=mtp, mtp_acceptance_rates=(0.5,) * mtp)
    counting = _counting(DecodeFirstWithSlack())
    p = plan(w, counting, decode_context=ctx)
    # the 12 prefill steps are a ramp whose first answer (a 64-token prompt beside up to 51 decodes)
    # holds until the front group has one request left; that step is asked, then the tail's first
    assert type(counting).played == 3
    reqs, makespan, peak, step_keys, _ = reference(w, DecodeFirstWithSlack(), affine, ctx)
    assert [p.shapes[i] for i in p.step_shape] == step_keys
    assert len({p.shapes[i] for i in p.step_shape[12:]}) >= 12  # the decode count falls in the tail
    ends = np.concatenate(([0.0], np.cumsum(step_times(p, price(affine, p.price_keys, False)))))
    assert np.allclose(_request_times(p, ends), sorted((r.arrival, r.first, r.finish) for r in reqs))
    assert p.peak_kv_tokens == pytest.approx(peak)
    assert p.finish_step.tolist() == sorted(p.finish_step.tolist())  # records in the order requests finish


@pytest.mark.parametrize("w", [
    Workload(100, 300, 300, 40),                       # 3, then 2, then 1 prompt a step as decodes grow
    Workload(100, 5, 300, 40),                         # the first requests finish inside the ramp
    Workload(100, 40, 120, 30, mtp_tokens=1, mtp_acceptance_rates=(0.5,)),  # decodes outgrow the budget
    Workload(200, 60, 512, 25, prefix_cache_hit_rate=0.5),  # cached prefixes held from the first chunk
    Workload(100, 30, 300, 6, arrival="closed", num_prompts=50),  # replacements ramp up between finishes
    Workload(90, 20, 250, 16, arrival="closed", num_prompts=40, measure="all"),
], ids=["fit-falls", "finish-inside", "decode-cap", "cached", "closed", "closed-all"])
@pytest.mark.parametrize("ctx", ["mean", "mid"])
def test_ramps_equal_the_reference_step_for_step(w, ctx):
    """Ramps (fresh prompts of the front group prefilled whole while every ready request decodes) are
    played in bulk; where they end (the policy takes other prompts, a request finishes, the decodes
    outgrow the budget) the plan still equals the per-request reference, step for step."""
    policy = DecodeFirstWithSlack()
    counting = _counting(DecodeFirstWithSlack())
    p = plan(w, counting, decode_context=ctx)
    _assert_plays_as_reference(p, w, policy, ctx)
    assert type(counting).played <= p.num_steps  # asked once a step at most


@settings(max_examples=examples(400), deadline=None)
@given(ready=st.integers(0, 300), prompt=st.integers(1, 400), budget=st.integers(1, 2000), qlen=st.integers(1, 3),
       slack=st.sampled_from([1.0, 1.15, 1.5]), done=st.integers(0, 300))
def test_decode_first_says_exactly_how_long_its_ramp_answer_holds(ready, prompt, budget, qlen, slack, done):
    """`ramp_steps` (the planner skips asking for that many steps) equals what asking step by step
    finds: the same takes, every ready request decoding, as the front group shrinks and either the
    ready count grows by the takes (their prompts' last chunk) or the chunks go to the back of the
    FIFO (a round: the answer then holds for as long as the group lasts; checked for 40 steps)."""
    from collections import deque

    from simulator.scheduler import QueueView

    policy, count, done = DecodeFirstWithSlack(slack), 10**6, min(done, prompt - 1)
    view = QueueView(deque([(count, done, 0, 0)]), ready, (prompt,), budget, qlen)
    sp = policy.plan_step(view)
    chunk = min(budget, prompt - done)
    if not (len(sp.takes) == 1 and sp.decode == ready):
        return  # not a ramp step
    n, joins = sp.takes[0][1], sp.takes[0][2] == prompt - done
    holds = policy.ramp_steps(ready, n, chunk, budget, qlen, n if joins else 0)
    alike, back = 1, 0
    while alike <= (holds if joins else 40):  # one step past the claim, to see the answer change there
        count -= n
        if joins:
            ready += n
        else:
            back += n
        view.ready_decode = ready
        view.prefill = deque([(count, done, 0, 0)] + ([(back, done + chunk, 0, 0)] if back else []))
        if policy.plan_step(view) != StepPlan(((0, n, chunk),), ready):
            break
        alike += 1
    assert alike == holds if joins else holds == math.inf and alike == 41


@pytest.mark.parametrize("policy", [DecodeFirstWithSlack(), TokenBudget()], ids=["decode-first", "token-budget"])
# the share of steps the policy may be asked for: halfway between the share the planner asked before
# these jumps (ad16983) and the share it asks now, measured (decode-first, token-budget; None where the
# planner gains nothing: token-budget's depth-first chunks are asked step by step)
@pytest.mark.parametrize("w, phase, shares", [
    (Workload(10, 20, 16, 300), "both", (0.54, 0.63)),     # 0.96 -> 0.11, 0.97 -> 0.29: finishes pace it
    (Workload(100, 8, 150, 400), "both", (0.51, None)),    # 0.99 -> 0.03, 1.0 -> 1.0: a partial chunk a step
    (Workload(64, 16, 100, 500, prefix_cache_hit_rate=0.5), "both", (0.47, 0.75)),  # 0.90 -> 0.05, 0.94 -> 0.57
    (Workload(10, 20, 25, 300), "prefill", (0.51, 0.52)),  # 1.0 -> 0.02, 1.0 -> 0.03: two prompts a step, alike
    (Workload(100, 30, 40, 12), "both", (0.34, None)),     # 0.54 -> 0.13, 0.56 -> 0.56: rounds of 40-token chunks
    (Workload(300, 20, 64, 24), "both", (0.49, None)),     # 0.87 -> 0.11, 0.92 -> 0.92: rounds beside decodes
], ids=["pace", "short", "cached", "prefill", "rounds", "rounds-decoding"])
def test_a_burst_s_steady_stretch_and_rounds_are_copied_not_played(w, phase, shares, policy):
    """A burst much larger than what runs at once settles, like a closed loop, into a period: steps
    that finish some requests and prefill as many fresh ones; that period is copied while the fresh
    ones last. A requeueing policy's chunks go round the FIFO in rounds of alike steps, played in
    bulk. The plan still equals the per-request reference, step for step, and the policy is asked
    for fewer steps than before these jumps (`shares`)."""
    counting = _counting(policy)
    p = plan(w, counting, phase=phase)
    _assert_plays_as_reference(p, w, policy, phase=phase)
    share = shares[0] if policy.requeue else shares[1]
    if share is not None:
        assert type(counting).played < share * p.num_steps, (type(counting).played, p.num_steps)


def test_a_ramp_of_short_requests_behind_a_long_one_finishes_them_first(tmp_path):
    """A trace: one request of 40 output tokens, then six of 3. The six ramp in one a step behind the
    long one and end long before it; the decode pool must look past the long one for them (its groups
    are no longer in the order they end), as the per-request reference plays it."""
    from simulator.mix import Lengths, RequestMix, Trace

    path = tmp_path / "t.csv"
    path.write_text("input_length,output_length\n10,40\n" + "10,3\n" * 6)
    w = Workload(10, 3, 16, 7, mix=RequestMix(Lengths.parse("10"), Lengths.parse("3"), Trace.load(path)))
    counting = _counting(DecodeFirstWithSlack())
    p = plan(w, counting)
    reqs, _, peak, step_keys, _ = reference(w, DecodeFirstWithSlack(), affine)
    assert type(counting).played < p.num_steps  # a ramp and stretches were taken
    assert [p.shapes[i] for i in p.step_shape] == step_keys
    ends = np.concatenate(([0.0], np.cumsum(step_times(p, price(affine, p.price_keys, False)))))
    assert np.allclose(_request_times(p, ends), sorted((r.arrival, r.first, r.finish) for r in reqs))
    # one prompt a step (floor(16 x 1.15) = 18 tokens: a 10-token prompt beside up to 8 decodes): request
    # i >= 1 gets its first token at step i and its other 2 at steps i+1, i+2; the long one at steps 0..39
    assert sorted(p.finish_step.tolist()) == [3, 4, 5, 6, 7, 8, 39]


@pytest.mark.parametrize("policy", [DecodeFirstWithSlack(), TokenBudget(max_num_seqs=4)])
def test_a_closed_loop_repeats_its_period_instead_of_playing_it(policy):
    """1,000 prompts through 5 slots: once the loop's state repeats, its period is copied to the last
    whole period the prompts allow; the plan still equals the per-request reference step for step,
    and the loop plays a small part of its steps."""
    counting = _counting(policy)
    w = Workload(37, 23, 16, 5, arrival="closed", num_prompts=1000)
    p = plan(w, counting)
    assert type(counting).played < p.num_steps / 10, (type(counting).played, p.num_steps)
    reqs, _, peak, step_keys, step_ends = reference(w, policy, affine)
    assert [p.shapes[i] for i in p.step_shape] == step_keys
    ends = np.concatenate(([0.0], np.cumsum(step_times(p, price(affine, p.price_keys, policy.fused)))))
    assert np.allclose(_request_times(p, ends), sorted((r.arrival, r.first, r.finish) for r in reqs))
    assert p.peak_kv_tokens == pytest.approx(peak)
    assert p.counts.sum() == 1000 and p.event_steady.sum() < len(p.event_steady)
    m = simulate(w, affine, policy)
    for name, value in expected_metrics(w, reqs, step_keys, step_ends, "both").items():
        assert m.as_dict()[name] == pytest.approx(value), name


@pytest.mark.parametrize("kwargs, message", [
    ({"phase": "both!"}, "phase must be one of ('both', 'prefill', 'decode'), got 'both!'"),
    ({"decode_context": "median"}, "decode_context must be one of ('mean', 'mid'), got 'median'"),
    ({"context_round": 0}, "context_round must be an integer >= 1, got 0"),
    ({"context_round": 1.5}, "context_round must be an integer >= 1, got 1.5"),
])
def test_plan_names_the_argument_it_refuses(kwargs, message):
    with pytest.raises(ValueError) as err:
        plan(Workload(10, 5, 8, 2), **kwargs)
    assert str(err.value) == message


def test_plan_refusals_of_the_workload_say_why():
    with pytest.raises(ValueError) as err:
        plan(Workload(10, 5, 8, 1, arrival="poisson", num_prompts=3, request_rate=1.0))
    assert str(err.value) == ("a timed workload (Poisson, or a closed loop behind a front end) is planned with its "
                              "prices: pass step_ms")
    with pytest.raises(ValueError) as err:
        plan(Workload(10, 1, 8, 2), phase="decode")
    assert str(err.value) == "a decode-only instance needs output_length >= 2 for every request (nothing to decode)"


def test_a_context_round_of_one_is_the_exact_mean():
    """context_round=1 is allowed and keys the decode step by the exact (ceiled) mean context."""
    p = plan(Workload(10, 4, 16, 1), context_round=1)
    # 3 decode steps; each one's input is the last token generated, so it attends to the 10 prompt tokens
    # and the 1, 2, 3 tokens generated so far: 11, 12, 13
    assert [k.seq_len for i in p.step_shape for k in p.shapes[i] if k.is_decode] == [11, 12, 13]


class _DecodeTooMany(DecodeFirstWithSlack):
    def plan_step(self, view):
        return StepPlan((), view.ready_decode + 1)


def test_a_policy_asking_more_decodes_than_ready_is_named():
    with pytest.raises(RuntimeError) as err:
        plan(Workload(10, 4, 16, 1), _DecodeTooMany())
    assert str(err.value) == "scheduler 'decode-first' asked 1 decodes of 0 ready"


def test_poisson_warm_up_and_drain_are_the_first_and_last_tenth_by_hand():
    """20 prompts: margin 2 requests; events 0-1 and 18-19 are not measured, 2-17 are (measure "steady")."""
    from simulator import StepPricer

    w = Workload(10, 3, 16, 1, arrival="poisson", num_prompts=20, request_rate=0.5)
    p = plan(w, DecodeFirstWithSlack(), step_ms=StepPricer(one_ms, DecodeFirstWithSlack()))
    assert p.counts.sum() == 20 and len(p.event_steady) == 20  # 2 s apart on average, 1 ms steps: one by one
    assert p.event_steady.tolist() == [False] * 2 + [True] * 16 + [False] * 2


def test_a_burst_whose_decodes_exceed_the_budget_splits_groups_step_for_step():
    """8 equal requests (prompt 4) join the decode pool two a step; 3 decodes fit a step, so a group of
    2 is cut: its first request decodes, the other waits a step. Exact contexts, as the reference."""
    w, policy = Workload(4, 6, 3, 8), DecodeFirstWithSlack(slack_ratio=3.0)
    reqs, makespan, peak, step_keys, step_ends = reference(w, policy, affine, context_round=1)
    p = plan(w, policy, context_round=1)
    assert [p.shapes[i] for i in p.step_shape] == step_keys
    assert p.peak_kv_tokens == pytest.approx(peak)
    assert max(p.step_decode) == 3


@pytest.mark.parametrize("policy, budget, mtp", [(DecodeFirstWithSlack(slack_ratio=3.0), 4, 0),
                                                 (TokenBudget(max_num_seqs=6), 5, 1)])
def test_capped_decodes_of_a_mix_finishing_out_of_order_equal_the_reference(policy, budget, mtp):
    """More requests ready to decode than the budget holds (only the oldest decode; the decode key's
    context is theirs), and a mix whose later requests finish before earlier ones (the decode pool
    leaves its ordered fast path): every step's keys, every request's times and the KV peak equal the
    per-request reference's. Decode-first prefills beside 4 decodes thanks to its slack; token-budget
    decodes 2 requests of 2 tokens (MTP) and prefills 1 token beside them. Contexts are keyed exactly
    (rounded to 1 token), so the oldest requests' context must be theirs to the token."""
    w = Workload(12, 9, budget, 6, mix=_mix("bins:3-5@1,10-14@1", "bins:2-3@1,12-20@1"), seed=2, arrival="closed",
                 num_prompts=18, mtp_tokens=mtp, mtp_acceptance_rates=(0.5,) * mtp)
    reqs, makespan, peak, step_keys, step_ends = reference(w, policy, affine, context_round=1)
    p = plan(w, policy, context_round=1)
    assert [p.shapes[i] for i in p.step_shape] == step_keys
    capped = budget // w.decode_query_len
    assert any(d == capped for d in p.step_decode)
    ends = np.concatenate(([0.0], np.cumsum(step_times(p, price(affine, p.price_keys, policy.fused)))))
    assert np.allclose(_request_times(p, ends), sorted((r.arrival, r.first, r.finish) for r in reqs))
    assert p.peak_kv_tokens == pytest.approx(peak)


def test_every_step_shape_is_named_once():
    """The plan names each distinct step shape once (pricing is per shape)."""
    for w in (Workload(300, 40, 64, 5), Workload(37, 23, 16, 5, arrival="closed", num_prompts=60)):
        p = plan(w)
        assert len(set(p.shapes)) == len(p.shapes) < p.num_steps


class _Takes(DecodeFirstWithSlack):
    """Makes one given take from the FIFO, whatever it holds."""

    def __init__(self, take):
        object.__setattr__(self, "take", take)

    def plan_step(self, view):
        return StepPlan((self.take,), 0)


@pytest.mark.parametrize("take, message", [
    ((1, 1, 4), "made an invalid take (1, 1, 4)"),      # one group in the FIFO: no position 1
    ((-1, 1, 4), "made an invalid take (-1, 1, 4)"),
    ((0, 0, 4), "made an invalid take (0, 0, 4)"),
    ((0, 1, 0), "made an invalid take (0, 1, 0)"),
    ((0, 3, 4), "over-advanced group (2, 0)"),          # 3 requests of a group of 2
    ((0, 1, 11), "over-advanced group (2, 0)"),         # 11 tokens of a 10-token prompt
])
def test_a_policy_s_impossible_take_is_named(take, message):
    with pytest.raises(RuntimeError) as err:
        plan(Workload(10, 3, 16, 2), _Takes(take))
    assert str(err.value) == f"scheduler 'decode-first' {message}"


class _Script(TokenBudget):
    """Answers with the given takes step after step (nobody decodes)."""

    def __init__(self, *takes):
        object.__setattr__(self, "takes", list(takes))

    def plan_step(self, view):
        return StepPlan((self.takes.pop(0),), view.ready_decode)


@pytest.mark.parametrize("takes, message", [
    # a ramp: whole prompts of the fresh front group, then no request at all
    ([(0, 1, 10), (0, 1, 10), (0, 0, 10)], "made an invalid take (0, 0, 10)"),
    # 2 of 3 requests prefill 4 tokens and keep the FIFO front; a whole prompt more is too much
    ([(0, 2, 4), (0, 1, 10)], "over-advanced group (2, 4)"),
])
def test_an_impossible_take_is_named_where_a_ramp_would_start_or_go_on(takes, message):
    with pytest.raises(RuntimeError) as err:
        plan(Workload(10, 30, 16, 3), _Script(*takes))
    assert str(err.value) == f"scheduler 'token-budget' {message}"


@pytest.mark.parametrize("policy", [DecodeFirstWithSlack(), TokenBudget()])
def test_an_arrival_at_a_step_boundary_inside_a_decode_stretch_joins_that_step(policy, tmp_path):
    """1 ms steps; r1 (10 in, 30 out) at 0 decodes alone from 1 ms; r2 arrives at exactly 5 ms, the end of
    the stretch's 4th step: the step starting at 5 ms admits it (arrivals due by a step's start join it),
    as the per-request reference plays it."""
    from simulator import StepPricer
    from simulator.mix import Lengths, RequestMix, Trace

    path = tmp_path / "t.csv"
    path.write_text("input_length,output_length,arrival_time\n10,30,0\n10,2,0.005\n")
    w = Workload(10, 30, 16, 1, arrival="poisson", request_rate=0.0, measure="all",
                 mix=RequestMix(Lengths.parse("10"), Lengths.parse("30"), Trace.load(path)))
    p = plan(w, policy, step_ms=StepPricer(one_ms, policy))
    assert p.event_ms.tolist() == [0.0, 5.0]
    shapes = [p.shapes[i] for i in p.step_shape]
    assert [sum(not k.is_decode for k in s) for s in shapes[:7]] == [1, 0, 0, 0, 0, 1, 0]  # r2's prefill: step 5
    assert shapes == reference(w, policy, one_ms)[3]


@settings(max_examples=examples(400), deadline=None)
@given(groups=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 3)), min_size=1, max_size=4),
       ready=st.integers(0, 60), budget=st.integers(1, 300), extra=st.integers(1, 1000),
       policy=st.sampled_from([DecodeFirstWithSlack(), DecodeFirstWithSlack(1.5), TokenBudget(),
                               TokenBudget(max_num_seqs=20), TokenBudget(long_prefill_token_threshold=16)]))
def test_an_answer_taking_part_of_a_group_is_the_same_for_a_larger_group(groups, ready, budget, extra, policy):
    """The contract a burst's copied period relies on (`Scheduler`): where a policy takes n requests
    of a FIFO group, not all, it answers the same with `extra` more requests in that group, and with
    as few as n + 1."""
    from simulator.scheduler import QueueView

    prompt = 37
    fifo = [(count, done * 10, 0, 0) for count, done in groups]  # dones 0, 10, 20, 30 of a 37-token prompt
    sp = policy.plan_step(QueueView(list(fifo), ready, (prompt,), budget, 1))
    taken: dict[int, int] = {}
    for pos, n, _ in sp.takes:
        taken[pos] = taken.get(pos, 0) + n
    for pos, n in taken.items():
        if n < fifo[pos][0]:
            for size in (fifo[pos][0] + extra, n + 1):
                other = list(fifo)
                other[pos] = (size, *fifo[pos][1:])
                assert policy.plan_step(QueueView(other, ready, (prompt,), budget, 1)) == sp


@pytest.mark.parametrize("policy", [DecodeFirstWithSlack(), TokenBudget(), TokenBudget(long_prefill_token_threshold=24),
                                    TokenBudget(max_num_seqs=2)],
                         ids=["decode-first", "token-budget", "threshold", "max-seqs"])
@pytest.mark.parametrize("w", [
    Workload(1000, 40, 64, 3),                          # depth-first: one prompt's chunks after another
    Workload(1000, 40, 64, 1),                          # one request: any policy keeps its place
    Workload(700, 300, 100, 4, prefix_cache_hit_rate=0.5),  # decodes beside the chunks; cached prefixes
    Workload(500, 30, 48, 2, mtp_tokens=1, mtp_acceptance_rates=(0.5,)),
], ids=["three", "one", "decoding-cached", "mtp"])
def test_chunk_stretches_equal_the_reference_step_for_step(w, policy):
    """Chunk stretches (the front group advances chunk after chunk of its prompt beside the same
    decodes) are played in bulk where the policy says how long its answer holds; the plan still
    equals the per-request reference step for step, with its KV peak."""
    p = plan(w, policy)
    _assert_plays_as_reference(p, w, policy)


@settings(max_examples=examples(400), deadline=None)
@given(ready=st.integers(0, 40), prompt=st.integers(2, 3000), done=st.integers(0, 2999), budget=st.integers(1, 600),
       count=st.integers(1, 3), behind=st.integers(0, 5), qlen=st.integers(1, 2),
       policy=st.sampled_from([DecodeFirstWithSlack(), DecodeFirstWithSlack(1.5), TokenBudget(),
                               TokenBudget(long_prefill_token_threshold=50), TokenBudget(max_num_seqs=30)]))
def test_a_policy_says_exactly_how_long_its_stretch_answer_holds(ready, prompt, done, budget, count, behind, qlen,
                                                                  policy):
    """`stretch_steps` equals what asking step by step finds, up to the last chunk: the same answer
    as the front group's prompts advance, every ready request decoding (`behind` fresh requests wait
    behind it; a requeueing policy's stretch needs the group alone)."""
    from simulator.scheduler import QueueView

    done = min(done, prompt - 1)
    fifo = [(count, done, 0, 0)] + ([(behind, 0, 0, 0)] if behind and not policy.requeue else [])
    view = QueueView(fifo, ready, (prompt,), budget, qlen)
    sp = policy.plan_step(view)
    if not (len(sp.takes) == 1 and sp.decode == ready and sp.takes[0][:2] == (0, count)
            and sp.takes[0][2] < prompt - done):
        return  # not a stretch answer
    tok = sp.takes[0][2]
    holds = policy.stretch_steps(ready, count, tok, prompt - done, budget, qlen)
    alike = 1
    while done + tok * (alike + 1) < prompt:  # the next step's chunk is not the last either
        fifo[0] = (count, done + tok * alike, 0, 0)
        if policy.plan_step(QueueView(fifo, ready, (prompt,), budget, qlen)) != sp:
            break
        alike += 1
    assert holds == alike


def test_a_stretch_stops_before_a_last_chunk_whatever_the_policy_claims():
    """The planner never plays a prompt's last chunk in a stretch (it completes the prompt: another
    step's shape), even for a policy that claims its answer holds for ever."""
    class Overclaiming(TokenBudget):
        def stretch_steps(self, *args):
            return math.inf

    w = Workload(1000, 40, 64, 3)
    p = plan(w, Overclaiming())
    assert [p.shapes[i] for i in p.step_shape] == reference(w, TokenBudget(), affine)[3]


@pytest.mark.parametrize("ctx, round_to", [("mean", 128), ("mean", 1), ("mid", 128)])
# the share of steps the policy may be asked for: halfway between the share before rounds were copied
# (95858cd) and now, both measured
@pytest.mark.parametrize("w, share", [
    (Workload(1000, 8, 64, 6), 0.24),                                    # 0.38 -> 0.11: 15 rounds, none decoding
    (Workload(143, 54, 15, 3, arrival="closed", num_prompts=27), 0.27),  # 0.35 -> 0.20: rounds beside a decode
    (Workload(186, 27, 8, 9, arrival="closed", num_prompts=13), 0.23),   # 0.35 -> 0.11
], ids=["idle", "decoding", "decoding-short-budget"])
def test_a_requeueing_policy_s_rounds_are_copied_not_played(w, share, ctx, round_to):
    """Once a round (every request of the lone FIFO group one chunk further) has been played, the
    rounds the policy says are alike are copied with their chunks further into the prompts and the
    decode contexts moved on (a context round of 1 shows every step's); the plan still equals the
    per-request reference step for step."""
    policy = DecodeFirstWithSlack()
    counting = _counting(policy)
    p = plan(w, counting, decode_context=ctx, context_round=round_to)
    _assert_plays_as_reference(p, w, policy, ctx, context_round=round_to)
    if round_to > 1:  # (with exact contexts every decode step is a new key, so the stretches beside are short)
        assert type(counting).played < share * p.num_steps, (type(counting).played, p.num_steps)


def _round(policy, count: int, done: int, ready: int, prompt: int, budget: int, qlen: int):
    """A requeueing policy's answers over one round of a lone FIFO group of `count` requests `done`
    tokens into their `prompt`, beside `ready` decodes: (chunk, answers), or None if that is no round
    (a take elsewhere than the front, a decode left out, a last chunk, or chunks of two sizes)."""
    from collections import deque

    from simulator.scheduler import QueueView

    answers, front, back, chunk = [], count, 0, None
    while front:
        fifo = deque([(front, done, 0, 0)] + ([(back, done + chunk, 0, 0)] if back else []))
        sp = policy.plan_step(QueueView(fifo, ready, (prompt,), budget, qlen))
        if sp.decode != ready or len(sp.takes) != 1 or sp.takes[0][0] != 0:
            return None
        _, n, tok = sp.takes[0]
        chunk = tok if chunk is None else chunk
        if tok != chunk or tok >= prompt - done:
            return None
        answers.append(sp)
        front, back = front - n, back + n
    return chunk, answers


@settings(max_examples=examples(400), deadline=None)
@given(ready=st.integers(0, 12), prompt=st.integers(2, 400), done=st.integers(0, 199), budget=st.integers(1, 120),
       count=st.integers(1, 5), qlen=st.integers(1, 2),
       policy=st.sampled_from([DecodeFirstWithSlack(), DecodeFirstWithSlack(1.5), DecodeFirstWithSlack(3.0),
                               _DecidesOtherwise()]))
def test_a_policy_says_exactly_how_many_more_rounds_are_alike(ready, prompt, done, budget, count, qlen, policy):
    """`round_repeats` equals what playing round after round finds: the same answers, step for step,
    as the prompts advance a chunk a round, up to the round that takes the last chunk; 0 for a
    policy that decides otherwise than the class that claims it."""
    done = min(done, prompt - 1)
    first = _round(policy, count, done, ready, prompt, budget, qlen)
    if first is None:
        return  # not a round
    chunk, answers = first
    remaining = prompt - done - chunk
    claim = policy.round_repeats(ready, count, chunk, remaining, budget, qlen)
    alike = 0
    while remaining - chunk * alike > chunk:  # the next round's chunk is not the last
        if _round(policy, count, prompt - remaining + chunk * alike, ready, prompt, budget, qlen) != first:
            break
        alike += 1
    assert claim == (0 if isinstance(policy, _DecidesOtherwise) else alike)


def test_rounds_stop_before_a_last_chunk_whatever_the_policy_claims():
    """The planner never copies a round that takes the prompts' last chunk (it completes them: they
    start decoding), even for a policy that claims its rounds are alike for ever."""
    class Overclaiming(DecodeFirstWithSlack):
        def round_repeats(self, *args):
            return math.inf

    for w in (Workload(1000, 8, 64, 6), Workload(143, 54, 15, 3, arrival="closed", num_prompts=27)):
        p = plan(w, Overclaiming())
        assert [p.shapes[i] for i in p.step_shape] == reference(w, DecodeFirstWithSlack(), affine)[3]


def test_a_round_that_leaves_decodes_out_is_played_whatever_the_policy_claims():
    """A round in which some ready requests did not decode delayed them: copying it would decode them
    all. The planner plays such rounds, so a policy claiming they repeat gets the plan it gets unclaimed."""
    class OneDecode(DecodeFirstWithSlack):
        def decide(self, state):
            return StepDecision(min(state.pending_prefill, 2), min(state.ready_decode, 1))

    class Claiming(OneDecode):
        def round_repeats(self, ready, count, chunk, remaining, budget, qlen):
            return math.inf

    def played(p):
        finishes = sorted(zip(p.counts.tolist(), p.first_step.tolist(), p.finish_step.tolist(), strict=True))
        return [p.shapes[i] for i in p.step_shape], finishes, p.peak_kv_tokens

    w = Workload(143, 54, 15, 3, arrival="closed", num_prompts=27)
    assert played(plan(w, Claiming())) == played(plan(w, OneDecode()))


@pytest.mark.parametrize("policy", [DecodeFirstWithSlack(), TokenBudget()], ids=["decode-first", "token-budget"])
# the share of steps the policy may be asked for: halfway between one saved state (6e2e216) and the
# last two (now), both measured (decode-first, token-budget; None where the two are equal)
@pytest.mark.parametrize("w, shares", [
    (Workload(64, 16, 128, 400), (0.127, 0.795)),  # 0.152 -> 0.102, 0.946 -> 0.644
    (Workload(64, 16, 100, 500), (None, 0.483)),   # 0.010 -> 0.010, 0.579 -> 0.386
    (Workload(10, 20, 16, 300), (0.082, None)),    # 0.111 -> 0.053, 0.290 -> 0.290
], ids=["both", "token-budget", "decode-first"])
def test_a_period_is_found_by_the_state_saved_before_the_last(w, shares, policy):
    """The cycle detection compares each event's state with the last two it saved: a state saved in a
    burst's transient no longer hides the period until the next save. Plans equal the reference."""
    counting = _counting(policy)
    p = plan(w, counting)
    _assert_plays_as_reference(p, w, policy)
    share = shares[0] if policy.requeue else shares[1]
    if share is not None:
        assert type(counting).played < share * p.num_steps, (type(counting).played, p.num_steps)


def _asked(policy) -> list[int]:
    """Count the steps `policy` is asked for, in the returned one-item list, without changing its class
    (a policy's claims hold for its class's own decision rule only)."""
    calls = [0]
    decide = type(policy).plan_step

    def plan_step(view):
        calls[0] += 1
        return decide(policy, view)

    object.__setattr__(policy, "plan_step", plan_step)  # frozen dataclass: an instance attribute
    return calls


# the share of steps the policy may be asked for: halfway between before token streams (ba9b62b) and
# now, both measured
@pytest.mark.parametrize("w, share", [
    (Workload(80, 12, 40, 60), 0.58),                              # 0.986 -> 0.177: a prompt is two budgets
    (Workload(30, 10, 100, 80), 0.47),                             # 0.795 -> 0.154: whole prompts and a part
    (Workload(80, 12, 40, 60, prefix_cache_hit_rate=0.5), 0.49),   # 0.885 -> 0.103
    (Workload(50, 9, 48, 40, mtp_tokens=1, mtp_acceptance_rates=(0.5,)), 0.65),  # 1.0 -> 0.298
], ids=["long", "short", "cached", "mtp"])
def test_token_streams_equal_the_reference_step_for_step(w, share):
    """A burst's token stream (a started prompt, then fresh ones, the budget the decodes leave taken in
    FIFO order) is played in bulk from token-budget's own answers (`Scheduler.stream`), finishes
    included; the plan still equals the per-request reference step for step, with its KV peak."""
    policy = TokenBudget()
    asked = _asked(policy)
    p = plan(w, policy)
    _assert_plays_as_reference(p, w, TokenBudget())
    assert asked[0] < share * p.num_steps, (asked[0], p.num_steps)


def test_a_stream_answer_other_than_the_policy_s_step_is_not_played():
    """The planner plays a stream only if its first answer is the one the policy gave for this step, and
    names a policy whose stream leaves a ready request out."""
    class Misstreaming(TokenBudget):
        def stream(self, ready, *args, **options):
            runs = super().stream(ready, *args, **options)
            return runs and [(1, ready, 1, 0, 0)] + runs[1:]  # a chunk of one token: not its answer

    class Undercounting(TokenBudget):
        def stream(self, *args, **options):
            runs = super().stream(*args, **options)
            return runs and runs[:1] + [(n, d - 1, *rest) for n, d, *rest in runs[1:]]

    w = Workload(80, 12, 40, 60)
    p = plan(w, Misstreaming())
    assert [p.shapes[i] for i in p.step_shape] == reference(w, TokenBudget(), affine)[3]
    with pytest.raises(RuntimeError, match="streamed .* decodes of .* ready"):
        plan(w, Undercounting())


@settings(max_examples=examples(200), deadline=None)
@given(w=workloads(ARRIVALS), policy=policies, fronted=st.booleans(),
       share=st.sampled_from([0.0, 0.3, 0.9, 0.999, 1.0, 2.0]))
def test_a_peak_limit_stops_only_a_plan_that_outgrows_it(w, policy, fronted, share):
    """A plan given a `peak_limit` is the whole plan while the whole plan's KV peak stays within it, and
    None only where that peak passes it (the KV a plan holds only grows); timed plans included."""
    from dataclasses import replace

    from simulator import Frontend, StepPricer

    if fronted and w.arrival == "closed":
        w = replace(w, frontend=Frontend(request_ms=0.3, client_ms=1.0, stream_us=200.0))
    pricer = StepPricer(affine, policy) if w.timed else None
    whole = plan(w, policy, step_ms=pricer)
    limit = share * whole.peak_kv_tokens
    got = plan(w, policy, step_ms=StepPricer(affine, policy) if w.timed else None, peak_limit=limit)
    if got is None:
        assert whole.peak_kv_tokens > limit
    else:
        assert list(got.step_shape) == list(whole.step_shape) and got.peak_kv_tokens == whole.peak_kv_tokens
        assert np.array_equal(got.finish_step, whole.finish_step) and np.array_equal(got.counts, whole.counts)
    if whole.peak_kv_tokens <= limit:
        assert got is not None


def test_a_closed_loop_that_outgrows_a_limit_early_is_not_played_to_its_end():
    """16 prompts of 100 tokens at once hold 1,600 KV tokens after their prefills, long before any of
    their 50 output tokens is done: a limit of 1,000 stops the plan there (None), 10,000 lets it finish."""
    w = Workload(100, 50, 400, 16, arrival="closed", num_prompts=64)
    assert plan(w, TokenBudget(), peak_limit=1000) is None
    whole = plan(w, TokenBudget())
    assert whole.peak_kv_tokens >= 1600
    assert plan(w, TokenBudget(), peak_limit=10_000).peak_kv_tokens == whole.peak_kv_tokens


@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 59)), min_size=1, max_size=4),
       st.integers(1, 4), st.integers(1, 60), st.booleans(), st.integers(0, 30))
@settings(max_examples=examples(300), deadline=None)
def test_a_lone_front_take_is_applied_as_any_takes_are(groups, n, tok, requeue, cached):
    """A step's only take, from the front group (most steps), has its own path (`_take_front`): it leaves the
    FIFO, the step's entries, the first tokens and the KV added as the general path (`_take_each`) does, for
    requests that finish their prompt or not, all of the group or some, and both FIFO disciplines."""
    from collections import deque
    from types import SimpleNamespace

    from simulator.planstate import _take_each, _take_front

    kinds = SimpleNamespace(effective=(60,), cached=(cached,))
    policy = SimpleNamespace(name="test", requeue=requeue)
    fifo = [(count, done, event, 0) for event, (count, done) in enumerate(groups)]
    take = (0, min(n, fifo[0][0]), min(tok, 60 - fifo[0][1]))
    queues, entries = (deque(fifo), deque(fifo)), ({(5, 5): 1}, {(5, 5): 1})
    fast = _take_front(queues[0], take, policy, kinds, entries[0])
    plain = _take_each(queues[1], (take,), policy, kinds, entries[1])
    assert fast == plain and queues[0] == queues[1] and entries[0] == entries[1]
    with pytest.raises(RuntimeError, match="over-advanced"):
        _take_front(deque(fifo), (0, fifo[0][0] + 1, 1), policy, kinds, {})
