"""Measured serving runs in NVIDIA AIConfigurator's silicon format (`silicon_sample.csv`: the format of
`../shared/reference/measured_serving*.csv`), read as configurations: `estimate --from-csv` takes such a file as it
is and reports our error beside each measured TTFT and TPOT. One reading of the format, shared with bench/.

The format's `batch_size` is the requests in flight on one attention-DP rank (its run ids name batch_size x
attention_dp_size as the concurrency); our `concurrency` counts all ranks.

Every run is a closed loop as aiperf drove it, from its pool of 100 prompts, on an engine without a prefix cache
(`PREFIX_CACHING`; a calibrated profile's own choice instead: `prefix_caching_read`; a run says where its campaign's
throughput shows one: `orchestrator.served_prompts`), launched with the engine's defaults except where the run's
engine version says AIConfigurator's generator launched it otherwise (`launch`)."""

from __future__ import annotations

import math
import re
from collections import Counter

from latency import known_models, load_device, load_engine, load_model
from latency.kernel_tables import GPU_DIRS
from orchestrator.engine_defaults import engine_default_budget
from orchestrator.fields import FIELDS, InputError
from orchestrator.layout_readings import folded_tp, implied_attention_dp, named_layout

#: the columns that say a CSV is in this format
SIGNATURE = ("model_path", "system", "backend", "isl", "osl", "batch_size", "tp_size")
#: the measured metrics, and the error columns written beside our figures (ours / measured - 1)
MEASURED = {"silicon_ttft_ms": ("ttft_ms", "ttft_error"), "silicon_tpot_ms": ("tpot_ms", "tpot_error")}
#: the same of a CSV of spec-key columns (calibrate's second form): its measured metric, ours, our error
MEASURED_SPEC = {"measured_ttft_ms": ("ttft_ms", "ttft_error"), "measured_tpot_ms": ("tpot_ms", "tpot_error")}
#: the spec keys a run's own columns give (what it measured); the others `to_spec` reads (engine, launch, client,
#: cache), and a flag given on the command line replaces such a reading
COLUMN_KEYS = frozenset({"model", "device", "input_length", "output_length", "concurrency", "tp", "pp", "ep",
                         "attention_dp", "moe_tp", "quantization"})
#: the format's GPU names -> our device files (AIConfigurator names its kernel tables' GPUs alike)
DEVICES = {system: device for device, system in GPU_DIRS.items()}
#: the format's backends, which are our engine profiles' names
ENGINES = ("vllm", "sglang", "trtllm")
#: the modes the format names (AIConfigurator's GEMMQuantMode and MoEQuantMode), each side read apart: the
#: linear layers' format, and the routed experts' where it differs. Weight-only 4-bit floats (nvfp4_wo,
#: w4a16_mxfp4) are their formats (computed in FP4 where the device has FP4 tensor cores)
GEMM_MODES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "bf16", "fp16": "bf16", "fp8": "fp8", "fp8_static": "fp8",
              "fp8_ootb": "fp8", "fp8_block": "fp8", "sq": "w8a8", "int8_wo": "w8a16", "int4_wo": "int4_wo",
              "nvfp4": "nvfp4", "nvfp4_wo": "nvfp4", "w4a16_nvfp4": "nvfp4"}
MOE_MODES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "bf16", "fp16": "bf16", "fp8": "fp8", "fp8_block": "fp8",
             "int4_wo": "int4_wo", "w4afp8": "w4afp8", "nvfp4": "nvfp4", "nvfp4_wo": "nvfp4", "w4a16_nvfp4": "nvfp4",
             "w4a16_mxfp4": "mxfp4", "w4a16_mxfp4_cutlass": "mxfp4", "w4a8_mxfp4_mxfp8": "mxfp4",
             "w4a8_mxfp4_mxfp8_trtllm": "mxfp4"}
