"""`latency.recent.Recent`: the shared step pricers' and step parts' store."""

from latency.recent import Recent


def test_a_value_is_made_once_and_the_least_recently_used_goes_first():
    """Hand-computed, two held: a, b made; a used again; c made lets b go (used least recently), not a."""
    made = []
    held = Recent(2)

    def get(key):
        return held.get(key, lambda: made.append(key) or key.upper())

    assert [get("a"), get("b"), get("a"), get("c")] == ["A", "B", "A", "C"]
    assert made == ["a", "b", "c"] and len(held) == 2
    assert get("a") == "A" and made == ["a", "b", "c"]  # still held
    assert get("b") == "B" and made == ["a", "b", "c", "b"]  # let go, made again
    held.clear()
    assert len(held) == 0
    assert get("a") == "A" and made[-1] == "a"
