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


def linear(a: float, b: float):
    """Rows whose one limit's margin is a + b x concurrency (feasible while it is <= 1)."""
    def evaluate(ns):
        return [{"concurrency": n, "output_throughput": 10.0 * n, "m": a + b * n} for n in ns]
    return evaluate, (lambda row: row["m"] <= 1), (lambda row: (row["m"],))


@settings(max_examples=examples(200), deadline=None)
@given(a=st.floats(0.0, 0.9), slope=st.floats(1e-4, 0.5), cap=st.integers(1, 4000))
def test_aiming_finds_what_doubling_finds_without_overshooting_a_straight_limit(a, slope, cap):
    """Along a straight margin the aim lands at the limit: the same highest feasible concurrency as the
    plain search, no point evaluated twice, none more than 3 past the answer (the neighbours checked),
    and never more concurrency evaluated in all than the plain search spends."""
    evaluate, feasible, margin = linear(a, slope)
    plain, seen = search_concurrency(evaluate, feasible, cap), []
    aimed = search_concurrency(lambda ns: seen.extend(ns) or evaluate(ns), feasible, cap, margin=margin)
    assert aimed.highest_feasible == plain.highest_feasible
    assert len(seen) == len(set(seen)) and max(seen) <= cap
    assert max(seen) <= max(2, aimed.highest_feasible + 3)
    assert sum(seen) <= sum(plain.rows)


def test_aiming_follows_each_limit_and_still_jumps_non_monotone_feasibility():
    """Two limits: TTFT flat near its limit, TPOT rising; the aim follows TPOT's line (to 60) instead of
    the flatter one. A feasible island above the boundary is still found."""
    def evaluate(ns):
        return [{"concurrency": n, "output_throughput": n, "ttft": 0.9 + 0.0001 * n, "tpot": n / 60} for n in ns]
    seen = []
    r = search_concurrency(lambda ns: seen.extend(ns) or evaluate(ns), lambda row: max(row["ttft"], row["tpot"]) <= 1,
                           4096, margin=lambda row: (row["ttft"], row["tpot"]))
    assert r.highest_feasible == 60 and max(seen) <= 63 and 64 not in seen
    island = lambda row: row["concurrency"] <= 10 or 13 <= row["concurrency"] <= 20  # noqa: E731
    r = search_concurrency(fake([]), island, 4096, margin=lambda row: (row["concurrency"] / 11,))
    assert r.highest_feasible == 20
