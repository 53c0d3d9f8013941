"""Plain values shared by the search, the drivers and storage: a job (one instance type to search),
its result, an assembled answer, and a sweep item. No Ray here."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from orchestrator.scenario import Layout, Scenario


@dataclass(frozen=True)
class Job:
    """One instance type to search: every limit pair of the scenario shares its evaluated points."""

    role: str
    layout: Layout
    max_batched_tokens: int


@dataclass
class JobResult:
    job: Job
    points: list[dict]
    best: list[dict]


@dataclass
class OptimizeResult:
    scenario: Scenario
    points: list[dict] = field(default_factory=list)   # every evaluated point
    best: list[dict] = field(default_factory=list)     # best point per limit pair, role, layout, budget
    splits: list[dict] = field(default_factory=list)   # PD instance splits
    infeasible: list[dict] = field(default_factory=list)  # {ttft_limit_ms, tpot_limit_ms, message}


@dataclass(frozen=True)
class SweepItem:
    """One scenario of a sweep: its id, the scenario, the search mode and the jobs it searches."""

    id: str
    scenario: Scenario
    mode: object  # orchestrator.modes.Mode
    jobs: tuple[Job, ...]

    @cached_property
    def family(self) -> str:
        """The scenario's plan family, worked out once (the driver groups points that share a plan)."""
        return self.scenario.plan_family()
