"""Request mixes: the length syntax, seeded sampling, traces replayed exactly (by hand)."""

import numpy as np
import pytest

from simulator import TokenBudget, Workload, per_request, per_step, plan, simulate, step_times
from simulator.mix import Lengths, MixError, RequestMix, Trace


@pytest.mark.parametrize("text, kind, bounds", [
    ("1024", "fixed", (1024, 1024)),
    ("uniform:100:200", "uniform", (100, 200)),
    ("normal:500:100:1:2000", "normal", (1, 2000)),
    ("lognormal:2000:0.8:100:16000", "lognormal", (100, 16000)),
    ("bins:1-128@3,129-2048@1.5", "bins", (1, 2048)),
])
def test_each_kind_reads_back_as_written_and_draws_within_its_bounds(text, kind, bounds):
    lengths = Lengths.parse(text)
    assert (lengths.kind, lengths.bounds, str(lengths)) == (kind, bounds, text)
    draws = lengths.sample(np.random.default_rng(0), 5000)
    assert draws.min() >= bounds[0] and draws.max() <= bounds[1] and draws.dtype == np.int64
    assert abs(draws.mean() - lengths.mean()) < 0.05 * lengths.mean() + 1


def test_the_moments_are_the_ones_asked_for():
    rng = np.random.default_rng(1)
    assert Lengths.parse("uniform:100:200").sample(rng, 20000).mean() == pytest.approx(150, abs=1.5)
    assert np.median(Lengths.parse("lognormal:2000:0.5:1:100000").sample(rng, 20000)) == pytest.approx(2000, rel=0.03)
    bins = Lengths.parse("bins:1-10@3,91-100@1").sample(rng, 20000)
    assert (bins <= 10).mean() == pytest.approx(0.75, abs=0.01) and set(np.unique(bins)) <= set(range(1, 101))
    normal = Lengths.parse("normal:50:10:45:55").sample(rng, 20000)
    assert normal.min() == 45 and normal.max() == 55  # clipped, not redrawn


@pytest.mark.parametrize("text", ["", "abc", "uniform:10", "uniform:20:10", "normal:5:1:0:9", "lognormal:0:1:1:9",
                                  "bins:5-1@1", "bins:1-5@0", "poisson:3", "uniform:1.5:3", "0", "-3"])
def test_a_bad_length_is_refused_with_the_syntax(text):
    with pytest.raises(MixError):
        Lengths.parse(text)


def test_sampling_is_seeded_and_apart_from_the_arrival_stream():
    mix = RequestMix(Lengths.parse("uniform:1:1000"), Lengths.parse("uniform:2:50"))
    a = Workload(500, 20, 512, 4, arrival="poisson", request_rate=5.0, num_prompts=50, seed=3, mix=mix)
    b = Workload(500, 20, 512, 4, arrival="poisson", request_rate=5.0, num_prompts=50, seed=3, mix=mix)
    c = Workload(500, 20, 512, 4, arrival="poisson", request_rate=5.0, num_prompts=50, seed=4, mix=mix)
    for x, y in zip(a.request_lengths(), b.request_lengths(), strict=True):
        assert np.array_equal(x, y)
    assert not np.array_equal(a.request_lengths()[0], c.request_lengths()[0])
    plain = Workload(500, 20, 512, 4, arrival="poisson", request_rate=5.0, num_prompts=50, seed=3)
    assert np.array_equal(a.arrival_times_ms(), plain.arrival_times_ms())  # a mix does not move the arrivals


def _trace(tmp_path, text, name="t.csv"):
    path = tmp_path / name
    path.write_text(text)
    return Trace.load(path)