#: 4-bit checkpoints labelled so on both sides keep attention in bf16: NVIDIA's NVFP4 ones (their configs
#: exclude self_attn) and the INT4 weight-only experts' (compressed-tensors)
ATTENTION_KEPT = ("nvfp4", "int4_wo")
#: `precision` alone (the dense file has no quant-mode columns)
PRECISION = {"": "bf16", "bf16": "bf16", "bfloat16": "bf16", "fp16": "bf16", "float16": "bf16", "fp8": "fp8",
             "fp8_block": "fp8", "int8": "w8a8", "fp4": "bf16+nvfp4", "nvfp4": "bf16+nvfp4", "mxfp4": "bf16+mxfp4",
             "int4": "bf16+int4_wo", "w4afp8": "fp8+w4afp8"}
#: the KV cache a label brings: NVIDIA's NVFP4 checkpoints declare an FP8 one (hf_quant_config.json:
#: kv_cache_quant_algo FP8)
LABEL_KV = {"bf16+nvfp4": "fp8"}
#: the linear layers' format whose KV-cache dtype is read from the engine profile pricing the run (`kv_cache`;
#: --engine where given, else the backend's), with its experts in any format (fp8+mxfp4: DeepSeek-V4's): vLLM's
#: `--kv-cache-dtype auto` keeps an FP8 checkpoint's cache in bf16, a launch may ask for FP8, and where the
#: measured MiniMax-M2.5 FP8 campaigns start to queue says both happened (on H100 with 0.18 as a bf16 cache
#: would, on B200 with 0.19 as an FP8 one; docs/calibration.md)
READ_KV_LABEL = "fp8"

#: (the label's experts format, the checkpoint's) where a label names the checkpoint's 4-bit float
#: by the other one's name: gpt-oss-120b ships only MXFP4 experts, labelled nvfp4
SAME_CHECKPOINT = {("nvfp4", "mxfp4")}
#: the runs' clients did not meet a prefix cache: the format does not record it, and AIConfigurator's generated
#: launches leave each engine's cache on (its rules set disable_prefix_cache only to false), but the runs' TPOTs
#: say so: with aiperf's 100 reused prompts served from a cache, the dense fit rows' TPOT would be 16-28 % low,
#: not within 3-9 % (`python bench/variants.py aiperf-pool --every 2`, README). A reading, not a launch the row
#: states: `servesweep calibrate` tries the cache on where a campaign's runs ask for it (vLLM 0.12's Llama-3.1-8B
#: FP8 runs on H200 stream prompt tokens faster than a full prefill allows), and a profile it calibrated reads
#: its runs as it chose (`prefix_caching_read`)
PREFIX_CACHING = "off"
#: the launch choices every row is read with but none records (`to_spec`): calibrate may choose them
READ_LAUNCH = ("prefix_caching",)
#: SGLang from 0.5.6.post2 on (Dynamo 0.8's, in AIConfigurator's backend version matrix) was launched
#: as AIConfigurator's generator launches SGLang (its rule_plugin/sglang.rule, since 2025-12-04;
#: --enable-mixed-chunk effective since its 2026-01-19 fix): prompt chunks mixed into the decode steps
#: (our token-budget policy; SGLang counts the decodes against the budget as vLLM does),
#: --max-prefill-tokens = the prompt + GENERATED_SPARE_TOKENS, --max-running-requests = the concurrency.
#: The runs' TPOT says so: read so, the Llama-3.1-8B runs on SGLang 0.5.6.post2 are within 5 % (median),
#: read as SGLang's defaults (prefill-first) 25 % low; the older 0.5.1 runs fit the defaults (README)
GENERATED_SPARE_TOKENS = 1500
#: TensorRT-LLM's max_num_tokens is a whole number of its KV blocks (the generator's tokens_per_block)
TRTLLM_BLOCK_TOKENS = 32
#: vLLM 0.12 (what Dynamo 0.8 ships beside SGLang 0.5.6.post2 in that matrix) was launched as the generator
#: launches vLLM (its rule_plugin/vllm.rule; --max-num-batched-tokens in its run.sh since 2026-01-08):
#: a token budget of the batch on a rank + the prompt + GENERATED_SPARE_TOKENS, --max-num-seqs that
#: batch. The later vLLM runs we have are another campaign's (the MoE file: its own run ids, at
#: vLLM's defaults: its FIT rows' TTFT 23.6 % at the defaults, 33.4 % read so), so 0.12 alone.
#: TensorRT-LLM 1.2 (1.2.0rc6.post1 is the third engine of that Dynamo 0.8 row) likewise: its template's
#: max_num_tokens (the batch + the prompt + GENERATED_SPARE_TOKENS, in KV blocks) and max_batch_size.
#: Per engine, the releases [from, to) read as generated (to None: every later one)
GENERATED = {"sglang": ((0, 5, 6), None), "vllm": ((0, 12, 0), (0, 13, 0)), "trtllm": ((1, 2, 0), (1, 3, 0))}
#: vLLM schedules a step while the one before runs (async scheduling) by default since 0.14 (its
#: release notes; `--async-scheduling`): runs of older releases are read with it off
VLLM_ASYNC_SINCE = (0, 14, 0)
#: checkpoint-name suffixes that say the weights' format, not another model
FORMAT_SUFFIXES = ("-FP8-Static-PerTensor", "-FP8-dynamic", "-FP8-Dynamic", "-FP8", "-NVFP4", "-FP4", "-BF16")


