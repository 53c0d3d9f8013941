"""Chunk stretches: the whole front group advancing chunk by chunk, taken at once."""

from __future__ import annotations

import numpy as np

from simulator.jumps.base import Jump
from simulator.scheduler import chunks_before_last


class Stretch(Jump):
    """Claim: when every ready request decodes and the whole front group advances one chunk (not its
    prompt's last) keeping its place (a depth-first policy, or the only group), the policy answers
    alike for as many steps as it says (`Scheduler.stretch_steps`); taken up to the chunk before the
    last and before a decode group finishes (at least 2 steps; the step after is the loop's)."""

    name, stage = "stretch", "answer"
    one_take = untimed = True


    def try_jump(self, st, sp) -> int | None:
        k = _stretch_steps(st, sp)  # the stage gave an answer of one take decoding every ready request
        if not k:
            return None
        # the KV peak, as on a ramp: every step of a stretch holds more than the one before
        st.kv_prefill += _stretch(st, sp, k)
        return k


def _stretch_steps(st, sp) -> int:
    """The steps of the chunk stretch starting with the policy's answer `sp` (0 if it starts none)."""
    queue, pool, scheduler = st.queue, st.pool, st.scheduler
    if not queue:
        return 0
    pos, n, tok = sp.takes[0]
    count, done, _, kind = queue[0]
    remaining = st.kinds.effective[kind] - done
    if not (pos == 0 and n == count and 0 < tok < remaining and (not scheduler.requeue or len(queue) == 1)):
        return 0
    k = chunks_before_last(remaining, tok)
    if k < 2:
        return 0
    k = min(scheduler.stretch_steps(pool.ready, n, tok, remaining, st.w.max_batched_tokens, st.qlen), k)
    if pool.ready:
        k = min(k, pool.next_end - pool.ticks - 1)
    return int(k) if k >= 2 else 0


def _stretch(st, sp, k: int) -> int:
    """Play the `k` steps of a chunk stretch, the first with the policy's answer `sp`; the decode keys'
    contexts as the loop would compute them. Returns the prefill KV tokens the chunks added (a cached
    prefix with the first)."""
    queue, pool = st.queue, st.pool
    count, done, event, kind = queue[0]
    _, n, tok = sp.takes[0]
    ready = pool.ready
    if ready:
        generated = ready + pool.rate * (pool.steps_sum + ready * np.arange(k))
        ctx = st.contexts(pool.prompt_sum, ready, generated, k)
    else:
        ctx = np.zeros(k, dtype=np.int64)
    seqs = np.arange(done + tok, done + tok * k + 1, tok)
    st.step_shape.extend(st.book.chunks(tok, n, seqs, ready, ctx))
    st.step_decode.extend([ready] * k)
    queue[0] = (count, done + tok * k, event, kind)
    if ready:
        pool.ticks += k
        pool.steps_sum += k * ready
    return n * tok * k + (0 if done else n * st.kinds.cached[kind])
