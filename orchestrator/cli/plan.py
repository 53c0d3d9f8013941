"""`servesweep plan`: the fewest devices that serve a request rate, and how to deploy them."""

from __future__ import annotations

from orchestrator.cli.common import add_field_flags, field_values, layout_label, lengths_label, processes_of
from orchestrator.fields import InputError
from orchestrator.scenario import Scenario

#: what `plan` deploys unless told otherwise: the commands it prints are vLLM's
PLAN_DEFAULTS = {"scheduler": "token-budget", "engine": "vllm"}


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="the fewest devices that serve a request rate under the limits, its cost, "
                       "and the vLLM commands to deploy and check it",
                       description="For each device type and instance size, the Poisson capacity of every "
                       "layout and budget; the answer needs the fewest devices (then the lowest cost). "
                       "Defaults to vLLM's token-budget scheduler and framework time (--scheduler, --engine).")
    add_field_flags(p, "plan")
    g = p.add_argument_group("plan")
    g.add_argument("--device", nargs="+", required=True, metavar="D", help="device types to consider")
    g.add_argument("--request-rate", type=float, required=True, help="requests per second to serve [req/s]")
    g.add_argument("--max-devices", type=int, default=8, help="devices at most (default: 8)")
    g.add_argument("--device-price", nargs="+", default=[], metavar="D=USD_PER_HOUR",
                   help="price per device-hour, overriding the device file's [cost] usd_per_hour")
    g.add_argument("--top-n", type=int, default=3, help="runner-up options shown (default: 3)")
    g.add_argument("--format", choices=("text", "json"), default="text", help="json: machine-readable, on stdout")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr (it appears once the "
                   "search has run a second)")
    g.add_argument("--processes", type=int, default=None, help="search the instance sizes in this many processes "
                   "(default: the CPUs this process may use); 1 = this process only")
    g.add_argument("--disagg", action="store_true", help="also consider prefill/decode splits (vLLM disaggregated "
                   "serving): prefill instances judged on TTFT, decode instances on TPOT, each side as few devices "
                   "as serve the rate (KV transfer not priced); the best split and the best aggregated plan are "
                   "both shown")
    p.set_defaults(func=cmd_plan)


def _prices(items: list[str], devices: list[str]) -> dict[str, float]:
    prices = {}
    for item in items:
        device, _, usd = item.partition("=")
        try:
            value = float(usd)
        except ValueError:
            value = -1.0
        if device not in devices or value < 0:
            raise InputError("--device-price", item, f"D=USD_PER_HOUR with D one of {', '.join(devices)} and a "
                             "price >= 0")
        prices[device] = value
    return prices


def cmd_plan(a) -> int:
    import json

    from orchestrator.plan import option_dict, plan_deployment
    from orchestrator.progress import SearchProgress

    if a.request_rate <= 0:
        raise InputError("--request-rate", a.request_rate, "a rate > 0 (req/s)")
    if a.max_devices < 1:
        raise InputError("--max-devices", a.max_devices, "an integer >= 1")
    if a.top_n < 0:
        raise InputError("--top-n", a.top_n, "an integer >= 0")
    values = {**PLAN_DEFAULTS, **field_values(a, "plan")}
    s = Scenario(**values, device=a.device[0], num_devices=1, arrival="poisson")
    for device in a.device:  # each device type is checked before the search starts
        s.with_(device=device).validate()
    prices = _prices(a.device_price, a.device)
    progress = SearchProgress(enabled=not a.no_progress, desc="plan", unit="size")
    try:
        options = plan_deployment(s, a.device, a.request_rate, a.max_devices, prices, pd=a.disagg, progress=progress,
                                  processes=processes_of(a))
    finally:
        progress.close()
    limits = ", ".join(f"{n} <= {v:g} ms" for n, v in (("TTFT", s.ttft_limits[0] if s.ttft_limits else None),
                                                       ("TPOT", s.tpot_limits[0] if s.tpot_limits else None)) if v)
    if not options:
        message = (f"no deployment of at most {a.max_devices} x {' or '.join(a.device)} serves {a.request_rate:g} "
                   f"req/s under {limits or 'memory'}; raise --max-devices or relax a limit")
        print(json.dumps({"plan": None, "message": message}) if a.format == "json" else message)
        return 0
    shown = options[1:1 + a.top_n]
    if a.disagg:  # the best of the other kind is shown too, whatever --top-n
        split = options[0].role == "split"
        other = next((o for o in options[1:] if (o.role == "split") != split), None)
        if other is not None and other not in shown:
            shown = [*shown[: max(a.top_n - 1, 0)], other]
    best = [option_dict(s, options[0], commands=True)] + [option_dict(s, o) for o in shown]
    if a.format == "json":
        print(json.dumps({"request_rate": a.request_rate, "plan": best[0], "runners_up": best[1:]}, indent=2))
        return 0
    _print_plan(s, a, best, limits)
    return 0


def _instances(o: dict) -> str:
    """2 x tp2pp1dp1 B=8192, 3.10 req/s per instance"""
    return (f"{o['instances']} x {layout_label({**o, 'dp': 1})} B={o['max_batched_tokens']}, "
            f"{o['capacity_per_instance']:.2f} req/s per instance")


def _print_plan(s, a, best, limits) -> None:
    top = best[0]
    print(f"{s.model}: {a.request_rate:g} req/s of {lengths_label(s)} under {limits or 'no limits'}"
          + (f" (p{s.slo_percentile:g})" if s.slo_percentile else ""))
    for i, o in enumerate(best):
        cost = (f", ${o['usd_per_hour']:.2f}/h, ${o['usd_per_mtok']:.3f}/M output tokens"
                if o["usd_per_hour"] == o["usd_per_hour"] else "")
        shape = (f"prefill {_instances(o['prefill'])} + decode {_instances(o['decode'])}" if o["role"] == "split"
                 else _instances(o))
        print(f"{'plan' if i == 0 else 'or  '}: {o['devices']} x {o['device']} = {shape}, "
              f"headroom {100 * o['headroom']:.0f} %{cost}")
    sides = [("prefill", top["prefill"]), ("decode", top["decode"])] if top["role"] == "split" else [("", top)]
    for role, side in sides:
        print(f"\ndeploy each of the {side['instances']} {role + ' ' if role else ''}instance(s):\n"
              f"  {side['serve']}")
        for note in side["notes"] if role else top["notes"]:
            if not role or "random dataset" not in note:
                print(f"  note: {note}")
    if top["role"] == "split":
        for note in top["notes"]:
            print(f"  note: {note}")
    where = "the split at the whole rate, through its router" if top["role"] == "split" else \
        "one instance at its share of the load"
    print(f"check {where} (predicted TTFT {top['predicted_ttft_ms']:.1f} ms, "
          f"TPOT {top['predicted_tpot_ms']:.2f} ms):\n  {top['vllm_bench_serve']}")