def test_a_hand_written_trace_is_replayed_at_its_times(tmp_path):
    """Three requests through the token budget (B = 8), every forward entry 10 ms (a fused step costs
    10 ms per entry). r1 (8 in, 3 out) at 0: prefill [0, 10], decode [10, 20] and [20, 40] (with r2's
    prefill): TTFT 10, TPOT 15. r2 (4 in, 2 out) at 15 ms waits for the step that starts at 20: TTFT
    40 - 15 = 25, decodes [40, 50]: TPOT 10. r3 (12 in, 1 out) at 100 ms: chunks of 8 and 4, first
    and last token at 120: TTFT 20."""
    trace = _trace(tmp_path, "input_length,output_length,arrival_time\n8,3,0\n4,2,0.015\n12,1,0.1\n")
    w = Workload(8, 2, 8, 1, arrival="poisson", request_rate=0.0, measure="all",
                 mix=RequestMix(Lengths.parse("8"), Lengths.parse("2"), trace))
    ten = lambda keys: [10.0] * len(keys)  # noqa: E731
    m = simulate(w, ten, TokenBudget())
    assert m.ttft_ms == pytest.approx((10 + 25 + 20) / 3) and m.tpot_ms == pytest.approx((15 + 10 + 0) / 3)
    assert m.makespan_ms == 120 and m.num_prompts == 3 and m.measured_requests == 3
    assert m.output_throughput == pytest.approx(1000 * 6 / 120)  # 3 + 2 + 1 tokens
    from simulator import StepPricer

    pricer = StepPricer(ten, TokenBudget())
    p = plan(w, TokenBudget(), step_ms=pricer)
    rows = per_request(p, step_times(p, pricer.prices(p)))
    assert rows["arrival_ms"].tolist() == [0, 15, 100] and rows["first_token_ms"].tolist() == [10, 40, 120]
    assert rows["finish_ms"].tolist() == [40, 50, 120] and rows["input_length"].tolist() == [8, 4, 12]
    assert rows["tpot_ms"].tolist() == [15, 10, 0]
    assert rows["ttft_ms"].tolist() == [10, 25, 20] and rows["e2e_ms"].tolist() == [40, 35, 20]
    assert rows["output_length"].tolist() == [3, 2, 1] and rows["cached_tokens"].tolist() == [0, 0, 0]
    assert rows["measured"].tolist() == [True, True, True]
    steps = per_step(p, step_times(p, pricer.prices(p)))
    assert steps["tokens"].tolist() == [8, 1, 5, 1, 8, 4] and steps["start_ms"].tolist() == [0, 10, 20, 40, 100, 110]
    assert steps["end_ms"].tolist() == [10, 20, 40, 50, 110, 120] and steps["step"].tolist() == list(range(6))
    assert steps["prefill_tokens"].tolist() == [8, 0, 4, 0, 8, 4] and steps["prefill_requests"].tolist() == \
        [1, 0, 1, 0, 1, 1]
    assert steps["decode_requests"].tolist() == [0, 1, 1, 1, 0, 0] and set(steps["budget"]) == {8}
    faster = Workload(8, 2, 8, 1, arrival="poisson", request_rate=20.0, measure="all", mix=w.mix)
    assert faster.arrival_times_ms().tolist() == pytest.approx([0, 15, 100])  # 3 requests over 0.1 s: 20 req/s
    assert Workload(8, 2, 8, 1, arrival="poisson", request_rate=40.0, mix=w.mix).arrival_times_ms()[-1] == \
        pytest.approx(50)


def test_per_request_tables_of_an_untimed_plan_and_a_prefill_instance():
    """A burst of 2 (4 prompt tokens, 3 output) at B = 8, 10 ms a forward entry, decode-first: one
    step prefills both (10 ms), two decode steps follow (10 ms each)."""
    w = Workload(4, 3, 8, 2)
    p = plan(w)
    durations = step_times(p, np.full(len(p.price_keys), 10.0))
    rows = per_request(p, durations)
    assert rows["first_token_ms"].tolist() == [10, 10] and rows["finish_ms"].tolist() == [30, 30]
    assert rows["tpot_ms"].tolist() == [10, 10] and rows["ttft_ms"].tolist() == [10, 10]
    steps = per_step(p, durations)
    assert steps["start_ms"].tolist() == [0, 10, 20] and steps["prefill_requests"].tolist() == [2, 0, 0]
    prefill = plan(w, phase="prefill")
    only = per_request(prefill, step_times(prefill, np.full(len(prefill.price_keys), 10.0)))
    assert only["tpot_ms"].tolist() == [0, 0] and only["finish_ms"].tolist() == [10, 10]


