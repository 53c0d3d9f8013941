"""A plan's distinct step shapes, registered as the planner meets them.

The planner names every step by the id of its shape, ids in order of first use. A step met alone
(the loop) has its shape made at once. Bulk steps are registered in one call: ramps, chunk stretches,
rounds and token streams, each one chunk further than the step before. Their new shapes of one
chunk beside the decodes are held as rows of columns (`latency.keys.StepShapes`). A latency model
prices those rows without a Python object each, and they are made into tuples only when asked for.
"""

from __future__ import annotations

import itertools
from itertools import repeat

import numpy as np

from latency.keys import ForwardKey, StepShape, StepShapes, make_rows

_new = tuple.__new__  # a ForwardKey from its fields at C speed (the planner makes thousands)
#: fewer chunk steps than this are registered one by one: numpy's calls would cost more than they save
BULK_STEPS = 32


class ShapeBook:
    """Shape ids by signature (`signature`), the shapes made, and the rows held; `table()` is the plan's
    `StepShapes`."""

    def __init__(self, decode_query_len: int):
        self.qlen = decode_query_len
        self.ids: dict[tuple, int] = {}
        self.made: list[StepShape | None] = []  # None: held in `rows`
        self.rows: list[np.ndarray] = []  # blocks of (id, requests, tokens, seq, decodes, context)

    def __len__(self) -> int:
        return len(self.made)

    def one(self, entries: tuple, d: int, ctx: int) -> int:
        """The id of the shape of prefill `entries` (((tokens, seq), requests) pairs, sorted) beside `d`
        decodes of context `ctx`; made if new."""
        key = signature(entries, d, ctx)
        shape_id = self.ids.get(key)
        if shape_id is None:
            shape_id = self.ids[key] = len(self.made)
            self.made.append(make_shape(entries, d, self.qlen, ctx))
        return shape_id

    def chunks(self, toks, counts, seqs, decodes, contexts, others: dict | None = None) -> list[int]:
        """The ids of steps in which `counts[i]` requests prefill a `toks[i]`-token chunk (to `seqs[i]`
        tokens) beside `decodes[i]` decodes (none: 0) of context `contexts[i]`, registered in step
        order; step j in `others` has the prefill entries `others[j]` instead (sorted pairs). Each is a
        sequence (`contexts` always) or an int alike in every step. New chunk shapes are held as rows."""
        others = others or {}
        if len(contexts) - len(others) < BULK_STEPS:
            return self._few((toks, counts, seqs, decodes, contexts), others)
        steps = np.empty((6, len(contexts)), dtype=np.int64)  # a row's layout: the id goes first
        for row, values in enumerate((counts, toks, seqs, decodes, contexts), start=1):
            steps[row] = values
        n, tok, seq, d, ctx = steps[1:].tolist()
        if n.count(1) == len(n):
            keys = list(zip(tok, seq, d, ctx, strict=True))  # `signature` of one request's chunk
        else:
            keys = [signature((((t, s), c),), dj, cj) for t, c, s, dj, cj in zip(tok, n, seq, d, ctx, strict=True)]
        for j, entries in others.items():
            keys[j] = signature(entries, d[j], ctx[j])
        at = steps[0]
        new_at = self._register(keys, at)
        if not len(new_at):
            return at.tolist()
        if others:
            first = len(self.made) - len(new_at)
            for j, entries in others.items():
                if at[j] >= first and self.made[at[j]] is None:
                    self.made[at[j]] = make_shape(entries, d[j], self.qlen, ctx[j])
            held = np.ones(len(at), dtype=bool)
            held[list(others)] = False
            new_at = new_at[held[new_at]]
        self.rows.append(steps.T if len(new_at) == len(at) else steps[:, new_at].T)
        return at.tolist()

    def _register(self, keys: list, at: np.ndarray) -> np.ndarray:
        """Set `at` to the ids of the steps' signatures `keys`, registering the new ones in step order;
        returns the steps that made new shapes."""
        # a new signature is registered under first + the step that makes it, then renumbered in order
        # from the first step that is not new (none in a stream of new shapes)
        first = len(self.made)
        at[:] = list(map(self.ids.setdefault, keys, itertools.count(first)))
        new = at == first + np.arange(len(at))
        new_at = np.flatnonzero(new)  # in id order
        if 0 < len(new_at) < len(at):
            renumbered = new_at[np.searchsorted(new_at, np.argmin(new)):]
            new = at >= first
            at[new] = first + np.searchsorted(new_at, at[new] - first)
            self.ids.update(zip(map(keys.__getitem__, renumbered.tolist()), at[renumbered].tolist(), strict=True))
        self.made.extend(repeat(None, len(new_at)))
        return new_at

    def _few(self, columns, others: dict) -> list[int]:
        """`chunks` one step at a time: cheaper than numpy's calls for a few steps."""
        columns = [c.tolist() if isinstance(c, np.ndarray) else repeat(int(c)) if isinstance(c, int | np.integer)
                   else c for c in columns]
        ids, get, made, qlen = [], self.ids.get, self.made, self.qlen
        for j, (t, c, s, dj, cj) in enumerate(zip(*columns, strict=False)):  # ints repeat: `contexts` ends it
            entries = others.get(j)
            if entries is None:
                key = (t, s, dj, cj) if c == 1 else ((((t, s), c),), dj, cj)  # `signature`, written out for speed
            else:
                key = signature(entries, dj, cj)
            shape_id = get(key)
            if shape_id is None:
                shape_id = self.ids[key] = len(made)
                if entries is None:
                    prefill = _new(ForwardKey, (False, c, t, s))
                    made.append((prefill, _new(ForwardKey, (True, dj, qlen, cj))) if dj else (prefill,))
                else:
                    made.append(make_shape(entries, dj, qlen, cj))
            ids.append(shape_id)
        return ids

    def decodes(self, decodes, contexts) -> list[int]:
        """The ids of pure decode steps: `decodes[i]` requests of context `contexts[i]` (Python ints)."""
        ids, get, made, qlen = [], self.ids.get, self.made, self.qlen
        for d, ctx in zip(decodes, contexts, strict=True):
            key = ((), d, ctx)  # `signature` of no prefill entry
            shape_id = get(key)
            if shape_id is None:
                shape_id = self.ids[key] = len(made)
                made.append((_new(ForwardKey, (True, d, qlen, ctx)),))
            ids.append(shape_id)
        return ids

    def shape(self, shape_id: int) -> StepShape:
        """Shape `shape_id` as a tuple (the rows held so far are made then, once)."""
        if self.made[shape_id] is None:
            for block in self.rows:
                make_rows(self.made, block, self.qlen)
            self.rows.clear()
        return self.made[shape_id]

    def table(self) -> StepShapes:
        rows = np.concatenate(self.rows) if self.rows else None
        return StepShapes(self.made, rows, self.qlen)


def signature(entries: tuple, d: int, ctx: int) -> tuple:
    """What a step shape is registered under: (tokens, seq, decodes, context) for a chunk of one request,
    the commonest (streams make thousands, and a flat tuple hashes fastest), else (((tokens, seq),
    requests) pairs sorted, decodes, context)."""
    if len(entries) == 1 and entries[0][1] == 1:
        (tok, seq), _ = entries[0]
        return tok, seq, d, ctx
    return entries, d, ctx


def make_shape(entries, d: int, qlen: int, ctx: int) -> StepShape:
    """The step's keys in order: prefill entries (((tokens, seq), requests) pairs; sorted), then the
    decode entry."""
    keys = [_new(ForwardKey, (False, n, tok, seq)) for (tok, seq), n in entries]
    if len(keys) > 1:
        keys.sort()
    if d:
        keys.append(_new(ForwardKey, (True, d, qlen, ctx)))
    return tuple(keys)
