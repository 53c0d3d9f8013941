"""Memory accounting of one device of an instance: weights, KV bytes per token, activation peak,
and the KV capacity left after the reserve (GiB, as the reference tool counts "GB")."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from latency.families import DENSE_RATIO, SPARSE_RATIO

GIB = 1024**3
#: bf16 activations between ops
ACT_BYTES = 2
#: logits are written in fp32
LOGIT_BYTES = 4
#: logit rows materialised at once: only sampled rows need logits, and samplers work in blocks
LOGIT_ROWS = 1024
#: tokens of the step the default memory picture assumes (vLLM's max_num_batched_tokens default on H100)
ACTIVATION_TOKENS = 8192
#: GiB kept free per device by default, as the reference tool
DEFAULT_RESERVED_GIB = 10.0


@dataclass(frozen=True)
class MemoryPicture:
    """Per device, in GiB unless named otherwise."""

    hbm_gib: float
    reserved_gib: float
    weights_gib: float
    activation_gib: float
    kv_bytes_per_token: float
    kv_capacity_tokens: int
    state_bytes_per_request: float = 0.0  # a request's recurrent state (linear-attention layers), beside its KV

    @property
    def kv_capacity_gib(self) -> float:
        return self.kv_capacity_tokens * self.kv_bytes_per_token / GIB

    @property
    def state_tokens(self) -> int:
        """A request's recurrent state in KV tokens of the pool it shares (vLLM's hybrid allocator: one slot a
        running request)."""
        return math.ceil(self.state_bytes_per_request / self.kv_bytes_per_token)

    def requests_held(self, requests: int, input_length: float, output_length: float) -> int:
        """How many of `requests` (at least one) the pool holds at once, each its state and, on average, its prompt
        and half its output: where states are large (Gemma 4's windows) fewer than are sent run, the rest queue."""
        if not self.state_tokens:
            return requests
        context = input_length + output_length / 2
        return max(1, min(requests, int(self.kv_capacity_tokens // (self.state_tokens + context))))

    def tokens_left(self, in_flight: float) -> int:
        """KV tokens left for the context of `in_flight` requests once each holds its recurrent state."""
        return max(0, self.kv_capacity_tokens - int(in_flight) * self.state_tokens)

    def as_dict(self) -> dict:
        return {**asdict(self), "kv_capacity_gib": self.kv_capacity_gib}


class MemoryAccount:
    """Bytes on the most loaded device of an instance, from the per-device parameter counts of
    `share` (a RooflineModel: qkv/o/mlp/expert parameters, KV elements per token and layer)."""

    def __init__(self, share):
        self.share = share
        self.model, self.parallel, self.quant, self.device = share.model, share.parallel, share.quant, share.device

    @property
    def weights_bytes(self) -> float:
        """Weights of its pipeline stage's layers, plus embeddings / LM head."""
        m, p, sh = self.model, self.parallel, self.share
        w = self.quant.weight_bytes
        per_layer_attn = (sh.qkv_params + sh.o_params) * w
        dense = sh.dense_layers * sh.mlp_params * w
        moe = sh.moe_layers * (sh.local_experts * m.expert_params / sh.expert_tp * self.quant.experts_bytes
                               + (sh.shared_params + sh.router_params) * w)
        layers = (m.num_layers * per_layer_attn + dense + moe) / p.pp
        vocab = m.vocab_size * m.hidden_size / p.tp * 2  # bf16
        vocab_total = vocab * (1 if m.tie_word_embeddings else 2)
        return layers + (vocab_total if p.pp == 1 else vocab)

    @property
    def kv_bytes_per_token(self) -> float:
        """KV of one token of context on the fullest stage. Sliding-window layers hold only their
        window per request (vLLM's hybrid allocator frees older blocks), so a token of context costs
        the full-attention layers' KV; the window is a request's own (`state_bytes_per_request`). A sparse-attention
        model keeps every token's indexer key too, in each layer that runs an indexer."""
        m, pp = self.model, self.parallel.pp
        indexed = -(-m.num_index_layers // pp)  # sparse attention's index cache
        if m.compress_ratios:  # DeepSeek-V4: an entry (and a CSA layer's index key) every few tokens
            entry = self.share.kv_elems_per_token_layer * self.quant.kv_bytes
            return (indexed * (entry + m.index_key_bytes) / SPARSE_RATIO
                    + -(-m.compressed_layers(DENSE_RATIO) // pp) * entry / DENSE_RATIO)
        layers = -(-m.num_full_layers // pp)
        return layers * self.share.kv_elems_per_token_layer * self.quant.kv_bytes + indexed * m.index_key_bytes

    @property
    def state_bytes_per_request(self) -> float:
        """What a request holds on the fullest stage whatever its context: each gated delta-net layer's
        recurrent state, and each local layer's KV of its window or chunk (held whole: a context shorter than
        it holds less; Gemma 4's 25 sliding layers keep 1,024 tokens each, 200 MiB a request at bf16)."""
        m, pp = self.model, self.parallel.pp
        linear = -(-m.num_linear_layers // pp) * self.share.state_bytes_layer
        windowed = m.num_layers if m.compress_ratios else m.num_local_layers  # DeepSeek-V4: every layer's window
        if not windowed:
            return linear
        window_tokens = m.sliding_window if m.compress_ratios else (
            m.num_sliding_layers * m.sliding_window + m.num_chunked_layers * m.attention_chunk) / windowed
        return linear + -(-windowed // pp) * window_tokens * self.share.local_heads.kv_elems * self.quant.kv_bytes

    def activation_bytes(self, tokens: int) -> float:
        """Peak transient activations of a step of `tokens` tokens (largest intermediate + logits)."""
        m, p, sh = self.model, self.parallel, self.share
        widest = max(sh.qkv_params / m.hidden_size, 2 * m.intermediate_size / p.tp if sh.dense_layers else 0,
                     2 * m.experts_per_token * m.moe_intermediate_size / p.tp)
        logits = min(tokens, LOGIT_ROWS) * m.vocab_size / p.tp * LOGIT_BYTES
        return tokens * (2 * m.hidden_size + widest) * ACT_BYTES + logits

    def picture(self, max_batched_tokens: int) -> MemoryPicture:
        """The device's memory for a step budget of `max_batched_tokens`: the KV pool is what the reserve, the
        weights and that step's activations leave, or the engine's fraction of it (`kv_free_fraction`), times
        the share of it measured runs held (`kv_share`, at most all the weights and activations leave); what
        the pool does not take counts as reserved."""
        act = self.activation_bytes(max_batched_tokens)
        unheld = max(0.0, self.device.hbm_gib * GIB - self.weights_bytes - act)
        free = max(0.0, unheld - self.share.reserved_memory_gib * GIB)
        engine = self.share.engine
        pool = min(unheld, free * (engine.kv_free_fraction or 1.0) * engine.kv_share)
        capacity = int(pool // self.kv_bytes_per_token)
        reserved = self.share.reserved_memory_gib + (free - pool) / GIB
        return MemoryPicture(self.device.hbm_gib, reserved, self.weights_bytes / GIB, act / GIB,
                             self.kv_bytes_per_token, capacity, self.state_bytes_per_request)
