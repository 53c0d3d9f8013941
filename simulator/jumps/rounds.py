"""Round copies: a requeueing policy's rounds over one FIFO group, copied instead of played."""

from __future__ import annotations

import numpy as np

from simulator.jumps.base import Jump
from simulator.scheduler import chunks_before_last


class RoundCopies(Jump):
    """Claim: when the FIFO holds one group again, whole, each request one chunk (not its last)
    further than at the mark, beside the same decodes and with nobody finished, the steps since the
    mark are a round; the policy says how many more rounds it answers alike
    (`Scheduler.round_repeats`), and they are copied up to the round before the last chunk and
    before a decode group finishes, each copy's chunks one chunk further into the prompts."""

    name, stage = "rounds", "before"

    def __init__(self) -> None:
        self.mark = None  # (step, lone FIFO group, ready, finish records) where a round may have begun

    @classmethod
    def make(cls, st) -> RoundCopies | None:
        return cls() if st.scheduler.requeue and not st.timed else None

    def try_jump(self, st, _) -> int | None:
        if len(st.queue) != 1 or st.ahead is not None:
            return None
        start = len(st.step_shape)
        copies = self._copies(st)
        if copies:
            st.kv_prefill += self._repeat(st, copies)
        self.mark = (len(st.step_shape), st.queue[0], st.pool.ready, len(st.finished))
        return (len(st.step_shape) - start) or None

    def _copies(self, st) -> int:
        """How many more times the round since the mark plays alike (0 if the steps since are no round)."""
        if self.mark is None:
            return 0
        t0, (count, done0, event, kind), ready, finishes0 = self.mark
        count_now, done, event_now, kind_now = st.queue[0]
        step, pool = len(st.step_shape), st.pool
        chunk, length = done - done0, step - t0
        if not (length and chunk > 0 and (count_now, event_now, kind_now) == (count, event, kind)
                and pool.ready == ready and len(st.finished) == finishes0):
            return 0
        remaining = st.kinds.effective[kind] - done
        copies = min(st.scheduler.round_repeats(ready, count, chunk, remaining, st.w.max_batched_tokens, st.qlen),
                     chunks_before_last(remaining, chunk))
        if ready:
            copies = min(copies, (pool.next_end - pool.ticks - 1) // length)
        if copies < 1 or any(d != ready for d in st.step_decode[t0:step]):
            return 0
        for shape_id in set(st.step_shape[t0:step]):  # every step since took requests of the group to `done`
            prefill = [key for key in st.book.shape(shape_id) if not key.is_decode]
            if len(prefill) != 1 or (prefill[0].query_len, prefill[0].seq_len) != (chunk, done):
                return 0
        return int(copies)

    def _repeat(self, st, copies: int) -> int:
        """Play the round since the mark `copies` more times: the same takes, each copy's chunks one
        chunk further, the decode keys' contexts as the loop would compute them. Returns the prefill
        KV tokens the copies added."""
        t0, (count, done0, event, kind), ready, _ = self.mark
        queue, pool, book = st.queue, st.pool, st.book
        chunk = queue[0][1] - done0
        length = len(st.step_shape) - t0
        round_shapes = np.array(st.step_shape[t0:], dtype=np.int64)
        total = copies * length
        if ready:
            steps_done = pool.steps_sum + ready * np.arange(total)
            ctx = st.contexts(pool.prompt_sum, ready, ready + pool.rate * steps_done, total)
        else:
            ctx = np.zeros(total, dtype=np.int64)
        # a step's shape follows from (copy, the round's shape it repeats, decode context): make each
        # once, in order of first use as the loop would
        copy = np.repeat(np.arange(1, copies + 1), length)
        codes = np.stack((copy, np.tile(round_shapes, copies), ctx), axis=1)
        unique, first, inverse = np.unique(codes, axis=0, return_index=True, return_inverse=True)
        made = np.argsort(first, kind="stable")
        j, shape, cj = unique[made].T
        prefill = [book.shape(shape_id)[0] for shape_id in shape.tolist()]  # a round's step has one
        ids = np.empty(len(unique), dtype=np.int64)
        ids[made] = book.chunks(chunk, [key.concurrency for key in prefill],
                                [key.seq_len + jj * chunk for key, jj in zip(prefill, j.tolist(), strict=True)],
                                ready, cj)
        st.step_shape.extend(ids[inverse.ravel()].tolist())
        st.step_decode.extend([ready] * total)
        queue[0] = (count, queue[0][1] + copies * chunk, event, kind)
        if ready:
            pool.ticks += total
            pool.steps_sum += total * ready
        return copies * count * chunk
