"""Token streams: a burst's prompts prefilled one after another beside all decodes, in bulk."""

from __future__ import annotations

import numpy as np

from simulator.jumps.base import Jump
from simulator.planstate import before_each, fresh
from simulator.pool import kv_held


class TokenStream(Jump):
    """Claim: when the FIFO holds a token stream (at most one started request, then fresh ones, of one
    event and kind), every ready request decodes and the policy says its answers for the steps ahead
    (`Scheduler.stream`, whose first must be the answer it gave), those steps follow from the tokens
    taken: for up to a request's decode steps, so nobody who starts decoding in the stream finishes
    in it, while the requests that finish meanwhile leave as the loop would let them. Bursts of one
    kind whose policy streams."""

    name, stage = "stream", "answer"

    @classmethod
    def make(cls, st) -> TokenStream | None:
        one_kind = len(st.kinds.input) == 1 and st.steps[0] > 0
        if st.burst and one_kind and st.scheduler.stream(1, 0, 0, 1, 1, 1) is not None:
            return cls()
        return None

    def try_jump(self, st, sp) -> int | None:
        pool = st.pool
        if not (pool.ready and sp.takes):  # the stage: every ready request decodes
            return None
        start = len(st.step_shape)
        streamed = _stream(st, sp)
        if streamed is None:
            return None
        st.kv_prefill, stream_peak, finished_now = streamed
        st.peak = max(st.peak, stream_peak)
        st.left -= finished_now
        st.check = bool(finished_now) and fresh(st.queue) >= 0
        return len(st.step_shape) - start


def _stream(st, sp):
    """Play the stream from the policy's answer `sp`, if there is one. Returns (the prefill KV tokens
    after it, the most KV a step held, requests finished), or None."""
    queue, pool, kinds, scheduler = st.queue, st.pool, st.kinds, st.scheduler
    start = _stream_start(queue, pool)
    if start is None:
        return None
    done, fresh_count, event, kind = start
    need, budget = kinds.effective[kind], st.w.max_batched_tokens
    front = need - done if done else 0  # the started request's prompt tokens to go
    if not scheduler.stream(pool.ready, front, fresh_count, need, budget, st.qlen, leaving=(0,)):
        return None  # no stream here: asked for its first step alone, before its finishes are worked out
    leaving = _leaving(pool, pool.steps[kind])
    runs = scheduler.stream(pool.ready, front, fresh_count, need, budget, st.qlen, leaving=leaving)
    if not runs or _stream_takes(runs[0][1:], front, need) != (sp.takes, sp.decode):
        return None
    runs = np.array(runs, dtype=np.int64)
    d, took, whole, part = np.repeat(runs[:, 1:], runs[:, 0], axis=0).T
    # the prompts are prefilled one after another, so the tokens taken so far say how far into its
    # prompt the started request is before each step
    tokens = took + whole * need + part
    into = (done + np.concatenate(([0], np.cumsum(tokens)))) % need
    fronts = np.where(into > 0, need - into, 0)  # the started request's tokens to go (0: none)
    joins = whole + ((took > 0) & (took == fronts[:-1]))
    return _pass(st, (d, took, whole, part, tokens, fronts, joins), leaving, (done, fresh_count, event, kind))


def _pass(st, cols: tuple, leaving: list, start: tuple):
    """Append the stream's steps (columns per step: decodes, the started request's chunk, whole fresh
    prompts, a fresh prompt's part, tokens, the started request's tokens to go before each step and
    after the last, requests joining the decode pool) and leave the FIFO as the loop would."""
    d, took, whole, part, tokens, fronts, joins = cols
    done, fresh_count, event, kind = start
    pool, kinds, queue = st.pool, st.kinds, st.queue
    need, prompt, steps, n = kinds.effective[kind], kinds.input[kind], pool.steps[kind], len(d)
    gone = np.array(leaving[:n], dtype=np.int64)
    joined = before_each(joins - gone)  # the decode pool before each step (joins and finishes land after it)
    ready = pool.ready + joined
    if not np.array_equal(d, ready):
        j = int(np.flatnonzero(d != ready)[0])
        raise RuntimeError(f"scheduler {st.scheduler.name!r} streamed {d[j]} decodes of {ready[j]} ready")
    prompts = pool.prompt_sum + prompt * joined
    steps_done = pool.steps_sum + before_each(d) - steps * before_each(gone)
    ctx = st.contexts(prompts, d, d + pool.rate * steps_done, n)
    starts = whole + (part > 0)
    kv = st.kv_prefill + np.cumsum(tokens + starts * kinds.cached[kind] - joins * prompt)
    held = kv + kv_held(prompts, d, pool.rate, steps_done + d) + joins * (prompt + 1)
    st.step_shape.extend(_stream_shapes(st.book, need, fronts[:-1], (took, whole, part), d, ctx))
    st.step_decode.extend(d.tolist())
    finished_now = pool.pass_stream(len(st.step_shape) - n, n, joins, (event, kind), int(d.sum()), st.finished)
    front, fresh_left = int(fronts[-1]), fresh_count - int(starts.sum())
    queue.clear()
    if front:
        queue.append((1, need - front, event, kind))
    if fresh_left:
        queue.append((fresh_left, 0, event, kind))
    return float(kv[-1]), float(held.max()), finished_now


def _leaving(pool, steps: int) -> list[int]:
    """Requests finishing after each of the next `steps` steps, while every ready request decodes."""
    ticks = pool.ticks
    leaving = [0] * steps
    for count, end, *_ in pool.groups:
        if end > ticks + steps:
            break
        leaving[end - ticks - 1] += count
    return leaving


def _stream_shapes(book, need: int, fronts, takes: tuple, decodes, contexts) -> list[int]:
    """The ids of a stream's step shapes: the started request's chunk, whole fresh prompts, a fresh
    prompt's first part (`takes`: those three per step), the decodes. The started request's chunk
    alone is the commonest step."""
    took, whole, part = takes
    seqs = need - fronts + took
    others = {}
    mixed = np.flatnonzero((took == 0) | (whole > 0) | (part > 0)).tolist()
    if mixed:
        tok_l, seq_l, whole_l, part_l = took.tolist(), seqs.tolist(), whole.tolist(), part.tolist()
        for j in mixed:
            t, w, p = tok_l[j], whole_l[j], part_l[j]
            entries = [((t, seq_l[j]), 1)] if t else []
            if w:
                entries.append(((need, need), w))
            if p:
                entries.append(((p, p), 1))
            others[j] = tuple(sorted(entries)) if len(entries) > 1 else tuple(entries)  # never two alike
    return book.chunks(took, 1, seqs, decodes, contexts, others)


def _stream_takes(answer: tuple, front: int, need: int) -> tuple:
    """The (takes, decodes) of the `StepPlan` a stream's answer stands for: the started request's chunk
    (it is at the FIFO front if `front`), then the fresh group's whole prompts and started one."""
    d, took, whole, part = answer
    takes = [(0, 1, took)] if took else []
    behind = 1 if front else 0
    if whole:
        takes.append((behind, whole, need))
    if part:
        takes.append((behind, 1, part))
    return tuple(takes), d


def _stream_start(queue, pool):
    """(prompt tokens the started request has prefilled (0: none started), fresh requests, their event,
    kind) if the FIFO and decode pool hold a token stream, else None."""
    if not pool.ordered or not 1 <= len(queue) <= 2:
        return None
    count, done, event, kind = queue[-1]
    if done:
        return None
    if len(queue) == 1:
        return 0, count, event, kind
    started = queue[0]
    if started[0] != 1 or not started[1] or started[2:] != (event, kind):
        return None
    return started[1], count, event, kind
