"""A scenario: what one optimizer run answers (model, devices, lengths, budget, limits), validated.

Its fields are the rows of `orchestrator.fields.FIELDS`; this module adds what a scenario means:
its layouts, latency models, scheduler and limit pairs, and the checks that span several fields.
"""

from __future__ import annotations

from dataclasses import field, make_dataclass, replace
from functools import cached_property, lru_cache

from latency import load_device, load_engine, load_model, parse_quantization
from latency.backends import backend_for, backend_names, has_backend
from latency.deployment import Deployment
from latency.engine import is_profile_path
from orchestrator.engine_defaults import (
    default_capacity_scheduler,
    default_reserved_gib,
    default_scheduler,
    engine_below_clients,
    engine_switch,
    launch_budget,
    launch_max_num_seqs,
    layout_reserved_gib,
)
from orchestrator.fields import (
    AUTO_MAX_BATCHED_TOKENS,
    DEFAULT_REQUEST_RATE,
    FIELD_BY_NAME,
    FIELDS,
    InputError,
)
from orchestrator.layouts import LAYOUTS, Layout, find_layouts, layout_key
from orchestrator.measured_runs import model_allowed
from simulator.benchmarks import protocol
from simulator.mix import Lengths, MixError, RequestMix, Trace
from simulator.scheduler import Scheduler, make_scheduler

__all__ = ["InputError", "Layout", "Scenario"]
#: field groups a plan depends on (see Scenario.plan_family)
PLAN_GROUPS = ("workload", "load", "scheduler")


