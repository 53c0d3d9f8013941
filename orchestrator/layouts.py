"""An instance's layout (tp, pp, EP and attention-DP ranks) and the layouts a scenario tries: every one the model
allows on its devices, MoE layouts whose weights do not fit pruned. Found once for the scenarios alike in what the
search reads (`layout_key`), so a sweep's expansion does not build a latency model per layout of every scenario."""

from __future__ import annotations

from dataclasses import dataclass

from latency import load_engine, load_model
from latency.parallel import ParallelSpec
from latency.recent import Recent


@dataclass(frozen=True)
class Layout:
    """One instance: attention_dp ranks of tp x pp devices; the experts over ep groups of moe_tp
    devices (see latency.ParallelSpec). A search point's concurrency is per attention rank."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    attention_dp: int = 1

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.attention_dp

    @property
    def rank_devices(self) -> int:
        return self.tp * self.pp

    @property
    def moe_tp(self) -> int:
        return self.tp * self.attention_dp // self.ep


#: the layouts of scenarios alike in what they read (`layout_key`): a few hundred in a sweep of thousands
LAYOUTS = Recent(1024)


def layout_key(s) -> tuple:
    """What `find_layouts` reads of scenario `s`: its fields, and the model, device and engine as loaded (an
    edited file is another key)."""
    return (load_model(s.model), s.device_spec, load_engine(s.engine), s.model, s.device, s.engine, s.num_devices,
            s.pp, s.tp_sizes, s.attention_dp_sizes, s.ep, s.redundant_experts, max(s.max_batched_tokens or (1,)),
            s.reserved_memory_gb, s.quantization, s.kv_cache_dtype, s.async_override, s.latency_backend)


def find_layouts(s) -> tuple[Layout, ...]:
    """Every layout to try for scenario `s`: the given tp sizes, or each divisor of the device count the model
    allows; for MoE models also every attention-DP size and both no EP and wide EP, unless given. A layout asked
    for explicitly that the engines cannot build is refused (ValueError); searched ones that cannot be built are
    skipped (never replaced by another). Searched MoE layouts whose weights do not fit are pruned; when none fits,
    the plain ones (no attention DP, no EP) stay so the answer can say why. Dense instances whose weights do not
    fit are kept the same way."""
    spec = load_model(s.model)
    n, pp = s.num_devices, s.pp
    explicit = bool(s.tp_sizes) and (not spec.is_moe or (bool(s.attention_dp_sizes) and s.ep > 0))
    sizes = s.tp_sizes or tuple(t for t in range(1, n + 1) if n % (t * pp) == 0)
    ranks = s.attention_dp_sizes or (tuple(range(1, n + 1)) if spec.is_moe else (1,))
    out = []
    for tp in sizes:
        for adp in ranks:
            if n % (tp * pp * adp):
                if explicit:
                    raise ValueError(f"tp {tp} x pp {pp} x attention_dp {adp} does not divide {n} devices")
                continue
            eps = (s.ep,) if s.ep else ((1, tp * adp) if spec.is_moe else (1,))
            for ep in dict.fromkeys(eps):
                try:
                    ParallelSpec(tp=tp, pp=pp, ep=ep, attention_dp=adp,
                                 redundant_experts=s.redundant_experts if ep > 1 else 0).validate(spec)
                except ValueError:
                    if explicit:
                        raise
                    continue
                out.append(Layout(tp, pp, ep, adp))
    if not spec.is_moe or explicit:
        return tuple(out)
    plain = [lay for lay in out if lay.attention_dp == 1 and lay.ep == 1]  # what explains "nothing fits"
    return tuple([lay for lay in out if _weights_fit(s, lay)] or plain or out)


def _weights_fit(s, layout: Layout) -> bool:
    mem = s.latency_model(layout).memory_for(max(s.max_batched_tokens or (1,)))
    return mem.kv_capacity_tokens > 0
