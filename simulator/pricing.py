"""Phase two of a simulation: price a plan's keys in one call, then turn prices into step times."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from latency.estimator import RooflineModel, ShapeParts
from latency.keys import ForwardKey, StepShape
from latency.recent import Recent


def key_latency(latency, keys: Sequence[ForwardKey]) -> np.ndarray:
    """Milliseconds of each ForwardKey, priced as its own forward pass, in one call."""
    fn: Callable = getattr(latency, "latency_ms", latency)
    out = np.asarray(fn(list(keys)), dtype=np.float64)
    if out.shape != (len(keys),):
        raise ValueError(f"latency returned shape {out.shape} for {len(keys)} keys")
    if len(out) and not (np.all(np.isfinite(out)) and np.all(out >= 0)):
        raise ValueError("latency returned a negative or non-finite time")
    return out


def shape_latency(latency, shapes: Sequence[StepShape]) -> np.ndarray:
    """Milliseconds of each fused step. A model with `step_latency_ms` fuses the entries (linear
    layers over all tokens, attention per entry); a plain callable cannot, so a step costs the sum
    of its entries."""
    fused = getattr(latency, "step_latency_ms", None)
    if fused is not None:
        out = np.asarray(fused(shapes if isinstance(shapes, Sequence) else list(shapes)), dtype=np.float64)
        if out.shape != (len(shapes),):
            raise ValueError(f"step_latency_ms returned shape {out.shape} for {len(shapes)} steps")
        return out
    keys = sorted({key for shape in shapes for key in shape})
    ms = dict(zip(keys, key_latency(latency, keys), strict=True))
    return np.array([sum(ms[k] for k in shape) for shape in shapes], dtype=np.float64)


def price(latency, keys: Sequence, fused: bool) -> np.ndarray:
    """Price a plan's `price_keys` (shapes when fused, ForwardKeys otherwise) in one call."""
    return shape_latency(latency, keys) if fused else key_latency(latency, keys)


def step_times(plan, prices: Sequence[float]) -> np.ndarray:
    """Duration of every planned step, from prices aligned with `plan.price_keys`: a fused step is
    its shape's price; otherwise its prefill and decode passes (each the sum of its keys, in shape
    order) combine by the policy's `step_latency`."""
    prices = np.asarray(prices, dtype=np.float64)
    if plan.scheduler.fused:
        shape_ms = prices
    else:
        (pre_shape, pre_key), (dec_shape, dec_key) = plan.entry_index
        n = len(plan.shapes)
        prefill = np.bincount(pre_shape, weights=prices[pre_key], minlength=n)
        decode = np.bincount(dec_shape, weights=prices[dec_key], minlength=n)
        shape_ms = np.asarray(plan.scheduler.step_latency(prefill, decode), dtype=np.float64)
    return shape_ms[plan.step_shape]


class StepPricer:
    """Prices step shapes one at a time, for plans that depend on time (Poisson arrivals): each
    distinct shape (fused policy) or ForwardKey is priced once and remembered. `prices` are aligned
    with the plan's `price_keys` afterwards, so a timed plan replays like any other. A roofline model's
    fused shapes are priced from remembered parts (`latency.estimator.ShapeParts`: the same floats)."""

    def __init__(self, latency, scheduler):
        self.latency, self.scheduler = latency, scheduler
        self.memo: dict = {}
        self.parts = ShapeParts(latency) if scheduler.fused and isinstance(latency, RooflineModel) else None

    def _key_ms(self, key) -> float:
        ms = self.memo.get(key)
        if ms is None:
            if self.parts is not None:
                ms = self.memo[key] = self.parts(key)
            else:
                ms = self.memo[key] = float(price(self.latency, [key], self.scheduler.fused)[0])
        return ms

    def __call__(self, shape: StepShape) -> float:
        if self.scheduler.fused:
            return self._key_ms(shape)
        prefill = sum(self._key_ms(k) for k in shape if not k.is_decode)
        decode = sum(self._key_ms(k) for k in shape if k.is_decode)
        return float(self.scheduler.step_latency(prefill, decode))  # a plain float: the clock adds it every step

    def prices(self, plan) -> np.ndarray:
        """Prices aligned with `plan.price_keys` (remembered from its planning; any other priced now)."""
        return np.array([self._key_ms(k) for k in plan.price_keys], dtype=np.float64)


class SharedPricers:
    """The process's step pricers of timed plans, one per (latency model's prices, policy), least recently used
    out first beyond `size`: latency models of one fingerprint price every step alike (it names everything that
    changes a price: latency.backends), so the first one's pricer serves them all; a capacity search reuses one,
    and so do calibrate's candidate profiles that move only what no price reads (the front end, the launch). A
    latency without a fingerprint (a plain callable) has its own."""

    def __init__(self, size: int):
        self.pricers = Recent(size)

    def get(self, latency, scheduler) -> StepPricer:
        key = (getattr(latency, "fingerprint", latency), scheduler)
        return self.pricers.get(key, lambda: StepPricer(latency, scheduler))

    def clear(self) -> None:
        self.pricers.clear()


#: step pricers kept per process
PRICERS = SharedPricers(64)
