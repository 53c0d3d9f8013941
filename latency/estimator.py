"""The roofline estimator: price forward steps op by op, vectorised over many keys at once.

Each op costs `max(flops / (peak * eff_c), bytes / (bw * eff_m)) + kernels * overhead` per layer.
A step is one or more entries (ForwardKeys); linear layers run over all tokens of the step at once,
attention runs per entry (a fused step, as vLLM V1 and the ascend tool's mixed step execute it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cache, cached_property
from pathlib import Path

import numpy as np

from latency.device import DeviceSpec
from latency.engine import EngineProfile
from latency.families import DENSE_RATIO, SPARSE_RATIO
from latency.keys import ForwardKey, StepShape, keys_to_arrays, shape_columns
from latency.memory import (
    ACT_BYTES,
    ACTIVATION_TOKENS,
    DEFAULT_RESERVED_GIB,
    LOGIT_BYTES,
    MemoryAccount,
    MemoryPicture,
)
from latency.model import ModelSpec
from latency.parallel import ParallelSpec
from latency.quant import Quantization
from latency.recent import Recent
from latency.routing import touched_share

#: hidden-sized activation passes per token per layer outside the GEMMs (2 norms in/out, residual
#: adds, rope on q/k, qk-norm): read or written once each
HIDDEN_PASSES = 8
#: MLP activation (SiLU * up) reads gate and up, writes one: 3 passes over the intermediate
MLP_ACT_PASSES = 3
#: ... an ungated one (squared ReLU) reads one and writes one
UNGATED_ACT_PASSES = 2
#: kernels per layer, for the per-kernel overhead (attention: rope + KV-cache write + the attention kernel)
KERNELS = {"qkv_proj": 1, "o_proj": 1, "attention": 3, "mlp": 2, "moe": 3, "elementwise": 2}
#: floating-point operations of a gated delta-net layer a state element and token: decay and rank-one update,
#: the state times the key, the state times the query (a multiply and an add each)
DELTA_RULE_FLOPS = 6
#: ... its kernels a layer: the short convolution, the delta rule, the gated norm
LINEAR_KERNELS = 3
#: a sparse-attention indexer's score of a (query, key) pair: an fp32 written, then read by the top-k pick
INDEX_SCORE_BYTES = 8
#: ... its kernels a layer, as vLLM runs it: three projections (its queries, key, head weights), the key's norm,
#: rope on its query and key, the FP8 quantisation of each (the key's into the index cache), the scores, the top-k
#: pick. AIConfigurator's tables time the engines' whole sparse-attention decode module 0.03-0.20 ms a layer
#: above their MLA module (vLLM 0.07-0.14 on H100, H200 and B200), launches a CUDA graph hides among them: these
#: ten kernels' 0.04 ms stand for the part a graph keeps (docs/modelling.md)
INDEX_KERNELS = 10
#: expert parallelism: tokens the busiest expert group receives over the mean. Routing is never
#: perfectly even; DeepSeek's EPLB reports a max/mean expert load near 1.2-1.3 before balancing.
#: The MoE layer waits for the busiest group. 1 when experts are not split (ep = 1).
EXPERT_IMBALANCE = 1.2
NO_ENGINE = EngineProfile()
#: what pricing one key costs here (1,000 decode keys in 1.48 ms, one core): far below asking a
#: shared cache, so a sweep never shares roofline prices (orchestrator.pricer)
ROOFLINE_KEY_MS = 0.0015


@cache
def pricing_code_version() -> str:
    """A digest of the latency package's source: changes whenever the code that prices a step does."""
    digest = hashlib.sha256()
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:12]
#: an EP all-to-all per MoE layer each way: dispatch the tokens to their experts, combine the results
A2A_ROUNDS = 2
OPS = ("qkv_proj", "attention", "o_proj", "mlp", "moe", "elementwise", "lm_head", "tp_comm", "ep_comm",
       "pp_comm", "overhead")
#: the ops a step's price adds up, in this order (attention between them), before its overhead
COUNTED_BEFORE = ("qkv_proj", "o_proj")
COUNTED_AFTER = ("mlp", "moe", "elementwise", "lm_head", "tp_comm", "ep_comm", "pp_comm")


@dataclass(frozen=True)
class HeadShape:
    """What one attention layer keeps and computes a head: its KV cache's elements a token on a device, and
    the query-key and value widths its prefill and its decode attend over (MLA's decode: the latent's)."""

    kv_elems: float
    qk_prefill: int
    v_prefill: int
    qk_decode: int
    v_decode: int