def test_chunk_plan_names_what_it_refuses():
    from simulator import chunk_plan

    assert [(c.query_len, c.seq_len) for c in chunk_plan(1, 1)] == [(1, 1)]
    assert [(c.query_len, c.seq_len) for c in chunk_plan(10, 4)] == [(4, 4), (4, 8), (2, 10)]
    with pytest.raises(ValueError, match="^effective_input_length must be an integer >= 1, got 0$"):
        chunk_plan(0, 4)
    with pytest.raises(ValueError, match="^max_batched_tokens must be an integer >= 1, got 0$"):
        chunk_plan(4, 0)


def test_an_untimed_trace_feeds_the_closed_loop_in_file_order_with_its_cached_tokens(tmp_path):
    trace = _trace(tmp_path, '{"input_length": 10, "output_length": 2, "cached_tokens": 6}\n'
                             '{"input_length": 30, "output_length": 5}\n', "t.jsonl")
    assert trace.cached_tokens == (6, -1)  # the second row leaves it to the hit rate
    w = Workload(10, 2, 64, 1, arrival="closed", num_prompts=4, mix=RequestMix(Lengths.parse("10"),
                                                                               Lengths.parse("2"), trace))
    prompts, outputs, cached = w.request_lengths()
    assert prompts.tolist() == [10, 30, 10, 30] and outputs.tolist() == [2, 5, 2, 5]
    p = plan(w)
    firsts = [s for s in (p.shapes[i] for i in p.step_shape) if any(not k.is_decode for k in s)]
    assert [k.query_len for s in firsts for k in s if not k.is_decode] == [4, 30, 4, 30]  # 10 - 6 cached


