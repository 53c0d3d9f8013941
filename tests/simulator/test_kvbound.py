"""KV-bound admission and preemption: vLLM 0.33's own scheduler traces with a small KV pool
reproduced step for step, the planner against a plain reference on random workloads, and
hand-computed cases. Set SERVESWEEP_VLLM_KV_TRACES to check other traces of the kind."""

import json
import math
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from simulator import TokenBudget, Workload, plan, simulate
from simulator.blocks import BLOCK_SIZE, NO_EVICT
from tests.conftest import examples
from tests.simulator.kv_reference import kv_reference
from tests.simulator.test_timeline import one_ms
from tests.simulator.test_vllm_traces import _expand, _planned_steps

TRACES = Path(os.environ.get("SERVESWEEP_VLLM_KV_TRACES",
                             Path(__file__).parents[1] / "data" / "vllm_kv_traces_0.33.0.jsonl"))
CASES = [json.loads(line) for line in TRACES.read_text().splitlines() if line.strip()]


def _workload(case) -> Workload:
    closed = case["mode"] == "closed"
    return Workload(case["input_length"], case["output_length"], case["max_num_batched_tokens"], case["concurrency"],
                    arrival="closed" if closed else "burst", num_prompts=case["num_prompts"] if closed else 0,
                    kv_blocks=case["num_blocks"])


def _recorded(case) -> list[Counter]:
    """Per step of a trace: requests by (tokens, "d" | "p"), a decode being one token that completes a
    request that has sampled before (vLLM labels an entry "d" once it is past the prompt, so a
    recomputation's later chunks too; we count those as chunks). Sampled tokens are counted along."""
    prompt, sampled, out = case["input_length"], {}, []
    for step in case["steps"]:
        c = Counter()
        for req, tokens, _, before in step:
            done = sampled.get(req, 0)
            c[(tokens, "d" if tokens == 1 and done and before + 1 == prompt + done else "p")] += 1
            if before + tokens >= prompt + done:
                sampled[req] = done + 1
        out.append(c)
    return out


@pytest.mark.parametrize("case", CASES, ids=[f"{c['mode']}-{c['input_length']}x{c['output_length']}-"
                                             f"{c['num_blocks']}blocks" for c in CASES])
def test_kv_bound_trace_is_reproduced_step_for_step(case):
    scheduler = TokenBudget(max_num_seqs=case["max_num_seqs"],
                            long_prefill_token_threshold=case["long_prefill_token_threshold"] or None)
    p = plan(_workload(case), scheduler)
    recorded = _recorded(case)
    assert p.num_steps == case["num_steps"]
    for i, (ours, theirs) in enumerate(zip(_planned_steps(p), recorded, strict=True)):
        assert ours == theirs, f"step {i}: ours {dict(ours)}, vLLM {dict(theirs)}"
    assert p.preemptions == case["preemptions"]
    assert _expand(p.first_step, p.counts) == sorted(case["first_token_step"])
    assert _expand(p.finish_step, p.counts) == sorted(case["finish_step"])
    assert _expand(p.event_step[p.arrival] + 1, p.counts) == sorted(case["arrival_step"])
    assert p.peak_kv_tokens <= (case["num_blocks"] - 1) * BLOCK_SIZE


