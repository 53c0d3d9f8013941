"""The garbage collector in a process that evaluates points: planning makes tens of thousands of small containers
a point, and the memos it fills (plans, shapes, prices) hold hundreds of thousands of objects that a collection
would walk."""

from __future__ import annotations

import gc

#: the garbage collector's thresholds in a process that evaluates points: planning makes tens of
#: thousands of small containers a point, and at Python's default (700, 10, 10) the full collections
#: they trigger walk every object the memos hold (0.5 M in a sweep's worker, ~0.12 s each): 17 % of an
#: inline sweep's time. These collect the young rarely and the old almost never; no memory is kept
#: longer (the evaluation makes no reference cycles of note).
GC_THRESHOLDS = (50_000, 20, 100)


def collect_rarely() -> None:
    """Set this process's garbage collection to GC_THRESHOLDS (idempotent)."""
    if gc.get_threshold() != GC_THRESHOLDS:
        gc.set_threshold(*GC_THRESHOLDS)


def freeze_survivors() -> None:
    """Put what is alive now beyond the collector's walks (`gc.freeze`), between one search and the next: the
    memos a sweep fills (plans, shapes, prices) reach a million objects, and each rare collection of the young
    walked all that had piled up since the last, a pause of up to 0.95 s landing on whatever was being planned
    (the inline 8,064-scenario sweep: 283 pauses, 10.3 s; its slowest "plans" were pauses, bench/cluster_replay.py).
    A frozen object is still freed once nothing refers to it; only a reference cycle among them is kept, and the
    searches make none of note."""
    gc.freeze()