def is_measured(columns) -> bool:
    return all(c in columns for c in SIGNATURE)


def our_model(path: str) -> str:
    """The shipped model a checkpoint's name stands for: its format suffix dropped, and another
    publisher's copy (nvidia/Llama-3.1-8B-Instruct-FP8; nvidia/Gemma-4-31B-IT-NVFP4, in its own capitals) read as
    the shipped original of that name;
    a name we do not ship is kept (the model's own check names it)."""
    name = path
    for suffix in FORMAT_SUFFIXES:
        name = name.removesuffix(suffix)
    shipped = known_models()
    if name in shipped:
        return name
    same = [m for m in shipped if m.split("/")[-1].lower() == name.split("/")[-1].lower()]
    return same[0] if len(same) == 1 else path


def model_allowed(model: str, error: str) -> str:
    """What MODEL may be, for a name load_model does not know: the shipped model a name without its publisher or
    a checkpoint of another format or publisher (nvidia/Llama-3.1-8B-Instruct-FP8) stands for, then every one."""
    if not error.startswith("unknown model"):
        return error
    shipped, ours = f"a shipped model ({', '.join(known_models())}) or a config.json", our_model(model)
    if ours == model:
        return shipped
    why = "the shipped model of that name" if "/" not in model else (
        f"that checkpoint is {ours} in another format or from another publisher: its weight format goes in "
        "--quantize-linear-action")
    return f"{ours} ({why}), or {shipped}"


def labelled_quantization(cells: dict) -> str:
    """The quantisation a run's columns name (each side by GEMM_MODES and MOE_MODES, a 4-bit checkpoint's
    attention kept in bf16; else PRECISION); raises KeyError if unknown."""
    gemm, moe = cells.get("gemm_quant_mode", ""), cells.get("moe_quant_mode", "")
    if not (gemm or moe):
        return PRECISION[cells.get("precision", "")]
    if gemm in ATTENTION_KEPT and moe in ("", gemm):
        return f"bf16+{MOE_MODES[gemm]}"
    linear = GEMM_MODES[gemm] if gemm else "bf16"
    experts = MOE_MODES[moe] if moe else linear
    return linear if experts == linear else f"{linear}+{experts}"


def quantization(label: str, model: str) -> str:
    """The label's quantisation with the routed experts as the checkpoint stores them where the label
    misnames them (SAME_CHECKPOINT); a dense model's linear layers in the label's 4-bit format (an NVFP4
    or INT4 checkpoint of a dense model quantises them all: its experts' part is its own)."""
    linear, _, experts = label.partition("+")
    try:
        spec = load_model(model)
    except ValueError:  # a model we do not ship: its own check names it
        return label
    if experts and not spec.is_moe:
        return experts
    own = spec.checkpoint_quantization.partition("+")[2]
    return f"{linear}+{own}" if (experts, own) in SAME_CHECKPOINT else label