class RooflineModel:
    """Latency and memory of one model instance (tp x pp devices) on one device type."""

    cost_per_key_ms = ROOFLINE_KEY_MS

    def __init__(self, model: ModelSpec, device: DeviceSpec, parallel: ParallelSpec, quant: Quantization,
                 reserved_memory_gib: float = DEFAULT_RESERVED_GIB, activation_tokens: int = ACTIVATION_TOKENS,
                 engine: EngineProfile = NO_ENGINE):
        parallel.validate(model)
        if reserved_memory_gib < 0:
            raise ValueError(f"reserved_memory_gb must be >= 0, got {reserved_memory_gib}")
        self.model, self.device, self.parallel, self.quant = model, engine.scaled_device(device), parallel, quant
        self.device_file = device  # as its file says, before the engine's [efficiency] multipliers
        self.reserved_memory_gib = reserved_memory_gib
        self.activation_tokens = activation_tokens
        self.engine = engine
        self._derive()
        self.memory_account = MemoryAccount(self)

    # ----- static shape of one device's share -------------------------------------------------
    def _derive(self) -> None:
        m, p = self.model, self.parallel
        tp = p.tp
        h = m.hidden_size
        self.heads = m.num_heads / tp
        self.kv_b_params = 0.0  # an MLA layer's latent-to-heads expansion (set below); none elsewhere
        if m.is_mla:
            q_in = (h * m.q_lora_rank + m.q_lora_rank * m.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
                    / tp) if m.q_lora_rank else h * m.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim) / tp
            self.kv_b_params = m.kv_lora_rank * m.num_heads * (m.qk_nope_head_dim + m.v_head_dim) / tp
            self.qkv_params = q_in + h * (m.kv_lora_rank + m.qk_rope_head_dim) + self.kv_b_params
            if m.attention_output_gate:  # a gate on each head's output (Kimi-K3's MLA layers)
                self.qkv_params += h * m.num_heads * m.v_head_dim / tp
            self.o_params = m.num_heads * m.v_head_dim * h / tp
            # the latent on every TP rank; prefill attends over expanded heads, decode over the absorbed latent
            self.full_heads = self.local_heads = HeadShape(
                m.kv_lora_rank + m.qk_rope_head_dim, m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim,
                m.kv_lora_rank + m.qk_rope_head_dim, m.kv_lora_rank)
            if m.is_sparse:  # the indexer's projections, on every TP rank, spread over the layers
                self.qkv_params += self._index_params * m.num_index_layers / m.num_layers
        elif m.compress_ratios:
            self._derive_compressed()
        else:
            self._derive_gqa()
        self.kv_elems_per_token_layer = self.full_heads.kv_elems  # the KV cache holds the full layers'
        self._derive_linear()
        #: layers by how their attention is priced: whole context, a window or chunk, a recurrent state
        self.attention_layers = (m.num_full_layers, m.num_local_layers, m.num_linear_layers)
        self.dense_layers = m.num_dense_layers if m.is_moe else m.num_layers - m.num_mlp_free_layers
        self.moe_layers = m.num_moe_layers
        self.mlp_params = m.mlp_matrices * h * m.intermediate_size / tp
        self.shared_params = m.shared_expert_params / tp
        self.expert_tp = p.moe_tp
        self.local_experts = p.expert_slots(m) / p.ep if m.is_moe else 0.0
        self.imbalance = EXPERT_IMBALANCE if p.ep > 1 else 1.0
        self.router_params = h * m.num_experts
        #: FP4 experts on FP4 tensor cores: the engine's fp4_bandwidth prices them
        self.native_fp4_experts = self.quant.experts_dtype == "fp4" and self.device.computes("fp4")
        #: weight-only experts (INT4; FP4 on a device without FP4 tensor cores, upcast in the kernel alike)
        #: stream at the device's own share for their kernels (B200: below its others; H100: above)
        upcast = self.quant.weight_only_experts or (self.quant.experts_dtype == "fp4" and not self.native_fp4_experts)
        self.weight_only_share = self.device.eff_weight_only_experts if upcast else 1.0
        self.lm_head_params = m.vocab_size * h / tp

    def _derive_gqa(self) -> None:
        """Grouped-query layers' share of a device: the sliding and the full layers' heads (alike but in Gemma 4
        and MiMo-V2), their projections averaged over those layers."""
        m = self.model
        local = (m.num_kv_heads, m.head_dim, m.values_dim, False)
        full = (m.full_kv_heads or m.num_kv_heads, m.full_head_dim or m.head_dim,
                m.full_v_head_dim or m.full_head_dim or m.values_dim, m.full_values_from_keys)
        self.qkv_params, self.o_params, self.local_heads = self._gqa_layer(*local)
        if full == local:
            self.full_heads = self.local_heads
            return
        qkv, o, self.full_heads = self._gqa_layer(*full)
        n_full, n_local = m.num_full_layers, m.num_local_layers
        self.qkv_params = (n_full * qkv + n_local * self.qkv_params) / (n_full + n_local)
        self.o_params = (n_full * o + n_local * self.o_params) / (n_full + n_local)

    def _gqa_layer(self, kv: int, width: int, values: int, from_keys: bool) -> tuple[float, float, HeadShape]:
        """One grouped-query layer of `kv` KV heads on a device (replicated where tp exceeds them), queries and
        keys `width` wide, values `values` (projected unless `from_keys`): its in and out projections, its heads."""
        m, h = self.model, self.model.hidden_size
        queries = self.heads * (2 if m.attention_output_gate else 1)  # a gate as wide as the queries
        kv_dev = max(kv / self.parallel.tp, 1.0)
        projected = kv_dev * (width + (0 if from_keys else values))
        return (h * (queries * width + projected), self.heads * values * h,
                HeadShape(kv_dev * (width + values), width, values, width, values))

    def _derive_compressed(self) -> None:
        """DeepSeek-V4's layers' share of a device, averaged over them: queries through their low rank to every
        head, one KV entry (on every rank), each compressed layer's gated compressor (over two windows in a CSA
        layer) and a CSA layer's indexer, the output projection in `o_groups` groups through `o_lora_rank`."""
        m, h, tp = self.model, self.model.hidden_size, self.parallel.tp
        w, L = m.head_dim, m.num_layers
        sparse, dense = m.compressed_layers(SPARSE_RATIO), m.compressed_layers(DENSE_RATIO)
        queries = h * m.q_lora_rank + m.q_lora_rank * m.num_heads * w / tp
        compressors = (sparse * 2 * h * 2 * w + dense * 2 * h * w + sparse * self._index_params) / L
        self.qkv_params = queries + h * w + compressors
        self.o_params = (m.num_heads * w * m.o_lora_rank + m.o_groups * m.o_lora_rank * h) / tp
        self.full_heads = self.local_heads = HeadShape(w, w, w, w, w)

    def _derive_linear(self) -> None:
        """Gated delta-net layers' share of a device (their heads split over tp): projections in (queries, keys,
        values, the output gate, two gates a value head) and out, averaged with the attention layers' over all
        layers; a request's recurrent state and short-convolution inputs in each."""
        m, tp, h = self.model, self.parallel.tp, self.model.hidden_size
        keys, values = m.linear_key_heads * m.linear_key_dim, m.linear_value_heads * m.linear_value_dim
        self.state_elems_layer = m.linear_value_heads / tp * m.linear_key_dim * m.linear_value_dim
        self.conv_bytes_layer = (2 * keys + values) / tp * max(m.linear_conv_kernel - 1, 0) * ACT_BYTES
        if not m.num_linear_layers:
            return
        attention = m.num_layers - m.num_linear_layers
        linear_in = h * (2 * keys + 2 * values + 2 * m.linear_value_heads) / tp
        self.qkv_params = (attention * self.qkv_params + m.num_linear_layers * linear_in) / m.num_layers
        self.o_params = (attention * self.o_params + m.num_linear_layers * values / tp * h) / m.num_layers

    @property
    def state_bytes_layer(self) -> float:
        """A request's recurrent state and short-convolution inputs in one gated delta-net layer, on a device."""
        return self.state_elems_layer * self.model.linear_state_bytes + self.conv_bytes_layer

    @property
    def _index_params(self) -> float:
        """A sparse-attention indexer's weights (vLLM and SGLang replicate them on every TP rank): its
        queries from the query latent, a key and a weight per head from the hidden state."""
        m = self.model
        return ((m.q_lora_rank or m.hidden_size) * m.index_heads * m.index_head_dim
                + m.hidden_size * (m.index_head_dim + m.index_heads))

    @property
    def num_devices(self) -> int:
        return self.parallel.num_devices

    @property
    def devices_per_instance(self) -> int:
        return self.parallel.devices_per_instance

    @cached_property
    def fingerprint(self) -> str:
        """Names model, device, parallelism, quantisation and every number that changes a price (of the engine
        profile, what a price reads of it), and the version of the pricing code, so a long-lived shared cache
        never serves another release's prices; models alike in it share prices (`simulator.StepPricer`)."""
        return self._fingerprint(self.engine.priced())

    @cached_property
    def parts_fingerprint(self) -> str:
        """The fingerprint with only what a step's parts read of the engine (`EngineProfile.parts`): models alike in
        it share the parts `ShapeParts` remembers, each adding its own overhead and host time."""
        return self._fingerprint(self.engine.parts())

    def _fingerprint(self, engine_fields: dict) -> str:
        payload = json.dumps([asdict(self.model), asdict(self.device), asdict(self.parallel),
                              asdict(self.quant), engine_fields, pricing_code_version()], sort_keys=True)
        digest = hashlib.sha256(payload.encode()).hexdigest()[:12]
        p = self.parallel
        adp = f"adp{p.attention_dp}" if p.attention_dp > 1 else ""
        return (f"{self.model.name}|{self.device.name}|tp{p.tp}pp{p.pp}ep{p.ep}{adp}|{self.quant.name}|"
                f"{self.engine.family}|{digest}")

    # ----- pricing ----------------------------------------------------------------------------
    def latency_ms(self, keys: Sequence[ForwardKey]) -> np.ndarray:
        """Each key priced as a forward step of its own."""
        if not len(keys):
            return np.zeros(0)
        dec, conc, q, s = keys_to_arrays(keys)
        return self._price(np.arange(len(keys)), dec, conc, q, s, len(keys))["total"]

    def step_latency_ms(self, shapes: Sequence[StepShape]) -> np.ndarray:
        """Each shape priced as one fused step over all its entries."""
        if not len(shapes):
            return np.zeros(0)
        step, dec, conc, q, s = shape_columns(shapes)
        return self._price(step, dec, conc, q, s, len(shapes))["total"]

    def breakdown(self, keys: Sequence[ForwardKey]):
        """Per key and op: ms, share of the step, and whether compute, memory or overhead bounds it."""
        import pandas as pd

        dec, conc, q, s = keys_to_arrays(keys)
        parts = self._price(np.arange(len(keys)), dec, conc, q, s, len(keys), detail=True)
        rows = []
        for i, key in enumerate(keys):
            total = parts["total"][i]
            for op in OPS:
                ms, bound = parts[op][0][i], parts[op][1][i]
                if ms > 0:
                    rows.append({"key": key, "op": op, "ms": ms, "share": ms / total, "bound": bound})
        return pd.DataFrame(rows)

    def _roof(self, flops, bytes_, peak, eff_c, kernels_ms, detail: bool, eff_m: float | None = None):
        """(ms, what bounds it: compute, memory or kernel overhead; None unless `detail`, as naming
        it costs more than the roof itself). `eff_m`: the memory efficiency (default the device's)."""
        compute = flops / (peak * eff_c) * 1e3
        memory = bytes_ / (self.device.hbm_bytes_per_s * (eff_m or self.device.eff_memory)) * 1e3
        roof = _larger(compute, memory)
        if not detail:
            return roof + kernels_ms, None
        bound = np.where(compute >= memory, "compute", "memory")
        return roof + kernels_ms, np.where(kernels_ms > roof, "overhead", bound)

    def _price(self, step, dec, conc, q, s, n_steps, detail=False):
        """Per-step milliseconds of every op; `step[i]` is the step of entry i."""
        tokens = np.bincount(step, weights=conc * q, minlength=n_steps)
        sampled = np.bincount(step, weights=conc, minlength=n_steps)
        prefills = np.bincount(step, weights=~dec, minlength=n_steps) > 0 if self.prices_prefills else 0
        counted = self._counted_ops(tokens, sampled, prefills, n_steps, detail)
        ops = {op: counted[op] for op in COUNTED_BEFORE}
        ops["attention"] = self._attention(step, dec, conc, q, s, n_steps, detail)
        ops |= {op: counted[op] for op in COUNTED_AFTER}
        overhead = counted["overhead"][0]
        gpu = _gpu_ms([ops[op][0] for op in COUNTED_BEFORE], ops["attention"][0],
                      [ops[op][0] for op in COUNTED_AFTER], overhead)
        total = self.engine.with_step(gpu)
        ops["overhead"] = (overhead + total - gpu, np.full(n_steps, "overhead") if detail else None)
        if detail:
            return {**ops, "total": total}
        return {"total": total}

    @property
    def prices_prefills(self) -> bool:
        """Whether a step's price depends on whether it computes prompt tokens (a MoE prefill time)."""
        return bool(self.engine.moe_prefill_layer_us and self.moe_layers)

    def _counted_ops(self, tokens, sampled, prefills, n_steps: int, detail: bool) -> dict:
        """Every op but attention, per step, from the step's tokens, requests and (`prefills`) whether it
        computes prompt tokens alone: COUNTED_BEFORE, COUNTED_AFTER and "overhead" (ms, bound)."""
        d, m, p, qz = self.device, self.model, self.parallel, self.quant
        h = m.hidden_size
        kov = d.kernel_overhead_us * 1e-3
        bf16 = d.peak_flops("bf16")
        L = m.num_layers
        ops = {}

        def linear(params, layers, n_kernels, **options):
            return self._linear(params, layers, n_kernels, tokens, detail, **options)

        ops["qkv_proj"] = linear(self.qkv_params, L, KERNELS["qkv_proj"])
        ops["o_proj"] = linear(self.o_params, L, KERNELS["o_proj"])
        absent = (np.zeros(n_steps), np.full(n_steps, "-") if detail else None)
        ops["mlp"] = linear(self.mlp_params, self.dense_layers, KERNELS["mlp"]) if self.dense_layers else absent
        ops["moe"] = self._moe(tokens, d.peak_flops(qz.experts_dtype), detail) if self.moe_layers else absent
        inter = (self.dense_layers * m.intermediate_size / p.tp
                 + self.moe_layers * m.experts_per_token * m.moe_intermediate_size / p.tp) / L
        passes = MLP_ACT_PASSES if m.mlp_matrices == 3 else UNGATED_ACT_PASSES
        ew_bytes = tokens * (HIDDEN_PASSES * h + passes * inter) * ACT_BYTES
        ew, ew_bound = self._roof(0.0, ew_bytes, bf16, 1.0, KERNELS["elementwise"] * kov, detail)
        ops["elementwise"] = (ew * L, ew_bound)
        ops["lm_head"] = self._linear(self.lm_head_params, 1, 1, sampled, detail, w_bytes=2, dtype="bf16",
                                      in_out=h + m.vocab_size / p.tp * LOGIT_BYTES / ACT_BYTES)
        ops["tp_comm"], ops["ep_comm"], ops["pp_comm"] = self._comm(tokens, detail)
        ops["overhead"] = (np.broadcast_to(self.step_overhead(sampled, tokens, prefills), n_steps).astype(np.float64),
                           None)
        return ops

    def step_overhead(self, sampled, tokens, prefills):
        """The device's and the engine's time a step of `sampled` requests and `tokens` tokens adds (`prefills`:
        whether it computes prompt tokens, where that is priced; numbers, or arrays of steps)."""
        return self.device.step_overhead_ms + self.engine.overhead_ms(
            sampled, tokens, self.model.num_layers, self.parallel.attention_dp, self.moe_layers, prefills)

    def _linear(self, params, layers, n_kernels, tokens, detail: bool, *, w_bytes=None, dtype=None, in_out=None):
        """ms per step of a linear layer of `params` weights (per device) over `tokens`, in `layers`
        layers, computed in `dtype` (default the layers' own): weights read once, activations in and out
        (`in_out` elements a token: 2 x hidden)."""
        d = self.device
        w_bytes = self.quant.weight_bytes if w_bytes is None else w_bytes
        dtype = self.quant.compute_dtype if dtype is None else dtype
        eff_c, eff_m = d.linear_efficiency(dtype)
        peak = d.peak_flops(dtype)
        in_out = 2 * self.model.hidden_size if in_out is None else in_out
        flops = 2 * tokens * params
        bytes_ = params * w_bytes + tokens * in_out * ACT_BYTES
        ms, bound = self._roof(flops, bytes_, peak, eff_c, n_kernels * d.kernel_overhead_us * 1e-3, detail, eff_m)
        return ms * layers, bound

    def _attention(self, step, dec, conc, q, s, n_steps, detail: bool):
        """Every layer's attention ms per step (and what bounds it, with `detail`)."""
        *parts, bound = self._attention_parts(dec, conc, q, s, detail)
        per_step = self.over_layers(*(None if part is None else np.bincount(step, weights=part, minlength=n_steps)
                                      for part in parts))
        return per_step, _step_bound(step, bound, n_steps) if detail else None

    def over_layers(self, full, windowed, recurrent):
        """Every layer's attention from one layer's of each kind (`attention_layers`; None: the model has none)."""
        full_layers, local_layers, linear_layers = self.attention_layers
        total = full * full_layers
        if windowed is not None:
            total = total + windowed * local_layers
        if recurrent is not None:
            total = total + recurrent * linear_layers
        return total

    def _attention_parts(self, dec, conc, q, s, detail: bool):
        """(a full-attention layer's ms, a local layer's ms or None, a gated delta-net layer's ms or None, what
        bounds the first) of each entry.
        Full-attention layers attend to the whole context; sliding-window layers (gpt-oss: every other layer,
        128 tokens) to the last `sliding_window` positions of each query, and read only that much KV; chunked
        layers (Llama 4) to the keys of the query's own `attention_chunk`. Attention sinks (one learned logit
        per head) add no cost worth pricing."""
        m, peak = self.model, self.device.peak_flops("bf16")
        _, local_layers, linear_layers = self.attention_layers
        if m.compress_ratios:  # one layer's on average: over_layers counts them all full
            full, bound = self._compressed_attention(dec, conc, q, s, peak, detail)
            return full, None, None, bound
        full, bound = self._attention_entries(dec, conc, q, s, peak, detail, self.full_heads)
        windowed = (self._attention_entries(dec, conc, q, s, peak, False, self.local_heads, m.sliding_window,
                                            m.attention_chunk)[0] if local_layers else None)
        return full, windowed, self._recurrent(conc, q) if linear_layers else None, bound

    def _recurrent(self, conc, q):
        """One gated delta-net layer's ms of each entry: each request's state and convolution inputs read and
        written once, and DELTA_RULE_FLOPS a state element a token (the delta rule's three products of the
        state by a vector). Its cost does not grow with the context."""
        d = self.device
        flops = DELTA_RULE_FLOPS * conc * q * self.state_elems_layer
        bytes_ = 2 * conc * self.state_bytes_layer
        return self._roof(flops, bytes_, d.peak_flops("bf16"), d.eff_attention,
                          LINEAR_KERNELS * d.kernel_overhead_us * 1e-3, False)[0]

    def _attention_entries(self, dec, conc, q, s, peak, detail: bool, heads: HeadShape, window: int = 0,
                           chunk: int = 0):
        """One layer's attention ms of each entry (and what bounds it, with `detail`), its heads `heads`; with a
        `window` each query sees at most that many keys and the step reads at most that much of each request's
        KV; with a `chunk`, the keys of its own chunk, reading those of the chunks its queries are in.
        Entries are arrays, or numbers for one (the same float operations, without numpy's cost a call)."""
        m = self.model
        window = window or m.index_topk  # sparse attention: a query attends to the keys its indexer picks
        if chunk:
            pairs, keys_read = _chunked_pairs(q, s, chunk), s - (s - q) // chunk * chunk
        else:
            pairs = _causal_pairs(q, s, window)
            keys_read = np.minimum(s, window) if window else s
        expanded = None
        if m.is_mla and not m.is_sparse:  # dense prefill expands the earlier context's latent into K and V
            expanded = _pick(dec, 0.0, 2 * conc * (s - q) * self.kv_b_params)
        ms, bound = self._attend(dec, conc, q, pairs, keys_read, heads, peak, detail, expanded)
        if m.is_mla and self.engine.mla_decode_attention:
            ms = ms * _pick(dec, self.engine.mla_decode_attention, 1.0)
        if m.is_sparse:
            ms = ms + self._indexer(conc, q, s) * (m.num_index_layers / m.num_layers)
        return ms, bound

    def _attend(self, dec, conc, q, pairs, keys_read, heads: HeadShape, peak, detail: bool, flops_more=None):
        """The roof of one layer's attention over `pairs` (query, key) pairs, reading `keys_read` tokens' KV of
        each request (and `flops_more`, where the layer computes more): its heads' widths, KV read at the cache's
        dtype, its kernels' launches (a prefill's more)."""
        d = self.device
        d_qk = heads.qk_decode if self.model.is_sparse else _pick(dec, heads.qk_decode, heads.qk_prefill)
        d_v = heads.v_decode if self.model.is_sparse else _pick(dec, heads.v_decode, heads.v_prefill)
        flops = 2 * conc * pairs * self.heads * (d_qk + d_v)
        if flops_more is not None:
            flops = flops + flops_more
        bytes_ = conc * (keys_read * (heads.kv_elems * self.quant.kv_bytes) + q * self.heads * (d_qk + d_v) * ACT_BYTES)
        kernel = KERNELS["attention"] * d.kernel_overhead_us + _pick(dec, 0.0, d.prefill_attention_overhead_us)
        return self._roof(flops, bytes_, peak, d.eff_attention, kernel * 1e-3, detail,
                          d.kv_memory_efficiency(self.quant.kv_bytes))

    def _indexer(self, conc, q, s, ratio: int = 1):
        """One indexer's ms: every query scores every earlier key (FP8 dot products over its heads, where the
        device computes FP8), reading the layer's index cache and writing and reading a score a pair, then
        picks the best `index_topk` (a second kernel); over a compressed layer's entries, one every `ratio`
        tokens."""
        d, m = self.device, self.model
        pairs = _causal_pairs(q, s) / ratio
        peak = d.peak_flops("fp8" if d.computes("fp8") else "bf16")
        flops = 2 * conc * pairs * m.index_heads * m.index_head_dim
        bytes_ = conc * (s / ratio * m.index_key_bytes + pairs * INDEX_SCORE_BYTES)
        return self._roof(flops, bytes_, peak, d.eff_attention, INDEX_KERNELS * d.kernel_overhead_us * 1e-3,
                          False)[0]

    def _compressed_attention(self, dec, conc, q, s, peak, detail: bool):
        """DeepSeek-V4's attention of one layer on average (and what bounds its CSA layers', with `detail`):
        every layer attends to its window's latest tokens, a CSA layer also to the `index_topk` entries its
        indexer picks of one every SPARSE_RATIO tokens, an HCA layer to all of one every DENSE_RATIO; an entry
        is one head_dim wide, its key and its value, read by every head of the rank."""
        m = self.model
        total, bound = 0.0, None
        for ratio in (SPARSE_RATIO, DENSE_RATIO, 0):
            if not (layers := m.compressed_layers(ratio)):
                continue
            pairs, keys = _causal_pairs(q, s, m.sliding_window), np.minimum(s, m.sliding_window)
            if ratio:
                cap = ratio * m.index_topk if ratio == SPARSE_RATIO else 0  # the picked entries' tokens
                pairs = pairs + _causal_pairs(q, s, cap) / ratio
                keys = keys + (np.minimum(s, cap) if cap else s) / ratio
            ms, kind = self._attend(dec, conc, q, pairs, keys, self.full_heads, peak, detail)
            if ratio == SPARSE_RATIO:
                ms = ms + self._indexer(conc, q, s, ratio)
            total, bound = total + ms * layers, kind if bound is None else bound
        return total / m.num_layers, bound

    def _moe(self, tokens, peak, detail: bool):
        """`tokens` are one attention rank's; every rank runs a step of the same size in lockstep, so
        the layer routes attention_dp x tokens over all tp x attention_dp devices of the stage."""
        d, m, p = self.device, self.model, self.parallel
        k, slots = m.experts_per_token, p.expert_slots(m)
        routed = tokens * p.attention_dp
        active_frac = touched_share(k, slots, routed)
        expert_bytes = m.expert_params / self.expert_tp * self.quant.experts_bytes
        w_bytes = self.local_experts * active_frac * expert_bytes + (self.shared_params + self.router_params) \
            * self.quant.weight_bytes
        per_device = routed * k / p.moe_devices * self.imbalance  # token-expert pairs on the busiest device
        flops = 2 * (per_device * m.expert_params + tokens * (self.shared_params + self.router_params))
        bytes_ = w_bytes + (2 * tokens + 2 * per_device) * m.hidden_size * ACT_BYTES
        e = self.engine
        eff_m = min(1.0, d.eff_memory * e.expert_bandwidth(self.native_fp4_experts) * self.weight_only_share)
        ms, bound = self._roof(flops, bytes_, peak, d.eff_gemm * e.moe_compute,
                               KERNELS["moe"] * d.kernel_overhead_us * 1e-3, detail, eff_m)
        return ms * self.moe_layers, bound

    def _link(self, group: int) -> tuple[float, float]:
        """(bytes/s, seconds per hop) of the slowest link a group of `group` devices spans."""
        d = self.device
        if group <= d.scale_up_domain:
            return d.intra_node_bandwidth_gbps * 1e9 * d.eff_communication, d.intra_node_latency_us * 1e-6
        return d.inter_node_bandwidth_gbps * 1e9 * d.eff_communication, d.inter_node_latency_us * 1e-6

    def _all_to_all(self, token_bytes):
        """Seconds of one dispatch (or combine) of a device's tokens (`token_bytes` of hidden states)
        to their k experts over the moe_devices of the layer, as DeepEP-style kernels send it: each
        peer's share in one batched message, one latency per round (not per peer); the copies for
        peers in the scale-up domain over its links and, at once, one copy per remote domain a token
        has an expert in over the scale-out network (forwarded to its devices there over theirs)."""
        d, group, k = self.device, self.parallel.moe_devices, self.model.experts_per_token
        local = min(group, d.scale_up_domain)
        intra_bw, intra_lat = self._link(local)
        seconds = token_bytes * k * (local - 1) / group / intra_bw
        if group <= local:
            return seconds + intra_lat
        domains = group / local
        remote_copies = (domains - 1) * (1 - (1 - 1 / domains) ** k)  # remote domains a token's experts are in
        inter_bw, inter_lat = self._link(group)
        return np.maximum(seconds, token_bytes * remote_copies / inter_bw) + inter_lat

    def _comm(self, tokens, detail: bool):
        m, p = self.model, self.parallel
        msg = tokens * m.hidden_size * ACT_BYTES
        zero = np.zeros_like(tokens)
        tp_ms = ep_ms = pp_ms = zero
        # With attention DP a token lives on its rank, and the MoE layer exchanges it beyond the tp group.
        # Without, every device of the tp group (= the MoE group) holds every token: each runs its
        # experts' share (by EP or TP) and the layer's all-reduce sums them, as in a dense MLP.
        spread = p.attention_dp > 1
        if p.tp > 1:
            n_allreduce = 2 * m.num_layers - (self.moe_layers if spread else 0)
            tp_ms = _ring(p.tp, msg, *self._link(p.tp)) * n_allreduce * 1e3
        if spread:  # with EP an all-to-all (dispatch to the k experts, combine back), else gather + reduce-scatter
            # the experts' input is sequence parallel: a tp device dispatches its 1/tp of the rank's
            # tokens, not a replica of all of them (vLLM's use_sequence_parallel_moe under DP, EP, tp > 1)
            per_layer = (A2A_ROUNDS * self._all_to_all(msg / p.tp) if p.ep > 1
                         else _ring(p.moe_devices, msg * p.attention_dp, *self._link(p.moe_devices)))
            ep_ms = per_layer * self.moe_layers * 1e3
        if p.pp > 1:
            bw, lat = self._link(p.tp * p.pp)
            pp_ms = (p.pp - 1) * (msg / bw + lat) * 1e3
        label = np.full(len(tokens), "communication") if detail else None
        return (tp_ms, label), (ep_ms, label), (pp_ms, label)

    # ----- memory (latency.memory) -------------------------------------------------------------
    @property
    def weights_bytes(self) -> float:
        return self.memory_account.weights_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        return self.memory_account.kv_bytes_per_token

    def activation_bytes(self, tokens: int) -> float:
        return self.memory_account.activation_bytes(tokens)

    def memory_for(self, max_batched_tokens: int) -> MemoryPicture:
        return self.memory_account.picture(max_batched_tokens)

    @property
    def memory(self) -> MemoryPicture:
        return self.memory_for(self.activation_tokens)


