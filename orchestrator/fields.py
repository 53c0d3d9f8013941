"""The one table of scenario fields. Each user-facing field is declared here once; the CLI flags of
every command, the sweep-spec keys, the `estimate --from-csv` columns, the validation messages and
the Parquet scenario columns are all derived from it. Adding a field is one entry plus its use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from latency import DEFAULT_RESERVED_GIB, load_engine, shipped_engines
from latency.checks import RangeError, check_number, describe
from latency.engine import CAPACITY_SCHEDULERS
from simulator.benchmarks import BENCHMARKS
from simulator.mix import SYNTAX, Lengths, MixError
from simulator.scheduler import DEFAULT_SLACK_RATIO, SCHEDULERS
from simulator.timeline import DECODE_CONTEXTS
from simulator.workload import ARRIVALS, MEASURES

#: max_batched_tokens tried when the user gives none: vLLM's ITL-friendly 2048 up to the 8192+ it
#: recommends for throughput; the optimizer keeps the best
AUTO_MAX_BATCHED_TOKENS = (2048, 4096, 8192, 16384)
#: estimate's Poisson request rate when none is given (a timed trace keeps its own times instead)
DEFAULT_REQUEST_RATE = 1.0
#: highest concurrency per instance the search probes
DEFAULT_MAX_CONCURRENCY = 4096
#: vLLM's defaults for `vllm serve`: `max_num_seqs`, and `max_num_batched_tokens`, larger
#: on devices with at least VLLM_LARGE_HBM_BYTES of HBM
VLLM_MAX_NUM_SEQS = 1024
#: vLLM's --gpu-memory-utilization, as its profile names it (the --reserved-memory-gb default leaves the rest)
VLLM_MEMORY_UTILIZATION = load_engine("vllm").gpu_memory_utilization
#: the share of what weights and activations leave that TensorRT-LLM's KV pool takes, as its profile names it
TRTLLM_KV_FRACTION = load_engine("trtllm").kv_free_fraction
VLLM_BATCHED_TOKENS, VLLM_BATCHED_TOKENS_LARGE, VLLM_LARGE_HBM_BYTES = 8192, 16384, 160 * 1024**3
#: the release that added that tier (`EngineArgs.get_batch_defaults`): older ones took 8192 there too
VLLM_LARGE_BUDGET_SINCE = (0, 28, 0)
#: commands that take scenario fields; `sweep` reads them as spec keys
COMMANDS = ("optimize", "estimate", "sweep")


class InputError(ValueError):
    """Bad user input for field (or flag) `name`: rendered with the flag on the command line
    (style "flag"), or with the key of a spec file or the column of a CSV (style "key")."""

    def __init__(self, name: str, value, allowed: str):
        self.name, self.value, self.allowed = name, value, allowed
        super().__init__(self.render("flag"))

    def render(self, style: str = "flag") -> str:
        f = FIELD_BY_NAME.get(self.name)
        if f is not None:
            label = f.flag if style == "flag" else f.key
        else:
            label = MODE_LABELS.get(self.name, {}).get(style, self.name)
        if self.value is None:  # a value the input had to give and did not
            return f"{label}: not given; expected {self.allowed}"
        if style == "flag":
            return f"{label}: {self.value!r} is not allowed; expected {self.allowed}"
        return f"{label} = {self.value!r}: expected {self.allowed}"


@dataclass(frozen=True)
class Field:
    """One scenario field. `flag` "" means `--name-with-dashes`; `key` "" means the name (spec key,
    CSV column); `column` "" means the key, None: not a scenario column (the point row has it)."""

    name: str
    kind: type
    default: Any
    help: str
    unit: str = ""
    low: float | None = None
    high: float | None = None
    high_open: bool = False
    low_open: bool = False
    choices: tuple[str, ...] = ()
    many: bool = False
    flag: str = ""
    aliases: tuple[str, ...] = ()
    deprecated: str = ""         # an old flag still accepted, with a warning
    key: str = ""
    column: str | None = ""
    required: bool = False
    group: str = "workload"
    commands: tuple[str, ...] = COMMANDS
    scheduler: str = ""          # a scheduler option: passed to that policy only
    scalar_column: bool = False  # a list field whose column holds its one value (None if empty)
    default_help: str = ""       # how --help names a default computed elsewhere
    path_suffix: str = ""        # besides its choices, a path with this suffix (a file of one's own) is allowed

    def __post_init__(self):
        object.__setattr__(self, "flag", self.flag or "--" + self.name.replace("_", "-"))
        object.__setattr__(self, "key", self.key or self.name)
        if self.column == "":
            object.__setattr__(self, "column", self.key)

    @property
    def allowed(self) -> str:
        if self.kind is Lengths:
            return SYNTAX
        if self.choices and self.path_suffix:
            return f"one of {', '.join(self.choices)}, or a path ending in {self.path_suffix}"
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.kind is str:
            return "a string"
        text = describe(self.kind is int, self.low, self.high, self.low_open, self.high_open)
        return f"{text} ({self.unit})" if self.unit else text

    def check(self, value):
        """`value` checked (each element when `many`); InputError names this field."""
        if self.many:
            if not isinstance(value, tuple):
                raise InputError(self.name, value, f"a list of {self.allowed}")
            for v in value:
                self._check_one(v)
            return value
        if value is None and self.default is None:
            return value
        return self._check_one(value)

    def _check_one(self, value):
        if self.kind is Lengths:  # an integer, or a distribution (simulator.mix) already parsed
            ok = isinstance(value, Lengths) or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)
            if not ok:
                raise InputError(self.name, value, self.allowed)
            return value
        if self.kind is str:
            if not isinstance(value, str) or (self.choices and value not in self.choices
                                              and not (self.path_suffix and value.endswith(self.path_suffix))):
                raise InputError(self.name, value, self.allowed)
            return value
        try:
            return check_number(self.name, value, integer=self.kind is int, low=self.low, high=self.high,
                                low_open=self.low_open, high_open=self.high_open)
        except RangeError:
            raise InputError(self.name, value, self.allowed) from None

    def parse(self, text: str):
        """A value from text (a CSV cell, a "none" in a spec): int, float or str as the field is."""
        text = text.strip()
        if self.kind is Lengths:
            try:
                lengths = Lengths.parse(text)
            except MixError:
                raise InputError(self.name, text, self.allowed) from None
            return lengths.params[0] if lengths.is_fixed else lengths
        if self.kind is str:
            return text
        try:
            return self.kind(text)
        except ValueError:
            raise InputError(self.name, text, self.allowed) from None

    def default_text(self) -> str:
        if self.default_help:
            return self.default_help
        if self.default is None:
            return "none"
        return self.text(self.default) or "none"

    @staticmethod
    def text(value) -> str:
        """A value as a flag or a CSV cell writes it (a list space-separated)."""
        return " ".join(map(str, value)) if isinstance(value, tuple) else str(value)


FIELDS: tuple[Field, ...] = (
    Field("model", str, None, "a shipped model name or a config.json (or its folder)", flag="MODEL", required=True,
       group="hardware"),
    Field("device", str, None, "device id (latency/data/devices/*.toml) or a .toml path", required=True,
       group="hardware"),
    Field("num_devices", int, None, "devices in the deployment", low=1, group="hardware",
       default_help="tp x pp x attention_dp when one --tp-sizes (and at most one --attention-dp-sizes) is given, "
       "else required"),
    Field("input_length", Lengths, None, "prompt tokens per request: an integer, or a distribution "
       "(uniform:LOW:HIGH, normal:MEAN:STD:MIN:MAX, lognormal:MEDIAN:SIGMA:MIN:MAX, bins:LOW-HIGH@WEIGHT,...)",
       "tokens", default_help="required unless --trace"),
    Field("output_length", Lengths, None, "output tokens per request: an integer or a distribution, as "
       "--input-length", "tokens", default_help="required unless --trace"),
    Field("max_batched_tokens", int, (), "token budget per step, also the prefill chunk size; several values are "
       "all tried", "tokens", low=1, many=True, deprecated="--max-prefill-tokens", column=None, group="scheduler",
       default_help="token-budget: vLLM's max_num_batched_tokens default (8192; 16384 on devices with >= 160 GiB, "
       "since vLLM 0.28); "
       "decode-first: the best of " + " ".join(map(str, AUTO_MAX_BATCHED_TOKENS))),
    Field("ttft_limits", float, (), "limits on TTFT (mean, or --slo-percentile); every combination is answered",
       "ms", low=0, low_open=True, many=True, key="ttft_limit_ms", group="limits", scalar_column=True),
    Field("tpot_limits", float, (), "limits on TPOT (mean, or --slo-percentile)", "ms", low=0, low_open=True,
       many=True, key="tpot_limit_ms", group="limits", scalar_column=True),
    Field("prefix_cache_hit_rate", float, 0.0, "share of each prompt served from the prefix cache", low=0, high=1,
       high_open=True),
    Field("trace", str, "", "a trace of requests replayed exactly (CSV, JSONL or Parquet with input_length, "
       "output_length, optional arrival_time in s and cached_tokens): replaces both lengths, and with times the "
       "arrivals (an open loop at those times, scaled to --request-rate when given)",
       default_help="none"),
    Field("tp_sizes", int, (), "tensor-parallel sizes to try; default: every size that divides the devices",
       low=1, many=True, aliases=("--tp",), key="tp", column="tp_sizes", group="parallelism"),
    Field("pp", int, 1, "pipeline-parallel stages", low=1, flag="--pp-size", group="parallelism"),
    Field("attention_dp_sizes", int, (), "attention data-parallel ranks per instance to try (MoE): each rank runs "
       "its own batch on tp devices, the MoE layers span all ranks' devices", low=1, many=True,
       aliases=("--attention-dp",), key="attention_dp", column="attention_dp_sizes", group="parallelism",
       default_help="MoE models: every size that fits the devices; dense models: 1 (their data parallelism is dp)"),
    Field("ep", int, 0, "expert-parallel groups (MoE): the experts are split over ep groups of "
       "tp x attention_dp / ep devices; 0 = try both 1 and wide EP (ep = tp x attention_dp)", low=0,
       flag="--ep-size", group="parallelism", default_help="0: MoE models try 1 and tp x attention_dp; dense: 1"),
    Field("redundant_experts", int, 0, "extra copies of experts (EPLB; vLLM --num-redundant-experts) the ep "
       "groups share with the routed ones: ep must divide experts + copies (EP 320 over DeepSeek's 256 + 64); "
       "layouts with ep = 1 have none", low=0, group="parallelism"),
    Field("moe_tp", int, 0, "devices each expert is split over (tp x attention_dp / ep); 0 = derived", low=0,
       group="parallelism", commands=("estimate",), column=None),
    Field("quantization", str, None, "linear-layer quantisation (bf16, W8A8_DYNAMIC, FP8, W4A16, ...)",
       flag="--quantize-linear-action", group="hardware",
       default_help="the device file's: W8A8_DYNAMIC on Ascend and TEST_DEVICE as the reference tool, bf16 on GPUs"),
    Field("kv_cache_dtype", str, "bf16", "KV-cache dtype (bf16, int8, fp8)", group="hardware"),
    Field("engine", str, "none", "serving engine whose framework time per step is added (latency/data/engines: "
       "none = kernels only, as the reference tool; vllm, sglang, trtllm fitted on measured runs), or an engine "
       "profile .toml of your own (servesweep calibrate writes one from your measured runs)",
       choices=tuple(shipped_engines()), path_suffix=".toml", group="hardware"),
    Field("latency_backend", str, "roofline", "what prices a forward step: roofline; aiconfigurator-tables (MoE "
       "experts from NVIDIA AIConfigurator's measured kernel tables for the GPU and --engine, the rest roofline; "
       "pip install 'servesweep[kernels]'); slow-roofline (the roofline at 5 ms a key: stands in for an expensive "
       "backend); or a plugin (entry point group servesweep.latency_backends)", group="hardware"),
    Field("device_price", float, 0.0, "what one device costs per hour; 0 = the device file's [cost] usd_per_hour "
       "(no shipped file names one: prices differ by provider and change)", "USD/h", low=0, group="hardware"),
    Field("reserved_memory_gb", float, None, "HBM kept free per device", "GiB", low=0, group="hardware",
       default_help=f"the --engine's own: what its memory utilisation leaves (vllm: {1 - VLLM_MEMORY_UTILIZATION:g} "
       f"of the device, its --gpu-memory-utilization {VLLM_MEMORY_UTILIZATION:g}; sglang: its rule for the device "
       "and layout; trtllm: its CUDA context and NCCL buffers, its KV pool then taking "
       f"{TRTLLM_KV_FRACTION:g} of what weights and activations leave, the rest free too); "
       f"{DEFAULT_RESERVED_GIB:g} with engines that name none"),
    Field("scheduler", str, None, "step policy: decode-first (the RFC's), token-budget (vLLM V1; "
       "TensorRT-LLM's in-flight batching alike) or prefill-first (SGLang: a waiting prompt's prefill batch runs "
       "before the decodes, never mixed with them)",
       choices=tuple(SCHEDULERS), group="scheduler",
       default_help="the --engine's own (vllm, trtllm: token-budget; sglang: prefill-first); decode-first with "
                    "--engine none"),
    Field("capacity_scheduler", str, None, "how the engine admits requests when its KV cache is full: "
       "max-utilization (admit when the prompt's blocks fit, preempt the newest when a decode needs a block: vLLM, "
       "TensorRT-LLM's MAX_UTILIZATION) or guaranteed-no-evict (admit only when the request's KV to its last "
       "token fits beside the running requests': TensorRT-LLM's GUARANTEED_NO_EVICT; never preempts) or "
       "new-token-ratio (admit when the prompt and every token it may generate fit beside a share of what the "
       "running requests have left to generate, 0.098 once warm and raised by a preemption: SGLang's)",
       choices=CAPACITY_SCHEDULERS, group="scheduler",
       default_help="the --engine's own (trtllm: guaranteed-no-evict; sglang: new-token-ratio; vllm, none: "
                    "max-utilization)"),
    Field("slack_ratio", float, DEFAULT_SLACK_RATIO, "decode-first: a mixed step may hold floor(B * ratio) tokens",
       low=1, group="scheduler", scheduler="decode-first"),
    Field("max_num_seqs", int, None, "token-budget: requests running at once", low=1, group="scheduler",
       scheduler="token-budget", default_help=f"the --engine's own: its profile's [launch] max_num_seqs, else vLLM's "
       f"{VLLM_MAX_NUM_SEQS}"),
    Field("long_prefill_token_threshold", int, 0, "token-budget: prefill tokens per request per step; 0 = no cap",
       "tokens", low=0, group="scheduler", scheduler="token-budget"),
    Field("decode_context", str, "mean", "decode key context: mean of the batch, or the reference tool's "
       "mid = input + output // 2 + 1", choices=DECODE_CONTEXTS, group="scheduler"),
    Field("mtp_tokens", int, 0, "MTP / speculative draft tokens per decode step", low=0, flag="--num-mtp-tokens",
       group="scheduler"),
    Field("mtp_acceptance_rates", float, (), "acceptance rate of each draft token", low=0, high=1, many=True,
       key="mtp_acceptance_rate", column="mtp_acceptance_rates", group="scheduler"),
    Field("max_concurrency", int, DEFAULT_MAX_CONCURRENCY, "highest concurrency per instance the search probes",
       low=1, group="limits", commands=("optimize", "sweep")),
    Field("slo_percentile", float, 0.0, "apply the TTFT/TPOT limits to this percentile of requests; 0 = the mean",
       low=0, high=100, high_open=True, group="limits"),
    Field("arrival", str, "burst", "how requests arrive: burst (all at t=0, the RFC's window), closed (concurrency "
       "in flight, each finished request replaced: vllm bench serve --max-concurrency), poisson (open loop at "
       "--request-rate: vllm bench serve --request-rate)", choices=ARRIVALS, group="load"),
    Field("num_prompts", int, 0, "requests sent in a closed loop or Poisson stream; 0 = 8 x concurrency (closed), "
       "1000 (poisson)", low=0, group="load"),
    Field("burstiness", float, 1.0, "poisson: gamma shape of the inter-arrival times (1 = Poisson; < 1 burstier)",
       low=0, low_open=True, group="load"),
    Field("seed", int, 0, "poisson: random seed of the arrival times", low=0, group="load"),
    Field("measure", str, "steady", "requests the latencies are over: steady (warm-up and drain left out: what a "
       "deployment sees) or all (what vllm bench serve and other benchmark clients report)", choices=MEASURES,
       group="load"),
    Field("benchmark", str, "steady", "benchmark protocol a closed loop or Poisson stream is measured as: steady "
       "(--measure, --num-prompts as given), aiperf (2 x concurrency warm-up requests, drained before it measures, "
       "then --num-prompts or 20 x concurrency measured from an idle engine, as AIConfigurator's bench_run.sh runs "
       "aiperf; an engine profile's [frontend] requests_per_client replaces the 20: shipped ones say 10), vllm-bench "
       "(every request measured, --num-prompts or 1000 sent, as vllm bench serve)", choices=BENCHMARKS,
       group="load"),
    Field("prefix_caching", str, None, "whether the engine serves a prompt it has seen and still holds from its "
       "prefix cache (vLLM's --enable-prefix-caching, SGLang's radix cache, TensorRT-LLM's block reuse): it matters "
       "when the client reuses prompts, as aiperf does (--benchmark aiperf: 100 prompts drawn at random), and a hit "
       "computes only the prompt's last block", choices=("on", "off"), group="load",
       default_help="the --engine's own (vllm, sglang, trtllm: on); off with --engine none"),
    Field("async_scheduling", str, None, "whether the engine schedules a step while the one before runs (vLLM's "
       "--async-scheduling, its default since 0.14): its time per step then hides behind the GPU's",
       choices=("on", "off"), group="hardware",
       default_help="the --engine's own (vllm: on; sglang, trtllm, none: off)"),
    Field("concurrency", int, 1, "requests in flight (burst: requests in the window)", low=1, group="load",
       commands=("estimate",), column=None),
    Field("request_rate", float, 0.0, "poisson: requests per second offered to one instance", "req/s", low=0,
       group="load", commands=("estimate",), column=None,
       default_help=f"{DEFAULT_REQUEST_RATE:g}, as is 0; with a timed --trace: the trace's own times"),
    Field("role", str, "agg", "what the instance does: agg (prefill and decode), prefill only, or decode only",
       choices=("agg", "prefill", "decode"), group="load", commands=("estimate",), column=None),
)

FIELD_BY_NAME = {f.name: f for f in FIELDS}
#: labels of the search-mode options (not scenario fields) on the command line and in a spec
MODE_LABELS = {
    "mode": {"flag": "--disagg / --enable-optimize-prefill-decode-ratio", "key": "sweep.mode"},
    "prefill_devices": {"flag": "--prefill-devices-per-instance", "key": "sweep.pd_devices"},
    "decode_devices": {"flag": "--decode-devices-per-instance", "key": "sweep.pd_devices"},
}
FIELD_BY_KEY = {f.key: f for f in FIELDS}


#: `plan` takes optimize's fields but sets these itself: several device types, the device counts it
#: searches, Poisson arrivals at the target rate, a price per device type
PLAN_SETS = ("device", "num_devices", "arrival", "max_concurrency", "device_price")


def fields_for(command: str) -> list[Field]:
    if command == "plan":
        return [f for f in fields_for("optimize") if f.name not in PLAN_SETS]
    return [f for f in FIELDS if command in f.commands]
