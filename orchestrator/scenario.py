"""A scenario: what one optimizer run answers (model, devices, lengths, budget, limits), validated.

Its fields are the rows of `orchestrator.fields.FIELDS`; this module adds what a scenario means:
its layouts, latency models, scheduler and limit pairs, and the checks that span several fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass, replace
from functools import lru_cache

from latency import build_latency_model, load_device, load_model, parse_quantization
from latency.parallel import ParallelSpec
from orchestrator.fields import (
    AUTO_MAX_BATCHED_TOKENS,
    FIELDS,
    VLLM_BATCHED_TOKENS,
    VLLM_BATCHED_TOKENS_LARGE,
    VLLM_LARGE_HBM_BYTES,
    InputError,
)
from simulator.scheduler import Scheduler, make_scheduler

__all__ = ["InputError", "Layout", "Scenario"]


@dataclass(frozen=True)
class Layout:
    """One instance: tp x pp devices, experts over ep groups."""

    tp: int = 1
    pp: int = 1
    ep: int = 1

    @property
    def devices(self) -> int:
        return self.tp * self.pp


def engine_default_budget(device) -> int:
    """vLLM's `max_num_batched_tokens` default: 8192, or 16384 on GPUs with >= 160 GB (B200)."""
    large = device.hbm_gib * 1024**3 >= VLLM_LARGE_HBM_BYTES
    return VLLM_BATCHED_TOKENS_LARGE if large else VLLM_BATCHED_TOKENS


class _ScenarioMethods:
    def __post_init__(self) -> None:
        """Fill the defaults that depend on the device: quantisation, and the token budget."""
        try:
            device = load_device(self.device)
        except ValueError:
            return  # validate() names the device
        if self.quantization is None:  # the device's default (the reference tool's on Ascend devices)
            object.__setattr__(self, "quantization", device.default_quantization)
        if not self.max_batched_tokens:
            budgets = (engine_default_budget(device),) if self.scheduler == "token-budget" else AUTO_MAX_BATCHED_TOKENS
            object.__setattr__(self, "max_batched_tokens", budgets)

    @property
    def default_notes(self) -> list[str]:
        """Defaults taken from elsewhere, to print with a result."""
        notes = []
        if self.scheduler == "token-budget" and self.max_batched_tokens == (engine_default_budget(
                load_device(self.device)),):
            notes.append(f"max_batched_tokens {self.max_batched_tokens[0]} and max_num_seqs {self.max_num_seqs} "
                         "are vLLM's defaults on this device unless given")
        return notes

    def validate(self) -> None:
        """Raise InputError naming the field of the first bad value."""
        try:
            spec = load_model(self.model)
        except ValueError as err:
            raise InputError("model", self.model, str(err)) from None
        try:
            load_device(self.device)
        except ValueError as err:
            raise InputError("device", self.device, str(err).split("; ", 1)[-1]) from None
        for f in FIELDS:
            f.check(getattr(self, f.name))
        self._validate_cross(spec)

    def _validate_cross(self, spec) -> None:
        if not self.max_batched_tokens:
            raise InputError("max_batched_tokens", self.max_batched_tokens, "at least one integer > 0")
        for b in self.max_batched_tokens:
            if b < 1 + self.mtp_tokens:
                raise InputError("max_batched_tokens", b, f"an integer >= {1 + self.mtp_tokens} (1 + MTP tokens)")
        if self.input_length - int(self.input_length * self.prefix_cache_hit_rate) < 1:
            raise InputError("prefix_cache_hit_rate", self.prefix_cache_hit_rate,
                             "a rate that leaves at least 1 prompt token")
        context = self.input_length + self.output_length
        if spec.max_position_embeddings and context > spec.max_position_embeddings:
            raise InputError("input_length", self.input_length,
                             f"input + output <= {spec.max_position_embeddings} tokens, the context of {spec.name} "
                             f"(max_position_embeddings); output is {self.output_length}")
        for tp in self.tp_sizes:
            if self.num_devices % (tp * self.pp):
                raise InputError("tp_sizes", tp, f"a divisor of --num-devices {self.num_devices} (with pp={self.pp})")
        try:
            parse_quantization(self.quantization, self.kv_cache_dtype)
        except ValueError as err:
            name = "kv_cache_dtype" if "KV" in str(err) else "quantization"
            raise InputError(name, getattr(self, name), str(err).split("; ", 1)[-1]) from None
        if len(self.mtp_acceptance_rates) < self.mtp_tokens:
            raise InputError("mtp_acceptance_rates", list(self.mtp_acceptance_rates),
                             f"{self.mtp_tokens} rates in [0, 1], one per MTP token")
        try:
            layouts = self.layouts()
        except ValueError as err:
            raise InputError("tp_sizes", list(self.tp_sizes), str(err)) from None
        if not layouts:
            with_ep = f" with --ep-size {self.ep} (ep must divide tp)" if self.ep > 1 else ""
            raise InputError("tp_sizes", list(self.tp_sizes) or "auto",
                             f"a tensor-parallel size that fits {self.model} on {self.num_devices} devices{with_ep}")

    def layouts(self) -> list[Layout]:
        """Every (tp, pp, ep) to try: the given tp sizes, or each divisor of the device count the
        model allows. An instance whose weights do not fit is kept: its points fail on memory and
        the answer says so."""
        spec = load_model(self.model)
        sizes = self.tp_sizes or tuple(t for t in range(1, self.num_devices + 1)
                                       if self.num_devices % (t * self.pp) == 0)
        out = []
        for tp in sizes:
            ep = self.ep  # never silently replaced: a tp that cannot host it is skipped, or refused if asked for
            try:
                ParallelSpec(tp=tp, pp=self.pp, ep=ep).validate(spec)
            except ValueError:
                if self.tp_sizes:
                    raise
                continue
            out.append(Layout(tp, self.pp, ep))
        return out

    def latency_model(self, layout: Layout):
        return _latency_model(self.model, self.device, layout.tp, layout.pp, self.num_devices // layout.devices,
                              layout.ep, self.quantization, self.kv_cache_dtype, self.reserved_memory_gb, self.engine)

    def make_scheduler(self) -> Scheduler:
        """The scenario's policy with its options (fields declared with `scheduler=` its name)."""
        options = {f.name: getattr(self, f.name) for f in FIELDS if f.scheduler == self.scheduler}
        return make_scheduler(self.scheduler, **options)

    def limit_pairs(self) -> list[tuple[float | None, float | None]]:
        """Every (TTFT limit, TPOT limit) combination; None where no limit is given."""
        return [(t, p) for t in (self.ttft_limits or (None,)) for p in (self.tpot_limits or (None,))]

    def with_(self, **changes):
        return replace(self, **changes)


def _dataclass_field(f):
    kind = tuple if f.many else f.kind
    return (f.name, kind) if f.required else (f.name, kind, field(default=f.default))


Scenario = make_dataclass("Scenario", [_dataclass_field(f) for f in FIELDS], bases=(_ScenarioMethods,), frozen=True)
Scenario.__doc__ = "One scenario; fields from orchestrator.fields.FIELDS (see there for meaning and ranges)."
Scenario.__module__ = __name__


@lru_cache(maxsize=256)
def _latency_model(model, device, tp, pp, dp, ep, quantization, kv_cache_dtype, reserved, engine):
    return build_latency_model(model, device, tp=tp, pp=pp, dp=dp, ep=ep, quantization=quantization,
                               kv_cache_dtype=kv_cache_dtype, reserved_memory_gb=reserved, engine=engine)
