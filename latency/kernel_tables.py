"""Measured kernel tables as a latency backend (`--latency-backend aiconfigurator-tables`).

NVIDIA's AIConfigurator publishes per-op kernel measurements as Parquet, per GPU, engine and engine
version (`aiconfigurator_core/systems/data/<gpu>/<op>/<engine>/<version>/`). This backend prices the
routed experts of a MoE layer from the MoE table measured on the deployment's GPU and engine (the op
our roofline prices worst: grouped, block-quantised expert GEMMs reach a fraction of what one
efficiency says) and every other op by the roofline. Where no table covers the layer (another
shape, dtype or layout, redundant experts), the roofline prices it and `notes` says so.

The tables are found in the installed `aiconfigurator-core` package (`pip install
"servesweep[kernels]"`; never downloaded at run time), or in the directory `SERVESWEEP_KERNEL_TABLES`
names, laid out the same way (a collection of one's own).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from latency.estimator import RooflineModel

NAME = "aiconfigurator-tables"
TABLES_ENV = "SERVESWEEP_KERNEL_TABLES"
PACKAGE = "aiconfigurator_core"
#: our device names -> the tables' GPU directories
GPU_DIRS = {"H100_SXM": "h100_sxm", "H200_SXM": "h200_sxm", "B200": "b200_sxm", "A100_SXM_80G": "a100_sxm",
            "GB200": "gb200", "B300_SXM": "b300_sxm", "GB300": "gb300", "L40S": "l40s",
            "RTX_PRO_6000_SERVER": "rtx_pro_6000_server", "B60": "b60", "H100_PCIE": "h100_pcie",
            "A100_PCIE_80G": "a100_pcie", "A30": "a30", "L4": "l4"}
#: our engine profiles -> the tables' framework directories
ENGINE_DIRS = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm"}
#: the routing skew the tables were measured with that we price: AIConfigurator's own default
#: (a power law of exponent 1.01 over experts), which stands for real routing better than "balanced"
DISTRIBUTION = "power_law_1.01"
#: our expert quantisation -> the tables' moe_dtype, in order of preference. Block FP8 first: the FP8
#: MoE checkpoints people deploy (DeepSeek-V3, Qwen3-FP8, MiniMax-M2.5) are block-quantised.
DTYPES = {"bf16": ("bfloat16",), "fp16": ("bfloat16",), "fp8": ("fp8_block", "fp8"), "mxfp4": ("w4a16_mxfp4",),
          "nvfp4": ("nvfp4",), "int4_wo": ("int4_wo",), "w4afp8": ("w4afp8",)}
MOE_TABLE = "moe_perf.parquet"
COLUMNS = ["moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
           "moe_ep_size", "distribution", "latency"]


def tables_root() -> Path:
    """The directory of GPU tables: SERVESWEEP_KERNEL_TABLES, else the installed package's data."""
    if os.environ.get(TABLES_ENV):
        root = Path(os.environ[TABLES_ENV])
        if not root.is_dir():
            raise ValueError(f"{TABLES_ENV}={root} is not a directory")
        return root
    spec = importlib.util.find_spec(PACKAGE)  # located, not imported: only its data is read
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"latency backend {NAME!r} needs AIConfigurator's tables: pip install "
                         f"'servesweep[kernels]' (or set {TABLES_ENV} to a directory of them)")
    return Path(next(iter(spec.submodule_search_locations))) / "systems" / "data"


def _version_key(name: str):
    """An engine version directory's order (PEP 440: 1.3.0rc20 before 1.3.0); a name that is no
    version sorts first."""
    from packaging.version import InvalidVersion, Version

    try:
        return (1, Version(name))
    except InvalidVersion:
        return (0, Version("0"))


def tables(root: Path, gpu: str, op: str, engine: str, table: str) -> list[Path]:
    """`engine`'s `table` of `op` (moe, gemm, attention, comm, ...) measured on `gpu`, newest engine
    version first."""
    found = (root / gpu / op / engine).glob(f"*/{table}")
    return sorted(found, key=lambda p: _version_key(p.parent.name), reverse=True)


def moe_tables(root: Path, gpu: str, engine: str) -> list[Path]:
    """The MoE tables of `engine` measured on `gpu`, newest engine version first."""
    return tables(root, gpu, "moe", engine, MOE_TABLE)


@lru_cache(maxsize=16)
def _read(path: str, mtime_ns: int):
    import pandas as pd

    table = pd.read_parquet(path, columns=COLUMNS)
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
    return table, digest


@dataclass(frozen=True)
class ExpertCurve:
    """Measured milliseconds of one MoE layer's routed experts against the tokens routed to it (all
    attention ranks' tokens), for one shape, dtype and (moe_tp, moe_ep). Interpolated linearly in
    log-log between measured points (latency follows a power of the tokens between them); below the
    first point the first value (one token is the least a step routes); above the last, the last
    scaled in proportion to the tokens (the kernel is compute-bound there)."""

    tokens: np.ndarray
    latency_ms: np.ndarray
    source: str  # what was measured: table path relative to the root, dtype, layout

    def __call__(self, routed) -> np.ndarray:
        routed = np.maximum(np.asarray(routed, dtype=np.float64), self.tokens[0])
        inside = np.exp(np.interp(np.log(routed), np.log(self.tokens), np.log(self.latency_ms)))
        beyond = self.latency_ms[-1] * routed / self.tokens[-1]
        return np.where(routed > self.tokens[-1], beyond, inside)


