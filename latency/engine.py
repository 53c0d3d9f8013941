"""EngineProfile: what a serving engine adds to every forward step beyond its kernels (scheduling,
input preparation, sampling, detokenisation), as measured end to end. One TOML file per engine
(`latency/data/engines/`); "none" is kernels only (the reference tool's model)."""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from pathlib import Path

import numpy as np

from latency.checks import RangeError, check_number
from latency.device import FP8_EFFICIENCIES
from latency.memory import DEFAULT_RESERVED_GIB
from latency.reserve import RESERVE_RULES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DATA = Path(__file__).parent / "data" / "engines"


#: a profile's front end (`simulator.frontend.Frontend`'s times: what a request spends outside the forward
#: steps, between client and scheduler; and FRONTEND_COUNTS); read here so that one file describes an engine
FRONTEND_KEYS = ("request_ms", "prompt_token_us", "return_ms", "client_ms", "lookahead_steps", "stream_us",
                 "requests_per_client")
#: the [frontend] keys that count, not time: async scheduling's steps ahead (0 or 1), and the requests each
#: client of an aiperf closed loop has measured where a run does not say (0: aiperf's 20 as
#: AIConfigurator's bench_run.sh asks; its AICONFIGURATOR_BENCH_MULTI_ROUND changes it)
FRONTEND_COUNTS = {"lookahead_steps": 1, "requests_per_client": None}
#: the [moe] table's keys and their defaults (fp4_bandwidth 0: as bandwidth)
MOE_KEYS = {"compute": 1.0, "bandwidth": 1.0, "fp4_bandwidth": 0.0}
MOE_REQUIRED = ("compute", "bandwidth")  # these must be > 0
#: a profile's [efficiency] table: multipliers on the device file's achievable efficiencies per op class
#: (what `servesweep calibrate` fits where a deployment's kernels run faster or slower than the device's
#: defaults); the product is capped at 1, the whole of the device's peak
EFFICIENCY_KEYS = ("gemm", "attention", "memory", "communication")
#: the range a multiplier may take: a quarter to twice the device's own efficiency
EFFICIENCY_RANGE = (0.25, 2.0)
#: how an engine may admit requests into a full KV cache: the one vocabulary of profiles, scenarios and the
#: KV-bound planner (simulator.blocks): vLLM's (and TensorRT-LLM's MAX_UTILIZATION), GUARANTEED_NO_EVICT, SGLang's
CAPACITY_SCHEDULERS = MAX_UTILIZATION, NO_EVICT, NEW_TOKEN_RATIO = ("max-utilization", "guaranteed-no-evict",
                                                                    "new-token-ratio")
#: a profile's [launch] table: how the engine was launched where the scenario does not say (0: the engine's
#: default: its budget on the device; vLLM's max_num_seqs). A cap on requests in flight is the engine's or
#: its clients' (an HTTP client's pool of connections): either way the others wait, and their wait is in TTFT
LAUNCH_KEYS = ("max_batched_tokens", "max_num_seqs", "below_clients")
#: a profile's [memory] keys: what the engine leaves free (by the device's memory, or by its own rule), the
#: share of the rest its KV pool takes, and the share of that pool measured runs held (calibrated)
MEMORY_KEYS = ("reserved_gib", "rule", "free_fraction", "kv_share")
#: the widest `kv_share` a profile may say: a pool this many times the one its flags give, or its inverse
KV_SHARE_RANGE = (0.1, 2.0)
#: a profile's top-level numbers (default 0, never negative) and their upper bound (None: none)
NUMBER_KEYS = {"step_ms": None, "layer_us": None, "request_us": None, "request_layer_us": None, "token_us": None,
               "mla_decode_attention": None,
               "dp_step_ms": None, "moe_prefill_layer_us": None, "moe_layer_us": None, "gpu_memory_utilization": 1}


#: the profile's fields no step's price reads: its labels (the family stands for name and base), what a request
#: does outside the steps (the front end), how the engine was launched and admits requests, its memory share
#: and KV dtype (the memory picture's, and the scenario's quantisation, which a price names on its own)
UNPRICED = ("name", "source", "base", "frontend", "scheduler", "prefix_caching", "fp8_kv_cache", "max_batched_tokens",
            "max_num_seqs", "below_clients", "capacity_scheduler", "gpu_memory_utilization", "reserved_by_hbm",
            "reserve_rule", "kv_free_fraction", "kv_share")


