import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.cache import get_cache
from orchestrator.dataset import read_table
from orchestrator.pricer import CachedPricer
from orchestrator.spec import SpecError, expand, load_spec
from orchestrator.sweep import run_sweep
from tests.localcluster import alive_nodes, kill_node, running, start_cluster, stop

ROOT = Path(__file__).resolve().parents[2]
SPEC = {
    "sweep": {"name": "test"},
    "grid": {"model": "Qwen/Qwen3-8B", "device": "H200_SXM", "num_devices": [1, 2], "input_length": [1024, 4096],
             "output_length": [64, 256], "max_batched_tokens": [2048], "ttft_limit_ms": [3000],
             "tpot_limit_ms": [15, 30]},
}
KEY = ["scenario_id", "role", "tp", "max_batched_tokens", "concurrency"]


def table(root, name="points"):
    df = read_table(root, name)
    return df.sort_values(KEY).reset_index(drop=True)[sorted(df.columns)]


@pytest.fixture(scope="module")
def inline_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("inline")
    run_sweep(expand(SPEC), out, backend="inline", progress=False)
    return out


def test_spec_expands_to_the_product():
    items = expand(SPEC)
    assert len(items) == 16 and len({i.id for i in items}) == 16
    assert {i.scenario.tpot_limits for i in items} == {(15.0,), (30.0,)}


@pytest.mark.parametrize("grid, message", [
    ({"input_length": [0]}, "input_length = 0: expected an integer >= 1"),
    ({"colour": ["red"]}, "grid.colour: unknown key"),
    ({"num_devices": ["two"]}, "grid.num_devices = 'two': expected a list of int"),
    ({"device": ["NOPE"]}, "device = 'NOPE'"),
    ({"prefix_cache_hit_rate": [1.0]}, "prefix_cache_hit_rate = 1.0"),
    ({"tp": [3]}, "tp = 3"),
])
def test_bad_spec_names_key_and_value(grid, message):
    spec = {**SPEC, "grid": {**SPEC["grid"], **grid}}
    with pytest.raises(SpecError, match=message):
        expand(spec)


