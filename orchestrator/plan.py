"""`servesweep plan`: the fewest devices (per device type) that serve a target request rate under the
limits, with what it costs and the commands that deploy and check it.

For each device type and each instance size k (1 .. max devices), every layout of k devices and
every budget has its Poisson capacity searched (the highest offered rate per instance that meets
the limits, as `optimize --arrival poisson`); serving R then takes ceil(R / capacity) instances of
k devices. The answer is the option with the fewest devices (then the lowest cost, then the most
headroom); the runner-ups follow.

With `pd`, prefill/decode splits compete too: prefill instances (judged on TTFT) and decode
instances (judged on TPOT) of one device type, each as few devices as serve the rate on their own;
the split is the best of each. The KV transfer between them is not priced (as `optimize --disagg`).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from orchestrator.evaluate import costs
from orchestrator.forked import can_fork, count_evaluated, forked_map
from orchestrator.jobs import Job
from orchestrator.launch import serve_command
from orchestrator.optimize import search_job
from orchestrator.progress import SearchProgress
from orchestrator.scenario import Layout, Scenario

ROUTER_NOTE = ("a prefill/decode router in front sends each request to a prefill instance, then on to a decode "
               "instance (vLLM's disaggregated-serving examples ship one); the KV transfer is not priced")


class _Ranked:
    """How deployments compare: the fewest devices, then the lowest cost, then the most headroom."""

    def sort_key(self) -> tuple:
        usd = self.cost["usd_per_hour"]
        return self.devices, usd if usd == usd else 0.0, -self.headroom


@dataclass(frozen=True)
class PlanOption(_Ranked):
    """`instances` instances of `layout` on `device`, each taking `capacity` req/s within the limits."""

    device: str
    layout: Layout
    max_batched_tokens: int
    capacity: float
    instances: int
    rate: float
    row: dict                  # the capacity point (per instance, at `capacity`)
    usd_per_device_hour: float
    role: str = "agg"          # agg, or a prefill or decode instance of a split

    @property
    def devices(self) -> int:
        return self.instances * self.layout.devices

    @property
    def headroom(self) -> float:
        """How much more load the plan takes before a limit breaks (0.25: 25 %)."""
        return self.instances * self.capacity / self.rate - 1

    @property
    def output_tokens_per_s(self) -> float:
        """The target rate's output tokens a second (not the instances' capacity)."""
        return self.rate * self.row["output_throughput"] / max(self.row["request_throughput"], 1e-12)

    @property
    def cost(self) -> dict:
        return costs(self.usd_per_device_hour * self.devices, self.output_tokens_per_s)


@dataclass(frozen=True)
class SplitOption(_Ranked):
    """A prefill/decode split: `prefill` instances judged on TTFT, `decode` ones on TPOT, both of one
    device type, serving the same rate."""

    prefill: PlanOption
    decode: PlanOption
    role = "split"

    @property
    def device(self) -> str:
        return self.prefill.device

    @property
    def devices(self) -> int:
        return self.prefill.devices + self.decode.devices

    @property
    def headroom(self) -> float:
        """The smaller side's: the split breaks when either does."""
        return min(self.prefill.headroom, self.decode.headroom)

    @property
    def cost(self) -> dict:
        return costs(self.decode.usd_per_device_hour * self.devices, self.decode.output_tokens_per_s)


def instance_options(s: Scenario, device: str, k: int, rate: float, role: str = "agg",
                     evaluated: Callable[[int], None] | None = None) -> list[PlanOption]:
    """Every layout of exactly k devices (one instance of `role`) and budget, with its Poisson capacity;
    `evaluated` told how many points each step of the searches evaluated."""
    one = s.with_(device=device, num_devices=k, arrival="poisson")
    try:
        one.validate()
        layouts = [lay for lay in one.layouts() if lay.devices == k]
    except ValueError:  # the model does not fit or cannot be split over k devices
        return []
    out = []
    for layout in layouts:
        for budget in one.max_batched_tokens:
            job = Job(role, layout, budget)
            found = search_job(one, job, evaluated=evaluated)
            if not found.best:
                continue
            row = found.best[0]
            capacity = row["request_rate"]
            out.append(PlanOption(device, layout, budget, capacity, math.ceil(rate / capacity), rate, row,
                                  one.usd_per_device_hour, role))
    return out


