import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.scheduler import (
    DecodeFirstWithSlack,
    PrefillFirst,
    QueueView,
    SchedulerState,
    StepDecision,
    StepPlan,
    TokenBudget,
    make_scheduler,
)
from tests.conftest import examples


def test_decode_first_rfc_example():
    s = DecodeFirstWithSlack()
    assert s.decide(SchedulerState(512, 1, 4000, 4000)) == StepDecision(1, 512)
    # 4000 + 700 > floor(4000 * 1.15) = 4600: the prefill waits
    assert s.decide(SchedulerState(700, 1, 4000, 4000)) == StepDecision(0, 700)
    assert s.step_latency(3, 5) == 5


def test_decode_first_caps_decode_at_budget_and_fills_the_slack():
    s = DecodeFirstWithSlack()
    assert s.decide(SchedulerState(5000, 10, 100, 4000)) == StepDecision(6, 4000)  # (4600-4000)//100
    assert s.decide(SchedulerState(0, 10, 1000, 4000)) == StepDecision(4, 0)      # 4600//1000
    assert DecodeFirstWithSlack(slack_ratio=1.0).decide(SchedulerState(1, 1, 4000, 4000)).p_step == 0


def test_slack_ratio_is_validated():
    with pytest.raises(ValueError, match="slack_ratio"):
        DecodeFirstWithSlack(slack_ratio=0.9)


def test_token_budget_mixes_decode_running_prefill_and_admission():
    # the note's example: B=2048, 8 decodes, a running request needing 1440, waiting 900-token prompts
    view = QueueView([(1, 460, 0, 0), (2, 0, 1, 0)], 8, (1900,), 2048, 1)
    plan = TokenBudget().plan_step(view)
    assert plan.decode == 8
    assert plan.takes == ((0, 1, 1440), (1, 1, 600))


def test_token_budget_threshold_and_max_num_seqs():
    view = QueueView([(4, 0, 0, 0)], 0, (1000,), 2048, 1)
    assert TokenBudget(long_prefill_token_threshold=512).plan_step(view).takes == ((0, 4, 512),)
    assert TokenBudget(max_num_seqs=2).plan_step(view).takes == ((0, 2, 1000),)
    assert TokenBudget(max_num_seqs=2).plan_step(QueueView([(4, 0, 0, 0)], 2, (1000,), 2048, 1)).takes == ()


def test_prefill_first_prefills_while_anyone_waits_and_never_mixes():
    """SGLang's policy on the note's example (B=2048, 8 ready decodes, a running request needing 1440,
    two waiting 1900-token prompts): the started request's 1440, then 608 of the next prompt, and no
    decode; with nothing waiting, every ready request decodes, beyond the budget too."""
    view = QueueView([(1, 460, 0, 0), (2, 0, 1, 0)], 8, (1900,), 2048, 1)
    assert PrefillFirst().plan_step(view) == StepPlan(((0, 1, 1440), (1, 1, 608)), 0)
    assert PrefillFirst().plan_step(QueueView([], 3000, (1900,), 2048, 2)) == StepPlan((), 3000)
    whole = QueueView([(3, 0, 0, 0)], 5, (500,), 2048, 1)  # whole prompts while they fit, the last cut
    assert PrefillFirst().plan_step(whole).takes == ((0, 3, 500),)
    assert PrefillFirst().plan_step(QueueView([(5, 0, 0, 0)], 5, (500,), 2048, 1)).takes == ((0, 4, 500), (0, 1, 48))


def test_prefill_first_plan_by_hand():
    """Two prompts of 10 tokens, B = 16, 3 output tokens: step 1 prefills the first and 6 of the
    second, step 2 the second's last 4 while the first waits (token-budget would decode it beside),
    then both decode twice."""
    from latency import ForwardKey
    from simulator import Workload, plan

    p = plan(Workload(10, 3, 16, 2), PrefillFirst())
    steps = [sorted(p.shapes[i]) for i in p.step_shape]
    assert steps[0] == sorted([ForwardKey(False, 1, 10, 10), ForwardKey(False, 1, 6, 6)])
    assert steps[1] == [ForwardKey(False, 1, 4, 10)]
    assert [[k.is_decode and k.concurrency for k in s] for s in steps[2:]] == [[2], [2]]
    mixed = plan(Workload(10, 3, 16, 2), TokenBudget())
    assert any(k.is_decode for k in mixed.shapes[mixed.step_shape[1]])