@pytest.mark.parametrize("text, message", [
    ("input_length\n5\n", "column output_length is missing"),
    ("input_length,output_length\n5,x\n", "row 2, column output_length: 'x' is not allowed; expected an integer >= 1"),
    # a column with one bad cell is read as text, the good ones too: the bad one is named, not the first
    ("input_length,output_length\n100,10\nabc,5\n", "row 3, column input_length: 'abc' is not allowed"),
    ("input_length,output_length\n100,10\n7.5,5\n", "row 3, column input_length: 7.5 is not allowed"),
    ("input_length,output_length\n5,0\n", "row 2, column output_length: 0 is not allowed"),
    ("input_length,output_length,arrival_time\n5,2,1\n5,2,0.5\n", "row 3, column arrival_time: arrival times must "
                                                                  "not decrease"),
    ("input_length,output_length,cached_tokens\n5,2,5\n", "row 2, column cached_tokens: must be < input_length"),
    ("input_length,output_length\n", "no requests"),
])
def test_a_bad_trace_names_row_and_column(tmp_path, text, message):
    with pytest.raises(MixError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _trace(tmp_path, text)


def test_parquet_traces_and_content_digests(tmp_path):
    import pandas as pd

    pd.DataFrame({"input_length": [5, 6], "output_length": [2, 3]}).to_parquet(tmp_path / "t.parquet")
    a = Trace.load(tmp_path / "t.parquet")
    assert a.input_length == (5, 6) and not a.timed and str(a).startswith("trace:t.parquet@")
    pd.DataFrame({"input_length": [5, 7], "output_length": [2, 3]}).to_parquet(tmp_path / "t.parquet")
    assert Trace.load(tmp_path / "t.parquet").digest != a.digest


def test_the_mean_of_each_kind_by_hand():
    assert Lengths.parse("7").mean() == 7.0 and Lengths.parse("uniform:100:200").mean() == 150.0
    assert Lengths.parse("bins:1-3@1,5-7@3").mean() == (1 * 2 + 3 * 6) / 4
    assert Lengths.parse("normal:50:10:1:1000").mean() == pytest.approx(50, abs=0.3)  # clipping far away
    assert Lengths.parse("normal:50:10:45:55").mean() == pytest.approx(50, abs=0.1)   # symmetric clipping
    assert Lengths.parse("lognormal:100:0.5:1:100000").mean() == pytest.approx(100 * np.exp(0.125), rel=0.01)


def test_trace_rows_and_times_by_hand(tmp_path):
    t = _trace(tmp_path, '{"input_length": 5, "output_length": 2, "arrival_time": 1.5}\n'
                         '{"input_length": 6, "output_length": 3, "arrival_time": 1.5}\n'
                         '{"input_length": 7, "output_length": 4, "arrival_time": 2.0}\n', "t.json")
    assert t.arrival_time == (0.0, 0.0, 0.5) and t.input_length == (5, 6, 7)  # from the first; ties are fine
    assert len(t.digest) == 12
    with pytest.raises(MixError, match=r"^trace .*t.csv row 3, column cached_tokens: must be < input_length "
                                       r"\(at least one prompt token is computed\)$"):
        _trace(tmp_path, "input_length,output_length,cached_tokens\n5,2,4\n5,2,5\n")
    with pytest.raises(MixError, match=r"row 2, column arrival_time: 'x' is not allowed; expected a number >= 0$"):
        _trace(tmp_path, "input_length,output_length,arrival_time\n5,2,x\n")
    with pytest.raises(MixError, match=r"^trace .*bad.parquet: not a readable CSV, JSONL or Parquet file \("):
        (tmp_path / "bad.parquet").write_text("no")
        Trace.load(tmp_path / "bad.parquet")
    with pytest.raises(MixError, match=r"column output_length is missing \(columns: input_length, output_length, "
                                       r"arrival_time, cached_tokens\)$"):
        _trace(tmp_path, "input_length\n5\n")
    times = _trace(tmp_path, "input_length,output_length,arrival_time\n5,2,0.25\n5,2,0.75\n").arrival_time
    assert times == (0.0, 0.5) and all(isinstance(x, float) for x in times)


def test_token_budget_options_name_what_they_refuse():
    from simulator import TokenBudget

    assert TokenBudget(max_num_seqs=1, long_prefill_token_threshold=0).long_prefill_token_threshold == 0
    with pytest.raises(ValueError, match="^max_num_seqs must be an integer >= 1, got 0$"):
        TokenBudget(max_num_seqs=0)
    with pytest.raises(ValueError, match="^long_prefill_token_threshold must be an integer >= 0, got -1$"):
        TokenBudget(long_prefill_token_threshold=-1)


def test_pd_rates_by_hand_and_their_refusals():
    from simulator import decode_qps, prefill_qps

    assert prefill_qps(4, 0.5) == pytest.approx(8000.0) and decode_qps(3, 0.5, 2) == pytest.approx(6000.0)
    assert decode_qps(2, 10.0, 1) == pytest.approx(200.0)  # one output token: one step
    with pytest.raises(ValueError, match="^ttft_ms must be > 0, got 0$"):
        prefill_qps(1, 0)
    with pytest.raises(ValueError, match="^tpot_ms must be > 0, got 0$"):
        decode_qps(1, 0, 5)


def test_each_distribution_has_the_spread_asked_for():
    rng = np.random.default_rng(7)
    normal = Lengths.parse("normal:500:100:1:5000").sample(rng, 40000)
    assert normal.std() == pytest.approx(100, rel=0.03) and normal.mean() == pytest.approx(500, rel=0.01)
    log = np.log(Lengths.parse("lognormal:1000:0.5:1:1000000").sample(rng, 40000))
    assert np.median(log) == pytest.approx(np.log(1000), abs=0.02) and log.std() == pytest.approx(0.5, rel=0.03)
    assert set(np.unique(Lengths.parse("uniform:1:3").sample(rng, 3000))) == {1, 2, 3}  # both ends drawn
    bins = Lengths.parse("bins:10-10@1,20-21@1").sample(rng, 4000)
    assert set(np.unique(bins)) == {10, 20, 21} and (bins == 10).mean() == pytest.approx(0.5, abs=0.03)
    assert Lengths.parse(12).sample(rng, 3).tolist() == [12, 12, 12]


def test_burstiness_keeps_the_rate_and_changes_the_spread():
    """vllm bench serve's gamma gaps: mean 1 / rate whatever the shape; shape < 1 spreads them more."""
    for burstiness in (0.5, 1.0, 4.0):
        w = Workload(10, 2, 64, 1, arrival="poisson", request_rate=5.0, burstiness=burstiness, num_prompts=20000)
        gaps = np.diff(w.arrival_times_ms())
        assert gaps.mean() == pytest.approx(200.0, rel=0.03), burstiness
        assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.05), burstiness