class _ScenarioMethods:
    def __post_init__(self) -> None:
        """Fill the defaults that depend on the device or engine: quantisation, the step policy and the
        token budget; and the device count a single layout implies."""
        if self.num_devices is None and len(self.tp_sizes) == 1 and len(self.attention_dp_sizes) <= 1:
            ranks = self.attention_dp_sizes[0] if self.attention_dp_sizes else 1
            if isinstance(self.pp, int) and isinstance(self.tp_sizes[0], int) and isinstance(ranks, int):
                object.__setattr__(self, "num_devices", self.tp_sizes[0] * self.pp * ranks)
        if self.scheduler is None:  # the engine's own step policy; the RFC's without one
            object.__setattr__(self, "scheduler", default_scheduler(self.engine))
        if self.capacity_scheduler is None:  # the engine's own admission into a full KV cache
            object.__setattr__(self, "capacity_scheduler", default_capacity_scheduler(self.engine))
        for switch in ("prefix_caching", "async_scheduling"):  # the engine's own default
            if getattr(self, switch) is None:
                object.__setattr__(self, switch, engine_switch(self.engine, switch))
        if self.max_num_seqs is None:  # the engine's own launch
            object.__setattr__(self, "max_num_seqs", launch_max_num_seqs(self.engine))
        try:
            device = self.device_spec
        except ValueError:
            return  # validate() names the device
        if self.reserved_memory_gb is None:  # what the engine's memory utilisation leaves free
            object.__setattr__(self, "reserved_memory_gb", default_reserved_gib(self.engine, device))
        if self.quantization is None:  # the checkpoint's on GPUs, else the device's (the reference tool's on Ascend)
            object.__setattr__(self, "quantization", _default_quantization(self.model, device))
        if not self.max_batched_tokens:
            budgets = (launch_budget(self.engine, device),) if self.scheduler == "token-budget" else \
                AUTO_MAX_BATCHED_TOKENS
            object.__setattr__(self, "max_batched_tokens", budgets)
        trace = _trace_or_none(self.trace) if self.trace else None
        timed = trace is not None and trace.timed
        if timed and self.arrival == "burst":  # a trace with times is an open loop at those times
            object.__setattr__(self, "arrival", "poisson")
        if self.arrival == "poisson" and not self.request_rate and not timed:
            object.__setattr__(self, "request_rate", DEFAULT_REQUEST_RATE)

    @cached_property
    def request_mix(self) -> RequestMix | None:
        """Per-request lengths when a length is a distribution or a trace is given; None: every
        request is input_length / output_length. Built once per scenario (every point asks)."""
        if self.trace:
            trace = _load_trace(self.trace)
            return RequestMix(Lengths("fixed", (trace.input_length[0],)), Lengths("fixed", (trace.output_length[0],)),
                              trace)
        if isinstance(self.input_length, Lengths) or isinstance(self.output_length, Lengths):
            return RequestMix(_as_lengths(self.input_length), _as_lengths(self.output_length))
        return None

    @property
    def reused_prompts(self) -> int:
        """Prompts the benchmark client draws every request's from (aiperf's pool); 0 when every prompt is
        new, a trace's requests included: only then does `prefix_caching` change a result."""
        return 0 if self.trace else protocol(self.benchmark).pool(self.arrival, 1)[0]

    def typical(self, name: str) -> int:
        """The typical request's `input_length` or `output_length`: the value, or the mix's mean, rounded."""
        if self.trace:
            return round(sum(values := getattr(_load_trace(self.trace), name)) / len(values))
        value = getattr(self, name)
        return round(value.mean()) if isinstance(value, Lengths) else value

    def length_bounds(self, name: str) -> tuple[int, int]:
        """The shortest and longest `input_length` or `output_length` a request can have."""
        if self.trace:
            values = getattr(_load_trace(self.trace), name)
            return min(values), max(values)
        value = getattr(self, name)
        return value.bounds if isinstance(value, Lengths) else (value, value)

    @property
    def default_notes(self) -> list[str]:
        """Defaults taken from elsewhere, to print with a result."""
        notes = []
        profile = load_engine(self.engine)
        if self.scheduler == "token-budget" and self.max_batched_tokens == (launch_budget(
                self.engine, load_device(self.device)),):
            whose = f"{profile.name}'s launch" if profile.max_batched_tokens else "vLLM's defaults on this device"
            notes.append(f"max_batched_tokens {self.max_batched_tokens[0]} and max_num_seqs {self.max_num_seqs} "
                         f"are {whose} unless given")
        own = profile.scheduler
        if own and own != self.scheduler:
            notes.append(f"{self.engine} schedules {own}, this answer {self.scheduler}: for {self.engine}'s own "
                         f"schedule, --scheduler {own}")
        quant = parse_quantization(self.quantization, self.kv_cache_dtype)
        if profile.fp8_kv_cache and quant.compute_dtype == "fp8" and quant.kv_bytes > 1:
            notes.append(f"{self.engine}'s measured FP8 runs kept an FP8 KV cache, this answer's is "
                         f"{self.kv_cache_dtype}: to match them, --kv-cache-dtype fp8")
        if profile.kv_free_fraction:
            notes.append(f"{self.engine}'s KV pool takes {profile.kv_free_fraction:g} of what its weights and "
                         "activations leave (its free_gpu_memory_fraction, as its measured runs were launched); "
                         "for another launch, a profile with [memory] free_fraction")
        if self.reused_prompts:
            cache = ("its prefix cache serves the ones it still holds" if self.prefix_caching == "on" else
                     "the prefix cache is off, so each is computed again")
            notes.append(f"{self.benchmark} draws every prompt from {self.reused_prompts} it reuses; {cache} "
                         "(--prefix-caching)")
        return notes

    def validate(self) -> None:
        """Raise InputError naming the field of the first bad value."""
        try:
            spec = load_model(self.model)
        except ValueError as err:
            raise InputError("model", self.model, model_allowed(self.model, str(err))) from None
        try:
            _ = self.device_spec  # read once a scenario (post_init read it too)
        except ValueError as err:
            raise InputError("device", self.device, str(err).split("; ", 1)[-1]) from None
        try:
            load_engine(self.engine)
        except ValueError as err:
            readable = is_profile_path(self.engine) or self.engine in FIELD_BY_NAME["engine"].choices
            allowed = f"a readable engine profile ({err})" if readable else FIELD_BY_NAME["engine"].allowed
            raise InputError("engine", self.engine, allowed) from None
        if self.num_devices is None:
            raise InputError("num_devices", None, "a device count, or one --tp-sizes value (with --pp-size and "
                             "--attention-dp-sizes) that implies it")
        for f in FIELDS:
            f.check(getattr(self, f.name))
        self._validate_cross(spec)

    def _validate_cross(self, spec) -> None:
        if self.trace:
            try:
                _load_trace(self.trace)
            except MixError as err:
                raise InputError("trace", self.trace, f"a readable trace ({err})") from None
        else:
            for name in ("input_length", "output_length"):
                if getattr(self, name) is None:
                    raise InputError(name, None, "a length (required unless --trace is given)")
        if self.arrival == "poisson" and not self.request_rate and not (self.trace and _load_trace(self.trace).timed):
            raise InputError("request_rate", self.request_rate, "a rate > 0 (0 replays a timed trace at its times)")
        if not self.max_batched_tokens:
            raise InputError("max_batched_tokens", self.max_batched_tokens, "at least one integer > 0")
        for b in self.max_batched_tokens:
            if b < 1 + self.mtp_tokens:
                raise InputError("max_batched_tokens", b, f"an integer >= {1 + self.mtp_tokens} (1 + MTP tokens)")
        shortest, longest = self.length_bounds("input_length")
        if shortest - int(shortest * self.prefix_cache_hit_rate) < 1:
            raise InputError("prefix_cache_hit_rate", self.prefix_cache_hit_rate,
                             "a rate that leaves at least 1 prompt token")
        context = longest + self.length_bounds("output_length")[1]
        if spec.max_position_embeddings and context > spec.max_position_embeddings:
            name = "trace" if self.trace else "input_length"
            value = self.trace or (str(self.input_length) if isinstance(self.input_length, Lengths) else
                                   self.input_length)
            raise InputError(name, value,
                             f"input + output <= {spec.max_position_embeddings} tokens, the context of {spec.name} "
                             f"(max_position_embeddings); the longest request has {context}")
        if not spec.is_moe and any(a > 1 for a in self.attention_dp_sizes):
            raise InputError("attention_dp_sizes", list(self.attention_dp_sizes),
                             f"1 for the dense {spec.name} (its data parallelism is dp: instances side by side)")
        for tp in self.tp_sizes:
            if self.num_devices % (tp * self.pp):
                raise InputError("tp_sizes", tp, f"a divisor of --num-devices {self.num_devices} (with pp={self.pp})")
        if not has_backend(self.latency_backend):
            raise InputError("latency_backend", self.latency_backend, "one of " + ", ".join(backend_names()))
        try:
            parse_quantization(self.quantization, self.kv_cache_dtype)
        except ValueError as err:
            name = "kv_cache_dtype" if "KV" in str(err) else "quantization"
            raise InputError(name, getattr(self, name), str(err).split("; ", 1)[-1]) from None
        if len(self.mtp_acceptance_rates) < self.mtp_tokens:
            raise InputError("mtp_acceptance_rates", list(self.mtp_acceptance_rates),
                             f"{self.mtp_tokens} rates in [0, 1], one per MTP token")
        if self.redundant_experts and (self.ep == 1 or not load_model(self.model).is_moe):
            raise InputError("redundant_experts", self.redundant_experts,
                             "0 unless experts are split over ep > 1 groups of a MoE model (copies of experts "
                             "need expert parallelism)")
        try:
            layouts = self.layouts()
        except ValueError as err:
            raise InputError("tp_sizes", list(self.tp_sizes), str(err)) from None
        if not layouts:
            with_ep = f" with --ep-size {self.ep} (ep must divide tp x attention_dp)" if self.ep > 1 else ""
            raise InputError("tp_sizes", list(self.tp_sizes) or "auto",
                             f"a tensor-parallel size that fits {self.model} on {self.num_devices} devices{with_ep}")
        try:  # a backend may refuse a deployment outright (the kernel tables need an engine)
            self.latency_model(layouts[0])
        except ValueError as err:
            raise InputError("latency_backend", self.latency_backend, str(err)) from None

    def layouts(self) -> list[Layout]:
        """Every layout to try (`orchestrator.layouts.find_layouts`), found once a scenario and shared by the
        scenarios alike in what they read (`layout_key`)."""
        return list(self._layouts)

    @cached_property
    def _layouts(self) -> tuple[Layout, ...]:
        return LAYOUTS.get(layout_key(self), lambda: find_layouts(self))

    def deployment(self, layout: Layout) -> Deployment:
        """What a latency backend prices for `layout`: one frozen object (the latency-model cache's key)."""
        reserved = layout_reserved_gib(self.engine, self.device_spec, self.reserved_memory_gb, layout.tp,
                                       layout.pp, layout.attention_dp)
        return Deployment(self.model, self.device, layout.tp, layout.pp, self.num_devices // layout.devices,
                          layout.ep, layout.attention_dp, self.quantization, self.kv_cache_dtype, reserved,
                          self.engine, self.redundant_experts if layout.ep > 1 else 0, self.async_override)

    @cached_property
    def device_spec(self):
        """The device's spec, read once a scenario (a sweep's expansion asked for it per layout)."""
        return load_device(self.device)

    def latency_model(self, layout: Layout):
        return _latency_model(self.latency_backend, self.deployment(layout))

    @property
    def async_override(self) -> bool | None:
        """The async scheduling asked for where it is not the engine's own (None: the engine's)."""
        own = self.async_scheduling == engine_switch(self.engine, "async_scheduling")
        return None if own else self.async_scheduling == "on"

    def make_scheduler(self, clients: int | None = None) -> Scheduler:
        """The scenario's policy with its options (fields declared with `scheduler=` its name); given a closed
        loop's `clients` on a rank, its cap on requests in flight at most their number less the engine's
        `below_clients` (a calibrated profile's [launch]: a batch limit set below the clients)."""
        options = {f.name: getattr(self, f.name) for f in FIELDS if f.scheduler == self.scheduler}
        below = engine_below_clients(self.engine)
        if below and clients and self.arrival == "closed" and "max_num_seqs" in options:
            options["max_num_seqs"] = max(1, min(options["max_num_seqs"], clients - below))
        return make_scheduler(self.scheduler, **options)

    def plan_family(self) -> str:
        """What the scenario's plans depend on (its workload, load and scheduler fields, never the
        model, device or limits): scenarios of one family share plans, so a sweep runs them together."""
        return repr(tuple(getattr(self, f.name) for f in FIELDS if f.group in PLAN_GROUPS))

    @cached_property
    def usd_per_device_hour(self) -> float:
        """The device's price per hour: --device-price, else the device file's; 0 when unknown (read
        once per scenario: every point's row prices it)."""
        return self.device_price or load_device(self.device).usd_per_hour

    def limit_pairs(self) -> list[tuple[float | None, float | None]]:
        """Every (TTFT limit, TPOT limit) combination; None where no limit is given."""
        return [(t, p) for t in (self.ttft_limits or (None,)) for p in (self.tpot_limits or (None,))]

    @cached_property
    def without_limits(self) -> Scenario:
        """This scenario with no TTFT or TPOT limit: what a point's simulation depends on (scenarios of a
        sweep's limit grid share their points)."""
        return self.with_(ttft_limits=(), tpot_limits=())

    def with_(self, **changes):
        return replace(self, **changes)


