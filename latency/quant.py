"""Quantisation: bytes per weight and the compute dtype of linear layers; KV-cache element size."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Quantization:
    """Linear layers (projections, MLP, experts) use `weight_bytes` and `compute_dtype`; embeddings,
    LM head and attention stay in bf16; the KV cache uses `kv_bytes` per element."""

    name: str
    weight_bytes: float
    compute_dtype: str
    kv_bytes: float = 2.0


_LINEAR = {  # our names and the reference tool's (quantize-linear-action)
    "bf16": (2.0, "bf16"), "fp16": (2.0, "fp16"), "disabled": (2.0, "bf16"),
    "w8a8": (1.0, "int8"), "w8a8_dynamic": (1.0, "int8"), "w8a8_static": (1.0, "int8"), "int8": (1.0, "int8"),
    "fp8": (1.0, "fp8"), "w8a8_fp8": (1.0, "fp8"), "fp8_dynamic": (1.0, "fp8"),
    "w4a16": (0.5, "bf16"), "w4a16_static": (0.5, "bf16"), "int4": (0.5, "bf16"),
    "w8a16": (1.0, "bf16"), "w8a16_static": (1.0, "bf16"),
    # 4-bit floats with a shared scale: MXFP4 (an 8-bit scale per 32 weights: 4.25 bits), NVFP4 (an FP8
    # scale per 16: 4.5 bits); priced weight-only (bf16 compute), as Hopper runs them
    "mxfp4": (4.25 / 8, "bf16"), "nvfp4": (4.5 / 8, "bf16"),
}
_KV = {"bf16": 2.0, "fp16": 2.0, "auto": 2.0, "disabled": 2.0, "int8": 1.0, "fp8": 1.0, "c8": 1.0}
LINEAR_CHOICES = tuple(sorted(_LINEAR))
KV_CHOICES = tuple(sorted(_KV))


def parse_quantization(linear: str = "bf16", kv_cache: str = "bf16") -> Quantization:
    key = str(linear).strip().lower()
    if key not in _LINEAR:
        raise ValueError(f"unknown quantization {linear!r}; choose one of {', '.join(LINEAR_CHOICES)}")
    kv_key = str(kv_cache).strip().lower()
    if kv_key not in _KV:
        raise ValueError(f"unknown KV-cache dtype {kv_cache!r}; choose one of {', '.join(KV_CHOICES)}")
    weight_bytes, dtype = _LINEAR[key]
    return Quantization(name=f"{key}/kv-{kv_key}", weight_bytes=weight_bytes, compute_dtype=dtype,
                        kv_bytes=_KV[kv_key])
