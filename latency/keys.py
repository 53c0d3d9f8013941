"""The key of one forward step (RFC 3.3): what a latency model prices and a cache stores."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import NamedTuple

import numpy as np


class ForwardKey(NamedTuple):
    """One batch entry of a forward step: `concurrency` requests, each adding `query_len`
    new tokens to a context that holds `seq_len` tokens after the step. A tuple: it hashes, orders
    and compares as its fields (prefill entries before decode), at C speed; the planner makes one
    per step."""

    is_decode: bool
    concurrency: int
    query_len: int
    seq_len: int

    @property
    def tokens(self) -> int:
        return self.concurrency * self.query_len


#: A fused step: every entry of one forward pass (linear layers over all tokens, attention per entry).
StepShape = tuple[ForwardKey, ...]


def keys_to_arrays(keys: Sequence[ForwardKey]):
    """Columns (is_decode, concurrency, query_len, seq_len) of `keys` as numpy arrays."""
    n = len(keys)
    dec = np.fromiter((k.is_decode for k in keys), dtype=bool, count=n)
    conc = np.fromiter((k.concurrency for k in keys), dtype=np.float64, count=n)
    q = np.fromiter((k.query_len for k in keys), dtype=np.float64, count=n)
    s = np.fromiter((k.seq_len for k in keys), dtype=np.float64, count=n)
    return dec, conc, q, s


class StepShapes(Sequence):
    """A plan's distinct step shapes, each a StepShape. Most are held as tuples, as the planner made
    them. Bulk steps (a token stream, a chunk stretch) make thousands of shapes of one form, each a
    chunk one step further into the prompts beside the decodes. Those are held as `chunk_rows` of
    (shape index, requests, chunk tokens, context after the chunk, decodes (0: none), decode context),
    all of one `decode_query_len`, and made into tuples only when a shape is asked for. A latency model
    prices every shape from `entry_columns` without making them."""

    def __init__(self, made: Sequence, chunk_rows: np.ndarray | None = None, decode_query_len: int = 1):
        self._made = made  # StepShape, or None where `chunk_rows` holds the shape
        self._rows = np.zeros((0, 6), dtype=np.int64) if chunk_rows is None else chunk_rows
        self._qlen = decode_query_len

    def __len__(self) -> int:
        return len(self._made)

    def __getitem__(self, i):
        return self.tuples[i]

    def __iter__(self):
        return iter(self.tuples)

    def __reduce__(self):
        return StepShapes, (self._made, self._rows, self._qlen)

    @property
    def tuples(self) -> tuple[StepShape, ...]:
        """Every shape as a tuple of ForwardKeys (the rows made once, when first asked)."""
        made = self.__dict__.get("_tuples")
        if made is None:
            made = list(self._made)
            make_rows(made, self._rows, self._qlen)
            made = self.__dict__["_tuples"] = tuple(made)
            self._made, self._rows = made, np.zeros((0, 6), dtype=np.int64)  # the rows are made: not held twice
        return made

    def entry_columns(self) -> tuple[np.ndarray, ...]:
        """(shape index, is_decode, concurrency, query_len, seq_len) of every entry, by shape and in
        entry order (float64 but the first two); the rows without making their tuples."""
        held = self.__dict__.get("_columns")
        if held is None:
            held = self.__dict__["_columns"] = self._columns()
        return held

    def _columns(self) -> tuple[np.ndarray, ...]:
        made = [i for i, shape in enumerate(self._made) if shape is not None]
        flat = [key for i in made for key in self._made[i]]
        owner = np.repeat(np.array(made, dtype=np.int64), [len(self._made[i]) for i in made])
        dec, conc, q, s = keys_to_arrays(flat)
        at, n, tok, seq, d, ctx = self._rows.T
        decoding = d > 0
        owner = np.concatenate((owner, at, at[decoding]))
        order = np.argsort(owner, kind="stable")  # the chunk before the decodes, as in a tuple
        count = int(decoding.sum())
        columns = (np.concatenate((dec, np.zeros(len(at), dtype=bool), np.ones(count, dtype=bool))),
                   np.concatenate((conc, n, d[decoding])),
                   np.concatenate((q, tok, np.full(count, self._qlen))),
                   np.concatenate((s, seq, ctx[decoding])))
        return (owner[order], columns[0][order], *(c[order].astype(np.float64) for c in columns[1:]))


def make_rows(made: list, rows: np.ndarray, decode_query_len: int) -> None:
    """Put the StepShape of each `StepShapes` chunk row in `made` at its index, made at C speed
    (thousands at a time)."""
    at, n, tok, seq, d, ctx = rows.T.tolist()
    new = tuple.__new__
    prefill = map(new, repeat(ForwardKey), zip(repeat(False), n, tok, seq))
    decode = map(new, repeat(ForwardKey), zip(repeat(True), d, repeat(decode_query_len), ctx))
    for i, p, k in zip(at, prefill, decode, strict=True):
        made[i] = (p, k) if k[1] else (p,)


def shape_columns(shapes: Sequence[StepShape]) -> tuple[np.ndarray, ...]:
    """(shape index, is_decode, concurrency, query_len, seq_len) of every entry of `shapes`: what a
    vectorised latency model prices a fused step from."""
    if isinstance(shapes, StepShapes):
        return shapes.entry_columns()
    flat = [k for shape in shapes for k in shape]
    step = np.repeat(np.arange(len(shapes)), [len(shape) for shape in shapes])
    return (step, *keys_to_arrays(flat))
