"""One real local Ray for the whole suite (ray.init costs ~10 s and ~0.7 GB here)."""

import _thread
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.localcluster import runs_task


@pytest.fixture(autouse=os.environ.get("MUTANT_UNDER_TEST") is not None)
def _fresh_caches():
    """Under mutation testing only: empty the process-wide caches (parsed model and device files,
    engine profiles) before each test, so every test that needs a parse runs it and mutmut credits
    that test to the parsing code (with the caches warm, only the first such test would be)."""
    import sys

    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in ("latency", "simulator"):
            for value in list(vars(module).values()):
                if callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()
    yield


@pytest.fixture(scope="session")
def ray_session():
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, object_store_memory=256 * 1024**2, include_dashboard=False,
                 log_to_driver=False)
    yield ray
    ray.shutdown()


class Faults:
    """Real faults for tests, from outside the code under test: kill a Ray worker process while it
    runs a task, or interrupt the main thread (KeyboardInterrupt) when a condition holds."""

    def __init__(self):
        self.killed: list[int] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sigint = None  # the SIGINT handler interrupt_when replaced, restored by stop

    def _watch(self, poll, act):
        def loop():
            while not self._stop.is_set():
                hit = poll()
                if hit:
                    act(hit)
                    return
                time.sleep(0.002)
        t = threading.Thread(target=loop, daemon=True)
        t.start()
        self._threads.append(t)

    def kill_worker(self, task: str) -> None:
        """SIGKILL the first process whose title says it runs Ray task `task` (Ray names it "ray::task")."""
        def running():
            pids = (int(p.name) for p in Path("/proc").glob("[0-9]*"))
            return next((pid for pid in pids if runs_task(pid, task)), None)

        def kill(pid):
            os.kill(pid, signal.SIGKILL)
            self.killed.append(pid)
        self._watch(running, kill)

    def interrupt_when(self, condition) -> None:
        """KeyboardInterrupt in the main thread, wherever it is, as soon as `condition()` is true. A
        process started in the background of a non-interactive shell inherits SIGINT ignored, and then
        interrupt_main does nothing: Python's own handler is put back for the test."""
        if self._sigint is None:
            self._sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
        self._watch(condition, lambda _: _thread.interrupt_main())

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join(5)
        if self._sigint is not None:
            signal.signal(signal.SIGINT, self._sigint)


@pytest.fixture
def s3(monkeypatch):
    """A real S3 API server (moto's) on 127.0.0.1 with one bucket; the standard AWS variables point
    at it, as they would at any endpoint. Yields the bucket's URI."""
    import socket

    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for key, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    pafs.S3FileSystem(endpoint_override=endpoint, allow_bucket_creation=True).create_dir("results")
    yield "s3://results"
    server.stop()


@pytest.fixture
def faults():
    f = Faults()
    yield f
    f.stop()


def examples(n: int) -> int:
    """Hypothesis examples for a property: `n`, divided by SERVESWEEP_EXAMPLES_DIVISOR for mutation
    runs (bench/mutation.sh), where every mutant reruns the properties."""
    return max(10, n // int(os.environ.get("SERVESWEEP_EXAMPLES_DIVISOR", "1")))