def test_registry():
    assert isinstance(make_scheduler("token-budget", max_num_seqs=8), TokenBudget)
    with pytest.raises(ValueError, match="decode-first"):
        make_scheduler("fifo")


def test_token_budget_counts_a_request_one_token_into_its_prompt_as_running():
    # max_num_seqs 2: one request has prefilled 1 of its 2 tokens, so only one of the 5 waiting is admitted
    view = QueueView([(1, 1, 0, 0), (5, 0, 0, 0)], 0, (2,), 4, 1)
    assert TokenBudget(max_num_seqs=2).plan_step(view).takes == ((0, 1, 1), (1, 1, 2))
    # a decode costs 1 + MTP tokens of the budget: 7 // 2 = 3 decodes fit, not 3.5
    assert TokenBudget().plan_step(QueueView([], 9, (2,), 7, 2)).decode == 3


class _DecidesOtherwise(DecodeFirstWithSlack):
    """Decode-first with its own decision rule: its claims do not carry over."""

    def decide(self, state):
        return super().decide(state)


def _stream_by_plan_step(policy, ready, front, fresh, need, budget, qlen, leaving):
    """What `plan_step` answers, step after step, on a token stream (see `Scheduler.stream`), as
    (decodes, started request's tokens, fresh prompts whole, tokens of a fresh prompt started)."""
    answers = []
    for left in leaving:
        fifo = ([(1, need - front, 0, 0)] if front else []) + ([(fresh, 0, 0, 0)] if fresh else [])
        if not ready or not fifo:
            break
        sp = policy.plan_step(QueueView(fifo, ready, (need,), budget, qlen))
        if sp.decode != ready or not sp.takes:
            break
        took = whole = part = 0
        for pos, n, tok in sp.takes:
            if front and pos == 0:
                took = tok
            elif tok == need:
                whole += n
            else:
                assert n == 1
                part = tok
        answers.append((ready, took, whole, part))
        joins = whole + (1 if took and took == front else 0)
        front -= took
        fresh -= whole
        if part:
            fresh, front = fresh - 1, need - part
        ready += joins - left
    return answers


@settings(max_examples=examples(500), deadline=None)
@given(ready=st.integers(0, 30), front=st.integers(0, 299), fresh=st.integers(0, 20), need=st.integers(1, 300),
       budget=st.integers(1, 600), qlen=st.integers(1, 2), leaving=st.lists(st.integers(0, 3), max_size=30),
       policy=st.sampled_from([TokenBudget(), TokenBudget(max_num_seqs=8),
                               TokenBudget(long_prefill_token_threshold=40), DecodeFirstWithSlack(),
                               DecodeFirstWithSlack(1.5), _DecidesOtherwise()]))
def test_a_policy_s_stream_is_its_plan_step(ready, front, fresh, need, budget, qlen, leaving, policy):
    """`stream` answers, step for step (runs expanded), what `plan_step` answers on the same stream, and stops where it
    would stop being one (a decode left out, nothing taken, nobody decoding); decode-first's started
    request, or a prompt longer than the budget, goes round the FIFO in chunks, so it claims no stream
    then; a token-budget policy with a cap on
    running requests or chunks, or a decode-first deciding otherwise, does not claim to know."""
    front = min(front, need - 1)
    leaving = [min(left, ready) for left in leaving]  # no more can finish than decode (checked again below)
    claimed = policy.stream(ready, front, fresh, need, budget, qlen, leaving=leaving)
    if isinstance(policy, _DecidesOtherwise) or getattr(policy, "max_num_seqs", None) is not None \
            or getattr(policy, "long_prefill_token_threshold", None):
        assert claimed is None
        return
    if policy.requeue and (front or need > budget):  # chunks that go round the FIFO
        assert claimed == []
        return
    assert all(run[0] >= 1 for run in claimed)
    steps = [tuple(run[1:]) for run in claimed for _ in range(run[0])]
    assert steps == _stream_by_plan_step(policy, ready, front, fresh, need, budget, qlen, leaving)
