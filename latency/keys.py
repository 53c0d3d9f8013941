"""The key of one forward step (RFC 3.3): what a latency model prices and a cache stores."""

from __future__ import annotations

from collections.abc import Sequence
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