def test_spec_file_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[grid\nmodel = 1")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(bad)
    with pytest.raises(SpecError, match="sweep.mode = 'mixed'"):
        expand({**SPEC, "sweep": {"mode": "mixed"}})
    with pytest.raises(SpecError, match="sweep.pd_devices"):
        expand({**SPEC, "sweep": {"mode": "pd"}})


def test_examples_expand():
    assert len(expand(load_spec(ROOT / "examples" / "quickstart.toml"))) == 32  # burst and closed
    items = expand(load_spec(ROOT / "examples" / "cluster_scale.toml"))
    assert len(items) == 8064 and len({i.id for i in items}) == 8064  # the README's figure


def test_ray_sweep_equals_inline_and_the_roofline_never_asks_the_shared_cache(ray_session, inline_run, tmp_path):
    first = run_sweep(expand(SPEC), tmp_path / "a", backend="ray", progress=False)
    assert first.written == 16 and first.priced > 0
    assert first.round_trips == 0  # pricing a roofline key costs less than asking for it
    # what the workers did is visible: every plan made counted (a family planned by two workers
    # twice), the distinct ones, each worker's busy seconds and the efficiency
    # (a grid no process of the session has planned: plans are memoised per process)
    fresh = {**SPEC, "grid": {**SPEC["grid"], "output_length": 97}}
    inline = run_sweep(expand(fresh), tmp_path / "inline", backend="inline", progress=False)
    ray_run = run_sweep(expand(fresh), tmp_path / "ray", backend="ray", progress=False)
    assert inline.plans_made == inline.distinct_plans > 0 and inline.workers == 1
    assert ray_run.distinct_plans == inline.distinct_plans <= ray_run.plans_made
    assert ray_run.workers == 2 and 0 < ray_run.efficiency <= 1 and len(ray_run.busy) >= 1
    manifest = json.loads((tmp_path / "ray" / "manifest.json").read_text())["runs"][-1]
    assert (manifest["plans_made"], manifest["distinct_plans"]) == (ray_run.plans_made, ray_run.distinct_plans)
    assert manifest["efficiency"] == pytest.approx(ray_run.efficiency)
    pd.testing.assert_frame_equal(table(tmp_path / "a"), table(inline_run), check_exact=False, rtol=1e-12)
    pd.testing.assert_frame_equal(table(tmp_path / "a", "best"), table(inline_run, "best"), check_exact=False,
                                  rtol=1e-12)


def test_an_expensive_backend_prices_every_key_once_per_cluster(ray_session, tmp_path):
    """The slow roofline (5 ms a key) through a sweep on 2 CPUs: the workers claim keys from the shared
    cache, so every distinct key is priced exactly once across them; a second sweep prices nothing."""
    spec = {"grid": {**SPEC["grid"], "num_devices": [1, 2], "input_length": [1024, 1536], "output_length": [16],
                     "max_batched_tokens": [2048], "prefix_cache_hit_rate": [0.0], "tpot_limit_ms": [30, 60]},
            "options": {"latency_backend": "slow-roofline"}}
    cache = get_cache()
    cache.clear()
    first = run_sweep(expand(spec), tmp_path / "a", backend="ray", progress=False)
    entries = sum(s["entries"] for s in cache.stats())
    assert first.written == 8 and first.round_trips > 0
    assert first.priced == entries > 0  # each key priced by one worker only
    second = run_sweep(expand(spec), tmp_path / "b", backend="ray", progress=False)
    assert second.priced == 0 and second.points == first.points
    pd.testing.assert_frame_equal(table(tmp_path / "b"), table(tmp_path / "a"))


def test_cache_shards_claims_and_bound_on_real_ray(ray_session):
    from orchestrator.cache import MINE, PENDING, LatencyCache, ShardedCache, shard_of

    # claims pass on after 1 s: long enough that a loaded machine's pause between two calls does not
    # pass them on early (0.2 s did, once), short enough to wait out below
    shards = ShardedCache([LatencyCache.remote(max_entries=4, claim_timeout_s=1.0) for _ in range(3)])
    pairs = [("fp", (True, n, 1, 128)) for n in range(30)]
    assert shards.claim_many(pairs[:2], "a") == [MINE, MINE]
    assert shards.claim_many(pairs[:2], "b") == [PENDING, PENDING]  # a is pricing them
    shards.put_many(pairs[:2], [1.0, 2.0])
    assert shards.claim_many(pairs[:2], "b") == [1.0, 2.0]
    assert shards.claim_many(pairs[2:3], "a") == [MINE]
    import time

    time.sleep(1.1)  # a never answers: its claim passes on
    assert shards.claim_many(pairs[2:3], "b") == [MINE]
    shards.put_many(pairs, [float(i) for i in range(30)])
    stats = shards.stats()
    assert [s["entries"] for s in stats] == [4, 4, 4] and sum(s["evicted"] for s in stats) == 30 - 12
    assert sum(s["claims"] for s in stats) == 0
    kept = shards.get_many(pairs)
    for i, (pair, v) in enumerate(zip(pairs, kept, strict=True)):  # each shard keeps its last 4 puts
        later = [j for j in range(i + 1, 30) if shard_of(pairs[j], 3) == shard_of(pair, 3)]
        assert (v == float(i)) if len(later) < 4 else v is None
    assert shard_of(pairs[5], 3) == shard_of(("fp", (True, 5, 1, 128)), 3)  # the same in every process


def test_a_task_estimates_the_pricing_of_an_expensive_backend():
    """A point's estimated work: its steps at MS_PER_STEP (a burst of 7 prompts of 3,000 tokens at
    B 1024: 39 decode steps, 7 x 3000 / 1024 prefill steps and one), plus, for a backend that costs
    more per key than asking the shared cache (5 ms a key), PRICED_KEYS_PER_POINT keys; the roofline
    adds nothing. So tasks of an expensive backend carry few points and searches do not wait on them."""
    from orchestrator.jobs import Job
    from orchestrator.placement import MS_PER_POINT, MS_PER_STEP, PRICED_KEYS_PER_POINT, estimate_ms
    from orchestrator.scenario import Layout, Scenario

    s = Scenario("Qwen/Qwen3-8B", "H200_SXM", 1, 3000, 40, (1024,))
    job = Job("agg", Layout(1), 1024)
    steps = 39 + 7 * 3000 / 1024 + 1
    assert estimate_ms(s, job, 7) == pytest.approx(MS_PER_POINT + MS_PER_STEP * steps)
    slow = s.with_(latency_backend="slow-roofline")
    assert estimate_ms(slow, job, 7) == pytest.approx(MS_PER_POINT + MS_PER_STEP * steps + 5.0 * PRICED_KEYS_PER_POINT)


def test_cache_actor_serves_a_fresh_worker(ray_session):
    from orchestrator.evaluate import _measured, evaluate_point
    from orchestrator.jobs import Job
    from orchestrator.scenario import Layout, Scenario

    s = Scenario("Qwen/Qwen3-8B", "H200_SXM", 1, 3000, 40, (1024,), latency_backend="slow-roofline")
    cache = get_cache()
    a = CachedPricer(cache)
    row_a = evaluate_point(s, Job("agg", Layout(1), 1024), 7, a)
    assert a.priced > 0
    cache.stats()  # the fire-and-forget put_many has landed before this returns
    b = CachedPricer(cache)  # a new worker: empty local dict, no point measured in it
    _measured.clear()
    row_b = evaluate_point(s, Job("agg", Layout(1), 1024), 7, b)
    assert b.priced == 0 and b.remote_hits == b.lookups > 0
    assert row_a == row_b
    roofline = CachedPricer(cache)
    evaluate_point(s.with_(latency_backend="roofline"), Job("agg", Layout(1), 1024), 7, roofline)
    assert roofline.round_trips == 0 and roofline.priced > 0


SPLIT_SPEC = {"sweep": {"name": "split"},
              "grid": {"model": "Qwen/Qwen3-8B", "device": "H200_SXM", "num_devices": [1, 8], "input_length": 1024,
                       "output_length": [64, 1024], "max_batched_tokens": 2048, "ttft_limit_ms": 3000,
                       "tpot_limit_ms": 30}}


def test_a_scenario_larger_than_a_part_is_placed_job_by_job_and_assembled_as_inline(ray_session, tmp_path):
    """8 devices, 1024/1024 is estimated at 420 ms, above the 100 ms parts of this 589 ms sweep on two
    workers: its four layouts are placed as four pieces, searched where they land, and the driver
    assembles and writes it; every row equals the inline run's, none lost or twice."""
    from orchestrator.placement import part_ms, pieces

    items = expand(SPLIT_SPEC)
    placed = pieces(items, 2)
    split = [p for p in placed if p.jobs is not None]
    whole = max(sum(p.ms for p in placed if p.item.id == it.id) for it in items)
    assert sum(p.ms for p in split) == whole > part_ms(sum(p.ms for p in placed), 2)
    assert [p.jobs for p in split] == [(0,), (1,), (2,), (3,)] and len({p.item.id for p in split}) == 1
    inline = run_sweep(items, tmp_path / "inline", backend="inline", progress=False)
    ray_run = run_sweep(items, tmp_path / "ray", backend="ray", progress=False)
    assert ray_run.written == inline.written == len(items)
    for name in ("points", "best"):
        got, want = table(tmp_path / "ray", name), table(tmp_path / "inline", name)
        assert not got.duplicated(KEY).any() and len(got) > 0
        pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-12)


