from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.search import search_concurrency
from tests.conftest import examples


def fake(counter):
    def evaluate(ns):
        counter.extend(ns)
        return [{"concurrency": n, "output_throughput": 10.0 * n} for n in ns]
    return evaluate


@settings(max_examples=examples(200), deadline=None)
@given(boundary=st.integers(0, 700), cap=st.integers(1, 1000), width=st.integers(1, 5))
def test_finds_the_highest_feasible_and_never_evaluates_twice(boundary, cap, width):
    seen = []
    r = search_concurrency(fake(seen), lambda row: row["concurrency"] <= boundary, cap, width=width)
    assert r.highest_feasible == min(boundary, cap)
    assert len(seen) == len(set(seen))
    if r.highest_feasible:
        assert r.best["concurrency"] == r.highest_feasible
        assert r.highest_feasible + 1 > cap or r.highest_feasible + 1 in r.rows  # the neighbour was checked
    else:
        assert r.best is None


def test_non_monotone_feasibility_is_followed():
    feasible = lambda row: row["concurrency"] <= 10 or 13 <= row["concurrency"] <= 20  # noqa: E731
    r = search_concurrency(fake([]), feasible, 4096)
    assert r.highest_feasible == 20


def test_best_is_the_most_throughput_not_the_highest_concurrency():
    def evaluate(ns):
        return [{"concurrency": n, "output_throughput": -abs(n - 5)} for n in ns]
    r = search_concurrency(evaluate, lambda row: row["concurrency"] <= 9, 100)
    assert r.highest_feasible == 9
    assert r.best["concurrency"] in r.rows and r.best["output_throughput"] == max(
        row["output_throughput"] for n, row in r.rows.items() if n <= 9)
