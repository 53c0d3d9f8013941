"""The decode tail: the last decodes after everything has arrived and been prefilled, at once."""

from __future__ import annotations

import numpy as np

from simulator.jumps.base import Jump
from simulator.planstate import before_each
from simulator.pool import kv_held

#: the tail is computed at once from this many decode groups on; fewer finish in fewer steps than
#: its numpy calls cost
TAIL_GROUPS = 8


class DecodeTail(Jump):
    """Claim: when nothing waits to prefill or will arrive and the policy decodes every ready request,
    it does so every step until the last group finishes (nothing else can be asked of it); the decode
    count falls as groups finish and each step's key context follows from the groups left, so the
    whole tail is computed at once, finish records in the order the loop makes them."""

    name, stage = "tail", "answer"
    untimed = True


    def try_jump(self, st, sp) -> int | None:
        pool, a = st.pool, st.arrivals
        if st.queue or a.sent != a.total or len(pool.groups) < TAIL_GROUPS:  # the stage: every ready one decodes
            return None
        start = len(st.step_shape)
        st.peak = max(st.peak, st.kv_prefill + _play_tail(st))
        st.left = 0  # every request left was in the tail
        return len(st.step_shape) - start


def _play_tail(st) -> float:
    """Append the tail's steps, shapes and finish records; return the most KV held by a step."""
    pool, step = st.pool, len(st.step_shape)
    groups = pool.groups
    count, end, first, event, kind = (np.array(col, dtype=np.int64) for col in zip(*groups, strict=True))
    last = end - pool.ticks - 1  # the tail step each group finishes in
    n = int(last.max()) + 1
    prompt = count * np.array(pool.prompts, dtype=np.int64)[kind]
    decoded = count * np.array(pool.steps, dtype=np.int64)[kind]
    # requests, prompt tokens, decode steps leaving after each step (sums of integers, exact in float64)
    gone = np.stack([np.bincount(last, weights=v, minlength=n) for v in (count, prompt, decoded)]).astype(np.int64)
    before = np.zeros((3, n), dtype=np.int64)
    np.cumsum(gone[:, :-1], axis=1, out=before[:, 1:])
    d = pool.ready - before[0]
    prompts = pool.prompt_sum - before[1]
    steps_done = pool.steps_sum + before_each(d) - before[2]
    ctx = st.contexts(prompts, d, d + pool.rate * steps_done, n)
    change = np.flatnonzero((d[1:] != d[:-1]) | (ctx[1:] != ctx[:-1])) + 1
    starts = np.concatenate(([0], change))
    ids = st.book.decodes(d[starts].tolist(), ctx[starts].tolist())
    st.step_shape.extend(np.repeat(np.array(ids, dtype=np.int64), np.diff(np.append(starts, n))).tolist())
    st.step_decode.extend(d.tolist())
    order = np.argsort(last, kind="stable")
    st.finished.extend(zip(count[order].tolist(), event[order].tolist(), first[order].tolist(),
                           (step + last[order]).tolist(), kind[order].tolist(), strict=True))
    groups.clear()
    return float(kv_held(prompts, d, pool.rate, steps_done + d).max())