#: what a step's overhead and host time read of a profile, and nothing else of a price (`overhead_ms`,
#: `moe_prefill_ms`, `with_step`): profiles alike but in these price a step's parts alike (`parts`)
OVERHEADS = ("step_ms", "layer_us", "request_us", "request_layer_us", "token_us", "dp_step_ms", "moe_prefill_layer_us",
             "moe_layer_us", "async_scheduling")


@dataclass(frozen=True)
class EngineProfile:
    """A step costs `step_ms` + `layer_us` per layer + `request_us` per request in it +
    `request_layer_us` per request in each layer + `token_us` per token it computes, on top of its
    kernels. `frontend` holds the
    [frontend] table's times (FRONTEND_KEYS)."""

    name: str = "none"
    step_ms: float = 0.0
    #: per layer of every step, whatever its size: the kernels an engine runs in each layer beyond the
    #: roofline's (activation quantisation before FP8 GEMMs, residual adds, rope and KV-cache writes)
    #: and the gaps between them. Fitted only where FIT rows of one engine span depths (README)
    layer_us: float = 0.0
    request_us: float = 0.0
    #: per request in the step, in every layer: what a decode step spends on each sequence beyond
    #: its bytes and FLOPs (the attention kernel's per-sequence set-up, page-table walk and split-KV
    #: merge; rope, cache write and norms at one token). It scales with the model's depth, which a
    #: per-step CPU time does not: fitted so, a 32-layer model is not priced as a 64-layer one (README)
    request_layer_us: float = 0.0
    token_us: float = 0.0
    #: the share of each device's memory the engine takes for weights, activations and its KV pool
    #: (vLLM's --gpu-memory-utilization); 0: not named, DEFAULT_RESERVED_GIB stays free
    gpu_memory_utilization: float = 0.0
    #: or what it leaves free by the device's memory (the [memory] table's reserved_gib: (HBM below, GiB free)
    #: pairs, the first whose bound exceeds the device's HBM applies)
    reserved_by_hbm: tuple = ()
    #: or by its own rule for the device and the layout ([memory] rule, latency.reserve.RESERVE_RULES): SGLang's
    reserve_rule: str = ""
    #: the share its KV pool takes of the memory still free once weights, a full step's activations and the
    #: reserve are placed ([memory] free_fraction: TensorRT-LLM's free_gpu_memory_fraction, 0.9 by default);
    #: 0: all of it
    kv_free_fraction: float = 0.0
    #: the share of that pool the engine's measured runs held ([memory] kv_share, fitted by `servesweep calibrate`
    #: where runs queued for KV blocks: a launch's own memory flag, or memory the engine holds that the picture
    #: does not count); 1: the pool as priced
    kv_share: float = 1.0
    #: per step when attention DP > 1: the ranks agree on every step (vLLM's DP ranks exchange their
    #: token counts and pad to the busiest), on top of step_ms
    dp_step_ms: float = 0.0
    #: per MoE layer of a step that computes prompt tokens: the expert path's kernels (routing,
    #: permutation, activation quantisation, two grouped GEMMs, combine) launched one by one from the
    #: host, where the engine runs such steps without the CUDA graphs it captures for decode batches
    moe_prefill_layer_us: float = 0.0
    #: per MoE layer of every step: the expert path's kernels beyond the three the roofline launches
    #: (routing, alignment, activation quantisation, combine), whatever the experts it touches
    moe_layer_us: float = 0.0
    #: an MLA model's decode attention over our roofline's price (0: as priced): the engine's absorbed-attention
    #: kernels reach less of the roof than a dense model's (bench/mla_kernels.py, AIConfigurator's tables)
    mla_decode_attention: float = 0.0
    #: it schedules step k+1 while step k runs (vLLM's async scheduling, its default since 0.14): the
    #: time per step (`step_ms`, host work) hides behind the GPU's, and only a step shorter than it waits
    async_scheduling: bool = False
    source: str = ""
    frontend: tuple = ()  # ((key, value), ...) of the [frontend] table
    moe_compute: float = 1.0    # share of the device's GEMM efficiency its grouped expert GEMMs reach
    moe_bandwidth: float = 1.0  # share of the device's memory efficiency they reach streaming expert weights
    #: the same share for FP4 experts on a device with FP4 tensor cores (B200: native FP4 grouped GEMMs,
    #: another kernel family than the weight-only and FP8 ones); 0: as moe_bandwidth
    moe_fp4_bandwidth: float = 0.0
    scheduler: str = ""  # the step policy the engine runs by default (a simulator.scheduler name; "": not said)
    fp8_kv_cache: bool = False  # its FP8 deployments keep an FP8 KV cache (the measured runs it is fitted on did)
    #: it serves a prompt it still holds from its prefix cache by default (vLLM V1, SGLang's radix cache,
    #: TensorRT-LLM's KV block reuse): what a benchmark client that reuses prompts (aiperf) meets
    prefix_caching: bool = False
    #: the shipped engine a calibrated profile starts from (its kernel tables, its measured runs' reading);
    #: "" for a shipped profile: its own name
    base: str = ""
    efficiency: tuple = ()  # ((op class, multiplier), ...) of the [efficiency] table (EFFICIENCY_KEYS)
    max_batched_tokens: int = 0  # [launch]: the budget the engine runs with; 0: its default on the device
    max_num_seqs: int = 0  # [launch]: the requests it runs at once; 0: vLLM's default
    #: [launch]: a closed loop's engine runs at most its clients less this many at once (a batch limit set below
    #: the clients: TensorRT-LLM 1.0's Llama-3.1-8B runs on H100 ran C - 1 of C at every C and tp); 0: none
    below_clients: int = 0
    #: how it admits requests when its KV cache is full (CAPACITY_SCHEDULERS; "": vLLM's, max-utilization);
    #: TensorRT-LLM's default is guaranteed-no-evict
    capacity_scheduler: str = ""

    @property
    def family(self) -> str:
        """The shipped engine whose kernels and launch rules this profile describes."""
        return self.base or self.name

    def priced(self) -> dict:
        """What of the profile a step's price reads: every field but UNPRICED, and the family whose kernels it
        runs. Profiles alike in it price every step alike (calibrate's candidates that move only the front
        end or the launch share their prices)."""
        fields = {key: value for key, value in dataclasses.asdict(self).items() if key not in UNPRICED}
        return {**fields, "family": self.family}

    def parts(self) -> dict:
        """What of the profile a step's parts read (its ops and attention): `priced` less OVERHEADS. Calibrate's
        candidates that move only the host's time or the MoE prompt-step time share them."""
        return {key: value for key, value in self.priced().items() if key not in OVERHEADS}

    def scaled_device(self, device):
        """`device` with its efficiencies multiplied by the [efficiency] table (each at most 1); a device's
        FP8 efficiency moves with the one it stands for (fp8_memory and fp8_kv_memory with memory)."""
        if not self.efficiency:
            return device
        scale = dict(self.efficiency)
        keys = [(key, key) for key in scale] + [(fp8, of) for fp8, of in FP8_EFFICIENCIES.items() if of in scale]
        return dataclasses.replace(device, **{f"eff_{key}": min(1.0, getattr(device, f"eff_{key}") * scale[of])
                                              for key, of in keys})

    def expert_bandwidth(self, native_fp4: bool) -> float:
        """The share of the device's memory efficiency the expert GEMMs reach: native FP4 ones apart."""
        return self.moe_fp4_bandwidth if native_fp4 and self.moe_fp4_bandwidth else self.moe_bandwidth

    def reserved_gib(self, hbm_gib: float, tp: int = 1, pp: int = 1, attention_dp: int = 1) -> float:
        """GiB of a device of `hbm_gib` the engine leaves to others in a layout: its rule's (`reserve_rule`), the
        rest of its utilisation, its reserve for that much memory (`reserved_by_hbm`), or the reference tool's
        fixed reserve when the profile names none (those three whatever the layout)."""
        if self.reserve_rule:
            return RESERVE_RULES[self.reserve_rule](hbm_gib, tp, pp, attention_dp)
        if self.reserved_by_hbm:
            return next((gib for below, gib in self.reserved_by_hbm if hbm_gib < below), self.reserved_by_hbm[-1][1])
        return (1 - self.gpu_memory_utilization) * hbm_gib if self.gpu_memory_utilization else DEFAULT_RESERVED_GIB

    def moe_prefill_ms(self, moe_layers: int) -> float:
        """Milliseconds a step that computes prompt tokens adds through `moe_layers` MoE layers."""
        return self.moe_prefill_layer_us * moe_layers * 1e-3

    def overhead_ms(self, requests, tokens, layers: int, attention_dp: int = 1, moe_layers: int = 0, prefills=0):
        """GPU milliseconds a step of `requests` sequences and `tokens` tokens through `layers` layers
        (`moe_layers` of them MoE) adds, `prefills` 1 where it computes prompt tokens (numbers, or
        arrays of steps); the host's time per step comes in `with_step`."""
        dp = self.dp_step_ms if attention_dp > 1 else 0.0
        per_request = self.request_us + self.request_layer_us * layers
        return dp + (self.layer_us * layers + self.moe_layer_us * moe_layers + per_request * requests
                     + self.token_us * tokens) * 1e-3 + prefills * self.moe_prefill_ms(moe_layers)

    def with_step(self, gpu_ms):
        """Each step's milliseconds from its GPU time: the host's time per step (`step_ms`) added, or,
        with async scheduling, hidden behind it (a step shorter than that waits for the host)."""
        if self.async_scheduling:
            return np.maximum(gpu_ms, self.step_ms)
        return gpu_ms + self.step_ms


