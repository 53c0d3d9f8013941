"""A benchmark client's prompt pool and the engine's prefix cache: hand-computed hits, the cache's
LRU, an independent per-request count of hits, and plans with hits against the per-request reference."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import TokenBudget, Workload, per_step, plan, simulate
from simulator.benchmarks import AIPERF_DATASET_ENTRIES, protocol
from simulator.prompts import PromptCache, PromptPool, cached_on_hit
from tests.conftest import examples
from tests.simulator.test_timeline import _assert_plays_as_reference, policies


def test_a_hit_serves_whole_blocks_and_leaves_a_token_to_compute():
    assert cached_on_hit(np.array([1, 16, 17, 32, 1024, 1025])).tolist() == [0, 0, 16, 16, 1008, 1024]


def test_the_cache_drops_the_least_recently_used_prompt():
    cache = PromptCache(10)
    cache.keep(1, 4)
    cache.keep(2, 4)
    assert cache.hit(1)          # 1 is now the most recently used
    cache.keep(3, 4)             # 12 tokens: 2 goes
    assert (cache.hit(2), cache.hit(1), cache.hit(3), cache.tokens) == (False, True, True, 8)
    cache.keep(4, 11)            # longer than the cache: never kept, nothing dropped
    assert (cache.hit(4), cache.tokens) == (False, 8)
    assert not PromptCache(0).hit(1) and PromptCache(None).capacity is None


def test_one_prompt_hits_from_the_second_wave_on():
    # a pool of one prompt, four requests at once, then replacements: the first wave finds nothing
    # (the prompt is being computed), every later request finds it; after a warm-up, all do
    def hits(pool):
        return pool.hits(pool.draws(10, seed=0), np.array([64]), wave=4)

    assert hits(PromptPool(size=1, cached=True)).tolist() == [False] * 4 + [True] * 6
    assert hits(PromptPool(1, warmup=8, cached=True)).all()
    assert not hits(PromptPool(1, cached=True, cache_tokens=0)).any()  # a cache that keeps nothing
    assert not hits(PromptPool(1)).any()  # an engine without a prefix cache
    with pytest.raises(ValueError, match="prompt_pool.size"):
        PromptPool(0)


def _hits_by_hand(draws, warmup, wave, n):
    """Plain count, independent of PromptCache: a request hits when its prompt was drawn by the warm-up or
    by an earlier request outside its own first wave (an unbounded cache)."""
    seen, out = set(draws[:warmup]), []
    played = draws[warmup:]
    for i in range(n):
        out.append(played[i] in seen)
        if i >= wave - 1:
            seen.update(played[: i + 1])
    return out


@settings(max_examples=examples(200), deadline=None)
@given(size=st.integers(1, 30), warmup=st.integers(0, 20), wave=st.integers(1, 12), n=st.integers(1, 80),
       seed=st.integers(0, 5))
def test_hits_equal_a_plain_count(size, warmup, wave, n, seed):
    pool = PromptPool(size, warmup, cached=True)
    draws = pool.draws(n, seed)
    assert pool.hits(draws, np.full(size, 100), wave).tolist() == _hits_by_hand(draws.tolist(), warmup, wave, n)


def test_aiperf_draws_from_its_hundred_prompts_its_warm_up_first():
    assert AIPERF_DATASET_ENTRIES == 100
    assert protocol("aiperf").pool("closed", 8) == (100, 16)
    assert protocol("aiperf").pool("poisson", 1) == (100, 0)  # a stream has no warm-up to drain
    assert protocol("aiperf").pool("burst", 8) == (0, 0)      # the RFC's window: every prompt new
    assert protocol("vllm-bench").pool("closed", 8) == (0, 0)  # its random dataset: every prompt new
    assert protocol("steady").pool("closed", 8) == (0, 0)


def _aiperf_loop(c=8, prompt=1024, output=16, caching=True, **kw):
    return Workload(prompt, output, 2048, c, arrival="closed", num_prompts=20 * c, measure="all",
                    prompt_pool=PromptPool(100, 2 * c, cached=caching), **kw)


def test_a_workload_s_hits_are_its_pool_s_and_a_miss_keeps_the_rate():
    w = _aiperf_loop(prefix_cache_hit_rate=0.25)
    inputs, _, cached = w.request_lengths()
    hit = w.prompt_pool.hits(w.prompt_pool.draws(w.prompts, w.seed), np.full(100, 1024), wave=8)
    assert 0 < hit.mean() < 1 and (inputs == 1024).all()
    assert cached[hit].tolist() == [1008] * hit.sum() and cached[~hit].tolist() == [256] * (~hit).sum()
    off = dataclasses.replace(w, prompt_pool=dataclasses.replace(w.prompt_pool, cached=False))
    assert off.request_lengths()[2].tolist() == [256] * w.prompts and off.kinds.kind_of is None
    kept = dataclasses.replace(w, prompt_pool=dataclasses.replace(w.prompt_pool, cache_tokens=0))
    assert kept.request_lengths()[2].tolist() == [256] * w.prompts  # the cache keeps nothing


def test_a_mixed_pool_repeats_each_prompt_s_lengths():
    from simulator.mix import Lengths, RequestMix

    mix = RequestMix(Lengths.parse("uniform:100:900"), Lengths.parse("uniform:10:50"))
    w = dataclasses.replace(_aiperf_loop(), mix=mix, prompt_pool=PromptPool(5, 16, cached=True))
    inputs, outputs, cached = w.request_lengths()
    assert len(set(zip(inputs.tolist(), outputs.tolist(), strict=True))) <= 5
    assert ((cached == 0) | (cached == (inputs - 1) // 16 * 16)).all() and (cached > 0).any()


def test_cached_prompts_make_the_loop_faster_and_nothing_else_changes():
    """Hits only take prefill work away, 1,008 of each hit's 1,024 prompt tokens (the steps' prefill
    tokens say so), so TTFT and TPOT fall; with the cache off the pool is invisible."""
    lm = lambda keys: np.array([0.5 + 0.01 * k.concurrency * k.query_len for k in keys])  # noqa: E731
    w = _aiperf_loop()
    hits = int((w.request_lengths()[2] > 0).sum())
    prefilled = {}
    for caching in (True, False):
        p = plan(_aiperf_loop(caching=caching), TokenBudget())
        prefilled[caching] = per_step(p, np.ones(p.num_steps))["prefill_tokens"].sum()
    assert prefilled[False] == 1024 * w.prompts and prefilled[True] == prefilled[False] - 1008 * hits
    on, off = simulate(w, lm, TokenBudget()), simulate(_aiperf_loop(caching=False), lm, TokenBudget())
    plain = simulate(dataclasses.replace(_aiperf_loop(caching=False), prompt_pool=None), lm, TokenBudget())
    assert on.ttft_ms < off.ttft_ms and on.tpot_ms < off.tpot_ms
    assert (off.ttft_ms, off.tpot_ms) == (plain.ttft_ms, plain.tpot_ms)


@settings(max_examples=examples(60), deadline=None)
@given(c=st.integers(1, 6), prompt=st.integers(1, 70), pool=st.integers(1, 12), capacity=st.sampled_from([None, 0, 64]),
       policy=policies)
def test_plans_with_cached_prompts_equal_the_reference(c, prompt, pool, capacity, policy):
    w = dataclasses.replace(_aiperf_loop(c, prompt, 5), prompt_pool=PromptPool(pool, 2 * c, True, capacity),
                            max_batched_tokens=48)
    _assert_plays_as_reference(plan(w, policy), w, policy)


def test_a_pool_is_refused_with_a_trace():
    from simulator.mix import Lengths, RequestMix, Trace

    trace = Trace("t.csv", "x", (4, 4), (2, 2))
    with pytest.raises(ValueError, match="prompt_pool does not apply to a trace"):
        Workload(4, 2, 8, 1, arrival="closed", mix=RequestMix(Lengths.parse(4), Lengths.parse(2), trace),
                 prompt_pool=PromptPool(3))
