"""Fast-forwards: ways the planner takes many steps at once where it can say what they are.

Each is a small object with one claim, stated in its docstring, that makes it exact: the steps it
appends are the steps `PlanState.play` would have appended one by one, with the same shapes, finish
records, arrivals and KV peak. `plan(..., jumps=())` plays every step; a test per fast-forward
compares the plans with and without it.

A fast-forward is asked at one stage of a step:

- "before": before the policy is asked (it copies what the loop played since a mark);
- "answer": with the policy's answer, when it decodes every ready request (no claim is made about
  a step that leaves decodes out), and for a `one_take` fast-forward only when the answer has one
  prefill take; one that takes steps stands in for the plain step;
- "after": after a plain step that prefilled nothing and finished nobody (it repeats that step).

`JUMPS` is the registry, in the order they are tried within a stage.
"""

from __future__ import annotations

from functools import cache

from simulator.jumps.base import STAGES, Jump
from simulator.jumps.period import PeriodCopies
from simulator.jumps.ramp import Ramp
from simulator.jumps.repeats import DecodeRepeats
from simulator.jumps.rounds import RoundCopies
from simulator.jumps.stream import TokenStream
from simulator.jumps.stretch import Stretch
from simulator.jumps.tail import DecodeTail

__all__ = ["JUMPS", "STAGES", "Jump", "for_plan", "names"]
#: the fast-forwards in the order they are tried within a stage
JUMPS = (RoundCopies, PeriodCopies, DecodeTail, Ramp, Stretch, TokenStream, DecodeRepeats)


@cache
def names() -> tuple[str, ...]:
    return tuple(j.name for j in JUMPS)


def for_plan(st, jumps: tuple[str, ...] | None) -> dict[str, list[Jump]]:
    """The fast-forwards of one plan by stage, in registry order: those named in `jumps` (None: all)
    that can apply to it."""
    chosen = names() if jumps is None else tuple(jumps)  # names checked by `plan`
    out: dict[str, list[Jump]] = {stage: [] for stage in STAGES}
    for cls in JUMPS:
        if cls.name in chosen:
            jump = cls.make(st)
            if jump is not None:
                out[cls.stage].append(jump)
    return out
