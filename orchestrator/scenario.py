"""A scenario: what one optimizer run answers (model, devices, lengths, budget, limits), validated."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from latency import DEFAULT_RESERVED_GIB, build_latency_model, load_device, load_model, parse_quantization
from latency.parallel import ParallelSpec
from simulator.scheduler import SCHEDULERS

#: max_batched_tokens tried when the user gives none: vLLM's ITL-friendly 2048 up to the 8192+ it
#: recommends for throughput; the optimizer keeps the best
AUTO_MAX_BATCHED_TOKENS = (2048, 4096, 8192, 16384)
#: highest concurrency per instance the search probes (all requests arrive at t=0, so without a
#: TTFT limit feasibility is bounded only by memory and this cap)
DEFAULT_MAX_CONCURRENCY = 4096
ROLES = ("agg", "prefill", "decode")


class InputError(ValueError):
    """Bad user input: `flag` names the option, `allowed` the range."""

    def __init__(self, flag: str, value, allowed: str):
        super().__init__(f"{flag}: {value!r} is not allowed; expected {allowed}")
        self.flag, self.value, self.allowed = flag, value, allowed


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    ep: int = 1

    @property
    def devices(self) -> int:
        return self.tp * self.pp

    def label(self) -> str:
        return f"tp{self.tp}pp{self.pp}" + (f"ep{self.ep}" if self.ep > 1 else "")


@dataclass(frozen=True)
class Scenario:
    model: str
    device: str
    num_devices: int
    input_length: int
    output_length: int
    max_batched_tokens: tuple[int, ...] = AUTO_MAX_BATCHED_TOKENS
    ttft_limits: tuple[float, ...] = ()
    tpot_limits: tuple[float, ...] = ()
    prefix_cache_hit_rate: float = 0.0
    tp_sizes: tuple[int, ...] = ()          # empty: every valid size
    pp: int = 1
    ep: int = 1
    quantization: str = "bf16"
    kv_cache_dtype: str = "bf16"
    reserved_memory_gb: float = DEFAULT_RESERVED_GIB
    scheduler: str = "decode-first"
    decode_context: str = "mean"
    mtp_tokens: int = 0
    mtp_acceptance_rates: tuple[float, ...] = field(default_factory=tuple)
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY

    def validate(self) -> None:
        """Raise InputError naming the flag of the first bad value."""
        try:
            load_model(self.model)
        except ValueError as err:
            raise InputError("MODEL", self.model, str(err)) from None
        try:
            load_device(self.device)
        except ValueError as err:
            raise InputError("--device", self.device, str(err).split("; ", 1)[-1]) from None
        _positive_int("--num-devices", self.num_devices)
        _positive_int("--input-length", self.input_length)
        _positive_int("--output-length", self.output_length)
        for b in self.max_batched_tokens:
            _positive_int("--max-batched-tokens", b, low=1 + self.mtp_tokens)
        if not self.max_batched_tokens:
            raise InputError("--max-batched-tokens", self.max_batched_tokens, "at least one integer > 0")
        for limit in self.ttft_limits:
            _positive_float("--ttft-limits", limit)
        for limit in self.tpot_limits:
            _positive_float("--tpot-limits", limit)
        rate = self.prefix_cache_hit_rate
        if not (isinstance(rate, (int, float)) and 0 <= rate < 1):
            raise InputError("--prefix-cache-hit-rate", rate, "a number in [0, 1)")
        if self.input_length - int(self.input_length * rate) < 1:
            raise InputError("--prefix-cache-hit-rate", rate, "a rate that leaves at least 1 prompt token")
        for tp in self.tp_sizes:
            _positive_int("--tp-sizes", tp)
            if self.num_devices % (tp * self.pp):
                raise InputError("--tp-sizes", tp, f"a divisor of --num-devices {self.num_devices} (with pp={self.pp})")
        _positive_int("--pp-size", self.pp)
        _positive_int("--ep-size", self.ep)
        try:
            parse_quantization(self.quantization, self.kv_cache_dtype)
        except ValueError as err:
            flag = "--kv-cache-dtype" if "KV" in str(err) else "--quantize-linear-action"
            raise InputError(flag, self.quantization if flag.startswith("--q") else self.kv_cache_dtype,
                             str(err).split("; ", 1)[-1]) from None
        if not self.reserved_memory_gb >= 0:
            raise InputError("--reserved-memory-gb", self.reserved_memory_gb, "a number >= 0 (GiB)")
        if self.scheduler not in SCHEDULERS:
            raise InputError("--scheduler", self.scheduler, f"one of {', '.join(SCHEDULERS)}")
        _positive_int("--num-mtp-tokens", self.mtp_tokens, low=0)
        if len(self.mtp_acceptance_rates) < self.mtp_tokens:
            raise InputError("--mtp-acceptance-rates", list(self.mtp_acceptance_rates),
                             f"{self.mtp_tokens} rates in [0, 1], one per MTP token")
        for r in self.mtp_acceptance_rates:
            if not 0 <= r <= 1:
                raise InputError("--mtp-acceptance-rates", r, "rates in [0, 1]")
        _positive_int("--max-concurrency", self.max_concurrency)
        if not self.layouts():
            raise InputError("--tp-sizes", list(self.tp_sizes) or "auto",
                             f"a tensor-parallel size that fits {self.model} on {self.num_devices} devices")

    def layouts(self) -> list[Layout]:
        """Every (tp, pp, ep) to try: the given tp sizes, or each divisor of the device count the
        model allows. An instance whose weights do not fit is kept: its points fail on memory and
        the answer says so."""
        spec = load_model(self.model)
        sizes = self.tp_sizes or tuple(t for t in range(1, self.num_devices + 1)
                                       if self.num_devices % (t * self.pp) == 0)
        out = []
        for tp in sizes:
            ep = self.ep if tp % self.ep == 0 else 1
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
                              layout.ep, self.quantization, self.kv_cache_dtype, self.reserved_memory_gb)

    def limit_pairs(self) -> list[tuple[float | None, float | None]]:
        """Every (TTFT limit, TPOT limit) combination; None where no limit is given."""
        return [(t, p) for t in (self.ttft_limits or (None,)) for p in (self.tpot_limits or (None,))]

    def with_(self, **changes) -> Scenario:
        return replace(self, **changes)


@lru_cache(maxsize=256)
def _latency_model(model, device, tp, pp, dp, ep, quantization, kv_cache_dtype, reserved):
    return build_latency_model(model, device, tp=tp, pp=pp, dp=dp, ep=ep, quantization=quantization,
                               kv_cache_dtype=kv_cache_dtype, reserved_memory_gb=reserved)


def _positive_int(flag: str, value, low: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InputError(flag, value, f"an integer >= {low}")


def _positive_float(flag: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InputError(flag, value, "a number > 0 (ms)")
