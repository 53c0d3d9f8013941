"""A cluster-scale sweep on a local two-node Ray cluster (token authentication on) whose worker node is
SIGKILLed in the middle: the sweep finishes on the head node; its rows equal an inline run of the same
scenarios, none lost or twice.

    python bench/cluster.py [--spec examples/cluster_scale.toml] [--limit 400] [--kill-after 0.4]

Prints scenarios/s, the driver's peak memory, the share of latency keys served from the caches, the
tasks the driver ran again after the node died, the nodes that ran tasks, and the row check.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)

from orchestrator.dataset import read_table  # noqa: E402
from orchestrator.spec import expand, load_spec  # noqa: E402
from orchestrator.sweep import run_sweep  # noqa: E402
from tests.localcluster import kill_node, start_cluster, stop  # noqa: E402

KEY = ["scenario_id", "role", "tp", "attention_dp", "ep", "max_batched_tokens", "concurrency"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=str(ROOT / "examples" / "cluster_scale.toml"))
    ap.add_argument("--limit", type=int, default=400, help="the first N scenarios of the spec")
    ap.add_argument("--kill-after", type=float, default=0.4, help="kill the worker node when this share is written")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ss-cluster-"))
    token = work / "auth_token"
    token.write_text(secrets.token_hex(32))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    env.pop("RAY_ADDRESS", None)
    spec = load_spec(a.spec)
    items = expand(spec)[: a.limit]
    sliced = work / "slice.json"
    sliced.write_text(json.dumps([i.id for i in items]))
    address, nodes = None, []
    for attempt in range(3):
        address, nodes = start_cluster(env, work, attempt)
        if address:
            break
    if not address:
        sys.exit("the two-node cluster did not come up")
    out = work / "cluster"
    driver = ("import json, sys; from orchestrator.spec import expand, load_spec; "
              "from orchestrator.sweep import init_ray, run_sweep; init_ray(sys.argv[3]); "
              "ids = set(json.load(open(sys.argv[2]))); "
              "items = [i for i in expand(load_spec(sys.argv[1])) if i.id in ids]; "
              "s = run_sweep(items, sys.argv[4], progress=False); print(json.dumps({'seconds': s.seconds, "
              "'points': s.points, 'priced': s.priced, 'lookups': s.lookups, 'nodes': s.nodes, "
              "'retried': s.retried}))")
    try:
        t0 = time.perf_counter()
        run = subprocess.Popen([sys.executable, "-c", driver, a.spec, str(sliced), address, str(out)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        while run.poll() is None and len(list(out.glob("best/*/*/*.parquet"))) < a.kill_after * len(items):
            time.sleep(0.1)
        killed_at = len(list(out.glob("best/*/*/*.parquet")))
        kill_node(nodes[1])
        stdout, stderr = run.communicate()
        wall = time.perf_counter() - t0
        if run.returncode:
            sys.exit(stderr[-3000:])
    finally:
        stop(nodes)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    summary = json.loads(stdout.strip().splitlines()[-1])
    inline = work / "inline"
    run_sweep(items, inline, backend="inline", progress=False)
    got, want = (read_table(p).sort_values(KEY).reset_index(drop=True) for p in (out, inline))
    lost = len(set(want["scenario_id"]) - set(got["scenario_id"]))
    twice = int(got.duplicated(KEY).sum())
    equal = got.drop(columns=[c for c in got if c not in want]).equals(want[[c for c in got if c in want]])
    print(f"{len(items)} scenarios on 2 nodes, worker node SIGKILLed after {killed_at} were written")
    print(f"{'wall s':>8} {'scen/s':>7} {'points':>7} {'keys from caches':>17} {'driver MiB':>10} "
          f"{'tasks retried':>13}  nodes (tasks)")
    print(f"{wall:>8.1f} {len(items) / summary['seconds']:>7.1f} {summary['points']:>7} "
          f"{1 - summary['priced'] / max(summary['lookups'], 1):>16.1%} {peak:>10.0f} {summary['retried']:>13}  "
          f"{summary['nodes']}")
    print(f"rows: {lost} scenarios lost, {twice} rows twice, equal to the inline run: {equal}")


if __name__ == "__main__":
    main()
