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