#: `Parts.count` prices, with a token count (or a count of requests sampled) not met yet, the counts this far
#: below and above it: ramps, streams and chunk stretches meet them next, and a call costs numpy's calls, not
#: its elements (SGLang's Llama-3.1-8B at 64 clients behind a streaming front end: 140 -> 3 calls an estimate)
BELOW, ABOVE = 32, 224
#: the counted ops that depend on a step's tokens alone, in `_price`'s order (all but lm_head, which its requests
#: sampled set), and where lm_head goes back among them
TOKEN_OPS = tuple(op for op in (*COUNTED_BEFORE, *COUNTED_AFTER) if op != "lm_head")
LM_HEAD_AT = len(COUNTED_BEFORE) + COUNTED_AFTER.index("lm_head")


class ShapeParts:
    """Prices fused step shapes one at a time (a timed plan meets them so) from remembered parts.

    Claim: `RooflineModel._price` adds, in a fixed order, parts that depend on a step's tokens alone (the linear
    layers, experts, elementwise ops and communication), its requests sampled alone (lm_head), both and whether
    it computes prompt tokens (`step_overhead`), and its entries' attention, each entry's alone
    (`_attention_entries`, here on one entry's numbers: each operation the one an array's element gets), summed
    in entry order; the same float operations on remembered parts give the price `step_latency_ms` gives the
    shape, to the bit. The parts are the same for models alike in `parts_fingerprint`, so such models share them
    (`PARTS`), each adding its own overhead and host time. `tests/latency` compares the two."""

    def __init__(self, model: RooflineModel):
        self.model = model
        self.prices_prefills = model.prices_prefills
        self.parts = PARTS.get(model.parts_fingerprint, lambda: Parts(model))

    def __call__(self, shape: StepShape) -> float:
        m, parts = self.model, self.parts
        tokens = float(sum(k.concurrency * k.query_len for k in shape))
        sampled = float(sum(k.concurrency for k in shape))
        prefills = self.prices_prefills and not all(k.is_decode for k in shape)
        if tokens not in parts.by_tokens or sampled not in parts.by_sampled:
            parts.count(tokens, sampled)
        entries = parts.entries
        new = [k for k in shape if k not in entries]
        if new:
            parts.attend(new)
        full = windowed = recurrent = 0.0
        for key in shape:  # as np.bincount adds a step's entries
            one, window, state = entries[key]
            full += one
            windowed += window
            recurrent += state
        _, local_layers, linear_layers = m.attention_layers
        attention = m.over_layers(full, windowed if local_layers else None, recurrent if linear_layers else None)
        counted = parts.by_tokens[tokens]
        ops = (*counted[:LM_HEAD_AT], parts.by_sampled[sampled], *counted[LM_HEAD_AT:])  # in _price's order
        before, after = ops[:len(COUNTED_BEFORE)], ops[len(COUNTED_BEFORE):]
        overhead = m.step_overhead(sampled, tokens, prefills)
        return float(m.engine.with_step(np.float64(_gpu_ms(before, attention, after, overhead))))