def _dataclass_field(f):
    kind = tuple if f.many else f.kind
    return (f.name, kind) if f.required else (f.name, kind, field(default=f.default))


Scenario = make_dataclass("Scenario", [_dataclass_field(f) for f in FIELDS], bases=(_ScenarioMethods,), frozen=True)
Scenario.__doc__ = "One scenario; fields from orchestrator.fields.FIELDS (see there for meaning and ranges)."
Scenario.__module__ = __name__


def _as_lengths(value) -> Lengths:
    return value if isinstance(value, Lengths) else Lengths("fixed", (value,))


@lru_cache(maxsize=16)
def _read_trace(path: str, mtime_ns: int) -> Trace:
    return Trace.load(path)


def _load_trace(path: str) -> Trace:
    """The trace at `path`, read once per version of the file; MixError if it cannot be read."""
    from pathlib import Path

    try:
        mtime = Path(path).stat().st_mtime_ns
    except OSError as err:
        raise MixError(f"trace {path}: {err.strerror or err}") from None
    return _read_trace(path, mtime)


def _trace_or_none(path: str) -> Trace | None:
    try:
        return _load_trace(path)
    except MixError:
        return None


def _default_quantization(model: str, device) -> str:
    """A published checkpoint's format where the device serves checkpoints as they are (bf16 default:
    the GPUs); the device file's otherwise, and for a model that cannot be read (validate names it)."""
    try:
        checkpoint = load_model(model).checkpoint_quantization
    except ValueError:
        checkpoint = ""
    return checkpoint if checkpoint and device.default_quantization == "bf16" else device.default_quantization


@lru_cache(maxsize=256)
def _latency_model(backend: str, deployment: Deployment):
    return backend_for(backend, deployment)
