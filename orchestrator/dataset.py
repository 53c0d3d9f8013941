"""The results dataset: Parquet files hive-partitioned by model and device, one file per finished
scenario in each table, so a rerun can resume without losing or duplicating rows.

    ROOT/points/model=<m>/device=<d>/<scenario_id>.parquet   one row per evaluated point
    ROOT/best/model=<m>/device=<d>/<scenario_id>.parquet     one row per limit pair, role, layout, budget
    ROOT/splits/model=<m>/device=<d>/<scenario_id>.parquet   PD instance splits (mode "pd")
    ROOT/manifest.json                                       run id(s), spec, counts, nodes, cache stats

ROOT is a local directory or any URI pyarrow's filesystems understand (`s3://bucket/prefix`; the
endpoint and credentials come from the standard AWS environment variables). Partition values are
URI-encoded ("Qwen%2FQwen3-8B"); pyarrow, pandas and DuckDB decode them.

A scenario is finished when its `best` file exists: it is written last. Every file appears whole or
not at all: on a local disk it is written to a temporary name and renamed; an object store has no
rename, but an object becomes visible only when its upload completes (one PUT, or a multipart upload
completed at close), so an interrupted write leaves no object behind, only an incomplete upload the
bucket's lifecycle rule removes.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

from orchestrator.jobs import OptimizeResult, SweepItem
from orchestrator.results import column_type, scenario_columns, write_bytes, write_parquet

TABLES = ("points", "best", "splits")
PARTITIONS = ("model", "device")


def filesystem(root: str | Path):
    """(pyarrow filesystem, base path) of a local directory or a URI such as s3://bucket/prefix."""
    import pyarrow.fs as pafs

    text = str(root)
    if "://" in text:
        fs, base = pafs.FileSystem.from_uri(text)
        return fs, base.rstrip("/")
    return pafs.LocalFileSystem(), str(Path(text).resolve())


def _schema(columns):
    import pyarrow as pa

    return pa.schema([(c, column_type(c)) for c in columns])


class Dataset:
    def __init__(self, root: str | Path):
        self.root = str(root)
        self.fs, self.base = filesystem(root)

    def path(self, table: str, item: SweepItem) -> str:
        s = item.scenario
        return (f"{self.base}/{table}/model={quote(s.model, safe='')}/device={quote(s.device, safe='')}"
                f"/{item.id}.parquet")

    def files(self, table: str) -> list[str]:
        """The Parquet files of a table (none if it does not exist)."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(f"{self.base}/{table}", recursive=True, allow_not_found=True)
        return [i.path for i in self.fs.get_file_info(selector)
                if i.type == pafs.FileType.File and i.path.endswith(".parquet")]

    def finished_ids(self) -> set[str]:
        return {Path(p).stem for p in self.files("best")}

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
        write_parquet(full, self.path(table, item), schema=_schema(columns), filesystem=self.fs)

    def write_manifest(self, info: dict) -> None:
        path = f"{self.base}/manifest.json"
        old = json.loads(self.read_bytes(path) or b"{}")
        runs = old.get("runs", []) + [info]
        write_bytes(json.dumps({"runs": runs}, indent=2, default=str).encode(), path, self.fs)

    def read_bytes(self, path: str) -> bytes | None:
        import pyarrow.fs as pafs

        if self.fs.get_file_info(path).type != pafs.FileType.File:
            return None
        with self.fs.open_input_stream(path) as f:
            return f.read()


def read_table(root: str | Path, table: str = "best"):
    """A results table as a pandas DataFrame (partition columns decoded); empty if absent."""
    import pandas as pd
    import pyarrow.dataset as ds

    data = Dataset(root)
    files = data.files(table)
    if not files:
        return pd.DataFrame()
    return ds.dataset(files, filesystem=data.fs, format="parquet",
                      partitioning=ds.HivePartitioning.discover(), partition_base_dir=f"{data.base}/{table}"
                      ).to_table().to_pandas()