def shipped_engines() -> list[str]:
    return sorted(p.stem for p in DATA.glob("*.toml"))


def is_profile_path(engine: str) -> bool:
    """Whether `engine` names a profile file (a .toml path) rather than a shipped engine."""
    return str(engine).endswith(".toml")


def load_engine(engine: str) -> EngineProfile:
    """A shipped engine by name (read once), or an engine profile file by its .toml path (read again when it
    changes)."""
    if not is_profile_path(engine):
        return _load_shipped(engine, DATA)
    path = Path(engine)
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        raise ValueError(_unknown(engine)) from None
    return _load(str(path), mtime)


@lru_cache(maxsize=64)
def _load_shipped(name: str, folder: Path) -> EngineProfile:
    path = folder / f"{name}.toml"
    if not path.is_file():
        raise ValueError(_unknown(name))
    return parse_profile(path)


@lru_cache(maxsize=256)
def _load(path: str, mtime_ns: int) -> EngineProfile:
    return parse_profile(Path(path))


def _unknown(engine: str) -> str:
    return f"unknown engine {str(engine)!r}; known: {', '.join(shipped_engines())}, or an engine profile .toml path"


def parse_profile(path: Path) -> EngineProfile:
    """The profile a TOML file describes; ValueError naming the file and key of a bad value."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ValueError(f"{path.name}: not a readable engine profile ({err})") from None
    values = {}
    for key, high in NUMBER_KEYS.items():
        try:
            values[key] = float(check_number(f"{path.name}: {key}", data.get(key, 0.0), low=0, high=high))
        except RangeError as err:
            raise ValueError(str(err)) from None
    table = data.get("frontend", {})
    unknown = sorted(set(table) - set(FRONTEND_KEYS))
    if unknown:
        raise ValueError(f"{path.name}: [frontend] has unknown keys {unknown}; known: {', '.join(FRONTEND_KEYS)}")
    frontend = []
    for key in FRONTEND_KEYS:
        if key in table:
            try:
                frontend.append((key, check_number(f"{path.name}: [frontend] {key}", table[key], low=0,
                                                   high=FRONTEND_COUNTS.get(key), integer=key in FRONTEND_COUNTS)))
            except RangeError as err:
                raise ValueError(str(err)) from None
    moe = data.get("moe", {})
    unknown = sorted(set(moe) - set(MOE_KEYS))
    if unknown:
        raise ValueError(f"{path.name}: [moe] has unknown keys {unknown}; known: {', '.join(MOE_KEYS)}")
    for key, default in MOE_KEYS.items():
        try:
            values[f"moe_{key}"] = float(check_number(f"{path.name}: [moe] {key}", moe.get(key, default), low=0,
                                                      low_open=key in MOE_REQUIRED, high=1.5))
        except RangeError as err:
            raise ValueError(str(err)) from None
    scheduler = data.get("scheduler", "")
    if not isinstance(scheduler, str):
        raise ValueError(f"{path.name}: scheduler = {scheduler!r} is not allowed; expected a step policy's name")
    capacity = data.get("capacity_scheduler", "")
    if capacity not in ("", *CAPACITY_SCHEDULERS):
        raise ValueError(f"{path.name}: capacity_scheduler = {capacity!r} is not allowed; expected one of "
                         f"{', '.join(CAPACITY_SCHEDULERS)}")
    switches = {}
    for key in ("fp8_kv_cache", "prefix_caching", "async_scheduling"):
        switches[key] = data.get(key, False)
        if not isinstance(switches[key], bool):
            raise ValueError(f"{path.name}: {key} = {switches[key]!r} is not allowed; expected true or false")
    base = data.get("base", "")
    if base and (not isinstance(base, str) or base not in shipped_engines()):
        raise ValueError(f"{path.name}: base = {base!r} is not allowed; expected one of {', '.join(shipped_engines())}")
    memory = data.get("memory", {})
    reserved, rule = _reserved_by_hbm(path, memory), memory.get("rule", "")
    if rule not in ("", *RESERVE_RULES):
        raise ValueError(f"{path.name}: [memory] rule = {rule!r} is not allowed; expected one of "
                         f"{', '.join(RESERVE_RULES)}")
    if sum(map(bool, (reserved, rule, values["gpu_memory_utilization"]))) > 1:
        raise ValueError(f"{path.name}: gpu_memory_utilization, [memory] reserved_gib and [memory] rule each say "
                         "what the engine leaves free; keep one")
    fraction = _memory_share(path, memory, "free_fraction", 0.0, low=0, high=1, low_open=True)  # 0: none
    kv_share = _memory_share(path, memory, "kv_share", 1.0, *KV_SHARE_RANGE)
    if fraction and values["gpu_memory_utilization"]:
        raise ValueError(f"{path.name}: [memory] free_fraction shares what weights leave free and "
                         "gpu_memory_utilization the whole GPU; keep one")
    return EngineProfile(name=path.stem, source=str(data.get("source", "")), frontend=tuple(frontend),
                         scheduler=scheduler, capacity_scheduler=capacity, base=base, reserved_by_hbm=reserved,
                         reserve_rule=rule, kv_free_fraction=fraction, kv_share=kv_share,
                         efficiency=_efficiency(path, data.get("efficiency", {})),
                         **_launch(path, data.get("launch", {})), **switches, **values)


def _reserved_by_hbm(path: Path, table: dict) -> tuple:
    """The [memory] table's reserved_gib: [[HBM below (GiB), GiB left free], ...], the bounds rising."""
    unknown = sorted(set(table) - set(MEMORY_KEYS))
    if unknown:
        raise ValueError(f"{path.name}: [memory] has unknown keys {unknown}; known: {', '.join(MEMORY_KEYS)}")
    pairs = table.get("reserved_gib", [])
    if not (isinstance(pairs, list) and all(map(_memory_class, pairs))
            and all(a[0] < b[0] for a, b in pairwise(pairs))):
        raise ValueError(f"{path.name}: [memory] reserved_gib = {pairs!r} is not allowed; expected [[HBM below (GiB), "
                         "GiB left free], ...], the bounds > 0 and rising (the last may be inf), the GiB >= 0")
    return tuple((float(below), float(gib)) for below, gib in pairs)


