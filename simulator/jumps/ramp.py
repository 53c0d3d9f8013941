"""Ramps: steps that each advance part of the front FIFO group one chunk, played in bulk."""

from __future__ import annotations

import numpy as np

from simulator.jumps.base import Jump
from simulator.planstate import before_each, push_back


class Ramp(Jump):
    """Claim: on a ramp step every ready request decodes and some but not all requests of the front
    group advance one chunk (their prompt's last: they start decoding; or, with a requeueing policy,
    an earlier one: a round). The next step is a ramp step of the same chunk while the policy says so
    (asked with the FIFO and ready count the loop would show it, unless it said how long its answer
    holds: `Scheduler.ramp_steps`) and nobody finishes; nothing else of the loop acts meanwhile, so the
    ramp's steps, joins and key contexts are computed at once. The policy's answer for the step after
    the ramp, if asked, is kept for it."""

    name, stage = "ramp", "answer"
    one_take = untimed = True


    def try_jump(self, st, sp) -> int | None:
        if not _ramps(st, sp):  # the stage gave an answer of one take decoding every ready request
            return None
        start = len(st.step_shape)
        # the KV peak: the step after a ramp step holds all it held and more
        st.ahead, kv_added = _ramp(st, sp)
        st.kv_prefill += kv_added
        return len(st.step_shape) - start


def _ramps(st, sp) -> bool:
    """A ramp step: see `Ramp`; an impossible take is the loop's to name."""
    queue, pool = st.queue, st.pool
    if not (queue and sp.takes):
        return False
    count, done, _, kind = queue[0]
    n, tok = _front_take(sp, pool.ready, count)
    need = st.kinds.effective[kind]
    if not (n and 0 < tok and done + tok <= need) or pool.next_end <= pool.ticks + (1 if sp.decode else 0):
        return False
    return pool.steps[kind] > 0 if done + tok == need else st.scheduler.requeue


def _front_take(sp, ready: int, count: int) -> tuple[int, int]:
    """(requests, tokens each) of a ramp answer: `sp` decodes all `ready` and advances some but not
    all `count` requests of the front group; (0, 0) if `sp` is no ramp answer."""
    if len(sp.takes) != 1 or sp.decode != ready:
        return 0, 0
    pos, n, tok = sp.takes[0]
    return (n, tok) if pos == 0 and 0 < n < count else (0, 0)


def _ramp(st, sp):
    """Play the ramp from the policy's answer `sp`. Returns the policy's answer for the step after the
    ramp if it was asked, and the prefill KV tokens the ramp added (a chunk's tokens; a cached prefix
    with the first chunk; a finished prompt's leave for the decode pool)."""
    queue, pool, kinds = st.queue, st.pool, st.kinds
    count, done, event, kind = queue[0]
    n, tok = _front_take(sp, pool.ready, count)
    seq = done + tok
    joins = seq == kinds.effective[kind]  # the prompts complete and start decoding, else a round
    takes, decodes, sp = _ramp_steps(st, sp, n, tok, joins)
    p, d = np.array(takes, dtype=np.int64), np.array(decodes, dtype=np.int64)
    joined = before_each(p) if joins else np.zeros(len(p), dtype=np.int64)
    prompts = pool.prompt_sum + kinds.input[kind] * joined
    steps_done = pool.steps_sum + before_each(d)
    live = d > 0
    safe = np.where(live, d, 1)
    ctx = np.where(live, st.contexts(prompts, safe, safe + pool.rate * steps_done, len(d)), 0)
    step = len(st.step_shape)
    st.step_shape.extend(st.book.chunks(tok, p, seq, d, ctx))
    clock = pool.ticks + np.cumsum(live)  # the decode pool's ticks after each step, when its prefills join
    if joins:
        steps = pool.steps[kind]
        pool.join_ramp([[nj, tick, step + j, event, kind]
                        for j, (nj, tick) in enumerate(zip(takes, (clock + steps).tolist(), strict=True))])
    pool.ticks = int(clock[-1])
    st.step_decode.extend(decodes)
    pool.steps_sum += int(d.sum())
    taken = int(p.sum())  # as `apply_takes` and the loop count them
    added = taken * (tok + (0 if done else kinds.cached[kind]))
    return sp, added - (taken * kinds.input[kind] if joins else 0)


def _ramp_steps(st, sp, n: int, tok: int, joins: bool):
    """Walk the ramp: the requests each step takes and the decodes beside them, asking the policy
    only where it did not say its answer holds. Leaves the FIFO and the policy's view as the loop
    would after the ramp; returns (takes, decodes, the policy's answer for the step after the ramp
    or None)."""
    queue, pool, scheduler, view = st.queue, st.pool, st.scheduler, st.view
    count, done, event, kind = queue[0]
    seq = done + tok
    steps = pool.steps[kind] if joins else 0
    ready, ticks = pool.ready, 0   # ticks: decode steps played in the ramp
    takes, decodes = [], []
    end = pool.next_end - pool.ticks  # ticks until the first decode group finishes
    moved = 0  # requests of a round not yet requeued
    holds = scheduler.ramp_steps(ready, n, tok, view.max_batched_tokens, st.qlen, n if joins else 0)
    while True:
        takes.append(n)
        decodes.append(ready)
        if ready:
            ticks += 1
        if joins:
            end = min(end, ticks + steps)  # the group joining now finishes `steps` ticks on
            ready += n
        else:
            moved += n
        count -= n
        holds -= 1
        if end <= ticks + 1:  # the next step finishes somebody
            sp = None
            break
        if holds > 0 and n < count:
            continue  # the policy answers the next step alike
        _ramp_sync(st, (count, done, event, kind), moved, seq, ready)
        moved = 0
        sp = scheduler.plan_step(view)
        n, took = _front_take(sp, ready, count)
        if not n or took != tok:
            break
        holds = scheduler.ramp_steps(ready, n, tok, view.max_batched_tokens, st.qlen, n if joins else 0)
    _ramp_sync(st, (count, done, event, kind), moved, seq, ready)
    return takes, decodes, sp


def _ramp_sync(st, front: tuple, moved: int, seq: int, ready: int) -> None:
    """Bring the FIFO and the policy's view up to a ramp's step: the front group `front` (count, done,
    event, kind), a round's `moved` chunks requeued (merged as `push_back` would)."""
    st.queue[0] = front
    if moved:
        push_back(st.queue, (moved, seq, *front[2:]))
    st.view.ready_decode = ready