class Parts:
    """The parts of step prices a `ShapeParts` remembers, computed by the first model of their `parts_fingerprint`:
    each token count's counted ops (TOKEN_OPS: COUNTED_BEFORE's, then COUNTED_AFTER's but lm_head), each count sampled's
    lm_head, and each entry's attention (full, windowed, recurrent)."""

    def __init__(self, model: RooflineModel):
        self.model = model
        self.by_tokens: dict[float, tuple[float, ...]] = {}
        self.by_sampled: dict[float, float] = {}
        self.entries: dict[ForwardKey, tuple[float, float, float]] = {}

    def count(self, tokens: float, sampled: float) -> None:
        """Remember the parts of `tokens` and of `sampled`, and of the counts BELOW and ABOVE each, in one call
        (elementwise float operations give each element what it would get alone; an element's token count and
        count sampled need not be one step's, as no part read here depends on both)."""
        j = np.arange(-BELOW, ABOVE + 1, dtype=np.float64)
        t, n = np.maximum(tokens + j, 1.0), np.maximum(sampled + j, 1.0)
        ops = self.model._counted_ops(t, n, 0, len(t), False)
        for tk, parts in zip(t.tolist(), zip(*(ops[op][0].tolist() for op in TOKEN_OPS), strict=True), strict=True):
            self.by_tokens.setdefault(tk, parts)
        for sp, head in zip(n.tolist(), ops["lm_head"][0].tolist(), strict=True):
            self.by_sampled.setdefault(sp, head)

    def attend(self, keys: list) -> None:
        """Remember the attention parts of `keys`, each priced alone as numbers (a step meets one or two new
        entries: numpy's cost a call would be most of theirs)."""
        for key in keys:
            full, windowed, recurrent, _ = self.model._attention_parts(
                key.is_decode, float(key.concurrency), float(key.query_len), float(key.seq_len), False)
            self.entries[key] = (float(full), 0.0 if windowed is None else float(windowed),
                                 0.0 if recurrent is None else float(recurrent))