def _memory_share(path: Path, table: dict, key: str, default: float, low: float, high: float,
                  low_open: bool = False) -> float:
    """A share of the [memory] table (free_fraction, kv_share) within its bounds; `default` where it names none."""
    if key not in table:
        return default
    try:
        return float(check_number(f"{path.name}: [memory] {key}", table[key], low=low, low_open=low_open, high=high))
    except RangeError as err:
        raise ValueError(str(err)) from None


def _memory_class(pair) -> bool:
    """Whether `pair` is [HBM below, GiB left free]: a bound > 0 (inf for the last class), a finite GiB >= 0."""
    if not (isinstance(pair, list) and len(pair) == 2
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in pair)):
        return False
    below, gib = pair
    return below > 0 and math.isfinite(gib) and gib >= 0


def _efficiency(path: Path, table: dict) -> tuple:
    unknown = sorted(set(table) - set(EFFICIENCY_KEYS))
    if unknown:
        raise ValueError(f"{path.name}: [efficiency] has unknown keys {unknown}; known: {', '.join(EFFICIENCY_KEYS)}")
    low, high = EFFICIENCY_RANGE
    try:
        return tuple((key, float(check_number(f"{path.name}: [efficiency] {key}", table[key], low=low, high=high)))
                     for key in EFFICIENCY_KEYS if key in table)
    except RangeError as err:
        raise ValueError(str(err)) from None


def _launch(path: Path, table: dict) -> dict:
    unknown = sorted(set(table) - set(LAUNCH_KEYS))
    if unknown:
        raise ValueError(f"{path.name}: [launch] has unknown keys {unknown}; known: {', '.join(LAUNCH_KEYS)}")
    try:
        return {key: check_number(f"{path.name}: [launch] {key}", table.get(key, 0), low=0, integer=True)
                for key in LAUNCH_KEYS}
    except RangeError as err:
        raise ValueError(str(err)) from None
