"""The command that launches one instance of a plan on its engine: `vllm serve`, TensorRT-LLM's `trtllm-serve`
(its PyTorch backend) or SGLang's `launch_server`, each in the engine's own flag names, with the memory the plan
was priced with; what no flag of the engine says is a note, never an invented flag."""

from __future__ import annotations

import math
import shlex

from latency import load_engine
from latency.engine import NO_EVICT

#: vLLM's spelling of the quantisations it can apply itself at load time; others need a quantised checkpoint
VLLM_QUANTIZATION = {"FP8": "fp8"}
#: vLLM's KV-cache dtypes (`--kv-cache-dtype`)
VLLM_KV_DTYPES = {"fp8": "fp8"}
#: how a prefill or decode instance of a split hands KV over (vLLM's NixlConnector; both sides kv_both)
VLLM_KV_TRANSFER = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
#: TensorRT-LLM's KV-cache dtypes (kv_cache_config.dtype in its YAML) and SGLang's (`--kv-cache-dtype`)
TRTLLM_KV_DTYPES = {"fp8": "fp8"}
SGLANG_KV_DTYPES = {"fp8": "fp8_e4m3"}
#: the port the check (`vllm bench serve`, which asks localhost:8000) reaches: vLLM's and trtllm-serve's own;
#: SGLang's is 30000, so its line names this one
CHECKED_PORT = 8000
#: SGLang's spelling of the quantisations it applies at load time (`--quantization`)
SGLANG_QUANTIZATION = {"FP8": "fp8"}


def serving_engine(engine: str) -> str:
    """The engine whose server launches an instance: a shipped engine's own, a calibrated profile's base, and
    vLLM's for the kernels-only `none` or a profile of no known base."""
    profile = load_engine(engine)
    name = profile.base or profile.name
    return name if name in SERVERS else "vllm"


def serve_command(s, option) -> tuple[str, str, list[str]]:
    """(serving engine, the command that launches one instance of `option`, notes) for scenario `s`."""
    engine = serving_engine(s.engine)
    command, notes = SERVERS[engine](s, option)
    profile = load_engine(s.engine)
    calibrated = f"the runs {s.engine} was calibrated on"
    if profile.kv_share != 1:
        notes = [*notes, f"the memory flag is the engine's own: {calibrated} held {profile.kv_share:g} of the KV pool "
                 "it gives ([memory] kv_share), and the plan is priced with that share"]
    if profile.below_clients:
        notes = [*notes, f"{calibrated} ran {profile.below_clients} request(s) fewer than their clients ([launch] "
                 "below_clients), and a closed loop is priced so: a batch limit their launch set"]
    return engine, command, notes


def _longest(s) -> int:
    return s.length_bounds("input_length")[1] + s.length_bounds("output_length")[1]


def _hundredths(share: float) -> float:
    """A memory share rounded down to a hundredth (never more than planned), after a rounding guard: 0.9 x 100
    can be 89.99..."""
    return math.floor(round(share * 100, 6)) / 100


def _memory_share(s, option) -> float:
    """The share of each GPU the plan gives weights, activations and the pool (vLLM's --gpu-memory-utilization,
    SGLang's --mem-fraction-static): what the reserve leaves, the pool as the flag gives it (a calibrated
    profile's runs held `kv_share` of it)."""
    mem = s.latency_model(option.layout).memory_for(option.max_batched_tokens)
    flagged = (mem.hbm_gib - mem.reserved_gib - mem.weights_gib - mem.activation_gib) / load_engine(s.engine).kv_share
    return _hundredths((mem.weights_gib + mem.activation_gib + flagged) / mem.hbm_gib)


def _quantization(s, flags: dict, server: str) -> tuple[list[str], list[str]]:
    """The --quantization a server applies at load time for the scenario's, or a note that it reads the format
    from a quantised checkpoint."""
    quant = s.quantization.upper() if s.quantization else "BF16"
    if quant in flags:
        return ["--quantization", flags[quant]], []
    if quant in ("BF16", "DISABLED"):
        return [], []
    return [], [f"{s.quantization}: serve a checkpoint quantised that way ({server} reads it from its config)"]


def _kv_dtype(s, dtypes: dict, server: str, flag: str = "--kv-cache-dtype") -> tuple[list[str], list[str]]:
    """The server's spelling of the scenario's KV-cache dtype after `flag`, or a note that it has none."""
    if s.kv_cache_dtype in dtypes:
        return [flag, dtypes[s.kv_cache_dtype]], []
    if s.kv_cache_dtype == "bf16":
        return [], []
    return [], [f"KV cache {s.kv_cache_dtype}: {server}'s {flag} has no such choice"]


def vllm_serve(s, option) -> tuple[str, list[str]]:
    """The `vllm serve` command of one instance, and notes on what vLLM cannot be told by a flag."""
    lay, notes = option.layout, []
    args = ["vllm", "serve", s.model, "--tensor-parallel-size", str(lay.tp)]
    if lay.pp > 1:
        args += ["--pipeline-parallel-size", str(lay.pp)]
    if lay.attention_dp > 1:
        args += ["--data-parallel-size", str(lay.attention_dp)]
    if lay.ep > 1:
        args += ["--enable-expert-parallel"]
        if lay.ep != lay.tp * lay.attention_dp:
            notes.append(f"ep={lay.ep} over part of the tp x attention_dp devices: vLLM's expert parallelism "
                         "spans them all")
    args += ["--max-model-len", str(_longest(s)), "--max-num-batched-tokens", str(option.max_batched_tokens),
             "--max-num-seqs", str(s.max_num_seqs), "--enable-chunked-prefill",
             "--gpu-memory-utilization", f"{_memory_share(s, option):.2f}"]
    for flags, said in (_quantization(s, VLLM_QUANTIZATION, "vLLM"), _kv_dtype(s, VLLM_KV_DTYPES, "vLLM")):
        args, notes = args + flags, notes + said
    if option.role != "agg":
        args += ["--kv-transfer-config", VLLM_KV_TRANSFER]
    return shlex.join(args), notes


