"""A one-shot map over forked processes (a search's groups of jobs, a plan's sizes): each process inherits the
calls (nothing is pickled on the way in), takes them one at a time by index over a pipe, and sends back each
answer and the points it counted. multiprocessing's pool costs a search 20-40 ms more here (its imports, its
threads, its shutdown), a tenth of the 8-GPU question (`python bench/optimize.py`, docs/benchmarks.md); a fit
that estimates over and over keeps that pool (`fork_pool`).
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
import struct
import sys
import traceback
from collections.abc import Callable

#: Linux's prctl option that signals a process when the one that forked it ends
PR_SET_PDEATHSIG = 1
#: how often a map redraws its bar while no process sends anything (s)
PROGRESS_POLL_S = 0.25
#: a message's header: the length of the pickle that follows
HEADER = struct.Struct("<I")
#: a call's index on a task pipe
INDEX = struct.Struct("<i")

#: in a process `forked_map` forked: the pipe its answers and counts go back on
_answers_fd: int | None = None


def can_fork() -> bool:
    """Forking is safe here unless this process runs Ray (its threads and sockets must not be copied)."""
    ray = sys.modules.get("ray")
    return ray is None or not ray.is_initialized()


def follow_parent(parent: int) -> None:
    """A forked process's start: Ctrl-C ignored (the process that forked it hears it and stops it), and (Linux)
    killed when `parent` ends, however it ends (killed, or a scheduler's SIGTERM), not after its jobs."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # it ended before the line above
            os._exit(1)


def count_evaluated(n: int) -> None:
    """In a process `forked_map` forked: `n` more points evaluated (the bar of the one that forked it hears)."""
    _send(_answers_fd, ("points", n))


def forked_map(fn: Callable, calls: list[tuple], processes: int, progress, jobs: list[int] | None = None) -> list:
    """`fn(*call)` of each call in `processes` forked processes, handed out in the calls' order as processes come
    free; the answers in the calls' order. `progress` (a SearchProgress) hears the points `fn` counts
    (`count_evaluated`) and each call's `jobs` (1 each by default) as it ends. A call's exception is raised here;
    interrupted, or on any error, the processes are killed at once."""
    jobs = jobs or [1] * len(calls)
    answers: list = [None] * len(calls)
    todo = list(range(len(calls)))[::-1]
    team: list[_Child] = []
    try:
        for _ in range(min(max(processes, 1), len(calls))):
            team.append(_fork(fn, calls))  # one at a time: an interrupt leaves none it does not end
        with selectors.DefaultSelector() as selector:
            for child in team:
                child.give(todo.pop())
                selector.register(child.answers, selectors.EVENT_READ, child)
            left = len(calls)
            while left:
                for key, _ in selector.select(PROGRESS_POLL_S):
                    for kind, *value in key.data.read():
                        if kind == "points":
                            progress.update(points=value[0])
                            continue
                        i, answer = value
                        if kind == "error":
                            raise answer
                        answers[i], left = answer, left - 1
                        progress.update(jobs=jobs[i])
                        if todo:
                            key.data.give(todo.pop())
    finally:
        for child in team:
            child.end()
    return answers


def fork_pool(processes: int):
    """A pool of `processes` forked processes for a fit that estimates over and over (they start with this
    process's memos and imports, and keep what they learn between calls). They ignore Ctrl-C: the process that
    forked them hears it and stops them (`stop`), so an interrupt prints one line, not a traceback a process; and
    they end with it however it ends (killed, or by a scheduler's SIGTERM), not after their jobs."""
    import multiprocessing  # here: a one-shot map does without it
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork"), initializer=follow_parent,
                               initargs=(os.getpid(),))


def stop(pool) -> None:
    """Stop a pool's processes now, their jobs unfinished (shutting it down would wait for them)."""
    processes = list((pool._processes or {}).values())  # the executor has no public terminate before Python 3.14
    for process in processes:
        process.kill()
    pool.shutdown(wait=False, cancel_futures=True)


class _Child:
    """One forked process as the process that forked it sees it: its pid, the pipe it takes calls from and the
    one its messages come back on."""

    def __init__(self, pid: int, tasks: int, answers: int):
        self.pid, self.tasks, self.answers, self.unread = pid, tasks, answers, bytearray()

    def give(self, i: int) -> None:
        os.write(self.tasks, INDEX.pack(i))

    def read(self) -> list[tuple]:
        """The whole messages that came in (none if only part of one did)."""
        chunk = os.read(self.answers, 1 << 16)
        if not chunk:
            raise RuntimeError(f"a forked search process (pid {self.pid}) ended before its answer")
        data, start, messages = self.unread, 0, []
        data += chunk
        while len(data) - start >= HEADER.size:
            end = start + HEADER.size + HEADER.unpack_from(data, start)[0]
            if len(data) < end:
                break
            messages.append(_unpickled(data[start + HEADER.size:end]))
            start = end
        del data[:start]  # what is left is the start of a message still coming
        return messages

    def end(self) -> None:
        """Kill the process (done, or its calls no longer wanted) and reap it."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)
        os.close(self.tasks)
        os.close(self.answers)


def _fork(fn: Callable, calls: list[tuple]) -> _Child:
    tasks_read, tasks_write = os.pipe()
    answers_read, answers_write = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(tasks_write)
        os.close(answers_read)
        _serve(fn, calls, parent, tasks_read, answers_write)
    os.close(tasks_read)
    os.close(answers_write)
    return _Child(pid, tasks_write, answers_read)


def _serve(fn: Callable, calls: list[tuple], parent: int, tasks: int, answers: int) -> None:
    """A forked process: answer the calls it is given until its task pipe closes; never returns."""
    global _answers_fd
    code = 0
    try:
        follow_parent(parent)
        _answers_fd = answers
        while len(got := os.read(tasks, INDEX.size)) == INDEX.size:
            i = INDEX.unpack(got)[0]
            try:
                message = ("answer", i, fn(*calls[i]))
            except Exception as err:
                message = _failure(i, err)
            _send(answers, message)
    except BaseException:  # the process that forked it is gone, or it could not send: nothing to tell
        code = 1
    finally:
        os._exit(code)


def _send(fd: int, message: tuple) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _failure(i: int, err: Exception) -> tuple:
    """A call's exception as a message: itself pickled where it pickles, and its traceback as text."""
    try:
        original = pickle.dumps(err, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        original = None
    return "error", i, original, "".join(traceback.format_exception(err))


def _unpickled(data: bytes) -> tuple:
    """A message; a call's exception as the exception to raise (itself where it unpickles, else its text)."""
    message = pickle.loads(data)
    if message[0] != "error":
        return message
    _, i, original, text = message
    try:
        err = pickle.loads(original)
    except Exception:
        err = RuntimeError(f"a forked search process failed:\n{text}")
    return "error", i, err
