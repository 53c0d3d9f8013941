"""Forked processes (orchestrator.forked): the one-shot map answers in the calls' order, every point and job heard,
a call's exception raised where the calls were made; neither it nor a fit's pool leaves a process running however
it ends."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.forked import can_fork, count_evaluated, fork_pool, forked_map, stop
from orchestrator.progress import SearchProgress


def _counted_square(n: int, points: int, sleep_s: float) -> tuple[int, int]:
    time.sleep(sleep_s)
    for _ in range(points):
        count_evaluated(1)
    return n * n, os.getpid()


def _bytes(n: int) -> bytes:
    return bytes([n]) * (3 * 2**20 + n)


def _fails(n: int) -> int:
    if n == 3:
        raise ValueError(f"no square of {n}")
    return n * n


class Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("not this one")


def _fails_unpicklably(n: int) -> int:
    raise Unpicklable("a failure that does not pickle")


def _sleeps(n: int) -> int:
    count_evaluated(1)
    time.sleep(30)
    return n


def _gone(pid: int) -> bool:
    """Neither running nor a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _children() -> set[int]:
    """The processes this one forked that still exist (zombies included)."""
    me = str(os.getpid())
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[1] == me:
            out.add(int(stat.parent.name))
    return out


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_answers_come_in_the_calls_order_from_two_processes_and_every_point_and_job_is_heard():
    """Six calls, the first slowest, over two processes: the answers in the calls' order, both processes used,
    the points each call counted (0+1+...+5 = 15) and the jobs each call was worth (2 each) heard, and the
    processes reaped when the map returns."""
    assert can_fork()
    before = _children()
    bar = SearchProgress(enabled=False)
    calls = [(n, n, 0.2 if n == 0 else 0.01) for n in range(6)]
    got = forked_map(_counted_square, calls, 2, bar, [2] * 6)
    assert [square for square, _ in got] == [0, 1, 4, 9, 16, 25]
    assert len({pid for _, pid in got}) == 2 and os.getpid() not in {pid for _, pid in got}
    assert (bar.points, bar.done) == (15, 12)
    assert _children() == before


def test_no_calls_need_no_process_and_one_process_still_answers_them_all():
    assert forked_map(_fails, [], 2, SearchProgress(enabled=False)) == []
    assert forked_map(_fails, [(n,) for n in (0, 1, 2)], 0, SearchProgress(enabled=False)) == [0, 1, 4]


def test_answers_larger_than_a_pipe_holds_come_back_whole():
    """Answers of 3 MiB (a pipe holds 64 KiB) from four calls over two processes: read in pieces as they come,
    each whole and in its place."""
    got = forked_map(_bytes, [(n,) for n in range(4)], 2, SearchProgress(enabled=False))
    assert [len(b) for b in got] == [3 * 2**20 + n for n in range(4)] and all(set(b) == {n} for n, b in
                                                                              enumerate(got))


def test_a_call_s_exception_is_raised_here_and_the_processes_end():
    before = _children()
    with pytest.raises(ValueError, match="no square of 3"):
        forked_map(_fails, [(n,) for n in range(6)], 2, SearchProgress(enabled=False))
    with pytest.raises(RuntimeError, match="a failure that does not pickle"):  # its traceback, as text
        forked_map(_fails_unpicklably, [(1,), (2,)], 2, SearchProgress(enabled=False))
    assert _children() == before


def test_an_interrupted_map_kills_its_processes_at_once():
    """Ctrl-C while calls run for 30 s: the map ends within seconds and leaves no process behind."""

    class Interrupting(SearchProgress):
        def update(self, points: int = 0, jobs: int = 0) -> None:
            raise KeyboardInterrupt

    before = _children()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        forked_map(_sleeps, [(1,), (2,), (3,)], 2, Interrupting(enabled=False))
    assert time.monotonic() - started < 10
    assert _children() == before


def test_a_forked_pool_stops_at_once_its_jobs_unfinished():
    """An interrupted fit stops its pool's processes (`stop`): leaving the pool would wait for every job to end,
    minutes for a long fit. The processes ignore Ctrl-C (the one that forked them hears it)."""
    pool = fork_pool(1)
    assert pool.submit(signal.getsignal, signal.SIGINT).result() is signal.SIG_IGN
    job = pool.submit(time.sleep, 30)
    while not job.running():
        time.sleep(0.01)
    pids = [p.pid for p in pool._processes.values()]
    stop(pool)
    deadline = time.monotonic() + 5  # the job sleeps 30 s: running after 5 s, it was left to end
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(pid) for pid in pids)  # the kernel's word: the pool's thread may have reaped them already
    assert job.cancelled() or job.exception() is not None


#: a process that forks processes which each print their pid and sleep a minute: through a fit's pool (one),
#: or through the one-shot map (two)
FORKS = {
    "pool": ("import os, time\nfrom orchestrator.forked import fork_pool\npool = fork_pool(1)\n"
             "print(pool.submit(os.getpid).result(), flush=True)\npool.submit(time.sleep, 60)\ntime.sleep(60)\n", 1),
    "map": ("import os, time\nfrom orchestrator.forked import forked_map\n"
            "from orchestrator.progress import SearchProgress\n"
            "def call(n):\n    os.write(1, f'{os.getpid()}\\n'.encode())\n    time.sleep(60)\n"
            "forked_map(call, [(1,), (2,)], 2, SearchProgress(enabled=False))\n", 2),
}


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
@pytest.mark.parametrize("kind", FORKS)
def test_forked_processes_end_with_the_process_that_forked_them(kind, how):
    """A scheduler's SIGTERM (or a SIGKILL) ends `servesweep` without its exit path: the processes it forked end
    with it (the kernel signals them), where they ran on for their calls' minutes, orphaned. (One pid a line:
    the map's two processes write theirs in one write each, so the lines do not interleave.)"""
    script, count = FORKS[kind]
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    children = [int(parent.stdout.readline()) for _ in range(count)]
    parent.send_signal(how)
    parent.wait(10)
    deadline = time.monotonic() + 5
    while not all(_gone(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.01)
    left = [pid for pid in children if not _gone(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "a forked process outlived the one that forked it"