#: step parts kept per process, by `parts_fingerprint` (as many as step pricers: simulator.pricing.PRICERS)
PARTS = Recent(64)


def _gpu_ms(counted_before, attention, counted_after, overhead):
    """A step's GPU time (numbers, or arrays of steps): its ops added in the one order both pricing paths
    keep (attention after COUNTED_BEFORE), then its overhead."""
    return sum((*counted_before, attention, *counted_after)) + overhead


def _larger(a, b):
    """np.maximum(a, b) for arrays of entries; max(a, b) for one entry's numbers (numpy's cost a call)."""
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


def _pick(cond, a, b):
    """np.where(cond, a, b) for arrays of entries; a or b for one entry's numbers."""
    return np.where(cond, a, b) if isinstance(cond, np.ndarray) else (a if cond else b)


def _causal_pairs(q, s, window: int = 0):
    """(query, key) pairs of q new tokens ending at context s: query at position p (0-based) sees
    p + 1 keys, at most `window` (0: no window). Sum over p in [s - q, s): the part below the window
    as an arithmetic series, the rest `window` each."""
    if not window:
        return q * (s - q) + q * (q + 1) / 2
    first = s - q
    below = np.maximum(np.minimum(s, window), first)  # positions first..below-1 see p + 1 < window keys
    return (below * (below + 1) - first * (first + 1)) / 2 + window * np.maximum(0, s - np.maximum(first, window))


def _chunked_pairs(q, s, chunk: int):
    """(query, key) pairs of q new tokens ending at context s where position p sees the p % chunk + 1 keys of
    its own chunk: what the first s positions see ((s // chunk) whole chunks' triangles and a partial one's)
    less what the first s - q see."""
    def seen(n):
        whole, rest = n // chunk, n % chunk
        return whole * (chunk * (chunk + 1) / 2) + rest * (rest + 1) / 2
    return seen(s) - seen(s - q)


def _ring(group: int, msg, bw: float, lat: float):
    """Seconds of a ring all-reduce (or all-gather + reduce-scatter) of `msg` bytes over `group` devices."""
    return 2 * (group - 1) / group * msg / bw + 2 * (group - 1) * lat


def _step_bound(step, bound, n_steps):
    out = np.full(n_steps, "-", dtype=object)
    out[step] = bound
    return out
