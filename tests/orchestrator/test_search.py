import math

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.search import AIM_REACH, _aim, _bisect, drive, search_concurrency
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


def test_an_aim_follows_a_limits_line_past_doubling_up_to_its_reach():
    """From feasible 1 and 2 along m = n / L the line reaches the limit at L: probed there when L is
    within AIM_REACH x 2, else at the reach; where no limit rises, doubling."""
    margin = lambda row: (row["m"],)  # noqa: E731
    feasible = lambda row: row["m"] <= 1  # noqa: E731
    for limit, probe in ((5, 5), (8, 8), (1000, 2 * AIM_REACH)):
        rows = {n: {"m": n / limit} for n in (1, 2)}
        assert _aim(rows, feasible, margin, 2) == probe
    flat = {1: {"m": 0.5}, 2: {"m": 0.5}}
    assert _aim(flat, feasible, margin, 2) == 4


def test_a_bracket_along_a_straight_limit_narrows_in_two_probes():
    """m = n / 100 between feasible 40 and infeasible 160: the line crosses 1 at 100 (feasible, on the
    limit), then between 100 and 160 at 100 again, so 101; plain bisection needs seven probes."""
    evaluate, feasible, margin = linear(0.0, 0.01)
    ends = lambda: {n: row for n, row in zip((40, 160), evaluate([40, 160]), strict=True)}  # noqa: E731
    seen, plain = [], []
    lo, hi = drive(_bisect(ends(), feasible, 40, 160, 1, margin), lambda ns: seen.extend(ns) or evaluate(ns))
    assert (lo, hi) == (100, 101) and seen == [100, 101]
    assert drive(_bisect(ends(), feasible, 40, 160, 1), lambda ns: plain.extend(ns) or evaluate(ns)) == (100, 101)
    assert plain == [100, 130, 115, 108, 104, 102, 101]


@settings(max_examples=examples(200), deadline=None)
@given(lo=st.integers(1, 500), span=st.integers(2, 3000), step=st.integers(1, 3000), low=st.floats(0.0, 1.0),
       high=st.floats(1.0001, 50.0))
def test_a_bracket_narrows_in_at_most_twice_bisections_probes_whatever_the_margin(lo, span, step, low, high):
    """A margin that lines cannot follow (a step from `low` to `high` at lo + step): the probes fall back to
    midpoints, so at most 2 x ceil(log2(hi - lo)) of them, and the boundary is the step's."""
    hi = lo + span
    edge = min(lo + step, hi)
    def evaluate(ns):
        return [{"concurrency": n, "output_throughput": n, "m": low if n < edge else high} for n in ns]
    feasible = lambda row: row["m"] <= 1  # noqa: E731
    rows = {n: row for n, row in zip((lo, hi), evaluate([lo, hi]), strict=True)}
    seen = []
    got = drive(_bisect(rows, feasible, lo, hi, 1, lambda row: (row["m"],)), lambda ns: seen.extend(ns) or evaluate(ns))
    assert got == (edge - 1, edge)
    assert len(seen) == len(set(seen)) <= 2 * math.ceil(math.log2(span))


@settings(max_examples=examples(200), deadline=None)
@given(limit=st.floats(1.5, 3000.0), power=st.sampled_from((0.3, 0.5, 1.0, 2.0, 3.0, 5.0)), floor=st.floats(0.0, 0.5),
       cap=st.integers(1, 5000))
def test_aiming_along_curved_limits_finds_what_doubling_finds(limit, power, floor, cap):
    """Margins that bend either way: the aimed search finds the plain search's answer and evaluates no
    point twice."""
    evaluate, feasible, margin = curved(limit, power, floor)
    plain, seen = search_concurrency(evaluate, feasible, cap), []
    aimed = search_concurrency(lambda ns: seen.extend(ns) or evaluate(ns), feasible, cap, margin=margin)
    assert aimed.highest_feasible == plain.highest_feasible
    assert len(seen) == len(set(seen))


def test_aiming_along_curved_limits_evaluates_a_fifth_fewer_points_than_doubling():
    """Over 108 curves (6 limits x 6 bends x 3 floors), the plain search evaluates 1,728 points; the aimed
    one 1,386 (0.80), where an aim capped at doubling without interpolating the bisection took 1,530 (0.885)."""
    aimed = plain = 0
    for limit in (3.5, 12.0, 47.0, 180.0, 700.0, 2900.0):
        for power in (0.3, 0.5, 1.0, 2.0, 3.0, 5.0):
            for floor in (0.0, 0.2, 0.5):
                evaluate, feasible, margin = curved(limit, power, floor)
                plain += len(search_concurrency(evaluate, feasible, 5000).rows)
                aimed += len(search_concurrency(evaluate, feasible, 5000, margin=margin).rows)
    assert plain == 1728 and aimed <= 0.81 * plain


def curved(limit: float, power: float, floor: float):
    """Rows whose one limit's margin is floor + (1 - floor) (n / limit)^power: at the limit at n = limit,
    bending up (power > 1) or down (< 1)."""
    def evaluate(ns):
        return [{"concurrency": n, "output_throughput": n, "m": floor + (1 - floor) * (n / limit) ** power}
                for n in ns]
    return evaluate, (lambda row: row["m"] <= 1), (lambda row: (row["m"],))


def test_without_aiming_the_bracket_doubles_and_the_bisection_still_follows_the_lines():
    """An untimed search keeps the doubling ladder (scenarios of a plan family probe the same concurrencies
    and share their plans) and narrows its bracket where the limit's line crosses 1: along m = n / 100,
    1 ... 64, 128, then 100 (on the limit) and 101, where plain bisection probes 96, 112, 104, 100, 102, 101."""
    evaluate, feasible, margin = linear(0.0, 0.01)
    seen = []
    r = search_concurrency(lambda ns: seen.extend(ns) or evaluate(ns), feasible, 4096, margin=margin, aim=False)
    assert r.highest_feasible == 100
    assert seen[:10] == [1, 2, 4, 8, 16, 32, 64, 128, 100, 101]
    plain = search_concurrency(evaluate, feasible, 4096)
    assert sorted(plain.rows) == sorted({*seen, 96, 112, 104}) and len(seen) == 13