class Size(NamedTuple):
    """One instance size to search: `instance_options`' arguments."""

    s: Scenario
    device: str
    k: int
    rate: float
    role: str


def plan_deployment(s: Scenario, devices: list[str], rate: float, max_devices: int,
                    prices: dict[str, float] | None = None, pd: bool = False,
                    progress: SearchProgress | None = None, processes: int = 1) -> list:
    """Every feasible option over the device types and instance sizes, best first; with `pd`, the
    best prefill/decode split of each device type among them. `prices`: USD per device-hour by
    device (else the device files'). `progress` hears of every point and every instance size searched;
    with `processes` > 1 the sizes are searched in forked processes (the same options: each size's search
    is its own)."""
    roles = ("agg", "prefill", "decode") if pd else ("agg",)
    sizes = [Size(s.with_(device_price=(prices or {}).get(device, 0.0)), device, k, rate, role)
             for device in devices for role in roles for k in range(1, max_devices + 1)]
    found = _search_sizes(sizes, progress or SearchProgress(enabled=False), processes)
    options = []
    for device in devices:
        sides = {role: [o for size, opts in zip(sizes, found, strict=True) if (size.device, size.role) == (device, role)
                        for o in opts if o.devices <= max_devices] for role in ("agg", "prefill", "decode")}
        options += sides["agg"]
        if sides["prefill"] and sides["decode"]:
            split = SplitOption(*(min(sides[r], key=PlanOption.sort_key) for r in ("prefill", "decode")))
            if split.devices <= max_devices:
                options.append(split)
    return sorted(options, key=_Ranked.sort_key)


def _search_sizes(sizes: list[Size], progress: SearchProgress, processes: int) -> list[list[PlanOption]]:
    """The options of each size, in the sizes' order: here, or in forked processes largest first (more devices,
    more layouts)."""
    progress.begin(len(sizes))
    if processes > 1 and len(sizes) > 1 and can_fork():
        order = sorted(range(len(sizes)), key=lambda i: -sizes[i].k)
        found = dict(zip(order, forked_map(_counted_options, [sizes[i] for i in order], processes, progress),
                         strict=True))
        return [found[i] for i in range(len(sizes))]
    found = []
    for size in sizes:
        found.append(instance_options(*size, progress.update))
        progress.update(jobs=1)
    return found


def _counted_options(s: Scenario, device: str, k: int, rate: float, role: str) -> list[PlanOption]:
    """`instance_options` in a forked process, its points counted for the bar of the process that forked it."""
    return instance_options(s, device, k, rate, role, count_evaluated)


def predicted(s: Scenario, option: PlanOption) -> dict:
    """The point row of one instance at its share of the load: what `vllm_bench` should measure."""
    from orchestrator.evaluate import evaluate_point

    one = s.with_(device=option.device, num_devices=option.layout.devices, arrival="poisson")
    return evaluate_point(one, Job(option.role, option.layout, option.max_batched_tokens), 1,
                          rate=option.rate / option.instances / option.layout.attention_dp)


def vllm_bench(s: Scenario, option: PlanOption, rate: float | None = None) -> tuple[str, list[str]]:
    """The `vllm bench serve` command that checks one instance at its share of the load (or the whole
    deployment at `rate`), and notes on what its random dataset cannot reproduce."""
    args = ["vllm", "bench", "serve", "--backend", "vllm", "--model", s.model, "--dataset-name", "random"]
    lengths, notes = _random_lengths(s)
    args += lengths
    share = rate if rate is not None else option.rate / option.instances
    args += ["--request-rate", f"{share:.3g}", "--num-prompts", str(s.num_prompts or 1000),
             "--percentile-metrics", "ttft,tpot,itl,e2el"]
    if s.slo_percentile:
        args += ["--metric-percentiles", f"{s.slo_percentile:g}"]
    return shlex.join(args), notes


