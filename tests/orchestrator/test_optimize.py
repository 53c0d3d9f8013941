import pytest

from latency import ForwardKey
from orchestrator.evaluate import evaluate_point, workload
from orchestrator.jobs import Job
from orchestrator.modes import Aggregated, make_mode
from orchestrator.optimize import optimize
from orchestrator.scenario import InputError, Layout, Scenario
from simulator import decode_qps, prefill_qps

RFC = Scenario("Qwen/Qwen3-32B", "TEST_DEVICE", 1, 32768, 1024, (8192,), tpot_limits=(1000.0,),
               quantization="W8A8_DYNAMIC")


def test_rfc_example_finds_concurrency_two_with_four_chunks():
    r = optimize(RFC)
    (best,) = r.best
    assert best["concurrency"] == 2 and best["prefill_num_chunks"] == 4 and best["tp"] == 1
    assert best["tpot_ms"] <= 1000 and best["fits_memory"]
    assert best["weights_gib"] == pytest.approx(31.98, rel=0.005)  # the reference tool's figure
    three = evaluate_point(RFC, Job("agg", Layout(1), 8192), 3)
    assert not three["fits_memory"]  # 3 x (32768 + 1024) tokens exceed the KV capacity
    concurrencies = [p["concurrency"] for p in r.points]
    assert len(concurrencies) == len(set(concurrencies))


def test_single_chunk_equals_full_prefill():
    s = RFC.with_(input_length=4096, max_batched_tokens=(8192,))
    row = evaluate_point(s, Job("agg", Layout(1), 8192), 1)
    lm = s.latency_model(Layout(1))
    assert row["prefill_num_chunks"] == 1
    assert row["ttft_ms"] == pytest.approx(lm.latency_ms([ForwardKey(False, 1, 4096, 4096)])[0])


def test_smaller_budget_more_chunks_later_first_token_less_throughput():
    rows = [evaluate_point(RFC, Job("agg", Layout(1), b), 2) for b in (2048, 4096, 8192, 16384, 32768)]
    chunks = [r["prefill_num_chunks"] for r in rows]
    assert chunks == [16, 8, 4, 2, 1]
    ttft = [r["ttft_ms"] for r in rows]
    assert ttft == sorted(ttft, reverse=True)
    tput = [r["output_throughput"] for r in rows]
    assert tput == sorted(tput)


def test_prefix_cache_shortens_prefill_but_not_decode():
    hit = RFC.with_(prefix_cache_hit_rate=0.5)
    a = evaluate_point(RFC, Job("agg", Layout(1), 8192), 1)
    b = evaluate_point(hit, Job("agg", Layout(1), 8192), 1)
    assert (b["effective_input_length"], b["prefill_num_chunks"]) == (16384, 2)
    assert b["ttft_ms"] < a["ttft_ms"]
    da = evaluate_point(RFC, Job("decode", Layout(1), 8192), 2)
    db = evaluate_point(hit, Job("decode", Layout(1), 8192), 2)
    assert da["tpot_ms"] == db["tpot_ms"] and da["peak_kv_tokens"] == db["peak_kv_tokens"]


def test_decode_instance_does_not_depend_on_budget():
    rows = [evaluate_point(RFC.with_(input_length=2048), Job("decode", Layout(1), b), 32) for b in (512, 8192)]
    assert rows[0]["tpot_ms"] == rows[1]["tpot_ms"]


