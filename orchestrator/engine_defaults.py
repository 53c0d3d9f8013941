"""What an engine does unless told: its default token budget on a device, its step policy, its switches
and the memory it leaves free, from its profile (a shipped engine or a profile file). Scenarios,
estimates and measured-run readings share these."""

from __future__ import annotations

from latency import DEFAULT_RESERVED_GIB, load_engine
from latency.engine import CAPACITY_SCHEDULERS
from orchestrator.fields import (
    VLLM_BATCHED_TOKENS,
    VLLM_BATCHED_TOKENS_LARGE,
    VLLM_LARGE_BUDGET_SINCE,
    VLLM_LARGE_HBM_BYTES,
    VLLM_MAX_NUM_SEQS,
)
from simulator.scheduler import DEFAULT_SCHEDULER


def engine_default_budget(device, release: tuple[int, ...] | None = None) -> int:
    """vLLM's `max_num_batched_tokens` default for `vllm serve`: 8192, or 16384 on GPUs with >= 160 GiB
    (B200) since VLLM_LARGE_BUDGET_SINCE; `release` None: the current vLLM's."""
    large = device.hbm_gib * 1024**3 >= VLLM_LARGE_HBM_BYTES
    if release is not None and release < VLLM_LARGE_BUDGET_SINCE:
        large = False
    return VLLM_BATCHED_TOKENS_LARGE if large else VLLM_BATCHED_TOKENS


def launch_budget(engine: str, device) -> int:
    """The token budget `engine` runs with on `device` unless told: its profile's [launch] budget (a
    calibrated one's), else vLLM's default there; vLLM's default for an unknown engine (validate() names it)."""
    return _launched(engine, "max_batched_tokens") or engine_default_budget(device)


def launch_max_num_seqs(engine: str) -> int:
    """The requests `engine` runs at once unless told: its profile's [launch] max_num_seqs (a calibrated
    one's), else vLLM's default; vLLM's for an unknown engine (validate() names it)."""
    return _launched(engine, "max_num_seqs") or VLLM_MAX_NUM_SEQS


def engine_below_clients(engine: str) -> int:
    """How many requests fewer than a closed loop's clients `engine` runs at once (its profile's [launch]
    below_clients, a calibrated one's); 0: as many as its cap allows."""
    return _launched(engine, "below_clients")


def _launched(engine: str, key: str) -> int:
    """A [launch] value of the engine's profile; 0 where it names none or the engine is unknown."""
    try:
        return getattr(load_engine(engine), key)
    except ValueError:
        return 0


def default_reserved_gib(engine: str, device) -> float:
    """GiB per device `engine` leaves free (`EngineProfile.reserved_gib`); the fixed reserve for an
    unknown engine, which validate() names."""
    try:
        return load_engine(engine).reserved_gib(device.hbm_gib)
    except ValueError:
        return DEFAULT_RESERVED_GIB


def layout_reserved_gib(engine: str, device, reserved_gib: float, tp: int, pp: int, attention_dp: int) -> float:
    """The GiB a device of a layout leaves free: the engine's own rule's for the layout where `reserved_gib` is the
    engine's default (its rule's at tp 1: SGLang reserves more for more GPUs and for attention DP), else
    `reserved_gib` (a reserve given holds for every layout)."""
    try:
        profile = load_engine(engine)
    except ValueError:
        return reserved_gib
    if not profile.reserve_rule or reserved_gib != profile.reserved_gib(device.hbm_gib):
        return reserved_gib
    return profile.reserved_gib(device.hbm_gib, tp, pp, attention_dp)


def default_scheduler(engine: str) -> str:
    """The step policy `engine` runs (its profile's `scheduler`); the RFC's decode-first for "none" or
    an engine that names none (validate() names an unknown engine)."""
    try:
        return load_engine(engine).scheduler or DEFAULT_SCHEDULER
    except ValueError:
        return DEFAULT_SCHEDULER


def engine_switch(engine: str, key: str) -> str:
    """An on/off default the engine's profile names (`prefix_caching`, `async_scheduling`); "off" for an
    unknown engine (validate() names it)."""
    try:
        return "on" if getattr(load_engine(engine), key) else "off"
    except ValueError:
        return "off"


def default_capacity_scheduler(engine: str) -> str:
    """How `engine` admits requests into a full KV cache (its profile's `capacity_scheduler`): vLLM's
    max-utilization where it names none, and for an unknown engine (validate() names it)."""
    try:
        return load_engine(engine).capacity_scheduler or CAPACITY_SCHEDULERS[0]
    except ValueError:
        return CAPACITY_SCHEDULERS[0]