def _random_lengths(s: Scenario) -> tuple[list[str], list[str]]:
    """vLLM's random dataset draws both lengths uniformly in [len x (1 - ratio), len x (1 + ratio)]
    with one ratio: a uniform prompt mix (and a fixed or like output) is exact; any other mix is
    approximated by its typical request, and said so."""
    out, notes, ratio = [], [], None
    for name, flag in (("input_length", "--random-input-len"), ("output_length", "--random-output-len")):
        value = getattr(s, name)
        kind = "trace" if s.trace else getattr(value, "kind", "fixed")
        if kind == "uniform":
            low, high = value.bounds
            out += [flag, str((low + high) // 2)]
            ratio = ratio if ratio is not None else (high - low) / (high + low)
        else:
            out += [flag, str(s.typical(name))]
            if kind != "fixed":
                notes.append(f"{name} {value if not s.trace else s.request_mix}: vLLM's random dataset draws "
                             "uniform lengths, so the check uses the typical length (replay the mix as a custom "
                             "dataset for the exact one)")
    if ratio:
        out += ["--random-range-ratio", f"{ratio:.3g}"]
        if sum(getattr(getattr(s, n), "kind", "fixed") == "uniform" for n in ("input_length", "output_length")) < 2:
            notes.append("--random-range-ratio also spreads the other length by the same ratio")
    return out, notes


def option_dict(s: Scenario, o, commands: bool = False) -> dict:
    """One option as plain values; with `commands`, the command that launches an instance on the scenario's
    engine (`serve`), the `vllm bench serve` that checks it and the predicted TTFT/TPOT at each instance's share
    of the load. A split is its two sides under `prefill` and `decode`."""
    if o.role == "split":
        return _split_dict(s, o, commands)
    lay = o.layout
    out = {"role": o.role, "device": o.device, "devices": o.devices, "instances": o.instances, "tp": lay.tp,
           "pp": lay.pp,
           "attention_dp": lay.attention_dp, "ep": lay.ep, "max_batched_tokens": o.max_batched_tokens,
           "capacity_per_instance": o.capacity, "headroom": o.headroom, **o.cost}
    if commands:
        engine, serve, notes = serve_command(s.with_(device=o.device, num_devices=lay.devices), o)
        at = predicted(s, o)
        bench, bench_notes = vllm_bench(s, o)
        out |= {"serve": serve, "serving_engine": engine, "notes": notes + bench_notes, "vllm_bench_serve": bench,
                "predicted_ttft_ms": at["ttft_slo_ms"], "predicted_tpot_ms": at["tpot_slo_ms"]}
        if engine == "vllm":  # the key it had before other engines' commands
            out["vllm_serve"] = serve
    return out


def _split_dict(s: Scenario, o: SplitOption, commands: bool) -> dict:
    """A split as plain values; with `commands`, each side's launch command, its predicted TTFT (prefill)
    or TPOT (decode), and one `vllm bench serve` of the whole split at the rate, through its router."""
    out = {"role": "split", "device": o.device, "devices": o.devices, "headroom": o.headroom, **o.cost,
           "prefill": option_dict(s, o.prefill, commands), "decode": option_dict(s, o.decode, commands)}
    if commands:
        bench, notes = vllm_bench(s, o.decode, rate=o.decode.rate)
        out |= {"vllm_bench_serve": bench, "notes": [ROUTER_NOTE, *notes],
                "predicted_ttft_ms": out["prefill"]["predicted_ttft_ms"],
                "predicted_tpot_ms": out["decode"]["predicted_tpot_ms"]}
    return out