def test_killed_worker_loses_and_duplicates_nothing(ray_session, inline_run, tmp_path, faults):
    faults.kill_worker("Searcher.search")
    summary = run_sweep(expand(SPEC), tmp_path / "out", backend="ray", progress=False)
    assert len(faults.killed) == 1  # a worker did die in the middle of a task
    assert summary.retried == 1  # its task, run again by the driver, and only it
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["runs"][-1]["tasks_retried"] == 1
    assert summary.written == 16
    got = table(tmp_path / "out")
    assert not got.duplicated(KEY).any()
    pd.testing.assert_frame_equal(got, table(inline_run), check_exact=False, rtol=1e-12)


def test_interrupted_driver_resumes_without_loss_or_duplicates(ray_session, inline_run, tmp_path, faults):
    out = tmp_path / "out"
    faults.interrupt_when(lambda: len(list(out.glob("best/*/*/*.parquet"))) >= 5)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(expand(SPEC), out, backend="ray", progress=False)
    partial = read_table(out, "best")["scenario_id"].nunique()
    assert 5 <= partial < 16
    assert not list(out.rglob("*.tmp"))  # an interrupted write leaves no half file behind
    with pytest.raises(FileExistsError):
        run_sweep(expand(SPEC), out, backend="ray", progress=False)
    rest = run_sweep(expand(SPEC), out, backend="ray", progress=False, resume=True)
    # a scenario whose atomic write was in flight at the interrupt lands whole or not at all
    assert partial <= rest.skipped <= partial + 1 and rest.skipped + rest.written == 16
    got = table(out)
    assert not got.duplicated(KEY).any()
    pd.testing.assert_frame_equal(got, table(inline_run), check_exact=False, rtol=1e-12)
    runs = json.loads((out / "manifest.json").read_text())["runs"]
    assert len(runs) == 2


def test_a_scenario_without_its_best_file_is_recomputed_on_resume(inline_run, tmp_path):
    """`best` is written last and marks a scenario finished: points alone (a write cut short) are redone."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(inline_run, out)
    victims = sorted((out / "best").glob("*/*/*.parquet"))[:2]
    for f in victims:
        f.unlink()
    (out / "points" / victims[1].parent.relative_to(out / "best") / victims[1].name).unlink()
    rest = run_sweep(expand(SPEC), out, backend="inline", progress=False, resume=True)
    assert rest.written == 2 and rest.skipped == 14
    got = table(out)
    assert not got.duplicated(KEY).any()
    pd.testing.assert_frame_equal(got, table(inline_run))


@pytest.mark.parametrize("backend", ["inline", "ray"])
def test_sweep_killed_at_random_moments_resumes_to_the_uninterrupted_rows(inline_run, tmp_path, backend, request):
    """SIGKILL a real sweep driver at several moments (writes included), resume until done. On Ray the
    drivers join the suite's cluster, which outlives them as a cluster outlives its jobs."""
    import random

    spec = tmp_path / "spec.toml"
    grid = "\n".join(f"{k} = {json.dumps(v)}" for k, v in SPEC["grid"].items())
    spec.write_text(f"[sweep]\nname = \"kill\"\n\n[grid]\n{grid}\n")
    if backend == "ray":
        where = ["--address", request.getfixturevalue("ray_session").get_runtime_context().gcs_address]
    else:
        where = ["--inline"]

    def sweep(out, resume=False):
        cmd = [sys.executable, "-m", "orchestrator", "sweep", str(spec), "--output", str(out), *where,
               "--no-progress", *(["--resume"] if resume else [])]
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    started = time.perf_counter()
    assert sweep(tmp_path / "timing").wait(timeout=300) == 0
    whole = time.perf_counter() - started  # start-up included: kill times scale with this machine
    rng = random.Random(7)
    kills = 0
    for trial in range(3):
        out = tmp_path / f"out{trial}"
        # the first run dies once it has written a random number of scenarios (mid-run by construction);
        # up to two resumed runs die at random moments; the last runs to the end
        p = sweep(out)
        written = rng.randint(1, 12)
        while p.poll() is None and len(list(out.glob("best/*/*/*.parquet"))) < written:
            time.sleep(0.005)
        if p.poll() is None:
            p.kill()
            kills += 1
        p.wait()
        for attempt in range(1, 4):
            p = sweep(out, resume=True)
            try:
                if p.wait(timeout=300 if attempt == 3 else rng.uniform(0.5, 1.0) * whole) == 0:
                    break
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                kills += 1
        got = table(out)
        assert not got.duplicated(KEY).any()
        pd.testing.assert_frame_equal(got, table(inline_run), check_exact=False, rtol=1e-12)
        pd.testing.assert_frame_equal(table(out, "best"), table(inline_run, "best"), check_exact=False, rtol=1e-12)
    assert kills >= 3  # the trials did kill runs in the middle


