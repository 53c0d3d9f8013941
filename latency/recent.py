"""A process's shared values by key, made on first use, the least recently used let go beyond a count: the
step pricers of timed plans (`simulator.pricing.PRICERS`) and the parts of step prices they share
(`latency.estimator.PARTS`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable


class Recent:
    """Values by key, at most `size` of them, the least recently used out first."""

    def __init__(self, size: int):
        self.size, self.values = size, OrderedDict()

    def get(self, key: Hashable, make: Callable):
        """The value of `key`, made by `make()` where it is not held."""
        if key in self.values:
            self.values.move_to_end(key)
            return self.values[key]
        value = self.values[key] = make()
        if len(self.values) > self.size:
            self.values.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self.values)

    def clear(self) -> None:
        self.values.clear()