def kv_read(label: str) -> bool:
    """Whether a run of quantisation `label` leaves its KV-cache dtype to a reading (READ_KV_LABEL)."""
    return label.partition("+")[0] == READ_KV_LABEL


def kv_cache(label: str, engine: str) -> str:
    """The KV-cache dtype a run used: the label's where its checkpoint declares one, else the engine profile's
    for an FP8 run (`fp8_kv_cache`: the format records no KV dtype, and launches differ), else bf16."""
    if kv_read(label):
        return "fp8" if load_engine(engine).fp8_kv_cache else "bf16"
    return LABEL_KV.get(label, "bf16")


def prefix_caching_read(engine: str) -> str:
    """Whether `engine`'s runs are read as served from a prefix cache ("on"/"off"): PREFIX_CACHING for a shipped
    profile (fitted on the runs read so), a calibrated one's own choice (calibrate chose it on its runs)."""
    profile = load_engine(engine)
    if not profile.base:
        return PREFIX_CACHING
    return "on" if profile.prefix_caching else "off"


def version(text: str) -> tuple[int, ...] | None:
    """A release's (major, minor, patch), or None for a build without one (nightly-5b8c30d); a release named
    without its patch (1.0, v0.11rc1) is its .0."""
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    return tuple(int(part or 0) for part in match.groups()) if match else None


def launch(engine: str, engine_version: str, isl: int, batch: int, device: str) -> dict:
    """The spec keys of how a run's engine was launched where it was not with its defaults, `batch`
    being the requests in flight on one attention-DP rank: vLLM before VLLM_ASYNC_SINCE without async
    scheduling, vLLM with the budget its release defaulted to where today's differs
    (`engine_default_budget`), and the releases GENERATED names as AIConfigurator's generator launches
    them (`generated_launch`). A build without a release number (a nightly) is newer than any: defaults."""
    release = version(engine_version)
    if release is None:
        return {}
    keys = {}
    if engine == "vllm":
        if release < VLLM_ASYNC_SINCE:
            keys["async_scheduling"] = "off"
        own, today = _default_budget(device, release), _default_budget(device)
        if own != today:
            keys["max_batched_tokens"] = str(own)
    since, until = GENERATED.get(engine, (None, None))
    if since is not None and since <= release and (until is None or release < until):
        keys |= generated_launch(engine, isl, batch, device)
    return keys


