"""The results dataset: Parquet files hive-partitioned by model and device, one file per finished
scenario in each table, written atomically, so a rerun can resume without losing or duplicating rows.

    DIR/points/model=<m>/device=<d>/<scenario_id>.parquet   one row per evaluated point
    DIR/best/model=<m>/device=<d>/<scenario_id>.parquet     one row per limit pair, role, layout, budget
    DIR/splits/model=<m>/device=<d>/<scenario_id>.parquet   PD instance splits (mode "pd")
    DIR/manifest.json                                       run id(s), spec, counts, nodes, cache stats

Partition values are URI-encoded ("Qwen%2FQwen3-8B"); pyarrow, pandas and DuckDB decode them.
A scenario is finished when its `best` file exists: it is written last.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import quote

from orchestrator.optimize import assemble
from orchestrator.results import scenario_columns as scenario_fields
from orchestrator.results import write_parquet
from orchestrator.runner import SweepItem

TABLES = ("points", "best", "splits")
INT = {"tp", "pp", "dp", "ep", "concurrency", "max_batched_tokens", "num_steps", "prefill_num_chunks",
       "effective_input_length", "kv_capacity_tokens", "num_devices", "input_length", "output_length",
       "mtp_tokens", "max_concurrency", "prefill_tp", "decode_tp", "prefill_concurrency", "decode_concurrency",
       "prefill_instances", "decode_instances", "devices_used"}
BOOL = {"fits_memory", "feasible"}
STR = {"role", "scenario_id", "mode", "quantization", "kv_cache_dtype", "scheduler", "decode_context",
       "mtp_acceptance_rates", "tp_sizes", "message", "model", "device"}
PARTITIONS = ("model", "device")


def scenario_columns(item: SweepItem, mode: str) -> dict:
    """A sweep scenario has one budget and at most one limit of each kind: single-valued columns."""
    s = item.scenario
    cols = {"scenario_id": item.id, "mode": mode, **scenario_fields(s)}
    for k in ("max_batched_tokens", "ttft_limits", "tpot_limits"):
        del cols[k]
    cols["ttft_limit_ms"] = s.ttft_limits[0] if s.ttft_limits else None
    cols["tpot_limit_ms"] = s.tpot_limits[0] if s.tpot_limits else None
    return cols


def _schema(columns):
    import pyarrow as pa

    def kind(c):
        return pa.int64() if c in INT else pa.bool_() if c in BOOL else pa.string() if c in STR else pa.float64()
    return pa.schema([(c, kind(c)) for c in columns])


class Dataset:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, table: str, item: SweepItem) -> Path:
        s = item.scenario
        return (self.root / table / f"model={quote(s.model, safe='')}" / f"device={quote(s.device, safe='')}"
                / f"{item.id}.parquet")

    def finished_ids(self) -> set[str]:
        return {p.stem for p in (self.root / "best").glob("*/*/*.parquet")}

    def has_results(self) -> bool:
        return bool(self.finished_ids())

    def write(self, item: SweepItem, job_results, mode: str) -> list[dict]:
        """Write one finished scenario; returns its best rows."""
        result = assemble(item.scenario, job_results, item.pd_devices)
        cols = scenario_columns(item, mode)
        points = [{**cols, **p} for p in result.points]
        best = [{**cols, **b, "feasible": True, "message": ""} for b in result.best]
        best += [{**cols, **i, "feasible": False} for i in result.infeasible]
        if result.splits:
            self._write("splits", item, [{**cols, **sp} for sp in result.splits])
        self._write("points", item, points)
        self._write("best", item, best)  # last: marks the scenario finished
        return best

    def _write(self, table: str, item: SweepItem, rows: list[dict]) -> None:
        columns = list(dict.fromkeys(c for r in rows for c in r))
        columns = [c for c in columns if c not in PARTITIONS]
        full = [{c: r.get(c) for c in columns} for r in rows]
        write_parquet(full, self.path(table, item), schema=_schema(columns))

    def write_manifest(self, info: dict) -> None:
        path = self.root / "manifest.json"
        old = json.loads(path.read_text()) if path.exists() else {}
        runs = old.get("runs", []) + [info]
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"runs": runs}, indent=2, default=str))
        os.replace(tmp, path)


def read_table(root: str | Path, table: str = "best"):
    """A results table as a pandas DataFrame (partition columns decoded)."""
    import pyarrow.dataset as ds

    path = Path(root) / table
    if not path.exists():
        import pandas as pd

        return pd.DataFrame()
    return ds.dataset(path, format="parquet", partitioning="hive").to_table().to_pandas()
