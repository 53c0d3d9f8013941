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

from orchestrator.jobs import OptimizeResult, SweepItem
from orchestrator.results import column_type, scenario_columns, write_parquet

TABLES = ("points", "best", "splits")
PARTITIONS = ("model", "device")


def _schema(columns):
    import pyarrow as pa

    return pa.schema([(c, column_type(c)) for c in columns])


class Dataset:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, table: str, item: SweepItem) -> Path:
        s = item.scenario
        return (self.root / table / f"model={quote(s.model, safe='')}" / f"device={quote(s.device, safe='')}"
                / f"{item.id}.parquet")

    def finished_ids(self) -> set[str]:
        return {p.stem for p in (self.root / "best").glob("*/*/*.parquet")}

    def write(self, item: SweepItem, result: OptimizeResult) -> list[dict]:
        """Write one finished scenario's assembled result; returns its best rows."""
        cols = {"scenario_id": item.id, "mode": item.mode.name, **scenario_columns(item.scenario)}
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