def test_token_budget_caps_running_decodes_at_max_num_seqs():
    from simulator.scheduler import QueueView, TokenBudget

    step = TokenBudget(max_num_seqs=2).plan_step(QueueView([], 5, (10,), 64, 1))
    assert step.decode == 2 and step.takes == ()
    assert TokenBudget().plan_step(QueueView([], 5, (10,), 64, 1)).decode == 5


@pytest.mark.parametrize("text, message", [
    ("normal:20:-1:1:40", "normal:20:-1:1:40: the spread must be >= 0"),
    ("lognormal:3:-0.5:1:7", "lognormal:3:-0.5:1:7: the spread must be >= 0"),
    ("normal:20:10:1.5:40", "normal:20:10:1.5:40: lengths must be integers with 1 <= low <= high"),
    ("lognormal:3:0.8:1:7.5", "lognormal:3:0.8:1:7.5: lengths must be integers with 1 <= low <= high"),
    ("lognormal:0:0.8:1:7", "lognormal:0:0.8:1:7: the median must be > 0"),
    ("uniform:5:4", "uniform:5:4: lengths must be integers with 1 <= low <= high"),
])
def test_each_distribution_s_parameters_are_checked_at_their_edges(text, message):
    with pytest.raises(MixError) as err:
        Lengths.parse(text)
    assert str(err.value) == message


@pytest.mark.parametrize("text", ["normal:20:0:1:40", "lognormal:3:0:1:7", "lognormal:0.5:0.8:1:7",
                                  "normal:20.5:3.5:1:40", "uniform:4:4"])
def test_the_edges_of_each_distribution_are_accepted(text):
    assert str(Lengths.parse(text)) == text


def test_a_prefill_instance_has_no_inter_token_latency_and_a_point_echoes_its_workload():
    """A prefill-only instance emits one token a request: ITL is 0, not undefined; the metrics carry
    the point's own budget, arrival, rate, devices and effective prompt back."""
    w = Workload(100, 8, 64, 4, prefix_cache_hit_rate=0.25, arrival="poisson", num_prompts=12, request_rate=3.0)
    from simulator.scheduler import DecodeFirstWithSlack

    m = simulate(w, lambda keys: [1.0] * len(keys), DecodeFirstWithSlack(), phase="prefill", num_devices=3)
    assert (m.itl_ms, m.itl_p50_ms, m.itl_p90_ms, m.itl_p99_ms) == (0.0, 0.0, 0.0, 0.0)
    assert (m.max_batched_tokens, m.arrival, m.request_rate, m.num_devices, m.effective_input_length) == \
        (64, "poisson", 3.0, 3, 75)


def test_a_bad_jsonl_trace_line_is_named_by_its_own_line(tmp_path):
    """A JSONL trace has no header: its second line is row 2 (a CSV's second request is its row 3)."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"input_length": 100, "output_length": 10}\n{"input_length": "x", "output_length": 5}\n')
    with pytest.raises(MixError, match=r"t.jsonl row 2, column input_length: 'x' is not allowed"):
        Trace.load(path)
    path.write_text('{"input_length": 5, "output_length": 2, "cached_tokens": 1}\n'
                    '{"input_length": 5, "output_length": 2, "cached_tokens": 5}\n')
    with pytest.raises(MixError, match=r"t.jsonl row 2, column cached_tokens: must be < input_length"):
        Trace.load(path)
