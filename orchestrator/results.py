"""Result tables: the documented columns, and atomic Parquet writes."""

from __future__ import annotations

import os
import uuid
from dataclasses import asdict
from pathlib import Path

#: columns of a point row (one evaluated concurrency of one instance layout); see README "Results"
POINT_COLUMNS = {
    "role": "agg | prefill | decode: what the instance does",
    "tp": "tensor-parallel size", "pp": "pipeline stages", "dp": "instances side by side", "ep": "expert groups",
    "concurrency": "requests per instance in the window (all arrive at t=0)",
    "max_batched_tokens": "token budget per step (also the chunk size)",
    "ttft_ms": "mean time to first token", "tpot_ms": "mean time per output token after the first",
    "ttft_p50_ms": "", "ttft_p90_ms": "", "ttft_p99_ms": "", "tpot_p50_ms": "", "tpot_p90_ms": "", "tpot_p99_ms": "",
    "makespan_ms": "time until the last request finishes",
    "request_throughput": "requests/s over all dp instances", "output_throughput": "output tokens/s, all instances",
    "output_throughput_per_device": "output tokens/s per device",
    "num_steps": "forward steps simulated", "prefill_num_chunks": "chunks per prompt",
    "effective_input_length": "prompt tokens left after the prefix cache",
    "peak_kv_tokens": "KV tokens held at the fullest step", "kv_capacity_tokens": "KV tokens that fit per instance",
    "weights_gib": "weights per device", "kv_gib": "KV at the fullest step per device",
    "activation_gib": "activation peak per device", "available_gib": "HBM left at the fullest step",
    "fits_memory": "peak KV within capacity",
}


def scenario_columns(scenario) -> dict:
    """The scenario's fields as flat columns (tuples joined by spaces)."""
    out = {}
    for k, v in asdict(scenario).items():
        out[k] = " ".join(map(str, v)) if isinstance(v, tuple) else v
    return out


def write_parquet(rows: list[dict], path: str | Path, schema=None) -> Path:
    """Write rows to `path` atomically: a temp file in the same folder, then rename."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)
    os.replace(tmp, path)
    return path