def expert_curve(model, device: str, engine: str, parallel, experts_quant: str) -> tuple[ExpertCurve | None, str]:
    """The measured curve of the deployment's routed experts, or (None, why not)."""
    gpu, framework = GPU_DIRS.get(device), ENGINE_DIRS.get(engine)
    if gpu is None:
        return None, f"no kernel tables for {device} (tables cover {', '.join(sorted(GPU_DIRS))})"
    if framework is None:
        return None, f"no kernel tables for engine {engine!r} (tables cover {', '.join(sorted(ENGINE_DIRS))})"
    if parallel.redundant_experts:
        return None, "the tables hold no layout with redundant experts"
    if model.moe_latent_size or model.mlp_matrices != 3:
        return None, "the tables time gated experts between hidden states, not latent or ungated ones"
    root = tables_root()
    paths = moe_tables(root, gpu, framework)
    if not paths:
        return None, f"no MoE table for {engine} on {gpu} under {root}"
    for path in paths:  # the newest engine version that measured this layer
        curve = _curve(path, root, model, parallel, experts_quant)
        if curve is not None:
            return curve, ""
    return None, (f"no {gpu}/moe/{framework} table has {experts_quant} rows for hidden {model.hidden_size}, expert "
                  f"{model.moe_intermediate_size}, {model.num_experts} experts top-{model.experts_per_token}, "
                  f"moe_tp {parallel.moe_tp} ep {parallel.ep}")


def _curve(path: Path, root: Path, model, parallel, experts_quant: str) -> ExpertCurve | None:
    table, digest = _read(str(path), path.stat().st_mtime_ns)
    shape = ((table.hidden_size == model.hidden_size) & (table.inter_size == model.moe_intermediate_size)
             & (table.topk == model.experts_per_token) & (table.num_experts == model.num_experts)
             & (table.moe_tp_size == parallel.moe_tp) & (table.moe_ep_size == parallel.ep)
             & (table.distribution == DISTRIBUTION))
    for dtype in DTYPES.get(experts_quant, ()):
        rows = table[shape & (table.moe_dtype == dtype)]
        if len(rows) >= 2:
            # one latency per token count: where several kernels were measured, the engine's fastest
            curve = rows.groupby("num_tokens")["latency"].min()
            source = (f"{path.relative_to(root).parent} {dtype} {model.moe_intermediate_size}x{model.num_experts}"
                      f"/top{model.experts_per_token} moe_tp{parallel.moe_tp} ep{parallel.ep} [{digest}]")
            return ExpertCurve(curve.index.to_numpy(dtype=np.float64), curve.to_numpy(dtype=np.float64), source)
    return None


class KernelTableModel(RooflineModel):
    """The roofline with the routed experts of each MoE layer priced from a measured curve; the shared
    experts and the router stay linear layers of the roofline, and the all-to-all its communication."""

    def __init__(self, *args, curve: ExpertCurve | None, why_not: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.curve, self.why_not = curve, why_not

    @property
    def notes(self) -> list[str]:
        if not self.moe_layers:
            return [f"{NAME}: a dense model has no MoE layer; every op priced by the roofline"]
        if self.curve is None:
            return [f"{NAME}: routed experts priced by the roofline: {self.why_not}"]
        return [f"{NAME}: routed experts from the measured table {self.curve.source}; other ops by the roofline"]

    def _fingerprint(self, engine_fields: dict) -> str:
        return f"{super()._fingerprint(engine_fields)}|{NAME}:{self.curve.source if self.curve else 'roofline'}"

    def _moe(self, tokens, peak, detail: bool):
        if self.curve is None:
            return super()._moe(tokens, peak, detail)
        routed_ms = self.curve(tokens * self.parallel.attention_dp)
        shared_ms, _ = self._linear(self.shared_params + self.router_params, self.moe_layers, 1, tokens, detail)
        bound = np.full(len(tokens), "measured") if detail else None
        return routed_ms * self.moe_layers + shared_ms, bound


def experts_quantization(quant) -> str:
    """Our name of the routed experts' format: the part after '+' of LINEAR+EXPERTS, else LINEAR."""
    linear = quant.name.split("/", 1)[0]
    return linear.partition("+")[2] or linear


def build(model, device, *, engine: str = "none", **options) -> KernelTableModel:
    """The backend's factory (latency.backends): refuses an engine the tables do not name, since the
    tables are each engine's own kernels."""
    from latency import build_latency_model, load_engine

    family = load_engine(engine).family  # a calibrated profile runs its base engine's kernels
    if family not in ENGINE_DIRS:
        raise ValueError(f"latency backend {NAME!r} prices the kernels an engine runs: give --engine "
                         f"{'|'.join(sorted(ENGINE_DIRS))} or a profile based on one (got {engine!r})")
    roof = build_latency_model(model, device, engine=engine, **options)
    curve, why_not = None, ""
    if roof.moe_layers:
        curve, why_not = expert_curve(roof.model, roof.device.name, family, roof.parallel,
                                      experts_quantization(roof.quant))
    return KernelTableModel(roof.model, roof.device_file, roof.parallel, roof.quant, roof.reserved_memory_gib,
                            engine=priced_with(roof.engine, curve), curve=curve, why_not=why_not)


def priced_with(engine, curve: ExpertCurve | None):
    """The engine profile beside a measured curve: a curve times the whole expert op, its launches too, so the
    profile's time a MoE layer beyond the roofline's kernels (`moe_layer_us`) is in it already."""
    return replace(engine, moe_layer_us=0.0) if curve is not None else engine
