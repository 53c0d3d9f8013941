"""Sweeps the page starts: each runs in a background thread of the page's process (inline, no Ray:
the page must not start a cluster), into a new directory under the results root, so Explore may
open it when it is done. Progress is what the dataset shows: its finished scenarios (whole or
absent, as every sweep writes them)."""

from __future__ import annotations

import sys
import threading
import time
import uuid

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class SweepJobs:
    """The sweeps of one page, by id: `start(toml)` launches one, `status(id)` says how far it is."""

    def __init__(self, root: str | None):
        self.root = root
        self.jobs: dict[str, dict] = {}
        self.lock = threading.Lock()

    def start(self, toml: str) -> dict:
        """{"id", "output", "total"} of a new sweep of the spec `toml`, or {"errors"} naming what is wrong."""
        from orchestrator.fields import InputError
        from orchestrator.spec import SpecError, expand

        if not self.root:
            return {"errors": {"sweep": "start servesweep ui --results DIR (or URI) to run sweeps from the page: "
                                        "their results go under it"}}
        try:
            items = expand(tomllib.loads(toml))
        except (SpecError, InputError, tomllib.TOMLDecodeError) as err:
            return {"errors": {"sweep": str(err)}}
        job_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        output = f"{self.root.rstrip('/')}/ui-sweep-{job_id}"
        job = {"id": job_id, "output": output, "total": len(items), "state": "running", "error": ""}
        with self.lock:
            self.jobs[job_id] = job
        threading.Thread(target=self._run, args=(job, items), daemon=True, name=f"sweep-{job_id}").start()
        return {"id": job_id, "output": output, "total": len(items)}

    def _run(self, job: dict, items) -> None:
        from orchestrator.sweep import run_sweep

        try:
            run_sweep(items, job["output"], backend="inline", progress=False)
            job["state"] = "done"
        except Exception as err:  # noqa: BLE001 (the page shows what stopped it; nothing is half written)
            job["state"], job["error"] = "failed", f"{type(err).__name__}: {err}"

    def status(self, job_id: str) -> dict:
        """{"state", "done", "total", "output", "error"}; done counts the finished scenarios on disk."""
        from orchestrator.dataset import Dataset

        job = self.jobs.get(job_id)
        if job is None:
            return {"errors": {"sweep": f"no sweep {job_id!r} was started by this page"}}
        try:
            done = len(Dataset(job["output"]).finished_ids())
        except (OSError, ValueError):
            done = 0
        return {**{k: job[k] for k in ("state", "total", "output", "error")}, "done": done}
