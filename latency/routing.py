"""How a MoE step's tokens pick experts: unevenly. Expert i of a layer's E (by popularity) is picked with odds
i^-ROUTING_SKEW (a Zipf law), so a decode batch touches fewer distinct experts, and streams fewer expert weights,
than even routing would; a prompt step touches them all either way."""

from __future__ import annotations

from functools import cache

import numpy as np

#: the law's exponent. AIConfigurator's measured vLLM expert kernels under its default routing (its power law of
#: exponent 1.01) take 0.78 / 0.77 / 0.81 / 0.87 of their balanced-routing time at 16 / 32 / 64 / 128 tokens; the
#: distinct experts this law touches give 0.76 / 0.76 / 0.79 / 0.89 (the best of 0.4-1.0 over 708 table points:
#: python bench/moe_kernels.py --skew). 0: even routing
ROUTING_SKEW = 0.8
#: the whole token counts (decode-sized) whose touched share is tabled; beyond it, or for a fraction, it is summed
#: once per count (a larger table costs more to make than the prompt steps that would read it save)
SHARE_TABLE_TOKENS = 1 << 12
_TABLES: dict[tuple[int, int, float], np.ndarray] = {}


def touched_share(k: int, slots: int, routed, skew: float = ROUTING_SKEW):
    """The share of a layer's expert slots that `routed` tokens (a number or an array) pick at least once, each
    token `k` of them (a copy of an expert takes its share of the expert's tokens). Whole token counts below
    SHARE_TABLE_TOKENS are read from a table of the same sums (`_share_table`), made once per expert layout."""
    r = np.asarray(routed, dtype=float)
    flat = r.reshape(-1)
    whole = flat.astype(np.int64)
    tabled = (whole == flat) & (whole >= 0) & (whole < SHARE_TABLE_TOKENS)
    share = np.empty(flat.shape)
    if tabled.any():
        counts = whole[tabled]
        share[tabled] = _share_table(k, int(slots), skew, int(counts.max()))[counts]
    if not tabled.all():  # prompt-sized counts, each summed once
        share[~tabled] = [_one_share(k, int(slots), skew, float(x)) for x in flat[~tabled]]
    return share.reshape(r.shape) if r.shape else float(share[0])


@cache
def _pick_odds(k: int, slots: int, skew: float) -> np.ndarray:
    """Each expert slot's chance to be among a token's `k` (the law of `skew`, summing to k, none above 1)."""
    weights = np.arange(1, slots + 1, dtype=float) ** -skew
    return np.minimum(1.0, k * weights / weights.sum())


def _share_table(k: int, slots: int, skew: float, upto: int) -> np.ndarray:
    """`_shares` of 0, 1, ... at least `upto` tokens, grown by doubling as larger counts are asked."""
    table = _TABLES.get((k, slots, skew), np.empty(0))
    if upto >= len(table):
        size = min(SHARE_TABLE_TOKENS, max(64, 2 * upto))
        table = np.concatenate([table, _shares(k, slots, skew, np.arange(len(table), size, dtype=float))])
        _TABLES[(k, slots, skew)] = table
    return table


@cache
def _one_share(k: int, slots: int, skew: float, routed: float) -> float:
    return float(_shares(k, slots, skew, np.array([routed]))[0])


def _shares(k: int, slots: int, skew: float, routed: np.ndarray) -> np.ndarray:
    odds = _pick_odds(k, slots, skew)
    return np.mean(1.0 - (1.0 - odds)[:, None] ** routed.reshape(1, -1), axis=0)