@st.composite
def bound_workloads(draw):
    closed = draw(st.booleans())
    c = draw(st.integers(1, 8))
    w = Workload(draw(st.integers(1, 60)), draw(st.integers(1, 30)), draw(st.integers(1, 64)), c,
                 prefix_cache_hit_rate=draw(st.sampled_from([0.0, 0.0, 0.5])),
                 arrival="closed" if closed else "burst", num_prompts=draw(st.integers(1, 20)) if closed else 0)
    longest = w.input_length + w.output_length
    # from a pool that holds one request's whole life to one that holds all of them
    return w, draw(st.integers(-(-longest // BLOCK_SIZE) + 1, -(-longest // BLOCK_SIZE) * c + 2))


@settings(max_examples=examples(300), deadline=None)
@given(case=bound_workloads(), seqs=st.integers(1, 6), cap=st.sampled_from([None, 4, 16]))
@example(case=(Workload(1, 17, 5, 3, arrival="closed", num_prompts=3), 4), seqs=3, cap=4)  # a 1-token chunk
def test_kv_bound_plans_equal_the_plain_reference(case, seqs, cap):  # of a recomputation is not a decode
    import dataclasses

    w, blocks = case
    scheduler = TokenBudget(max_num_seqs=seqs, long_prefill_token_threshold=cap)
    steps, reqs, preemptions, peak = kv_reference(w, scheduler, blocks)
    p = plan(dataclasses.replace(w, kv_blocks=blocks), scheduler)
    theirs = [Counter(("d",) if decode else (n, after) for _, n, after, decode in step) for step in steps]
    ours = []
    for shape_id in p.step_shape:
        c = Counter()
        for k in p.shapes[shape_id]:
            c[("d",) if k.is_decode else (k.query_len, k.seq_len)] += k.concurrency
        ours.append(c)
    assert ours == theirs
    assert p.preemptions == preemptions
    assert _expand(p.first_step, p.counts) == sorted(r["first"] for r in reqs)
    assert _expand(p.finish_step, p.counts) == sorted(r["finish"] for r in reqs)
    assert p.peak_kv_tokens == peak * BLOCK_SIZE


def test_a_pool_too_small_queues_requests_hand_computed():
    # 3 requests of 16 + 4 tokens, budget 64, a pool of 3 blocks (2 usable: one is the null block).
    # Step 0 admits request 0 (its 16-token prompt: 1 block) and request 1 (1 block); request 2
    # waits. Step 1: request 0 decodes to 17 tokens and needs a 2nd block: request 1 (the newest)
    # is preempted. Request 0 then decodes alone until it finishes at step 3; request 1 is
    # recomputed (16 + 1 tokens: 2 blocks) in step 4 and finishes at step 6; request 2 (it waited
    # for the blocks) is prefilled in step 7 and finishes at step 10. One 1-ms step each: TTFT
    # 1, 1 and 8 ms.
    w = Workload(16, 4, 64, 3, kv_blocks=3)
    p = plan(w, TokenBudget())
    assert p.preemptions == 1
    assert _expand(p.first_step, p.counts) == [0, 0, 7]
    assert _expand(p.finish_step, p.counts) == [3, 6, 10]
    m = simulate(w, one_ms, TokenBudget())
    assert m.peak_kv_tokens == 2 * BLOCK_SIZE
    assert m.ttft_ms == pytest.approx((1 + 1 + 8) / 3)


def test_kv_bound_refusals_name_what_is_not_modelled():
    from simulator import DecodeFirstWithSlack

    with pytest.raises(ValueError, match="token-budget .* and prefill-first .* policies, not .decode-first"):
        plan(Workload(16, 4, 64, 3, kv_blocks=3), DecodeFirstWithSlack())
    with pytest.raises(ValueError, match="MTP"):
        plan(Workload(16, 4, 64, 3, kv_blocks=3, mtp_tokens=1, mtp_acceptance_rates=(0.5,)), TokenBudget())
    with pytest.raises(RuntimeError, match="cannot hold one request"):
        plan(Workload(64, 4, 64, 1, kv_blocks=2), TokenBudget())
    assert np.array_equal(plan(Workload(16, 4, 64, 3, kv_blocks=1000), TokenBudget()).step_shape,
                          plan(Workload(16, 4, 64, 3), TokenBudget()).step_shape)


def _plan_or_refusal(*args, **kwargs):
    """plan_kv_bound's plan, or its refusal (a pool that cannot admit one request: under new-token-ratio admission
    a pool of one request's exact size cannot, as SGLang's rule asks for fewer tokens than are free)."""
    from simulator.kvbound import plan_kv_bound

    try:
        return plan_kv_bound(*args, **kwargs)
    except RuntimeError as refused:
        return str(refused)


def _same_outcome(a, b) -> None:
    if isinstance(a, str) or isinstance(b, str):
        assert a == b and "cannot hold one request" in a
    else:
        _same_plan(a, b)


def _same_plan(a, b) -> None:
    assert [a.shapes[i] for i in a.step_shape] == [b.shapes[i] for i in b.step_shape]
    for name in ("counts", "first_step", "finish_step", "arrival", "event_step", "step_decode", "kind"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert (a.peak_kv_tokens, a.preemptions) == (b.peak_kv_tokens, b.preemptions)
    if a.step_end_ms is not None:
        assert np.allclose(a.step_end_ms, b.step_end_ms) and np.allclose(a.event_ms, b.event_ms)
    if a.step_delivered_ms is not None or b.step_delivered_ms is not None:
        assert np.allclose(a.step_delivered_ms, b.step_delivered_ms)


@settings(max_examples=examples(200), deadline=None)
@given(case=bound_workloads(), timed=st.sampled_from([None, "closed", "streamed"]))
def test_a_pool_that_never_binds_plays_prefill_first_as_the_plain_planner(case, timed):
    """SGLang's default policy in the KV-bound planner, in a pool every request holds whole: the same steps as
    the group timeline's PrefillFirst (a prefill batch of the started prompts then whole ones, the last cut to the
    budget, nobody decoding; else every ready request decodes), the same first tokens and finishes, untimed,
    timed and behind a streaming front end."""
    import dataclasses

    from simulator import Frontend, PrefillFirst, StepPricer, per_request
    from simulator.kvbound import plan_kv_bound
    from tests.simulator.test_timeline import affine

    w, _ = case
    w = dataclasses.replace(w, prefix_cache_hit_rate=0.0)  # (the plain planner shares cached prefixes by group)
    if timed:
        fe = Frontend(request_ms=0.3, return_ms=0.5, client_ms=1.0, stream_us=300.0 if timed == "streamed" else 0.0)
        w = dataclasses.replace(w, arrival="closed", num_prompts=max(w.prompts, 2), measure="all", frontend=fe)
    scheduler = PrefillFirst()
    step_ms = StepPricer(affine, scheduler) if w.timed else None
    plain = plan(w, scheduler, step_ms=step_ms)
    bound = plan_kv_bound(w, scheduler, 10_000, step_ms=step_ms)
    assert [plain.shapes[i] for i in plain.step_shape] == [bound.shapes[i] for i in bound.step_shape]
    assert bound.preemptions == 0
    if w.timed:
        times = [per_request(p, np.diff(np.concatenate(([0.0], p.step_end_ms)))) for p in (plain, bound)]
        for key in ("arrival_ms", "first_token_ms", "finish_ms"):
            assert np.allclose(np.sort(times[0][key]), np.sort(times[1][key])), key
    else:
        for p in (plain, bound):
            assert p.counts.sum() == w.prompts
        assert sorted(np.repeat(plain.finish_step, plain.counts)) == sorted(np.repeat(bound.finish_step, bound.counts))


def test_a_prefill_batch_does_not_schedule_a_started_prompt_its_first_preempted():
    """Two started prompts of 100 tokens in a pool of 7 blocks, the second holding one: the first's 7 blocks
    preempt the second (the newest), which goes back to the queue holding nothing, and only the first is in the
    batch."""
    from simulator import PrefillFirst
    from simulator.kvbound import KVBoundPlanner, _Request

    planner = KVBoundPlanner(Workload(100, 10, 512, 2), PrefillFirst(), kv_blocks=8)
    first, second = _Request(0, 100, 10, 0, 0), _Request(0, 100, 10, 0, 0)
    planner.running += [first, second]
    planner._take(second, 16)
    head, scheduled = planner.step()
    assert (head, scheduled) == (0, [(first, 100)])
    assert list(planner.waiting) == [second] and second.blocks == 0 and planner.preemptions == 1
    assert first.blocks == 7 and planner.free == 0


@pytest.mark.parametrize("output", [2, 3, 9])
def test_a_pool_that_never_binds_streams_as_the_plain_planner(output):
    """The KV-bound planner's front end streams each step's chunks and sends replacements when the last
    token is out, as the plain planner does: a closed loop behind a streaming server, in a pool that never
    binds, has the same steps, the same times out and the same requests' times."""
    from simulator import Frontend, StepPricer, per_request, plan
    from simulator.kvbound import plan_kv_bound
    from tests.simulator.test_timeline import affine

    fe = Frontend(request_ms=0.3, return_ms=0.5, client_ms=1.0, stream_us=700.0)
    w = Workload(24, output, 64, 5, arrival="closed", num_prompts=17, measure="all", frontend=fe)
    scheduler = TokenBudget()
    plain = plan(w, scheduler, step_ms=StepPricer(affine, scheduler))
    bound = plan_kv_bound(w, scheduler, 10_000, step_ms=StepPricer(affine, scheduler))
    assert [plain.shapes[i] for i in plain.step_shape] == [bound.shapes[i] for i in bound.step_shape]
    for name in ("step_end_ms", "step_delivered_ms", "event_ms"):  # (its KV peak counts whole blocks)
        assert np.allclose(getattr(plain, name), getattr(bound, name)), name
    times = [per_request(p, np.diff(np.concatenate(([0.0], p.step_end_ms)))) for p in (plain, bound)]
    for key in ("arrival_ms", "first_token_ms", "finish_ms"):
        assert np.allclose(np.sort(times[0][key]), np.sort(times[1][key])), key
    assert (plain.step_delivered_ms > plain.step_end_ms).any()  # tokens go out after their steps


@settings(max_examples=examples(200), deadline=None)
@given(case=bound_workloads(), seqs=st.integers(1, 6),
       timed=st.sampled_from([None, "closed", "streamed", "poisson"]),
       ctx=st.sampled_from(["mean", "mid"]), round_to=st.sampled_from([1, 8, 128]),
       admission=st.sampled_from(["max-utilization", "new-token-ratio"]))
def test_the_decode_run_fast_forward_plays_as_every_step(case, seqs, timed, ctx, round_to, admission):
    """Untimed, timed, and behind a front end that streams at a cost (each step's chunks hold back the
    requests behind them, so the run asks before each step whether one reached the scheduler)."""
    import dataclasses

    from simulator import Frontend, StepPricer
    from simulator.kvbound import DecodeRun
    from tests.simulator.test_timeline import affine

    w, blocks = case
    w = dataclasses.replace(w, kv_admission=admission)
    if timed in ("closed", "streamed"):
        fe = Frontend(request_ms=0.2, return_ms=0.5, client_ms=2.0, stream_us=300.0 if timed == "streamed" else 0.0)
        w = dataclasses.replace(w, arrival="closed", num_prompts=max(w.prompts, 2), frontend=fe)
    elif timed == "poisson":
        w = dataclasses.replace(w, arrival="poisson", num_prompts=max(w.prompts, 2), request_rate=200.0)
    scheduler = TokenBudget(max_num_seqs=seqs)
    off = DecodeRun()
    off.enabled = False
    plans = [_plan_or_refusal(w, scheduler, blocks, decode_context=ctx, context_round=round_to, run=run,
                              step_ms=StepPricer(affine, scheduler) if w.timed else None) for run in (DecodeRun(), off)]
    _same_outcome(*plans)


@st.composite
def crowded_workloads(draw):
    """Closed loops of up to 48 requests in a pool too small for them: the head run of decoders is long,
    finishes and preemptions cut it often."""
    c = draw(st.integers(8, 48))
    w = Workload(draw(st.integers(1, 40)), draw(st.integers(2, 40)), draw(st.integers(8, 96)), c,
                 arrival="closed", num_prompts=draw(st.integers(c, 3 * c)))
    longest = w.input_length + w.output_length
    return w, draw(st.integers(-(-longest // BLOCK_SIZE) + 1, -(-longest // BLOCK_SIZE) * c))


@settings(max_examples=examples(200), deadline=None)
@given(case=st.one_of(bound_workloads(), crowded_workloads()), seqs=st.integers(1, 64),
       timed=st.sampled_from([None, "closed", "streamed"]), cap=st.sampled_from([None, 4]),
       ctx=st.sampled_from(["mean", "mid"]), run=st.booleans(),
       admission=st.sampled_from(["max-utilization", "new-token-ratio"]), prefill_first=st.booleans())
def test_the_head_run_of_decoders_plays_as_every_request(case, seqs, timed, cap, ctx, run, admission, prefill_first):
    """Decoders (the head run of decoding requests kept as one step count) against every request played,
    with the decode-run fast-forward on or off, untimed, timed and behind a streaming front end, under either
    admission and either policy that has one (token budget; SGLang's prefill-first)."""
    import dataclasses

    from simulator import Frontend, PrefillFirst, StepPricer
    from simulator.kvbound import Decoders, DecodeRun
    from tests.simulator.test_timeline import affine

    w, blocks = case
    w = dataclasses.replace(w, kv_admission=admission)
    if timed:
        fe = Frontend(return_ms=0.5, client_ms=2.0, stream_us=300.0 if timed == "streamed" else 0.0)
        w = dataclasses.replace(w, arrival="closed", num_prompts=max(w.prompts, 2), frontend=fe)
    scheduler = PrefillFirst() if prefill_first else TokenBudget(max_num_seqs=seqs, long_prefill_token_threshold=cap)
    plans = []
    for on in (True, False):
        decoders, decode_run = Decoders(), DecodeRun()
        decoders.enabled, decode_run.enabled = on, run
        plans.append(_plan_or_refusal(w, scheduler, blocks, decode_context=ctx, run=decode_run, decoders=decoders,
                                      step_ms=StepPricer(affine, scheduler) if w.timed else None))
    _same_outcome(*plans)


def test_the_head_run_of_decoders_takes_all_but_the_cut_prompt_of_a_crowded_loop():
    """A closed loop of 40 in a pool of 30 requests' worth, preempting. Prompts of 64 tokens fit a 2,048-token
    budget whole, so the only request not decoding when a step is scheduled is the last one admitted the step
    before, whose prompt the budget cut (admission stops there); it sits at the tail. So every step the head
    run schedules all of a step's running requests but at most that one (an empty head only when nothing
    runs): no step costs one operation a request. And the plan equals the plain one."""
    from simulator.kvbound import Decoders, DecodeRun, plan_kv_bound

    class Counted(Decoders):
        def schedule(self, planner, budget):
            head = super().schedule(planner, budget)
            ran.append((head, len(planner.running)))
            return head

    w = Workload(64, 200, 2048, 40, arrival="closed", num_prompts=400)
    scheduler, ran = TokenBudget(), []
    fast = plan_kv_bound(w, scheduler, 30 * 17, run=DecodeRun(), decoders=Counted())
    plain = Decoders()
    plain.enabled = False
    _same_plan(fast, plan_kv_bound(w, scheduler, 30 * 17, run=DecodeRun(), decoders=plain))
    assert fast.preemptions > 0
    assert all(running - head <= 1 for head, running in ran)


@pytest.mark.parametrize(("tokens", "pool", "expect"), [
    ([16, 16], 2, 1),    # a block each holds 16 tokens; one more token needs a second block each
    ([17, 17], 4, 16),   # 2 blocks each, until 33 tokens need a third
    ([16, 30], 4, 3),    # 1 + 2 blocks; at +1 the first needs 2 (4 in all), at +3 the second needs 3
    ([1], 10, 160),      # 10 blocks hold 160 tokens: the 161st needs an 11th
])
def test_fitting_steps_hand_computed(tokens, pool, expect):
    from simulator.kvbound import _fitting_steps

    assert _fitting_steps(np.array(tokens), pool) == expect


def test_guaranteed_no_evict_admits_only_what_fits_to_the_last_token_and_never_preempts():
    """TensorRT-LLM's default capacity scheduler, by hand: a pool of 21 blocks (22 less the null one),
    requests of 100 + 60 tokens reach 10 blocks, so two run at a time: a burst of six runs in three waves
    of 60 steps (a prefill step with the first token, 59 decodes), never preempting. vLLM's admission on the
    same pool takes three prompts of 7 blocks at once and must preempt when their decodes grow."""
    kw = {"input_length": 100, "output_length": 60, "max_batched_tokens": 512, "concurrency": 6, "kv_blocks": 22}
    p = plan(Workload(**kw, kv_admission="guaranteed-no-evict"), TokenBudget())
    assert p.preemptions == 0 and p.num_steps == 3 * 60
    per_step = [sum(key.concurrency for key in p.shapes[i]) for i in p.step_shape]
    assert max(per_step) == 2 and per_step[0] == per_step[60] == per_step[120] == 2
    assert p.peak_kv_tokens <= 21 * BLOCK_SIZE
    vllm = plan(Workload(**kw), TokenBudget())
    assert vllm.preemptions > 0


def test_new_token_ratio_admits_a_prompt_with_its_whole_output_beside_a_share_of_what_the_running_have_left():
    """SGLang's admission, by hand, on the pool above (21 blocks: 336 tokens), requests of 100 + 60 tokens.
    Step 0: the first needs 160 < 336 and is admitted (its prompt takes 7 blocks, its 60 tokens of output are
    promised); the second needs 160, not < 224 - 0.098 x 60 - 60 = 158.1: refused. Step 1: the first has 59 left,
    and 160 < 224 - 0.098 x 59 = 218.2 admits the second; the third needs 160, not < 112 - 0.098 x 119. So two
    run, staggered by a step: the pairs start at steps 0, 60 and 120 (the third admitted when the first frees its
    10 blocks: 160 < 176 - 0.098 x 1), 181 steps, and nothing is preempted."""
    kw = {"input_length": 100, "output_length": 60, "max_batched_tokens": 512, "concurrency": 6, "kv_blocks": 22}
    p = plan(Workload(**kw, kv_admission="new-token-ratio"), TokenBudget())
    per_step = [sum(key.concurrency for key in p.shapes[i]) for i in p.step_shape]
    prefills = [i for i, shape in enumerate(p.step_shape) if any(not k.is_decode for k in p.shapes[shape])]
    assert (p.preemptions, p.num_steps, max(per_step), per_step[0]) == (0, 181, 2, 1)
    assert prefills == [0, 1, 60, 61, 120, 121]
    assert p.peak_kv_tokens == 320


def test_sglang_s_new_token_ratio_rises_at_a_retraction_and_decays_by_decode_steps():
    """SGLang's ratio, by hand: warm, 0.7 x 0.14 = 0.098; a retraction keeping 4 requests that decoded 100 tokens of
    the 400 they may generate sets (100 + 4 x 20) / 401 = 0.4489; each decode step lowers it by (0.7 - 0.098) /
    600 = 0.001003, so 100 steps later 0.3486, and from 351 steps on it rests at 0.098; steps counted, not
    subtracted, so 100 steps at once and one by one agree to the bit."""
    from simulator.blocks import NewTokenRatio

    ratio = NewTokenRatio()
    assert ratio.value == pytest.approx(0.098)
    ratio.retracted(decoded=100, may_generate=400, kept=4)
    assert ratio.value == pytest.approx(180 / 401)
    ratio.steps += 100
    assert ratio.value == pytest.approx(180 / 401 - 100 * 0.602 / 600)
    one_by_one = NewTokenRatio()
    one_by_one.retracted(100, 400, 4)
    for _ in range(100):
        one_by_one.steps += 1
    assert one_by_one.value == ratio.value
    ratio.steps += 251
    assert ratio.value == pytest.approx(0.098)
    ratio.retracted(decoded=900, may_generate=400, kept=4)
    assert ratio.value == 1.0  # at most all of what they have left


def test_a_retraction_sets_sglang_s_ratio_from_the_requests_kept():
    """A crowded SGLang load (24 clients of 200 + 300 tokens, 120 blocks), played to its first preemption: the
    ratio is then what the requests kept have decoded and 20 more each over what they may generate, well above
    the warm 0.098, and the decode steps after it lower it one step each; fewer preemptions than vLLM's rule in
    the same pool."""
    import dataclasses

    from simulator.kvbound import _KVPlan

    w = Workload(200, 300, 512, 24, kv_blocks=120, arrival="closed", num_prompts=72, kv_admission="new-token-ratio")
    k = _KVPlan(w, TokenBudget(), 120, None, "mean", 1)
    k.send(24, -1)
    while not k.planner.preemptions:
        done = k.play()
        if done:
            k.replace(done)
    p = k.planner
    may = sum(r.output for r in p.running)
    assert p.share.steps == 0 and p.share.since == (may - p.to_generate + 20 * len(p.running)) / (may + 1) > 0.3
    before = len(k.step_shape)
    k.play()
    decode_steps = sum(1 for i in range(before, len(k.step_shape))
                       if all(key.is_decode for key in k.book.table()[k.step_shape[i]]))
    assert p.preemptions == 1 and p.share.steps == decode_steps  # the step after it preempted nobody
    sglang, vllm = (plan(dataclasses.replace(w, kv_admission=rule), TokenBudget())
                    for rule in ("new-token-ratio", "max-utilization"))
    assert 0 < sglang.preemptions < vllm.preemptions


def test_a_request_whose_whole_kv_cannot_fit_is_refused_under_no_evict():
    w = Workload(100, 300, 512, 2, kv_blocks=20, kv_admission="guaranteed-no-evict")  # 25 blocks > 19
    with pytest.raises(RuntimeError, match="cannot hold one request"):
        plan(w, TokenBudget())
    with pytest.raises(ValueError, match="kv_admission must be one of"):
        Workload(100, 300, 512, 2, kv_admission="fifo")


def test_the_pool_a_load_outgrows_hand_computed():
    """1,000 tokens of cache for 10 requests in flight: 62 blocks, and a plan without the pool fits while it
    holds at most 1,000 - 16 x 10 = 840 tokens; admitted by NO_EVICT, 10 requests of 60 + 40 tokens reserve
    1,000 to their last token, so no plan fits (-inf), and 10 of 50 + 30 reserve 800 (840 again)."""
    from simulator.blocks import kv_pool

    assert kv_pool(Workload(60, 40, 64, 10), 1000, 10) == (62, 840)
    assert kv_pool(Workload(60, 40, 64, 10, kv_admission=NO_EVICT), 1000, 10) == (62, -math.inf)
    assert kv_pool(Workload(50, 30, 64, 10, kv_admission=NO_EVICT), 1000, 10) == (62, 840)
    assert kv_pool(Workload(60, 40, 64, 10, kv_admission="new-token-ratio"), 1000, 10) == (62, -math.inf)
    assert kv_pool(Workload(50, 30, 64, 10, kv_admission="new-token-ratio"), 1250, 10) == (78, 1090)  # 10 x 96 + 32


@settings(max_examples=examples(100), deadline=None)
@given(case=bound_workloads(), seqs=st.integers(1, 8))
def test_new_token_ratio_refuses_nobody_while_every_request_in_flight_fits_whole(case, seqs):
    """In the smallest pool `kv_pool` plans a load without (every request in flight, prompt and output, and two
    blocks each to spare: `held_kv_tokens`), SGLang's rule refuses nobody: it admits as vLLM's does there."""
    import dataclasses

    from simulator.blocks import held_kv_tokens, kv_pool

    w, _ = case
    w = dataclasses.replace(w, kv_admission="new-token-ratio")
    in_flight = w.prompts if w.arrival != "closed" else min(w.prompts, w.concurrency)
    capacity = held_kv_tokens(w, 0.0, in_flight) + BLOCK_SIZE * in_flight
    assert kv_pool(w, capacity, in_flight).fits == held_kv_tokens(w, 0.0, in_flight)  # not bound: planned without
    blocks = kv_pool(w, capacity, in_flight).blocks
    sglang, vllm = (plan(dataclasses.replace(w, kv_blocks=blocks, kv_admission=rule), TokenBudget(max_num_seqs=seqs))
                    for rule in ("new-token-ratio", "max-utilization"))
    _same_plan(sglang, vllm)