def test_dataset_is_hive_partitioned_and_readable(inline_run):
    files = list((inline_run / "points").glob("model=*/device=*/*.parquet"))
    assert files and all(f.parent.parent.name == "model=Qwen%2FQwen3-8B" for f in files)
    best = read_table(inline_run, "best")
    assert set(best["model"]) == {"Qwen/Qwen3-8B"} and best["feasible"].any()
    via_pandas = pd.read_parquet(inline_run / "points")
    assert len(via_pandas) == len(read_table(inline_run, "points"))


def test_cluster_yaml_matches_the_ray_schema():
    import jsonschema
    import ray
    import yaml

    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    jsonschema.validate(yaml.safe_load((ROOT / "cluster.yaml").read_text()), schema)


def _int_or_string(schema):
    """Kubernetes' x-kubernetes-int-or-string as JSON Schema says it."""
    if isinstance(schema, list):
        return [_int_or_string(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _int_or_string(v) for k, v in schema.items()}
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out


def test_the_kuberay_rayjob_matches_the_crd_and_runs_our_sweep_with_token_auth():
    """examples/rayjob.yaml against KubeRay's RayJob schema (tests/data, from its CRD; a misspelt
    field or mode fails), with token authentication on, no searcher on the head, and an entrypoint
    our sweep command parses, naming a spec the repository ships."""
    import gzip
    import shlex

    import jsonschema
    import yaml

    from orchestrator.cli import build_parser

    packed = (ROOT / "tests" / "data" / "kuberay_rayjob_schema.json.gz").read_bytes()
    schema = _int_or_string(json.loads(gzip.decompress(packed)))
    job = yaml.safe_load((ROOT / "examples" / "rayjob.yaml").read_text())
    jsonschema.validate(job, schema)
    cluster = job["spec"]["rayClusterSpec"]
    assert cluster["authOptions"]["mode"] == "token"
    assert tuple(map(int, cluster["rayVersion"].split(".")[:2])) >= (2, 52)  # token auth needs Ray 2.52
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:2] == ["servesweep", "sweep"]
    args = build_parser().parse_args(argv[1:])
    assert args.address == "auto" and args.output.startswith("s3://")
    assert (ROOT / Path(args.spec).relative_to("/home/ray/servesweep")).is_file()
    wrong = json.loads(json.dumps(job))
    wrong["spec"]["rayClusterSpec"]["authOptions"]["mode"] = "tokens"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(wrong, schema)


def test_cli_sweep_inline_and_bad_spec(tmp_path):
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "orchestrator", "sweep", str(ROOT / "examples" / "quickstart.toml"),
           "--output", str(out), "--inline", "--no-progress"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "32 scenarios: 32 run" in p.stdout and f"results: {out}/" in p.stdout
    assert "note: burst: every request arrives at t=0" in p.stdout and "--arrival closed" in p.stdout
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "--resume" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    bad = tmp_path / "bad.toml"
    bad.write_text('[grid]\nmodel = "Qwen/Qwen3-8B"\ndevice = "H200_SXM"\nnum_devices = 1\n'
                   'input_length = -1\noutput_length = 8\n')
    p = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", str(bad), "--inline"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "input_length = -1" in p.stderr and "Traceback" not in p.stderr


