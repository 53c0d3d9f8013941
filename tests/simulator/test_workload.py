import pytest

from simulator import Workload, chunk_plan
from simulator.workload import PrefillChunk


def spans(chunks):
    return [(c.query_len, c.seq_len) for c in chunks]


def test_chunk_plan_rfc_cases():
    assert spans(chunk_plan(4096, 8192)) == [(4096, 4096)]
    assert spans(chunk_plan(10000, 4096)) == [(4096, 4096), (4096, 8192), (1808, 10000)]
    assert len(chunk_plan(32768, 8192)) == 4
    assert chunk_plan(10000, 4096)[2] == PrefillChunk(2, 1808, 10000)


def test_prefix_cache_chunks_the_effective_length():
    w = Workload(input_length=10, output_length=1, max_batched_tokens=3, concurrency=1,
                 prefix_cache_hit_rate=0.5)
    assert (w.cached_prefix_tokens, w.effective_input_length) == (5, 5)
    assert spans(w.chunk_plan()) == [(3, 3), (2, 5)]
    assert w.prefill_num_chunks == 2
    rfc = Workload(32768, 1024, 8192, 1, prefix_cache_hit_rate=0.5)
    assert (rfc.effective_input_length, rfc.prefill_num_chunks) == (16384, 2)


@pytest.mark.parametrize("field, value", [
    ("input_length", 0), ("output_length", -1), ("max_batched_tokens", 0), ("concurrency", 0),
    ("prefix_cache_hit_rate", 1.0), ("prefix_cache_hit_rate", -0.1), ("input_length", 2.5),
])
def test_invalid_workload_names_field_and_value(field, value):
    args = dict(input_length=100, output_length=10, max_batched_tokens=64, concurrency=4)
    args[field] = value
    with pytest.raises(ValueError, match=field) as err:
        Workload(**args)
    assert repr(value) in str(err.value)


def test_mtp_needs_a_rate_per_token():
    with pytest.raises(ValueError, match="mtp_acceptance_rates"):
        Workload(10, 10, 8, 1, mtp_tokens=2, mtp_acceptance_rates=(0.5,))
    w = Workload(10, 11, 8, 1, mtp_tokens=2, mtp_acceptance_rates=(0.5, 0.5, 0.9))
    assert w.tokens_per_decode_step == 2.0 and w.decode_steps == 5 and w.decode_query_len == 3


@pytest.mark.parametrize("fields, message", [
    ({"input_length": 0}, "input_length must be an integer >= 1, got 0"),
    ({"output_length": 0}, "output_length must be an integer >= 1, got 0"),
    ({"max_batched_tokens": 0}, "max_batched_tokens must be an integer >= 1, got 0"),
    ({"concurrency": 0}, "concurrency must be an integer >= 1, got 0"),
    ({"mtp_tokens": -1}, "mtp_tokens must be an integer >= 0, got -1"),
    ({"prefix_cache_hit_rate": 1.0}, "prefix_cache_hit_rate must be a number in [0, 1), got 1.0"),
    ({"prefix_cache_hit_rate": -0.1}, "prefix_cache_hit_rate must be a number in [0, 1), got -0.1"),
    ({"max_batched_tokens": 2, "mtp_tokens": 2, "mtp_acceptance_rates": (0.5, 0.5)},
     "max_batched_tokens=2 cannot hold one decode step of 1 + mtp_tokens=2 tokens"),
    ({"mtp_tokens": 2, "mtp_acceptance_rates": (0.5,)},
     "mtp_acceptance_rates needs 2 values (one per MTP token), got 1"),
    ({"mtp_tokens": 1, "mtp_acceptance_rates": (1.5,)}, "mtp_acceptance_rates must be a number in [0, 1], got 1.5"),
    ({"mtp_tokens": 1, "mtp_acceptance_rates": (-0.5,)}, "mtp_acceptance_rates must be a number in [0, 1], got -0.5"),
    ({"num_prompts": -1}, "num_prompts must be an integer >= 0, got -1"),
    ({"seed": -1}, "seed must be an integer >= 0, got -1"),
    ({"burstiness": 0.0}, "burstiness must be a number > 0, got 0.0"),
    ({"burstiness": -1.0}, "burstiness must be a number > 0, got -1.0"),
    ({"arrival": "poisson", "num_prompts": 4, "request_rate": 0.0}, "request_rate must be a number > 0, got 0.0"),
    ({"arrival": "poisson", "num_prompts": 4, "request_rate": -1.0}, "request_rate must be a number > 0, got -1.0"),
])
def test_each_bad_workload_field_is_named_with_its_range(fields, message):
    with pytest.raises(ValueError) as err:
        Workload(**{"input_length": 10, "output_length": 5, "max_batched_tokens": 8, "concurrency": 2, **fields})
    assert str(err.value) == message


@pytest.mark.parametrize("fields", [
    {"input_length": 1, "output_length": 1, "max_batched_tokens": 1, "concurrency": 1},
    {"mtp_tokens": 2, "max_batched_tokens": 3, "mtp_acceptance_rates": (0.0, 1.0)},
    {"prefix_cache_hit_rate": 0.0}, {"prefix_cache_hit_rate": 0.95},
    {"num_prompts": 0, "seed": 0, "burstiness": 1e-6},
    {"arrival": "poisson", "num_prompts": 4, "request_rate": 1e-6},
])
def test_the_edges_of_each_range_are_accepted(fields):
    Workload(**{"input_length": 10, "output_length": 5, "max_batched_tokens": 8, "concurrency": 2, **fields})
