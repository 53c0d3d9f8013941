"""Latency backends by name. A backend prices forward steps for one deployment (model, device,
parallelism, quantisation); the default is the roofline. External, expensive sources (a profiling
table service, an op-level simulator, a traced graph) plug in here, registered in code
(`register_backend`) or by a Python entry point in the group `servesweep.latency_backends` whose
object is a factory.

A factory is called as `factory(model, device, *, tp, pp, dp, ep, attention_dp, quantization,
kv_cache_dtype, reserved_memory_gb, engine)` (model and device are names or paths), and with
`redundant_experts=N` only when a scenario asks for redundant experts (a backend that does not take
it cannot price them: the scenario is refused, naming it); it returns an object with:

- `latency_ms(keys) -> array`: each ForwardKey priced as a step of its own;
- `step_latency_ms(shapes) -> array` (optional): each fused step priced as one pass; `shapes` is a
  sequence of StepShapes (a plan hands its `latency.keys.StepShapes`, whose shapes of one chunk are
  made into tuples only when iterated; `latency.keys.shape_columns(shapes)` gives every entry's
  fields as arrays without making them);
- `memory_for(max_batched_tokens) -> MemoryPicture`;
- `fingerprint: str`: names everything that changes a price, including the code's version (a
  long-lived shared cache keys latencies by it);
- `cost_per_key_ms: float`: what pricing one key costs this process. The sweep shares keys through
  the cluster's cache only when pricing costs more than asking (orchestrator.pricer);
- `notes: list[str]` (optional): how it priced this deployment where that is not plain (`estimate`
  prints them: which ops came from a measured table, which fell back to the roofline and why).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from latency.deployment import Deployment

#: the backend a scenario uses unless it names one
DEFAULT_BACKEND = "roofline"
ENTRY_POINT_GROUP = "servesweep.latency_backends"
#: the stand-in for an expensive backend: what each key it prices costs (slept, not computed)
SLOW_KEY_MS = 5.0

_REGISTRY: dict[str, Callable] = {}


def register_backend(name: str, factory: Callable) -> None:
    """Make `factory` available as `--latency-backend NAME` (and spec key `latency_backend`)."""
    _REGISTRY[name] = factory


def backend_names() -> list[str]:
    _load_entry_points()
    return sorted(_REGISTRY)


def has_backend(name: str) -> bool:
    """Whether `name` is a backend; plugins are looked up only for a name not registered in code
    (scanning the installed packages' entry points costs ~0.1 s)."""
    return name in _REGISTRY or name in backend_names()


def backend_for(name: str, deployment: Deployment):
    """The latency model of backend `name` for `deployment` (one frozen object: a cache key)."""
    return make_backend(name, deployment.model, deployment.device, **deployment.options())


def make_backend(name: str, model, device, **options):
    """The latency model of backend `name` for one deployment; ValueError names the known ones."""
    if name not in _REGISTRY:
        _load_entry_points()
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown latency backend {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None
    if "redundant_experts" in options and not _takes(factory, "redundant_experts"):
        raise ValueError(f"latency backend {name!r} does not price redundant experts (its factory takes no "
                         "redundant_experts)")
    return factory(model, device, **options)


def _takes(factory: Callable, option: str) -> bool:
    import inspect

    params = inspect.signature(factory).parameters.values()
    return any(p.name == option or p.kind is p.VAR_KEYWORD for p in params)


_loaded = False


def _load_entry_points() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        _REGISTRY.setdefault(ep.name, ep.load())


def _roofline(model, device, **options):
    from latency import build_latency_model

    return build_latency_model(model, device, **options)


class SlowRoofline:
    """The roofline, slowed to SLOW_KEY_MS per key it prices: stands in for an expensive backend in
    benchmarks and tests of the shared cache (each key it prices is counted in `priced_keys`)."""

    cost_per_key_ms = SLOW_KEY_MS

    def __init__(self, inner):
        self.inner = inner
        self.fingerprint = "slow|" + inner.fingerprint
        self.priced_keys = 0

    def latency_ms(self, keys):
        self._sleep(len(keys))
        return self.inner.latency_ms(keys)

    def step_latency_ms(self, shapes):
        self._sleep(len(shapes))
        return self.inner.step_latency_ms(shapes)

    def _sleep(self, n: int) -> None:
        self.priced_keys += n
        time.sleep(n * SLOW_KEY_MS / 1000)

    def __getattr__(self, name):  # memory, devices, breakdown: the roofline's
        return getattr(self.inner, name)


def _kernel_tables(model, device, **options):
    from latency import kernel_tables

    return kernel_tables.build(model, device, **options)


register_backend(DEFAULT_BACKEND, _roofline)
register_backend("aiconfigurator-tables", _kernel_tables)
register_backend("slow-roofline", lambda model, device, **options: SlowRoofline(_roofline(model, device, **options)))
