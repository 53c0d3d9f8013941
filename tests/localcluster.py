"""A local Ray cluster of `ray start` nodes on 127.0.0.1 (each its own process group, on free ports),
for the two-node test and bench/cluster.py."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def free_ports(n):
    import socket

    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def start_node(args, env, log: Path):
    """A node in the foreground (`--block`) in a session of its own, on ports nobody else holds."""
    agent, grpc, metrics, runtime_env, manager, objects = free_ports(6)
    ports = ["--dashboard-agent-listen-port", str(agent), "--dashboard-agent-grpc-port", str(grpc),
             "--metrics-export-port", str(metrics), "--runtime-env-agent-port", str(runtime_env),
             "--node-manager-port", str(manager), "--object-manager-port", str(objects)]
    with open(log, "wb") as out:
        return subprocess.Popen(["ray", "start", "--block", "--num-cpus", "1", "--disable-usage-stats", *ports,
                                 *args], env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)


def stop(nodes):
    """Stop the nodes (SIGTERM to each node's process group, SIGKILL if one does not exit in 60 s)."""
    for p in nodes:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in nodes:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def node_processes(node) -> list[int]:
    """Every process of a node started by `start_node`: its session (Ray workers run in process
    groups of their own, but stay in the node's session)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp session
        except OSError:
            continue
        if int(fields[3]) == node.pid:
            pids.append(int(stat.parent.name))
    return pids


def runs_task(pid: int, task: str) -> bool:
    """Whether process `pid` runs Ray task `task` now (Ray titles a worker "ray::task" while it runs one)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(f"ray::{task}".encode())
    except OSError:
        return False


def running(node, task: str) -> list[int]:
    """The node's processes if one of its workers runs Ray task `task` now, else []: one scan, so a
    kill can follow at once."""
    pids = node_processes(node)
    return pids if any(runs_task(pid, task) for pid in pids) else []


def kill_node(node, pids: list[int] | None = None) -> None:
    """Lose a node as a machine is lost: SIGKILL every process of its session at once (killing the
    node's process group alone would leave its workers running, and finishing their tasks)."""
    for pid in pids or node_processes(node):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    node.wait(60)


def alive_nodes(address, env) -> int:
    probe = ("import ray,sys; ray.init(address=sys.argv[1], log_to_driver=False); "
             "print(sum(1 for x in ray.nodes() if x['Alive']))")
    try:
        p = subprocess.run([sys.executable, "-c", probe, address], env=env, capture_output=True, text=True,
                           timeout=30)
    except subprocess.TimeoutExpired:
        return 0
    out = p.stdout.strip().splitlines()
    return int(out[-1]) if p.returncode == 0 and out and out[-1].isdigit() else 0


def start_cluster(env, tmp_path, attempt):
    """Head and one worker node on fresh ports; None (with the nodes stopped) if they do not come up."""
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    temp = f"/tmp/ss-{os.getpid()}-{attempt}"  # short: Ray's socket paths must stay under 108 bytes
    head = start_node(["--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--temp-dir", temp,
                        "--include-dashboard", "false"], env,
                       tmp_path / f"head{attempt}.log")
    nodes = [head]
    deadline = time.time() + 90
    while time.time() < deadline and head.poll() is None and alive_nodes(address, env) < 1:
        time.sleep(1)
    if head.poll() is None:
        nodes.append(start_node(["--address", address, "--temp-dir", temp], env, tmp_path / f"worker{attempt}.log"))
        while time.time() < deadline and all(n.poll() is None for n in nodes):
            if alive_nodes(address, env) >= 2:
                return address, nodes
            time.sleep(2)
    stop(nodes)
    return None, []
