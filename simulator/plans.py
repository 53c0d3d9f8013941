"""A planned schedule (`Plan`): what `simulator.timeline.plan` and the KV-bound planner
(`simulator.kvbound`) both return, and what pricing and replay read. Its own module, so that neither
planner imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from latency.keys import StepShapes
from simulator.scheduler import Scheduler
from simulator.standin import StandIn
from simulator.workload import Workload


@dataclass(frozen=True)
class Plan:
    """A planned schedule: step i has shape `shapes[step_shape[i]]`; finish records say that
    `counts[j]` requests of arrival event `arrival[j]` and kind `kind[j]` (`workload.kinds`) got their
    first token at the end of step `first_step[j]` (-1: at t=0) and finished at the end of step
    `finish_step[j]`.

    Arrival event e came at the end of step `event_step[e]` (-1: at t=0) or, in a timed plan
    (Poisson), at `event_ms[e]`; `event_steady[e]` says whether its requests are measured (not
    warm-up or drain). A timed plan was priced while planned: `step_end_ms` holds its clock (and, where the
front end streams at a cost, `step_delivered_ms` when each step's tokens left it). A plan with
a `stand_in` is that of its smaller loop (`workload`); replay adds the other clients' wait."""

    workload: Workload
    scheduler: Scheduler
    phase: str
    shapes: StepShapes
    step_shape: np.ndarray
    counts: np.ndarray
    first_step: np.ndarray
    finish_step: np.ndarray
    peak_kv_tokens: float
    arrival: np.ndarray
    event_step: np.ndarray
    event_steady: np.ndarray
    step_decode: np.ndarray
    kind: np.ndarray
    event_ms: np.ndarray | None = None
    step_end_ms: np.ndarray | None = None
    token_delay_ms: float = 0.0  # a token reaches the client this long after its step ends (front end)
    step_delivered_ms: np.ndarray | None = None  # timed, streaming at a cost: when each step's tokens left the server
    preemptions: int = 0  # KV-bound plans: running requests preempted (freed, recomputed later)
    kv_blocks: int = 0    # KV-bound plans: the pool they were admitted to (blocks of 16 tokens); 0: unbounded
    stand_in: StandIn | None = None  # planned as a smaller loop that keeps the engine as busy (simulator.standin)

    @property
    def num_steps(self) -> int:
        return len(self.step_shape)

    @cached_property
    def entry_index(self) -> tuple:
        """((shape, key) of every prefill entry, (shape, key) of every decode entry): positions in
        `shapes` and `price_keys`, in shape order, for pricing the steps of an unfused policy."""
        position = {key: i for i, key in enumerate(self.price_keys)}
        prefill: tuple[list[int], list[int]] = ([], [])
        decode: tuple[list[int], list[int]] = ([], [])
        for s, shape in enumerate(self.shapes):
            for key in shape:
                side = decode if key.is_decode else prefill
                side[0].append(s)
                side[1].append(position[key])
        return tuple((np.array(a, dtype=np.int64), np.array(b, dtype=np.int64)) for a, b in (prefill, decode))

    @cached_property
    def price_keys(self) -> tuple:
        """What must be priced: whole shapes for a fused policy, else the distinct ForwardKeys
        (in order of first use)."""
        if self.scheduler.fused:
            return self.shapes
        return tuple(dict.fromkeys(key for shape in self.shapes for key in shape))
