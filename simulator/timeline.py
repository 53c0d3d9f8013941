"""The chunked-prefill timeline on request groups, phase one: plan the schedule without latencies.

Decisions depend only on counts, so the whole schedule is planned first. The plan names every
distinct step shape; pricing them is ONE batched call (`simulator.pricing`), and `replay` turns
the prices into times. A group is `count` identical requests: in the prefill FIFO `(count, done,
event, kind)`, in decode `[count, end tick, first step, event, kind]`.

`plan` is one loop over a `PlanState` (simulator.planstate, which draws the state): each step it
asks the fast-forwards of `simulator.jumps` in turn, and plays one step when none takes any. See
simulator/DESIGN.md for the loop and the fast-forwards on one page.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from simulator import jumps as fast_forwards
from simulator.kvbound import Decoders, DecodeRun, plan_kv_bound
from simulator.plans import Plan
from simulator.planstate import PlanState
from simulator.scheduler import DecodeFirstWithSlack, Scheduler
from simulator.standin import NAME as STAND_IN
from simulator.standin import StandIn
from simulator.workload import Workload

__all__ = ["DECODE_CONTEXTS", "PHASES", "Plan", "plan"]

#: The decode key's context is the decoding requests' mean context rounded up to this many tokens,
#: so nearby steps share one key (and one cache entry).
DECODE_CONTEXT_ROUND = 128
PHASES = ("both", "prefill", "decode")
DECODE_CONTEXTS = ("mean", "mid")


def plan(
    workload: Workload,
    scheduler: Scheduler | None = None,
    *,
    phase: str = "both",
    decode_context: str = "mean",
    context_round: int = DECODE_CONTEXT_ROUND,
    step_ms=None,
    jumps: tuple[str, ...] | None = None,
    peak_limit: float | None = None,
) -> Plan | None:
    """Play the scheduler over `workload` until every request has its `output_length` tokens.

    phase "prefill" models a prefill-only instance (requests leave at their first token),
    "decode" a decode-only one (requests arrive with their prompt prefilled and first token out).
    A timed workload (Poisson, or a closed loop behind a front end) depends on time: `step_ms(shape)
    -> ms` prices each new step shape while planning (see `simulator.pricing.StepPricer`). `jumps`
    names the fast-forwards to use (`simulator.jumps`, and "stand-in": `simulator.standin`; None: all,
    (): play every step): the plan is the same whichever are used. Given a `peak_limit`, planning stops
    (None) once the plan holds more KV tokens than that: the KV it holds only grows, so its whole plan
    would too (a caller that admits such a load into a KV pool instead need not play the rest).
    """
    scheduler = scheduler or DecodeFirstWithSlack()
    _check(workload, phase, decode_context, context_round, step_ms, jumps)
    stand_in = StandIn.make(workload, scheduler) if jumps is None or STAND_IN in jumps else None
    if stand_in is not None:
        planned = plan(stand_in.workload(workload), scheduler, phase=phase, decode_context=decode_context,
                       context_round=context_round, step_ms=step_ms, jumps=jumps, peak_limit=peak_limit)
        return None if planned is None else replace(planned, stand_in=stand_in)
    w = workload
    if w.kv_blocks:
        run, decoders = DecodeRun(), Decoders()  # the KV-bound planner's fast paths
        run.enabled = decoders.enabled = jumps is None or "repeats" in jumps
        return plan_kv_bound(w, scheduler, w.kv_blocks, phase=phase, decode_context=decode_context,
                             context_round=context_round, step_ms=step_ms, run=run, decoders=decoders)
    fixed = w.input_length + w.output_length // 2 + 1 if decode_context == "mid" else None
    st = PlanState.start(w, scheduler, phase, fixed, context_round, step_ms if w.timed else None)
    if not _play(st, fast_forwards.for_plan(st, jumps), math.inf if peak_limit is None else peak_limit):
        return None
    return _result(st)


def _play(st: PlanState, stages: dict, limit: float) -> bool:
    """Play the steps until every request is done, a fast-forward taking many at once where one can: True,
    or False as soon as the plan holds more than `limit` KV tokens."""
    before, answer_one, after = ([jump.try_jump for jump in stages[s]] for s in fast_forwards.STAGES)
    answer_any = [jump.try_jump for jump in stages["answer"] if not jump.one_take]
    while st.left:
        if st.peak > limit:
            return False
        for try_jump in before:
            try_jump(st, None)
        if st.timed:
            st.receive()
        sp = st.answer()
        if sp.decode == st.pool.ready:  # the only answers a fast-forward makes claims about
            for try_jump in answer_one if len(sp.takes) == 1 else answer_any:
                if try_jump(st, sp) is not None:
                    break
            else:
                step = st.play(sp)
                if step is not None:  # a pure-decode step that finished nobody: "after" repeats it
                    for try_jump in after:
                        try_jump(st, step)
        else:
            st.play(sp)
    return True


def _check(w: Workload, phase: str, decode_context: str, context_round: int, step_ms, jumps) -> None:
    """Name the first argument `plan` cannot take."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    if decode_context not in DECODE_CONTEXTS:
        raise ValueError(f"decode_context must be one of {DECODE_CONTEXTS}, got {decode_context!r}")
    if not isinstance(context_round, int) or context_round < 1:
        raise ValueError(f"context_round must be an integer >= 1, got {context_round!r}")
    if jumps:
        known = (*fast_forwards.names(), STAND_IN)
        unknown = sorted(set(jumps) - set(known))
        if unknown:
            raise ValueError(f"unknown fast-forwards {unknown}; known: {', '.join(known)}")
    if w.kv_blocks:
        return
    if w.timed and step_ms is None:
        raise ValueError("a timed workload (Poisson, or a closed loop behind a front end) is planned with its "
                         "prices: pass step_ms")
    if phase == "decode" and not all(w.kinds.decode_steps):
        raise ValueError("a decode-only instance needs output_length >= 2 for every request (nothing to decode)")


def _result(st: PlanState) -> Plan:
    """The plan the state holds once every request finished."""
    a, timed = st.arrivals, st.timed
    counts, arrival, first, finish, kind = (np.array(col, dtype=np.int64) for col in zip(*st.finished, strict=True))
    return Plan(st.w, st.scheduler, st.phase, st.book.table(), np.array(st.step_shape, dtype=np.int64), counts,
                first, finish, float(st.peak), arrival, np.array(a.steps, dtype=np.int64),
                np.array(a.steady), np.array(st.step_decode, dtype=np.int64), kind,
                np.array(a.ms) if timed else None, np.array(st.step_end) if timed else None,
                a.frontend.return_ms if timed else 0.0, a.delivered_ms() if timed else None)
