"""The results dataset: Parquet files hive-partitioned by model and device, one file per finished
scenario in each table, so a rerun can resume without losing or duplicating rows.

    ROOT/points/model=<m>/device=<d>/<scenario_id>.parquet   one row per evaluated point
    ROOT/best/model=<m>/device=<d>/<scenario_id>.parquet     one row per limit pair, role, layout, budget
    ROOT/splits/model=<m>/device=<d>/<scenario_id>.parquet   PD instance splits (mode "pd")
    ROOT/manifest.json                                       run id(s), spec, counts, nodes, tasks retried, cache stats

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
import logging
import os
import socket
import time
from pathlib import Path
from urllib.parse import quote

from orchestrator.jobs import OptimizeResult, SweepItem
from orchestrator.results import TEMPORARY_GLOB, columns_schema, scenario_columns, write_bytes, write_parquet

TABLES = ("points", "best", "splits", "requests")
PARTITIONS = ("model", "device")
#: a writer refreshes its lock at most this often (seconds) ...
LOCK_BEAT_S = 30
#: ... and a lock on another host not refreshed for this long belongs to a sweep that stopped
LOCK_STALE_S = 300
log = logging.getLogger(__name__)


def filesystem(root: str | Path):
    """(pyarrow filesystem, base path) of a local directory or a URI such as s3://bucket/prefix."""
    import pyarrow.fs as pafs

    text = str(root)
    if "://" in text:
        fs, base = pafs.FileSystem.from_uri(text)
        return fs, base.rstrip("/")
    return pafs.LocalFileSystem(), str(Path(text).resolve())


class Dataset:
    def __init__(self, root: str | Path):
        self.root = str(root)
        self.fs, self.base = filesystem(root)

    def discard_temporaries(self) -> int:
        """Remove what writes cut short left on a local disk, once no writer is left (a searcher killed mid-write
        when the driver is interrupted leaves its temporary file; an object store keeps none). Returns how many."""
        import pyarrow.fs as pafs

        if not isinstance(self.fs, pafs.LocalFileSystem):
            return 0
        stale = list(Path(self.base).rglob(TEMPORARY_GLOB))
        for path in stale:
            path.unlink(missing_ok=True)
        return len(stale)

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

    def write(self, item: SweepItem, result: OptimizeResult, per_request: bool = False) -> list[dict]:
        """Write one finished scenario's assembled result; returns its best rows. `per_request`: also
        the requests of each best point (table `requests`), re-simulated here."""
        cols = {"scenario_id": item.id, "mode": item.mode.name, **scenario_columns(item.scenario)}
        points = [{**cols, **p} for p in result.points]
        best = [{**cols, **b, "feasible": True, "message": ""} for b in result.best]
        best += [{**cols, **i, "feasible": False} for i in result.infeasible]
        if result.splits:
            self._write("splits", item, [{**cols, **sp} for sp in result.splits])
        if per_request:
            self._write("requests", item, _requests(item, result.best, cols))
        self._write("points", item, points)
        self._write("best", item, best)  # last: marks the scenario finished
        return best

    def _write(self, table: str, item: SweepItem, rows: list[dict]) -> None:
        if not rows:
            return
        seen: dict = {}
        for r in rows:  # every column in the order it first appears (a dict update per row runs in C)
            seen.update(r)
        columns = tuple(c for c in seen if c not in PARTITIONS)
        write_parquet(rows, self.path(table, item), schema=columns_schema(columns), filesystem=self.fs)

    def write_manifest(self, info: dict) -> None:
        path = f"{self.base}/manifest.json"
        old = json.loads(self.read_bytes(path) or b"{}")
        runs = old.get("runs", []) + [info]
        write_bytes(json.dumps({"runs": runs}, indent=2, default=str).encode(), path, self.fs)

    def lock(self) -> WriterLock:
        return WriterLock(self)

    def read_bytes(self, path: str) -> bytes | None:
        import pyarrow.fs as pafs

        if self.fs.get_file_info(path).type != pafs.FileType.File:
            return None
        with self.fs.open_input_stream(path) as f:
            return f.read()


class WriterLock:
    """One writer per output: ROOT/.writer.json names the sweep writing it (host, pid, start) and
    when it last wrote. A live holder makes another sweep fail; a stopped one (its process gone on
    this host, or no heartbeat for LOCK_STALE_S elsewhere) is taken over with --resume. An object
    store cannot create a file only if absent portably, so two sweeps starting within the same
    moment may both pass; the check guards the usual case, a second sweep started later."""

    def __init__(self, data: Dataset):
        self.data, self.path = data, f"{data.base}/.writer.json"
        self.mine: dict | None = None
        self.last_beat = 0.0

    def holder(self) -> dict | None:
        raw = self.data.read_bytes(self.path)
        return json.loads(raw) if raw else None

    def acquire(self, resume: bool) -> None:
        other = self.holder()
        if other is not None:
            who = f"host {other['host']}, pid {other['pid']}, started {other['started']}"
            if _alive(other):
                raise FileExistsError(f"{self.data.root} is being written by another sweep ({who})")
            if not resume:
                raise FileExistsError(f"{self.data.root} was being written by a sweep that stopped ({who}); "
                                      "pass --resume to take it over")
            log.warning("taking over %s from a sweep that stopped (%s)", self.data.root, who)
        self.mine = {"host": socket.gethostname(), "pid": os.getpid(),
                     "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        self.beat(force=True)

    def beat(self, force: bool = False) -> None:
        """Say this writer is alive (at most every LOCK_BEAT_S seconds unless forced)."""
        now = time.time()
        if self.mine is not None and (force or now - self.last_beat >= LOCK_BEAT_S):
            write_bytes(json.dumps({**self.mine, "heartbeat": now}).encode(), self.path, self.data.fs)
            self.last_beat = now

    def release(self) -> None:
        if self.mine is not None and (self.holder() or {}).get("pid") == self.mine["pid"]:
            self.data.fs.delete_file(self.path)
        self.mine = None


def _alive(holder: dict) -> bool:
    if holder.get("host") == socket.gethostname():
        try:
            os.kill(int(holder["pid"]), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return time.time() - float(holder.get("heartbeat", 0)) < LOCK_STALE_S


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


def _requests(item: SweepItem, best: list[dict], cols: dict) -> list[dict]:
    """The requests of every best point of a scenario (one row each), tagged with its limit pair."""
    from orchestrator.point_tables import point_tables, row_point

    rows = []
    for b in best:
        if "tp" not in b:  # a prefill/decode split's deployment row: its sides are rows of their own
            continue
        job, n, rate = row_point(b)
        requests, _ = point_tables(item.scenario, job, n, rate)
        tag = {**cols, "ttft_limit_ms": b["ttft_limit_ms"], "tpot_limit_ms": b["tpot_limit_ms"], "role": b["role"]}
        rows += [{**tag, **{k: v[i].item() for k, v in requests.items()}} for i in range(len(requests["arrival_ms"]))]
    return rows
