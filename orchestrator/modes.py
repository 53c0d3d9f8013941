"""Search modes: what instance types a scenario searches and how their results become an answer.

A mode plans its jobs, validates itself against a scenario and assembles the job results; the
tables it fills are those of its result (points and best; splits for "pd"). Registry:
`MODES`; `make_mode("pd", prefill_devices=2, decode_devices=2)`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from latency.checks import RangeError, check_int
from orchestrator.evaluate import first_failure
from orchestrator.jobs import Job, JobResult, OptimizeResult
from orchestrator.scenario import InputError, Layout, Scenario
from simulator import decode_qps, prefill_qps


class Mode(ABC):
    name: str = ""
    help: str = ""

    @abstractmethod
    def jobs(self, s: Scenario) -> list[Job]: ...

    def validate(self, s: Scenario) -> None:  # noqa: B027  (most modes run on any valid scenario)
        """Raise InputError when the mode cannot run on this scenario."""

    def assemble(self, s: Scenario, results: list[JobResult]) -> OptimizeResult:
        out = OptimizeResult(s)
        for r in results:
            out.points.extend(r.points)
            out.best.extend(r.best)
        _explain_infeasible(s, out)
        return out

    def options(self) -> dict:
        """What distinguishes this mode's scenarios (part of the scenario id)."""
        return {}


def _decode_budget(s: Scenario) -> tuple[int, ...]:
    return (max(s.max_batched_tokens),)  # chunking does not apply to a decode instance


@dataclass(frozen=True)
class Aggregated(Mode):
    name = "agg"
    help = "one instance type serves prefill and decode (default)"

    def jobs(self, s: Scenario) -> list[Job]:
        return [Job("agg", layout, b) for layout in s.layouts() for b in s.max_batched_tokens]


@dataclass(frozen=True)
class Disaggregated(Mode):
    name = "disagg"
    help = "a prefill instance (TTFT limits, chunked) and a decode instance (TPOT limits), searched apart"

    def jobs(self, s: Scenario) -> list[Job]:
        roles = [r for r, lim in (("prefill", s.ttft_limits), ("decode", s.tpot_limits)) if lim]
        out = []
        for role in roles or ["prefill", "decode"]:
            budgets = s.max_batched_tokens if role == "prefill" else _decode_budget(s)
            out += [Job(role, layout, b) for layout in s.layouts() for b in budgets]
        return out


@dataclass(frozen=True)
class PrefillDecodeSplit(Mode):
    """A P-device prefill and a Q-device decode instance, and the integer split of instances that
    serves the most requests per second per device (RFC 3.1.6)."""

    prefill_devices: int = 1
    decode_devices: int = 1
    name = "pd"
    help = "prefill and decode instances of the given sizes and their best integer split"

    def __post_init__(self):
        for name in ("prefill_devices", "decode_devices"):
            try:
                check_int(name, getattr(self, name))
            except RangeError as err:
                raise InputError(name, err.value, err.allowed) from None

    def options(self) -> dict:
        return {"pd_devices": [self.prefill_devices, self.decode_devices]}

    def validate(self, s: Scenario) -> None:
        p, q = self.prefill_devices, self.decode_devices
        if p + q > s.num_devices:
            raise InputError("num_devices", s.num_devices, f">= P + Q = {p + q} for the PD split")
        for name, v in (("prefill_devices", p), ("decode_devices", q)):
            try:
                s.with_(tp_sizes=(v,), num_devices=v).layouts()
            except ValueError as err:
                raise InputError(name, v, str(err)) from None

    def jobs(self, s: Scenario) -> list[Job]:
        return ([Job("prefill", Layout(self.prefill_devices, s.pp), b) for b in s.max_batched_tokens]
                + [Job("decode", Layout(self.decode_devices, s.pp), b) for b in _decode_budget(s)])

    def assemble(self, s: Scenario, results: list[JobResult]) -> OptimizeResult:
        out = super().assemble(s, results)
        out.splits = pd_splits(s, out.best, (self.prefill_devices, self.decode_devices))
        return out


MODES: dict[str, type[Mode]] = {m.name: m for m in (Aggregated, Disaggregated, PrefillDecodeSplit)}


def make_mode(name: str, **options) -> Mode:
    if name not in MODES:
        raise InputError("mode", name, f"one of {', '.join(MODES)}")
    return MODES[name](**options)