def trtllm_free_fraction(s, option) -> float:
    """The `free_gpu_memory_fraction` that gives TensorRT-LLM the pool the plan was priced with: the pool (to
    its next whole token, as the flag gives it: a calibrated profile's runs held `kv_share` of it) over what its
    weights, activations and its profile's own reserve (its CUDA context and NCCL buffers) leave."""
    lay, profile = option.layout, load_engine(s.engine)
    mem = s.latency_model(lay).memory_for(option.max_batched_tokens)
    held = profile.reserved_gib(mem.hbm_gib, lay.tp, lay.pp, lay.attention_dp)
    free = mem.hbm_gib - held - mem.weights_gib - mem.activation_gib
    pool = (mem.kv_capacity_tokens + 1) * mem.kv_bytes_per_token / 1024**3 / profile.kv_share
    return min(1.0, _hundredths(pool / free)) if free > 0 else 0.0


def trtllm_serve(s, option) -> tuple[str, list[str]]:
    """`trtllm-serve` (PyTorch backend) of one instance; what it takes only from the YAML file its
    --extra_llm_api_options names (chunked prefill, attention DP, the capacity scheduler, the KV dtype) in a note.
    Its tp_size counts every GPU of the instance, attention-DP ranks included."""
    lay = option.layout
    args = ["trtllm-serve", s.model, "--backend", "pytorch", "--tp_size", str(lay.tp * lay.attention_dp),
            "--pp_size", str(lay.pp)]
    if lay.ep > 1:
        args += ["--ep_size", str(lay.ep)]
    args += ["--max_batch_size", str(s.max_num_seqs), "--max_num_tokens", str(option.max_batched_tokens),
             "--max_seq_len", str(_longest(s)),
             "--kv_cache_free_gpu_memory_fraction", f"{trtllm_free_fraction(s, option):.2f}"]
    extra = ["enable_chunked_prefill: true"]
    if lay.attention_dp > 1:
        extra.append("enable_attention_dp: true")
    if s.capacity_scheduler != NO_EVICT:
        extra.append("scheduler_config: {capacity_scheduler_policy: MAX_UTILIZATION}")
    kv, kv_notes = _kv_dtype(s, TRTLLM_KV_DTYPES, "TensorRT-LLM", "kv_cache_config.dtype")
    if kv:
        extra.append(f"kv_cache_config: {{dtype: {kv[1]}}}")
    notes = [f"in the YAML file --extra_llm_api_options names: {'; '.join(extra)}", *kv_notes]
    notes += _quantization(s, {}, "TensorRT-LLM")[1]
    if s.scheduler != "token-budget":
        notes.append(f"scheduler {s.scheduler}: TensorRT-LLM's in-flight batching is token-budget's; no option "
                     "changes it")
    if option.role != "agg":
        notes.append(f"a {option.role} instance of a split: launch it with `trtllm-serve disaggregated` and a "
                     "cache_transceiver_config")
    return shlex.join(args), notes


def sglang_serve(s, option) -> tuple[str, list[str]]:
    """SGLang's `launch_server` of one instance, on the port the check asks. Its --tp-size counts every GPU of the
    instance; with attention DP, --dp-size ranks of them attend apart (--enable-dp-attention);
    --mem-fraction-static is the share of the GPU its weights and pool take."""
    lay, notes = option.layout, []
    args = ["python", "-m", "sglang.launch_server", "--model-path", s.model, "--port", str(CHECKED_PORT),
            "--tp-size", str(lay.tp * lay.attention_dp)]
    if lay.attention_dp > 1:
        args += ["--dp-size", str(lay.attention_dp), "--enable-dp-attention"]
    if lay.ep > 1:
        args += ["--ep-size", str(lay.ep)]
    if lay.pp > 1:
        args += ["--pp-size", str(lay.pp)]
    args += ["--context-length", str(_longest(s)), "--chunked-prefill-size", str(option.max_batched_tokens),
             "--max-running-requests", str(s.max_num_seqs), "--mem-fraction-static", f"{_memory_share(s, option):.2f}"]
    if s.scheduler == "token-budget":
        args += ["--enable-mixed-chunk"]
    elif s.scheduler != "prefill-first":
        notes.append(f"scheduler {s.scheduler}: SGLang runs prefill-first, or mixes chunks into decode steps "
                     "(--enable-mixed-chunk, our token-budget)")
    for flags, said in (_quantization(s, SGLANG_QUANTIZATION, "SGLang"), _kv_dtype(s, SGLANG_KV_DTYPES, "SGLang")):
        args, notes = args + flags, notes + said
    if s.prefix_caching == "off":
        args += ["--disable-radix-cache"]
    if option.role != "agg":
        args += ["--disaggregation-mode", option.role]
    return shlex.join(args), notes


SERVERS = {"vllm": vllm_serve, "trtllm": trtllm_serve, "sglang": sglang_serve}