def generated_launch(engine: str, isl: int, batch: int, device: str) -> dict:
    """The spec keys of AIConfigurator's generated aggregated launch (its rule_plugin/benchmark/*.rule)
    of `batch` requests a rank: prompt chunks mixed into the decode steps (token budget), a budget of
    the batch + the prompt + GENERATED_SPARE_TOKENS (TensorRT-LLM's in whole KV blocks; SGLang's
    --max-prefill-tokens is the prompt + the spare, its mixed decodes counted in, at most the default
    chunk), as many running requests as the batch. TensorRT-LLM's template leaves chunked prefill
    off; a prompt longer than its budget is chunked here all the same."""
    if engine == "sglang":
        budget = min(_default_budget(device), isl + GENERATED_SPARE_TOKENS)
    else:
        budget = batch + isl + GENERATED_SPARE_TOKENS
        if engine == "trtllm":
            budget = -(-budget // TRTLLM_BLOCK_TOKENS) * TRTLLM_BLOCK_TOKENS
    return {"scheduler": "token-budget", "max_batched_tokens": str(budget), "max_num_seqs": str(batch)}


def _default_budget(device: str, release: tuple[int, ...] | None = None) -> int:
    """`engine_default_budget` of a device named as the measured files name it."""
    return engine_default_budget(load_device(device), release)


def _int(cells: dict, column: str, where: str, default: int = 1, low: int = 1) -> int:
    """A layout or length cell as an integer >= `low` (`default` where empty; "2.0" is 2), else one line naming it
    (an expert group of 0 is what some exports write for a dense model)."""
    text = cells.get(column, "").strip()
    value = _number(text) if text else default
    if not (math.isfinite(value) and value == int(value) and value >= low):
        raise InputError(f"{where}, column {column}", text, f"an integer >= {low}")
    return int(value)


def measured_ms(text: str, where: str) -> float | None:
    """A measured time cell in ms: a number > 0, None where empty, else one line naming it."""
    if not text.strip():
        return None
    value = _number(text)
    if not (math.isfinite(value) and value > 0):
        raise InputError(where, text, "a measured time in ms > 0")
    return value


def _number(text: str) -> float:
    """A cell's number; NaN where it reads as none (every check above refuses NaN)."""
    try:
        return float(text)
    except ValueError:
        return math.nan


#: a run id's leading date (AIConfigurator's collector names runs YYYY_MM_DD_...): runs of one model, GPU
#: and precision collected on one date are one campaign's
RUN_DATE = re.compile(r"^(\d{4}_\d{2}_\d{2})_")


def campaign_of(cells: dict) -> tuple:
    """The campaign a run belongs to, as far as its columns say: engine, model, GPU, precision, run date."""
    date = RUN_DATE.match(cells.get("id", ""))
    return (cells.get("backend", ""), cells.get("model_path", ""), cells.get("system", ""),
            cells.get("precision", ""), date.group(1) if date else "")


#: what a cell holds where a table written by pandas or Python's csv module had no value
MISSING_MARKS = frozenset({"none", "nan", "null", "n/a", "na"})
NAMES = ("system", "backend", "precision", "gemm_quant_mode", "moe_quant_mode")  # the columns of names


def as_format_reads(rows: list[dict]) -> list[dict]:
    """`rows` with every cell that marks a missing value ("None", "nan", ...) empty, as the format leaves it, and
    the columns of names (NAMES) read in any case and spacing ("FP8 ", "H100_SXM") as its lower case."""
    return [{k: "" if str(v).strip().lower() in MISSING_MARKS else str(v).strip().lower() if k in NAMES else v
             for k, v in cells.items()} for cells in rows]


def read_releases(rows: list[dict]) -> list[dict]:
    """`rows` with an empty backend_version read as the release its campaign's other runs (`campaign_of`)
    ran most, and `release_read_as` naming it; a run whose campaign names none keeps it empty (read as
    newer than any release: the engine's defaults). Such runs exist: the collector did not record it."""
    seen = {}
    for cells in rows:
        if cells.get("backend_version", "").strip():
            seen.setdefault(campaign_of(cells), Counter())[cells["backend_version"].strip()] += 1
    out = []
    for cells in rows:
        releases = seen.get(campaign_of(cells))
        if not cells.get("backend_version", "").strip() and releases:
            release = releases.most_common(1)[0][0]
            cells = dict(cells, backend_version=release, release_read_as=release)
        out.append(cells)
    return out


def replaced_readings(values: dict) -> tuple[str, ...]:
    """The spec keys whose reading the flags in `values` (field values given on the command line) replace in every
    run: each flag's but those the runs' columns give (COLUMN_KEYS), in the fields' order."""
    return tuple(f.key for f in FIELDS if f.name in values and f.key not in COLUMN_KEYS)


def to_spec(cells: dict, where: str, engine: str = "", kv_cache_dtype: str = "") -> dict:
    """One measured run (its cells as text) as spec keys, priced with `engine` (a profile's name or file) or
    else its backend's profile, its KV cache `kv_cache_dtype` where the row leaves it to a reading; `where`
    names its line for errors."""
    device = DEVICES.get(cells["system"])
    if device is None:
        raise InputError(f"{where}, column system", cells["system"], f"one of {', '.join(sorted(DEVICES))}")
    if cells["backend"] not in ENGINES:
        raise InputError(f"{where}, column backend", cells["backend"], f"one of {', '.join(ENGINES)}")
    try:
        label = labelled_quantization(cells)
    except KeyError:
        raise InputError(f"{where}, columns gemm_quant_mode/moe_quant_mode/precision",
                         "/".join(cells.get(c, "") for c in ("gemm_quant_mode", "moe_quant_mode", "precision")),
                         f"gemm_quant_mode one of {', '.join(GEMM_MODES)}; moe_quant_mode one of "
                         f"{', '.join(MOE_MODES)}; or precision {', '.join(p for p in PRECISION if p)}") from None
    batch, dp, tp, pp, isl, osl = (_int(cells, c, where) for c in ("batch_size", "attention_dp_size", "tp_size",
                                                                    "pp_size", "isl", "osl"))
    ep, moe_tp = _int(cells, "moe_ep_size", where, low=0), _int(cells, "moe_tp_size", where, 0, low=0)
    for column in MEASURED:
        measured_ms(cells.get(column, ""), f"{where}, column {column}")
    model = our_model(cells["model_path"])
    try:
        dense = not load_model(model).is_moe
    except ValueError as err:
        raise InputError(f"{where}, column model_path", cells["model_path"], model_allowed(model, str(err))) from None
    if dense:  # a dense model's MoE columns mean nothing
        ep, moe_tp, dp = 1, 0, 1
    unrecorded = not dense and moe_tp * ep == 1 < tp * dp  # a MoE group stated as one device under several
    moe_tp = 0 if unrecorded else moe_tp  # as if left empty: the engine's default, experts split over them all
    concurrency = batch * dp
    group = max(moe_tp, 1) * ep
    implied = not dense and not cells.get("attention_dp_size", "").strip() and group > tp and group % tp == 0
    if implied:
        dp, concurrency = implied_attention_dp(cells, tp, group, batch)
    folded = folded_tp(tp, dp, group)  # a dense model's dp is 1
    tp = tp // dp if folded else tp
    named = None if dense else named_layout(cells, tp, ep, dp, batch)
    if named:
        concurrency, ep, dp = *named, 1
    engine = engine or cells["backend"]
    given_kv = kv_cache_dtype if kv_read(label) else ""  # a given dtype replaces a reading, not a label's
    spec = {"model": model, "device": device, "engine": engine, "input_length": str(isl),
            "output_length": str(osl), "concurrency": str(concurrency), "tp": str(tp), "pp": str(pp),
            "ep": str(ep), "attention_dp": str(dp), "quantization": quantization(label, model),
            "kv_cache_dtype": given_kv or kv_cache(label, engine), "arrival": "closed", "benchmark": "aiperf",
            "prefix_caching": prefix_caching_read(engine)}
    if moe_tp:
        spec["moe_tp"] = str(moe_tp)
    if kv_read(label) and not given_kv:
        spec["kv_cache_read_as"] = spec["kv_cache_dtype"]
    spec |= {said: cells[said] for said in ("release_read_as", "prefix_cache_evidence") if cells.get(said)}
    spec |= {"attention_dp_read_as": str(dp)} if implied else {}
    spec |= {"moe_layout_read_as": f"moe_tp {tp * dp}"} if unrecorded else {}
    spec |= {"tp_read_as": f"tp {tp} x {dp} attention-DP ranks"} if folded else {}
    if named:
        spec["layout_read_as"] = f"tp{tp} ep{ep}"
        spec |= {"layout_id": cells["layout_id"]} if cells.get("layout_id") else {}
    return spec | launch(cells["backend"], cells.get("backend_version", ""), isl, batch, device)


def add_errors(table, metrics, measured_columns: dict = MEASURED):
    """`table` (the measured runs) with our error beside each measured metric it has."""
    for measured, (ours, error) in measured_columns.items():
        if measured in table and ours in metrics:
            table[error] = metrics[ours] / table[measured].astype(float) - 1
    return table