def _explain_infeasible(s: Scenario, result: OptimizeResult) -> None:
    """For a limit pair nothing meets: which limit fails first and the closest point (lowest
    concurrency); for each instance role searched (a disaggregated search's decode side can fail
    while its prefill side meets its limit)."""
    roles = list(dict.fromkeys(p["role"] for p in result.points))
    for ttft, tpot in s.limit_pairs():
        for role in roles:
            if any(b["role"] == role and b["ttft_limit_ms"] == ttft and b["tpot_limit_ms"] == tpot
                   for b in result.best):
                continue
            mine = [p for p in result.points if p["role"] == role]
            lowest = [p for p in mine if p["concurrency"] == p.get("attention_dp", 1)] or mine
            closest = min(lowest, key=lambda p: (p["ttft_ms"] if ttft else 0) + (p["tpot_ms"] if tpot else 0))
            failure = first_failure(closest, ttft, tpot) or "limits"
            pairs = (("TTFT", ttft if role != "decode" else None), ("TPOT", tpot if role != "prefill" else None))
            limits = " and ".join(f"{n} <= {v:g} ms" for n, v in pairs if v is not None)
            who = "configuration" if role == "agg" else f"{role} instance"
            side = "" if role == "agg" else "; the PD split needs both sides"
            result.infeasible.append({"ttft_limit_ms": ttft, "tpot_limit_ms": tpot, "role": role, "message": (
                f"no {who} meets {limits or 'memory'}: {failure} fails first; closest point "
                f"{closest['role']} tp{closest['tp']} concurrency {closest['concurrency']} "
                f"B={closest['max_batched_tokens']}: "
                f"TTFT {closest['ttft_ms']:.1f} ms, TPOT {closest['tpot_ms']:.2f} ms, "
                f"KV {closest['peak_kv_tokens']:.0f} of {closest['kv_capacity_tokens']} tokens{side}")})


def _best_of(best: list[dict], role: str, ttft, tpot) -> dict | None:
    rows = [b for b in best if b["role"] == role and b["ttft_limit_ms"] == ttft and b["tpot_limit_ms"] == tpot]
    return max(rows, key=lambda b: b["request_throughput"], default=None)


def pd_splits(s: Scenario, best: list[dict], pd_devices: tuple[int, int]) -> list[dict]:
    """For each limit pair: P QPS from the chunked-prefill TTFT, D QPS from the TPOT (RFC formulas;
    under steady load, each instance's measured request throughput), then the integer split of
    instances that serves the most requests per second per device."""
    p_dev, d_dev = pd_devices
    out = []
    for ttft, tpot in s.limit_pairs():
        pre, dec = (_best_of(best, role, ttft, tpot) for role in ("prefill", "decode"))
        if pre is None or dec is None:
            continue
        if s.arrival == "burst":  # the RFC's formulas over the window
            p_qps = prefill_qps(pre["concurrency"], pre["ttft_ms"])
            d_qps = decode_qps(dec["concurrency"], dec["tpot_ms"], s.typical("output_length"))
        else:  # steady load: what one instance completes per second
            p_qps, d_qps = pre["request_throughput"] / pre["dp"], dec["request_throughput"] / dec["dp"]
        choice = None
        for n_p in range(1, s.num_devices // p_dev + 1):
            n_d = (s.num_devices - n_p * p_dev) // d_dev
            if n_d < 1:
                break
            served = min(n_p * p_qps, n_d * d_qps)
            used = n_p * p_dev + n_d * d_dev
            key = (served / used, served)
            if choice is None or key > choice[0]:
                choice = (key, n_p, n_d, served, used)
        if choice is None:
            continue
        _, n_p, n_d, served, used = choice
        out.append({
            "ttft_limit_ms": ttft, "tpot_limit_ms": tpot, "prefill_tp": p_dev, "decode_tp": d_dev,
            "prefill_concurrency": pre["concurrency"], "decode_concurrency": dec["concurrency"],
            "max_batched_tokens": pre["max_batched_tokens"], "ttft_ms": pre["ttft_ms"], "tpot_ms": dec["tpot_ms"],
            "p_qps": p_qps, "d_qps": d_qps, "pd_ratio": d_qps / p_qps,
            "prefill_instances": n_p, "decode_instances": n_d, "devices_used": used,
            "served_qps": served, "served_qps_per_device": served / used,
            "output_throughput": served * s.typical("output_length"),
            "output_throughput_per_device": served * s.typical("output_length") / used,
        })
    return out
