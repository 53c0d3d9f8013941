"""Where a sweep's work goes: its scenarios cut into parts of plan families, each part handed to a
free worker (`Placement`), and the estimates that size the parts. A scenario whose estimated work
alone exceeds a part is placed job by job (`pieces`): its layouts' searches are independent, so the
largest scenarios stop bounding the wall on many workers; the driver assembles it once every job is in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter

from orchestrator.evaluate import workload
from orchestrator.jobs import Job, SweepItem
from orchestrator.optimize import memory_bound
from orchestrator.pricer import shared_backend
from orchestrator.scenario import Scenario
from simulator.workload import sent_prompts

#: the least estimated work of one part handed to a worker: far above the ~2 ms a Ray call costs
TARGET_TASK_MS = 800.0
#: parts per worker a sweep is cut into at least, so the last parts are short: the idle tail at the
#: end of a sweep is at most about one part (1 / PARTS_PER_WORKER of a worker's share)
PARTS_PER_WORKER = 20
#: a part holds less than TARGET_TASK_MS where that would leave a worker fewer than this many parts (a
#: sweep spread over hundreds of workers), but never less than MIN_TASK_MS (a Ray call costs ~3 ms)
MIN_PARTS_PER_WORKER, MIN_TASK_MS = 4, 100.0

#: rough cost of one simulated step plus a fixed cost per point, for estimating a scenario's work
MS_PER_STEP, MS_PER_POINT = 0.008, 0.3
POISSON_IN_FLIGHT = 16
#: points a job's search evaluates, roughly (a bracket and a bisection over concurrency), and the
#: concurrency a point is estimated at
POINTS_PER_SEARCH, REFERENCE_LOAD = 12, 64
#: keys a point prices itself with an expensive backend (a guess: what the caches miss)
PRICED_KEYS_PER_POINT = 10


def estimate_ms(s: Scenario, job: Job, n: int) -> float:
    """Rough work of one point: decode steps plus the steps its prompt tokens fill at B per step
    (a Poisson point's requests in flight are unknown before it runs: POISSON_IN_FLIGHT is a guess),
    plus, with a backend that costs more per key than asking the shared cache, the keys it prices."""
    arrival, num_prompts, trace, decode, prefill_steps, pricing = _point_work(s, job)
    poisson = arrival == "poisson"
    prompts = sent_prompts(arrival, 1 if poisson else n, num_prompts, trace)
    rounds = prompts / (POISSON_IN_FLIGHT if poisson else n)
    return MS_PER_POINT + MS_PER_STEP * (decode * rounds + prompts * prefill_steps + 1) + pricing


@lru_cache(maxsize=4096)
def _point_work(s: Scenario, job: Job) -> tuple:
    """What a job's point estimates share, whatever its load: arrival, num_prompts, a trace's
    requests, decode steps a request, prefill steps a prompt, pricing ms."""
    w = workload(s, job.max_batched_tokens, 1)
    trace = w.mix.trace if w.mix is not None else None
    lm = s.latency_model(job.layout)
    return (w.arrival, w.num_prompts, None if trace is None else len(trace),
            w.decode_steps if job.role != "prefill" else 0, w.effective_input_length / w.max_batched_tokens,
            lm.cost_per_key_ms * PRICED_KEYS_PER_POINT if shared_backend(lm) else 0.0)


def job_ms(s: Scenario, job: Job) -> float:
    """Rough work of one job's search: POINTS_PER_SEARCH points at a typical load."""
    bound = memory_bound(s, job)
    n = max(1, min(REFERENCE_LOAD, s.max_concurrency, bound or REFERENCE_LOAD))
    return POINTS_PER_SEARCH * estimate_ms(s, job, n)


@dataclass(frozen=True)
class Piece:
    """What a part holds of one scenario: all its jobs (`jobs` None: searched, assembled and written
    where it is searched) or one of them (its result goes back to the driver); `ms` its estimated
    work, worked out once by `pieces`."""

    item: SweepItem
    jobs: tuple[int, ...] | None = None
    ms: float = 0.0

    @property
    def id(self) -> str:
        return self.item.id if self.jobs is None else f"{self.item.id}#{','.join(map(str, self.jobs))}"

    @property
    def family(self) -> str:
        return self.item.family


def pieces(items: list[SweepItem], workers: int) -> list[Piece]:
    """Each scenario whole, or job by job where its estimated work alone exceeds a part (`part_ms`)."""
    job_costs = [[job_ms(item.scenario, job) for job in item.jobs] for item in items]
    part = part_ms(sum(map(sum, job_costs)), workers)
    out: list[Piece] = []
    for item, costs in zip(items, job_costs, strict=True):
        if sum(costs) > part and len(costs) > 1:
            out += [Piece(item, (j,), ms) for j, ms in enumerate(costs)]
        else:
            out.append(Piece(item, None, sum(costs)))
    return out


class Placement:
    """Which part of the sweep a free worker searches next. The sweep (its `pieces`, or anything with
    an id and a family) is cut by plan family, each family into parts of contiguous scenarios
    (>= `part_ms`: TARGET_TASK_MS, less on many workers; <= total / (workers x PARTS_PER_WORKER)
    where a scenario allows). A worker takes the next part of a family it started (its plans are in
    that worker's memo), else starts the largest family nobody has, else helps with the family that
    has the most work left (reading the plans of it worth sharing, `runner.PlanShelf`, and making the
    others again), taking its parts from the end: its owners work from the front, making the plans the
    next parts there need, which a helper would otherwise make again beside them."""

    def __init__(self, items: list, workers: int, cost=attrgetter("ms")):
        families: dict[str, list[tuple[Piece, float]]] = {}
        for item in items:
            families.setdefault(item.family, []).append((item, cost(item)))
        total = sum(ms for members in families.values() for _, ms in members)
        self.part_ms = part_ms(total, workers)
        self.parts: dict[str, deque] = {f: deque(_cut(m, self.part_ms)) for f, m in families.items()}
        self.left = {f: sum(ms for _, ms in m) for f, m in families.items()}
        self.owners: dict[str, set] = {f: set() for f in families}
        self.helpers: dict[str, set] = {f: set() for f in families}  # owners that joined it once it was started

    def take(self, worker) -> tuple[str, list[Piece], float] | None:
        """(family, pieces, estimated ms) for `worker`, or None when nothing is left."""
        open_ = [f for f, parts in self.parts.items() if parts]
        if not open_:
            return None
        mine = [f for f in open_ if worker in self.owners[f]]
        free = [f for f in open_ if not self.owners[f]]
        family = (mine or [max(free or open_, key=self.left.__getitem__)])[0]
        if not mine and not free:
            self.helpers[family].add(worker)
        self.owners[family].add(worker)
        helping = worker in self.helpers[family]
        items, ms = self.parts[family].pop() if helping else self.parts[family].popleft()
        self.left[family] -= ms
        return family, items, ms

    def give_back(self, family: str, items: list[Piece], ms: float, worker) -> None:
        """A part whose worker was lost: first in its family again; the worker owns nothing now."""
        self.parts[family].appendleft((items, ms))
        self.left[family] += ms
        for owners in (*self.owners.values(), *self.helpers.values()):
            owners.discard(worker)


def part_ms(total: float, workers: int) -> float:
    """The least estimated work of a part: TARGET_TASK_MS, or less where that would leave a worker fewer
    than MIN_PARTS_PER_WORKER parts (never below MIN_TASK_MS); more where the sweep has work enough for
    PARTS_PER_WORKER parts of more each."""
    workers = max(1, workers)
    floor = max(MIN_TASK_MS, min(TARGET_TASK_MS, total / (workers * MIN_PARTS_PER_WORKER)))
    return max(floor, total / (workers * PARTS_PER_WORKER))


def _cut(members: list[tuple[Piece, float]], part_ms: float) -> list[tuple[list[Piece], float]]:
    """Contiguous parts of a family of >= part_ms each (the last may be less)."""
    parts, items, ms = [], [], 0.0
    for item, cost in members:
        items.append(item)
        ms += cost
        if ms >= part_ms:
            parts.append((items, ms))
            items, ms = [], 0.0
    if items:
        parts.append((items, ms))
    return parts
