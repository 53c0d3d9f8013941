"""Quantisation: bytes per weight and the compute dtype of linear layers; KV-cache element size."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Quantization:
    """Linear layers (projections, MLP, experts) use `weight_bytes` and `compute_dtype`; embeddings,
    LM head and attention stay in bf16; the KV cache uses `kv_bytes` per element. Routed experts may
    be quantised apart (`expert_weight_bytes`, `expert_compute_dtype`; 0 / "": as the linear layers),
    as checkpoints such as gpt-oss (MXFP4 experts) and Kimi-K2.5 (INT4 experts) ship them."""

    name: str
    weight_bytes: float
    compute_dtype: str
    kv_bytes: float = 2.0
    expert_weight_bytes: float = 0.0
    expert_compute_dtype: str = ""

    @property
    def experts_bytes(self) -> float:
        return self.expert_weight_bytes or self.weight_bytes

    @property
    def experts_dtype(self) -> str:
        return self.expert_compute_dtype or self.compute_dtype

    @property
    def weight_only_experts(self) -> bool:
        """Integer-quantised experts computed in bf16 (INT4 weight-only, w4a16, w8a16): the kernel
        upcasts each weight as it streams it."""
        return self.experts_dtype == "bf16" and self.experts_bytes < 2.0


_LINEAR = {  # our names and the reference tool's (quantize-linear-action)
    "bf16": (2.0, "bf16"), "fp16": (2.0, "fp16"), "disabled": (2.0, "bf16"),
    "w8a8": (1.0, "int8"), "w8a8_dynamic": (1.0, "int8"), "w8a8_static": (1.0, "int8"), "int8": (1.0, "int8"),
    "fp8": (1.0, "fp8"), "w8a8_fp8": (1.0, "fp8"), "fp8_dynamic": (1.0, "fp8"),
    "w4a16": (0.5, "bf16"), "w4a16_static": (0.5, "bf16"), "int4": (0.5, "bf16"),
    "w8a16": (1.0, "bf16"), "w8a16_static": (1.0, "bf16"),
    # 4-bit floats with a shared scale, in FP4 on devices with FP4 tensor cores (B200's block-scaled
    # MMA takes both: vLLM runs gpt-oss's MXFP4 experts through FlashInfer's TRT-LLM-gen MoE there),
    # else weight-only: MXFP4 (an 8-bit scale per 32 weights: 4.25 bits), NVFP4 (an FP8 scale per 16:
    # 4.5 bits); INT4 weight-only with a bf16 scale per 32 (4.5 bits: Kimi-K2.5's experts)
    "mxfp4": (4.25 / 8, "fp4"), "nvfp4": (4.5 / 8, "fp4"), "int4_wo": (4.5 / 8, "bf16"),
    # INT4 weights with FP8 activations (TensorRT-LLM's W4A8 experts): a bf16 scale per 128 weights
    "w4afp8": (4.125 / 8, "fp8"),
}
_KV = {"bf16": 2.0, "fp16": 2.0, "auto": 2.0, "disabled": 2.0, "int8": 1.0, "fp8": 1.0, "c8": 1.0}
LINEAR_CHOICES = tuple(sorted(_LINEAR))
KV_CHOICES = tuple(sorted(_KV))


def parse_quantization(linear: str = "bf16", kv_cache: str = "bf16") -> Quantization:
    """`linear` names the linear layers' format, or LINEAR+EXPERTS for routed experts apart
    (bf16+mxfp4: attention and dense layers in bf16, experts in MXFP4)."""
    key, _, experts = str(linear).strip().lower().partition("+")
    for part in (key, experts) if experts else (key,):
        if part not in _LINEAR:
            raise ValueError(f"unknown quantization {linear!r}; choose one of {', '.join(LINEAR_CHOICES)}, "
                             "or LINEAR+EXPERTS (e.g. bf16+mxfp4)")
    kv_key = str(kv_cache).strip().lower()
    if kv_key not in _KV:
        raise ValueError(f"unknown KV-cache dtype {kv_cache!r}; choose one of {', '.join(KV_CHOICES)}")
    weight_bytes, dtype = _LINEAR[key]
    expert_bytes, expert_dtype = _LINEAR[experts] if experts else (0.0, "")
    return Quantization(name=f"{key}{'+' + experts if experts else ''}/kv-{kv_key}", weight_bytes=weight_bytes,
                        compute_dtype=dtype, kv_bytes=_KV[kv_key], expert_weight_bytes=expert_bytes,
                        expert_compute_dtype=expert_dtype)