def test_two_node_cluster_sweep_matches_embedded(inline_run, tmp_path):
    """A cluster of two `ray start` nodes with token authentication: the sweep (given the token) uses
    both; a client with another token is refused."""
    import secrets

    token = tmp_path / "auth_token"
    token.write_text(secrets.token_hex(32))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN", None)
    address, nodes = None, []
    for attempt in range(3):  # starting a second Ray on a busy machine can fail; the logs say why
        address, nodes = start_cluster(env, tmp_path, attempt)
        if address:
            break
    logs = "\n".join(f.read_text()[-1500:] for f in sorted(tmp_path.glob("*.log")))
    assert address, f"a two-node cluster did not come up in 3 attempts:\n{logs}"
    try:
        out = tmp_path / "cluster"
        p = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", str(ROOT / "examples" / "quickstart.toml"),
                            "--output", str(out), "--address", address, "--no-progress"], env=env,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        intruder = {**env, "RAY_AUTH_TOKEN": secrets.token_hex(32)}  # takes precedence over the file
        assert alive_nodes(address, intruder) == 0
        lost = tmp_path / "lost-node"  # another sweep; the worker node dies in the middle
        # other output lengths: the workers' plan memo (warm from the first sweep) must not make the tasks instant
        other = tmp_path / "other.toml"
        other.write_text((ROOT / "examples" / "quickstart.toml").read_text().replace("output_length = 512",
                                                                                   "output_length = 256"))
        run = subprocess.Popen([sys.executable, "-m", "orchestrator", "sweep", str(other), "--output", str(lost),
                                "--address", address, "--no-progress"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 300
        victims = []  # the worker node's processes, once it runs a task after a scenario is written
        while run.poll() is None and time.time() < deadline and not victims:
            if list(lost.glob("best/*/*/*.parquet")):
                victims = running(nodes[1], "Searcher.search")
        assert victims and run.poll() is None and len(list(lost.glob("best/*/*/*.parquet"))) < 32  # mid-run
        kill_node(nodes[1], victims)
        out_text, err_text = run.communicate(timeout=600)
        assert run.returncode == 0, err_text[-2000:]
    finally:
        stop(nodes)
    manifest = json.loads((out / "manifest.json").read_text())["runs"][-1]
    assert len(manifest["nodes"]) == 2 and all(n > 0 for n in manifest["nodes"].values())
    embedded = tmp_path / "embedded"
    run_sweep(expand(load_spec(ROOT / "examples" / "quickstart.toml")), embedded, backend="inline", progress=False)
    pd.testing.assert_frame_equal(table(out), table(embedded), check_exact=False, rtol=1e-12)
    # no count of retried tasks is asserted here: a task caught running may already have sent its rows
    # (test_killed_worker_loses_and_duplicates_nothing pins the count: exactly the killed task, once)
    got = table(lost)  # the run that lost its worker node: complete, nothing lost or twice
    assert not got.duplicated(KEY).any()
    run_sweep(expand(load_spec(other)), tmp_path / "other-inline", backend="inline", progress=False)
    pd.testing.assert_frame_equal(got, table(tmp_path / "other-inline"), check_exact=False, rtol=1e-12)


def test_sweep_rows_equal_the_optimize_run_of_the_same_scenario(ray_session, tmp_path):
    from orchestrator.optimize import optimize

    items = expand(SPEC)[:3]
    run_sweep(items, tmp_path, backend="ray", progress=False)
    best = read_table(tmp_path, "best")
    points = read_table(tmp_path, "points")
    for item in items:
        direct = optimize(item.scenario)
        got_best = best[best["scenario_id"] == item.id]
        got_points = points[points["scenario_id"] == item.id]
        assert len(got_points) == len(direct.points)
        for row in direct.best:
            match = got_best[(got_best["role"] == row["role"]) & (got_best["tp"] == row["tp"])
                             & (got_best["max_batched_tokens"] == row["max_batched_tokens"])]
            assert len(match) == 1
            for col in ("concurrency", "ttft_ms", "tpot_ms", "output_throughput", "peak_kv_tokens"):
                assert match.iloc[0][col] == pytest.approx(row[col], rel=1e-12)


def test_ray_sweep_into_object_storage_is_written_by_the_driver(ray_session, inline_run, s3):
    """Ray workers may lack the driver's object-store credentials (here they do: the endpoint is set
    after Ray started), so the driver writes what they send: the same rows as a local inline run."""
    uri = f"{s3}/runs/ray"
    summary = run_sweep(expand(SPEC), uri, backend="ray", progress=False)
    assert summary.written == 16
    pd.testing.assert_frame_equal(table(uri), table(inline_run), check_exact=False, rtol=1e-12)
    pd.testing.assert_frame_equal(table(uri, "best"), table(inline_run, "best"), check_exact=False, rtol=1e-12)


def test_results_go_to_object_storage_with_the_same_guarantees(inline_run, tmp_path, s3):
    """A sweep into s3:// on a real S3 API server: killed mid-run and resumed, it holds the same rows
    as a local run; --resume is needed to continue; report and compare read the same URI."""
    uri = f"{s3}/runs/one"
    spec = tmp_path / "spec.toml"
    grid = "\n".join(f"{k} = {json.dumps(v)}" for k, v in SPEC["grid"].items())
    spec.write_text(f"[sweep]\nname = \"s3\"\n\n[grid]\n{grid}\n")
    cmd = [sys.executable, "-m", "orchestrator", "sweep", str(spec), "--output", uri, "--inline", "--no-progress"]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    from orchestrator.dataset import Dataset

    deadline = time.time() + 120
    while first.poll() is None and len(Dataset(uri).finished_ids()) < 3 and time.time() < deadline:
        time.sleep(0.05)
    first.kill()
    first.wait()
    partial = len(Dataset(uri).finished_ids())
    assert 0 < partial < 16  # it died in the middle
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "--resume" in again.stderr
    done = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"16 scenarios: {16 - partial} run, {partial} already finished" in done.stdout
    got = table(uri)
    assert not got.duplicated(KEY).any()
    pd.testing.assert_frame_equal(got, table(inline_run), check_exact=False, rtol=1e-12)
    pd.testing.assert_frame_equal(table(uri, "best"), table(inline_run, "best"), check_exact=False, rtol=1e-12)
    runs = json.loads(Dataset(uri).read_bytes(f"{Dataset(uri).base}/manifest.json"))["runs"]
    assert [r["written"] for r in runs] == [16 - partial]  # the killed run had no chance to log itself
    report = subprocess.run([sys.executable, "-m", "orchestrator", "report", uri, "--out", str(tmp_path / "rep")],
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert (tmp_path / "rep" / "index.html").exists()
    same = subprocess.run([sys.executable, "-m", "orchestrator", "compare", uri, str(inline_run)],
                          capture_output=True, text=True, timeout=120)
    assert same.returncode == 0, same.stderr
    missing = subprocess.run([sys.executable, "-m", "orchestrator", "report", f"{s3}/nothing"],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "RESULTS" in missing.stderr


def test_one_writer_per_output(tmp_path):
    """A live sweep's output is refused to a second one, naming it; a stopped sweep's lock is taken
    over with --resume; a lock from another host counts as live until its heartbeat is old."""
    import socket

    from orchestrator.dataset import LOCK_STALE_S, Dataset

    items = expand(SPEC)[:2]
    out = tmp_path / "out"
    lock = Dataset(out).lock()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        Dataset(out).fs.create_dir(str(out), recursive=True)
        (out / ".writer.json").write_text(json.dumps({"host": socket.gethostname(), "pid": other.pid,
                                                      "started": "2026-11-30 09:00:00 UTC", "heartbeat": 0}))
        with pytest.raises(FileExistsError, match=rf"being written by another sweep \(host .*, pid {other.pid}, "
                                                  r"started 2026-11-30 09:00:00 UTC\)"):
            run_sweep(items, out, backend="inline", progress=False, resume=True)
    finally:
        other.kill()
        other.wait()
    with pytest.raises(FileExistsError, match="sweep that stopped .* pass --resume to take it over"):
        run_sweep(items, out, backend="inline", progress=False)
    summary = run_sweep(items, out, backend="inline", progress=False, resume=True)
    assert summary.written == 2 and lock.holder() is None  # taken over, finished, released
    far = {"host": "elsewhere", "pid": 1, "started": "then"}
    (out / ".writer.json").write_text(json.dumps({**far, "heartbeat": time.time()}))
    with pytest.raises(FileExistsError, match="host elsewhere"):
        run_sweep(items, out, backend="inline", progress=False, resume=True)
    (out / ".writer.json").write_text(json.dumps({**far, "heartbeat": time.time() - LOCK_STALE_S - 1}))
    assert run_sweep(items, out, backend="inline", progress=False, resume=True).skipped == 2


def test_cache_command_shows_and_clears_the_shards(ray_session, capsys):
    from orchestrator.cli import cache_command, main

    cache = get_cache()
    cache.put_many([("fp", (True, 1, 1, 128))], [1.5])
    assert cache_command("stats") == 0
    out = capsys.readouterr().out
    assert "entries" in out and sum(s["entries"] for s in cache.stats()) >= 1
    assert cache_command("clear") == 0 and sum(s["entries"] for s in cache.stats()) == 0
    assert "cleared" in capsys.readouterr().out
    import os

    if "RAY_ADDRESS" not in os.environ:
        assert main(["cache", "stats"]) == 2  # no cluster named: one line, exit 2
        assert "--address" in capsys.readouterr().err


def test_placement_keeps_a_family_on_the_worker_that_started_it():
    """Hand-computed: families A (3 scenarios of 1,000 ms), B (one of 1,000) and C (two of 500) on two
    workers. Parts hold >= 625 ms (TARGET_TASK_MS, 800 ms, would leave a worker fewer than 4 parts of
    the 5,000 ms: 5,000 / (2 x 4)): A's scenarios one a part, C's two in one. A worker starts the
    largest family nobody has, keeps to its own, and helps with what is left at the end."""
    from orchestrator.placement import MIN_PARTS_PER_WORKER, TARGET_TASK_MS, Placement

    assert (TARGET_TASK_MS, MIN_PARTS_PER_WORKER) == (800.0, 4)
    items = expand(SPEC)
    fams = sorted({it.family for it in items})[:3]
    a = [it for it in items if it.family == fams[0]][:3]
    b = [it for it in items if it.family == fams[1]][:1]
    c = [it for it in items if it.family == fams[2]][:2]
    cost = {**{it.id: 1000.0 for it in a + b}, **{it.id: 500.0 for it in c}}
    p = Placement(b + a + c, workers=2, cost=lambda it: cost[it.id])
    assert p.part_ms == 625.0

    def take(worker):
        family, part, ms = p.take(worker)
        return [it.id for it in part], ms

    assert take(1) == ([a[0].id], 1000.0)  # the largest family: A
    assert take(2) == ([b[0].id], 1000.0)  # A is taken: the largest free one (B ties C, B first)
    assert take(2) == ([c[0].id, c[1].id], 1000.0)  # B is done: the next free family
    assert take(1) == ([a[1].id], 1000.0)  # its own family
    family, part, ms = p.take(2)  # nothing free: helps with A
    assert [it.id for it in part] == [a[2].id]
    p.give_back(family, part, ms, 2)  # worker 2 was lost: the part is first in A again
    assert take(1) == ([a[2].id], 1000.0)
    assert p.take(1) is None and p.take(2) is None



def test_a_helper_takes_a_family_s_parts_from_its_end():
    """Hand-computed: one family of four 1,000 ms scenarios on two workers (parts of >= 500 ms: a scenario each).
    Worker 1 starts it and takes its parts front to back; worker 2, with no family free, helps and takes them
    from the end, where the plans its owner is making for the next parts are not needed (bench/cluster_replay.py:
    128 / 256 / 512 workers 3.6 / 2.4 / 2.0 s -> 3.3 / 2.3 / 1.9 s)."""
    from orchestrator.placement import Placement

    items = expand(SPEC)
    family = [it for it in items if it.family == items[0].family][:4]
    p = Placement(family, workers=2, cost=lambda it: 1000.0)
    assert p.part_ms == 500.0

    def take(worker):
        return [it.id for it in p.take(worker)[1]]

    assert take(1) == [family[0].id]
    assert take(2) == [family[3].id]  # a helper: from the end
    assert take(2) == [family[2].id]  # and it stays one
    assert take(1) == [family[1].id]  # the owner from the front
    assert p.take(1) is None and p.take(2) is None

def test_searchers_share_plans_only_where_there_are_more_of_them_than_plan_families():
    """SPEC's 16 scenarios hold 4 plan families (2 input x 2 output lengths at one budget; the device
    count and the limits never enter one): 4 searchers each keep their own, a 5th must share one."""
    from orchestrator.placement import pieces
    from orchestrator.runner import shares_plans

    placed = pieces(expand(SPEC), 2)
    assert len({p.family for p in placed}) == 4
    assert not shares_plans(4, placed) and shares_plans(5, placed)


def test_parts_shrink_below_the_target_only_where_workers_would_get_too_few():
    """Hand-computed: a part holds the sweep's work over workers x PARTS_PER_WORKER (20) where that is
    above TARGET_TASK_MS (800 ms); else 800 ms unless that leaves a worker fewer than 4 parts; never
    below 100 ms (MIN_TASK_MS)."""
    from orchestrator.placement import part_ms

    assert part_ms(234_000.0, 2) == 234_000.0 / 40  # 5,850 ms: a big sweep on 2 CPUs, as before
    assert part_ms(234_000.0, 32) == 800.0  # 366 ms by the 20-part rule: the target holds
    assert part_ms(234_000.0, 256) == 234_000.0 / 1024  # 228.5 ms: 800 would leave 1.1 parts a worker
    assert part_ms(10_000.0, 512) == 100.0  # 4.9 ms a part by the work: the floor
    assert part_ms(0.0, 0) == 100.0


@settings(max_examples=60, deadline=None)
@given(costs=st.lists(st.floats(1.0, 5000.0), min_size=1, max_size=16), workers=st.integers(1, 5),
       order=st.lists(st.integers(0, 4), min_size=1, max_size=200))
def test_placement_hands_out_every_scenario_once(costs, workers, order):
    """Conservation: whatever order free workers ask in, every scenario is handed out exactly once; a
    worker takes its own family first, then the largest free one, and helps with the family that has
    the most work left only when no family is free."""
    from orchestrator.placement import Placement

    items = expand(SPEC)
    chosen = [items[i % len(items)] for i in range(len(costs))]
    chosen = list({it.id: it for it in chosen}.values())
    cost = {it.id: ms for it, ms in zip(chosen, costs, strict=False)}
    p = Placement(chosen, workers, cost=lambda it: cost[it.id])
    handed = []
    for w in order + list(range(workers)) * len(chosen):
        open_ = [f for f, parts in p.parts.items() if parts]
        free = [f for f in open_ if not p.owners[f]]
        mine = [f for f in open_ if w % workers in p.owners[f]]
        most = max((p.left[f] for f in free or open_), default=None)
        taken = p.take(w % workers)
        if taken is None:
            assert not open_
            break
        family = taken[0]
        assert family in mine if mine else p.left[family] + taken[2] == pytest.approx(most)
        handed += [it.id for it in taken[1]]
    assert sorted(handed) == sorted(it.id for it in chosen)


def test_an_evaluating_process_collects_garbage_rarely(tmp_path):
    """A process that evaluates points sets the collector's thresholds (GC_THRESHOLDS): at Python's
    defaults the full collections the planner's small containers trigger walk every memoised object."""
    import gc

    from orchestrator.collector import GC_THRESHOLDS

    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        run_sweep(expand(SPEC)[:1], tmp_path, backend="inline", progress=False)
        assert gc.get_threshold() == GC_THRESHOLDS
    finally:
        gc.set_threshold(*before)


def test_a_finished_search_leaves_its_plans_beyond_the_collectors_walks(tmp_path):
    """Once a job's search ends, what it left alive (the plans it memoised) is frozen out of the collector's
    generations (`freeze_survivors`): a later collection of the young does not walk it (the pauses that walk
    a sweep's memos reached 0.95 s), while a plan made after it is still walked until its own search ends."""
    import gc

    from orchestrator.evaluate import _plan
    from simulator import Workload, plan

    run_sweep(expand(SPEC)[:1], tmp_path, backend="inline", progress=False)
    walked = {id(o) for o in gc.get_objects()}
    kept = [entry[0] for entry in _plan.memo.values()]
    assert kept and not any(id(p) in walked for p in kept)
    fresh = plan(Workload(64, 8, 2048, 4))
    assert any(o is fresh for o in gc.get_objects())


def test_a_searcher_that_cannot_write_sends_its_results_to_the_driver(ray_session, tmp_path):
    """A searcher on the driver's node writes a local output itself; where a write fails (here the
    output is a regular file) it sends that scenario's result back, and every later one."""
    import ray

    from orchestrator.placement import Piece
    from orchestrator.runner import Searcher

    items = expand(SPEC)[:2]
    node = ray.get_runtime_context().get_node_id()
    good = Searcher(None, str(tmp_path / "out"), False, node)
    searched = good.search([Piece(items[0])])  # (its plans may be memoised by earlier tests)
    out, stats, busy = searched.written, searched.stats, searched.work[1]
    assert out[0][0] == items[0].id and out[0][1] is None  # written here
    assert read_table(tmp_path / "out", "best")["scenario_id"].unique().tolist() == [items[0].id]
    assert stats["points"] > 0 and busy > 0
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    bad = Searcher(None, str(blocked), False, node)
    out = bad.search([Piece(it) for it in items]).written
    assert [(i, type(r).__name__) for i, r, _ in out] == [(it.id, "OptimizeResult") for it in items]
    assert bad.data is None
    elsewhere = Searcher(None, str(tmp_path / "out"), False, "another-node")
    assert elsewhere.data is None  # a local output is not this node's to write


def test_a_searcher_reads_the_plans_another_made_from_the_object_store(ray_session, tmp_path):
    """Two searchers (real Ray actors: two processes, two plan memos) search one scenario in turn. The
    first makes every plan and puts those that took SHARE_PLAN_S or more in the object store; the
    second, handed their references as the driver hands a family's, makes only the others, and both
    write the same rows."""
    import ray

    from orchestrator.placement import Piece
    from orchestrator.runner import Searcher

    spec = {"grid": {"model": "Qwen/Qwen3-8B", "device": "H200_SXM", "num_devices": 1, "input_length": 4096,
                     "output_length": 1024, "max_batched_tokens": 2048, "arrival": "closed",
                     "ttft_limit_ms": 60000, "tpot_limit_ms": 30}}
    item = expand(spec)[0]
    node = ray.get_runtime_context().get_node_id()
    actor = ray.remote(num_cpus=1)(Searcher)
    first, second = (actor.remote(None, str(tmp_path / name), False, node, False, True) for name in ("a", "b"))
    try:
        one = ray.get(first.search.remote([Piece(item)]))
        two = ray.get(second.search.remote([Piece(item)], one.made))
        (_, _, made_first), shared, (_, _, made_second), more = one.work, one.made, two.work, two.made
    finally:
        ray.kill(first)
        ray.kill(second)
    assert len(shared) >= 1 and not set(more) & set(shared)  # (a plan near the threshold may go either way)
    assert len(made_second) == len(made_first) - len(shared)
    assert table(tmp_path / "a").equals(table(tmp_path / "b"))


def test_a_disaggregated_sweep_names_the_side_that_fails_in_its_best_rows(tmp_path):
    """A sweep's best rows say which side of a disaggregated search found nothing, and why, as
    `optimize --disagg` prints it."""
    spec = {"sweep": {"mode": "disagg"},
            "grid": {"model": "Qwen/Qwen3-8B", "device": "H200_SXM", "num_devices": 2, "input_length": 2048,
                     "output_length": 256, "max_batched_tokens": 8192, "ttft_limit_ms": 5000, "tpot_limit_ms": 1}}
    run_sweep(expand(spec), tmp_path, backend="inline", progress=False)
    best = read_table(tmp_path, "best")
    failed = best[~best["feasible"]]
    assert failed["role"].tolist() == ["decode"]
    assert failed["message"].iloc[0].startswith("no decode instance meets TPOT <= 1 ms: TPOT fails first")
    assert set(best[best["feasible"]]["role"]) == {"prefill"}


def test_prefix_caching_changes_a_scenario_s_id_only_where_it_changes_its_results(tmp_path):
    """The prefix cache matters only when the client reuses prompts (aiperf): elsewhere both values are
    one scenario, with the id it had before the field existed, so a resumed sweep finds its rows."""
    from orchestrator.spec import expand, load_spec

    def ids(benchmark):
        path = tmp_path / f"{benchmark}.toml"
        path.write_text('[grid]\nmodel = "Qwen/Qwen3-8B"\ndevice = "H100_SXM"\nnum_devices = 1\ninput_length = 1024\n'
                        'output_length = 128\nprefix_caching = ["on", "off"]\n[options]\nengine = "vllm"\n'
                        f'arrival = "closed"\nbenchmark = "{benchmark}"\n')
        return [item.id for item in expand(load_spec(path))]

    steady, aiperf = ids("steady"), ids("aiperf")
    assert len(steady) == 1 and len(aiperf) == 2 and steady[0] not in aiperf  # one scenario where it is inert


def test_async_scheduling_changes_a_scenario_s_id_only_where_it_is_not_the_engine_s_own(tmp_path):
    """The engine's own async scheduling (vLLM: on) keeps the id a scenario had before the field
    existed; the other value is another scenario."""
    from orchestrator.spec import expand, load_spec

    def ids(values: str):
        path = tmp_path / "spec.toml"
        grid = f"async_scheduling = {values}\n" if values else ""
        path.write_text('[grid]\nmodel = "Qwen/Qwen3-8B"\ndevice = "H100_SXM"\nnum_devices = 1\ninput_length = 1024\n'
                        f'output_length = 128\n{grid}[options]\nengine = "vllm"\n')
        return [item.id for item in expand(load_spec(path))]

    unset, on, both = ids(""), ids('["on"]'), ids('["on", "off"]')
    assert on == unset and len(both) == 2 and unset[0] in both


def test_a_scenario_s_id_is_the_one_its_fields_always_gave():
    """Ids name finished scenarios for a resumed sweep: the digest of the fields as `dataclasses.asdict` gives
    them (a length distribution as its kind and bins), pinned here as they were before the id skipped asdict's
    copies (`spec._plain`), for a fixed length and two distributions."""
    from orchestrator.spec import expand

    grid = {"model": "Qwen/Qwen3-8B", "device": "H200_SXM", "num_devices": 1, "output_length": 32, "tp": 1,
            "input_length": ["uniform:100:300", 1024, "bins:10-100@0.5,100-900@0.5"], "max_batched_tokens": 2048,
            "tpot_limit_ms": 20}
    assert [item.id for item in expand({"grid": grid})] == ["8c4726313bdae5ab", "abb54f86fc3cc07b",
                                                           "ae16890c7e020e5f"]


def test_a_write_a_killed_searcher_cut_short_is_removed_and_nothing_else(tmp_path):
    """A searcher killed mid-write (the driver interrupted) leaves its temporary file; once the killed searchers are
    gone the driver removes such files (`Dataset.discard_temporaries`, called by `run_ray` where it killed searchers
    with calls in flight: test_interrupted_driver_resumes_without_loss_or_duplicates), and only those (a user's file
    of another name stays, and so does a finished scenario)."""
    from orchestrator.dataset import Dataset
    from orchestrator.results import temporary_name

    out = tmp_path / "out"
    run_sweep(expand(SPEC)[:1], out, backend="inline", progress=False)
    cut = temporary_name(out / "best" / "model=x" / "device=y" / "0123456789abcdef.parquet")
    cut.parent.mkdir(parents=True)
    cut.write_bytes(b"PAR1 half")
    (out / "notes.tmp").write_text("mine")
    finished = list(out.glob("best/*/*/*.parquet"))
    assert Dataset(out).discard_temporaries() == 1
    assert not cut.exists() and (out / "notes.tmp").exists() and finished == list(out.glob("best/*/*/*.parquet"))