def test_disagg_prefill_uses_chunks_and_pd_split_uses_rfc_formulas():
    s = Scenario("Qwen/Qwen3-8B", "H200_SXM", 8, 16384, 512, (4096,), ttft_limits=(8000.0,),
                 tpot_limits=(30.0,))
    r = optimize(s, make_mode("pd", prefill_devices=2, decode_devices=2))
    pre = next(b for b in r.best if b["role"] == "prefill")
    dec = next(b for b in r.best if b["role"] == "decode")
    assert pre["prefill_num_chunks"] == 4 and pre["ttft_ms"] <= 8000
    assert dec["tpot_ms"] <= 30  # both limits are applied
    (split,) = r.splits
    p, d = prefill_qps(pre["concurrency"], pre["ttft_ms"]), decode_qps(dec["concurrency"], dec["tpot_ms"], 512)
    assert split["pd_ratio"] == pytest.approx(d / p)
    best = max((min(n_p * p, n_d * d) / (2 * n_p + 2 * n_d), n_p, n_d) for n_p in range(1, 4)
                for n_d in range(1, (8 - 2 * n_p) // 2 + 1))
    assert (split["prefill_instances"], split["decode_instances"]) == best[1:]


def test_infeasible_limits_are_a_result():
    r = optimize(RFC.with_(ttft_limits=(50.0,)))
    assert r.best == []
    (item,) = r.infeasible
    assert (item["ttft_limit_ms"], item["tpot_limit_ms"]) == (50.0, 1000.0)
    assert item["message"].startswith("no configuration meets TTFT <= 50 ms and TPOT <= 1000 ms: TTFT fails first")


def test_mtp_speeds_up_decode():
    s = RFC.with_(input_length=2048, output_length=257)
    plain = evaluate_point(s, Job("agg", Layout(1), 8192), 8)
    mtp = evaluate_point(s.with_(mtp_tokens=1, mtp_acceptance_rates=(0.8,)), Job("agg", Layout(1), 8192), 8)
    assert mtp["tpot_ms"] < plain["tpot_ms"]


@pytest.mark.parametrize("change, flag", [
    (dict(max_batched_tokens=(0,)), "--max-batched-tokens"), (dict(input_length=-5), "--input-length"),
    (dict(prefix_cache_hit_rate=1.0), "--prefix-cache-hit-rate"), (dict(device="NOPE"), "--device"),
    (dict(model="nope/x"), "MODEL"), (dict(tp_sizes=(3,), num_devices=4), "--tp-sizes"),
    (dict(tpot_limits=(0.0,)), "--tpot-limits"), (dict(ttft_limits=(-1.0,)), "--ttft-limits"),
    (dict(quantization="W3"), "--quantize-linear-action"), (dict(scheduler="lifo"), "--scheduler"),
])
def test_bad_input_names_the_flag(change, flag):
    with pytest.raises(InputError) as err:
        RFC.with_(**change).validate()
    assert err.value.render("flag").startswith(flag + ":")


@pytest.mark.parametrize("role, budget", [("agg", 8192), ("prefill", 8192), ("decode", 8192)])
def test_memory_bound_is_never_below_a_feasible_point(role, budget):
    from orchestrator.optimize import memory_bound

    s = RFC.with_(input_length=16384, output_length=64, model="Qwen/Qwen3-8B", device="H200_SXM")
    job = Job(role, Layout(1), budget)
    bound = memory_bound(s, job)
    assert bound is not None
    for n in (bound + 1, 2 * bound):  # nothing above the bound fits
        assert not evaluate_point(s, Job(role, Layout(1), budget), n)["fits_memory"]


def test_no_memory_bound_where_none_is_provable():
    from orchestrator.optimize import memory_bound

    assert memory_bound(RFC.with_(input_length=4096), Job("agg", Layout(1), 8192)) is None  # one chunk
    assert memory_bound(RFC.with_(scheduler="token-budget"), Job("agg", Layout(1), 8192)) is None


def test_documented_point_columns_are_the_columns_written():
    from orchestrator.results import POINT_COLUMNS

    row = evaluate_point(RFC.with_(input_length=1024), Job("agg", Layout(1), 8192), 1)
    assert list(row) == list(POINT_COLUMNS)


def test_an_expert_parallel_request_never_silently_disappears():
    moe = Scenario("Qwen/Qwen3-30B-A3B", "H200_SXM", 8, 2048, 128, (8192,), tpot_limits=(50.0,), ep=4,
                   attention_dp_sizes=(1,))
    assert {(x.tp, x.ep) for x in moe.layouts()} == {(4, 4), (8, 4)}  # tp 1 and 2 cannot host ep 4: skipped
    with pytest.raises(InputError) as err:
        moe.with_(tp_sizes=(2,)).validate()
    assert err.value.render("flag").startswith("--tp-sizes: [2]") and \
        "ep=4 must divide tp x attention_dp = 2" in str(err.value)
    with pytest.raises(InputError, match="with --ep-size 16"):
        moe.with_(ep=16).validate()
    assert {r["ep"] for r in optimize(moe).points} == {4}
    # with attention DP searched, ep 4 also spans ranks: tp 1 x 4 ranks, tp 2 x 2 ranks, ...
    wide = {(x.tp, x.attention_dp, x.ep, x.moe_tp) for x in moe.with_(attention_dp_sizes=()).layouts()}
    assert {(1, 4, 4, 1), (1, 8, 4, 2), (2, 2, 4, 1), (2, 4, 4, 2), (4, 1, 4, 1), (8, 1, 4, 2)} <= wide
    assert all(tp * adp % 4 == 0 and 8 % (tp * adp) == 0 for tp, adp, _, _ in wide)


def test_moe_models_search_attention_dp_and_wide_ep_by_default_dense_models_do_not():
    moe = Scenario("Qwen/Qwen3-30B-A3B", "H200_SXM", 4, 2048, 128, (8192,), tpot_limits=(50.0,))
    got = {(x.tp, x.attention_dp, x.ep) for x in moe.layouts()}
    assert got == {(tp, adp, ep) for tp in (1, 2, 4) for adp in (1, 2, 4) if tp * adp <= 4 and 4 % (tp * adp) == 0
                   for ep in {1, tp * adp}}
    dense = Scenario("Qwen/Qwen3-8B", "H200_SXM", 4, 2048, 128, (8192,), tpot_limits=(50.0,))
    assert {(x.tp, x.attention_dp, x.ep) for x in dense.layouts()} == {(1, 1, 1), (2, 1, 1), (4, 1, 1)}
    with pytest.raises(InputError, match="--attention-dp-sizes: \\[2\\].*dense"):
        dense.with_(attention_dp_sizes=(2,)).validate()


def test_attention_dp_ranks_add_up_to_the_instance():
    """attention_dp = 1 is today's layout exactly; with 2 ranks the row is two ranks' throughput at
    twice the concurrency, each rank priced with the MoE layer spanning both."""
    s = Scenario("Qwen/Qwen3-30B-A3B", "H200_SXM", 2, 2048, 128, (8192,), tpot_limits=(50.0,))
    one = evaluate_point(s, Job("agg", Layout(2, 1, 1, 1), 8192), 16)
    again = evaluate_point(s.with_(ep=1, attention_dp_sizes=(1,), tp_sizes=(2,)), Job("agg", Layout(2), 8192), 16)
    assert one == again and one["attention_dp"] == 1 and one["moe_tp"] == 2
    two = evaluate_point(s, Job("agg", Layout(1, 1, 2, 2), 8192), 16)
    alone = evaluate_point(s.with_(num_devices=1), Job("agg", Layout(1), 8192), 16)
    assert (two["concurrency"], two["dp"], two["moe_tp"]) == (32, 1, 1)
    assert two["output_throughput"] == pytest.approx(2 * 1000 * two["num_prompts"] / 2 * 128 / two["makespan_ms"])
    assert two["output_throughput_per_device"] == pytest.approx(two["output_throughput"] / 2)
    assert two["kv_capacity_tokens"] > alone["kv_capacity_tokens"]  # half the experts per device


@pytest.mark.parametrize("arrival", ["closed", "burst"])
def test_a_search_in_two_processes_answers_exactly_as_in_one(arrival, monkeypatch):
    """A steady load's search and a burst's (every prompt at once), each budget's jobs in a process of their
    own, answer as one process does."""
    s = Scenario("Qwen/Qwen3-8B", "H200_SXM", 2, 2048, 128, (2048, 4096), tpot_limits=(20.0, 40.0),
                 arrival=arrival, num_prompts=64)
    import pandas as pd

    import orchestrator.optimize as search_module

    forked, search_in_processes = [], search_module._search_in_processes

    def counted(*args):
        forked.append(len(args[2]))  # the groups shared out
        return search_in_processes(*args)

    monkeypatch.setattr(search_module, "_search_in_processes", counted)
    assert search_module.can_fork()  # else optimize falls back to one process: a run compared with itself
    one, two = optimize(s), optimize(s, processes=2)
    assert forked == [2]  # the two-process search went over forked processes, a group a budget; the other did not
    for a, b in ((one.points, two.points), (one.best, two.best)):
        assert pd.DataFrame(a).equals(pd.DataFrame(b)) and len(a) > 0  # NaN (goodput, cost) equal to NaN
    assert one.infeasible == two.infeasible


def test_timed_jobs_of_one_budget_spread_over_processes_and_answer_as_in_one():
    """A closed loop behind vLLM's front end is timed: its plans depend on each job's prices, so jobs
    of one budget share nothing and go one to a process group; the answer is the same job for job."""
    import pandas as pd

    from orchestrator.forked import can_fork
    from orchestrator.optimize import _groups

    assert can_fork()  # else optimize falls back to one process and this test would compare a run with itself
    s = Scenario("Qwen/Qwen3-8B", "H200_SXM", 2, 2048, 128, (2048,), tpot_limits=(20.0,), arrival="closed",
                 num_prompts=64, engine="vllm", tp_sizes=(1, 2))
    untimed = s.with_(engine="none", max_batched_tokens=(2048, 4096))
    jobs = list(Aggregated().jobs(s))
    assert workload(s, 2048, 4).timed and len(jobs) == 2
    assert _groups(s, jobs) == [[0], [1]]
    assert _groups(untimed, list(Aggregated().jobs(untimed))) == [[0, 2], [1, 3]]  # by budget: plans shared
    one, two = optimize(s), optimize(s, processes=2)
    for a, b in ((one.points, two.points), (one.best, two.best)):
        assert pd.DataFrame(a).equals(pd.DataFrame(b)) and len(a) > 0


@pytest.mark.parametrize("processes", [1, 2])
def test_the_search_bar_hears_of_every_point_and_job_in_this_process_and_in_forked_ones(processes, capsys):
    """The bar of an optimize search counts the points evaluated and the jobs done, those searched in forked
    processes included (a shared count they inherit); shown at once here, it ends at 2 of 2 jobs and every point.
    A search shorter than its `show_after_s` draws nothing."""
    from orchestrator.progress import SearchProgress

    s = Scenario("Qwen/Qwen3-8B", "H200_SXM", 2, 2048, 128, (2048,), tpot_limits=(20.0,), arrival="closed",
                 num_prompts=64, engine="vllm", tp_sizes=(1, 2))
    bar = SearchProgress(show_after_s=0.0)
    result = optimize(s, processes=processes, progress=bar)
    bar.close()
    assert (bar.jobs, bar.done, bar.points) == (2, 2, len(result.points)) and len(result.points) > 4
    assert "2/2 [" in capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    quiet = SearchProgress(show_after_s=60.0)
    optimize(s, processes=processes, progress=quiet)
    assert quiet.points == len(result.points) and quiet.bar is None and capsys.readouterr().err == ""


def test_a_point_of_scenarios_differing_only_in_limits_is_replayed_once_and_judged_per_limits(monkeypatch):
    """A sweep's limit grid repeats points: the second scenario reuses the first one's measured point
    and judges its requests against its own limits (goodput); every other column is the same, and
    goodput equals a fresh replay's with those limits."""
    import orchestrator.evaluate as ev
    from simulator import plan, price, replay, step_times

    calls = []
    measure = ev.measure
    monkeypatch.setattr(ev, "measure", lambda *a, **k: calls.append(1) or measure(*a, **k))
    monkeypatch.setattr(ev, "_measured", type(ev._measured)())
    loose = Scenario("Qwen/Qwen3-8B", "H200_SXM", 1, 2048, 256, (2048,), ttft_limits=(5000.0,), tpot_limits=(60.0,))
    tight = loose.with_(tpot_limits=(9.0,))
    job = Job("agg", Layout(1), 2048)
    a, b = evaluate_point(loose, job, 48), evaluate_point(tight, job, 48)
    assert len(calls) == 1
    assert {k for k in a if a[k] != b[k] and a[k] == a[k]} == {"goodput"}  # NaN (no device price) aside
    w = ev.workload(tight, 2048, 48)
    lm, p = tight.latency_model(job.layout), plan(w, tight.make_scheduler())
    fresh = replay(p, step_times(p, price(lm, p.price_keys, p.scheduler.fused)), 1, None, (5000.0, 9.0))
    assert b["goodput"] == fresh.goodput < a["goodput"]


def test_a_disaggregated_search_says_when_its_decode_side_fails():
    from orchestrator.modes import Disaggregated

    s = Scenario("Qwen/Qwen3-8B", "H200_SXM", 2, 2048, 256, (8192,), ttft_limits=(5000.0,), tpot_limits=(1.0,))
    result = optimize(s, Disaggregated())
    assert any(b["role"] == "prefill" for b in result.best) and not any(b["role"] == "decode" for b in result.best)
    (decode,) = [i for i in result.infeasible if i["role"] == "decode"]
    assert decode["message"].startswith("no decode instance meets TPOT <= 1 ms: TPOT fails first; closest point decode")
    assert decode["message"].endswith("the PD split needs both sides")
    assert not result.splits


def test_the_plan_memo_keeps_plans_by_count_and_by_bytes():
    """A plan asked again is the one made (not made twice); the least recently used leaves first
    once the memo holds more plans than its count or more array bytes than its budget."""
    from orchestrator.evaluate import PlanMemo, _array_bytes
    from simulator import TokenBudget, Workload

    policy = TokenBudget()
    loads = [Workload(100, 10, 64, c) for c in (1, 2, 3)]
    memo = PlanMemo(plans=2)
    first = memo(loads[0], policy, "both", "mean")
    assert memo(loads[0], policy, "both", "mean") is first and memo.made == 1
    memo(loads[1], policy, "both", "mean")
    memo(loads[0], policy, "both", "mean")  # the most recently used now
    memo(loads[2], policy, "both", "mean")  # the count is passed: loads[1] leaves, not loads[0]
    assert memo.made == 3 and [k[0].concurrency for k in memo.memo] == [1, 3]
    third = memo.memo[(loads[2], policy, "both", "mean")][0]
    assert memo.bytes == _array_bytes(first) + _array_bytes(third) > 0
    from simulator import plan

    tight = PlanMemo(budget=_array_bytes(plan(loads[1], policy)))  # room for the second plan's arrays alone
    tight(loads[0], policy, "both", "mean")
    tight(loads[1], policy, "both", "mean")
    assert [k[0].concurrency for k in tight.memo] == [2] and tight.bytes <= tight.budget


@pytest.mark.parametrize("model, device, devices", [("openai/gpt-oss-120b", "H200_SXM", 2),
                                                    ("moonshotai/Kimi-K2.5", "B200", 8),
                                                    ("MiniMaxAI/MiniMax-M2.5", "H200_SXM", 4)])
def test_the_moe_models_people_deploy_now_optimize_from_their_shipped_names(model, device, devices):
    """Each of the measured MoE models searches from its shipped name on vLLM: every layout's best
    point meets the 50 ms TPOT and fits the devices' memory, and the best of all is what evaluating
    its job alone says (at its concurrency per attention-DP rank)."""
    s = Scenario(model, device, devices, 1024, 256, (8192,), tpot_limits=(50.0,), engine="vllm")
    r = optimize(s)
    assert r.best and all(b["tpot_ms"] <= 50.0 and b["fits_memory"] for b in r.best)
    best = max(r.best, key=lambda b: b["output_throughput"])
    layout = Layout(best["tp"], attention_dp=best["attention_dp"], ep=best["ep"])
    per_rank = best["concurrency"] // best["attention_dp"]
    again = evaluate_point(s, Job("agg", layout, best["max_batched_tokens"]), per_rank)
    assert again["tpot_ms"] == pytest.approx(best["tpot_ms"]) and again["ttft_ms"] == pytest.approx(best["ttft_ms"])


def test_a_timed_search_aims_at_the_limits_and_an_untimed_one_doubles():
    """A timed search (a closed loop behind vLLM's front end) aims where its limits' lines reach them and
    finds what doubling and bisecting find, over fewer and smaller concurrencies; an untimed one probes
    the powers of two up to its bracket, as every scenario of its plan family does (they share plans),
    then narrows it where the limit's line crosses, over fewer points than halving it."""
    from orchestrator.evaluate import meets
    from orchestrator.optimize import job_search
    from orchestrator.search import drive, search

    timed = Scenario("Qwen/Qwen3-8B", "H100_SXM", 1, 1024, 256, (8192,), tpot_limits=(20.0,), ttft_limits=(1000.0,),
                     arrival="closed", engine="vllm")
    job = Job("agg", Layout(1), 8192)
    seen: list[int] = []

    def evaluate(ns):
        seen.extend(ns)
        return [evaluate_point(timed, job, n) for n in ns]

    aimed = drive(job_search(timed, job), evaluate)
    aimed_points = list(seen)
    plain = drive(search(lambda r: meets(r, 1000.0, 20.0), timed.max_concurrency), evaluate)
    assert aimed.best[0]["concurrency"] == plain.best["concurrency"]
    assert len(aimed_points) < len(plain.rows) and sum(aimed_points) < sum(plain.rows)

    burst = Scenario("Qwen/Qwen3-8B", "H100_SXM", 1, 1024, 256, (8192,), tpot_limits=(20.0,))
    found = drive(job_search(burst, job), lambda ns: [evaluate_point(burst, job, n) for n in ns])
    rows = {r["concurrency"]: r for r in found.points}
    powers = [n for n in sorted(rows) if n & (n - 1) == 0]  # the bracket's probes (bisection fills in between)
    first_fail = next(n for n in powers if not meets(rows[n], None, 20.0))
    assert powers[:first_fail.bit_length()] == [2 ** k for k in range(first_fail.bit_length())]
    halving = drive(search(lambda r: meets(r, None, 20.0), burst.max_concurrency),
                    lambda ns: [evaluate_point(burst, job, n) for n in ns])  # its bracket narrowed at the middle
    assert found.best[0]["concurrency"] == halving.best["concurrency"] and len(rows) < len(halving.rows)
