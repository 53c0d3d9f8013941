"""The discrete choices calibrate tries where the runs leave them open: the launch (token budget, a cap on requests
in flight, async scheduling, the prefix cache where the client reuses prompts) and the profile's own (the front
end's time per streamed chunk, the requests an uncounted aiperf client sent, the share of its KV pool the engine
held); where each sits in a profile's TOML data, and which the runs leave open.
"""

from __future__ import annotations

import copy

from orchestrator.runs import Run, streamed

#: budgets tried where the runs do not give one (0: the engine's default on the device)
BUDGETS = (0, 2048, 4096, 8192, 16384)
#: caps on requests in flight tried where the runs do not give one and two runs' clients or more exceed it (0:
#: the engine's default; one run alone cannot tell a cap from anything else that slows its load: TensorRT-LLM's
#: Llama-3.1-8B kept 100 for its one C=128 run of five, and its other C=128 runs came out 1.6-7.4x slow): an HTTP
#: client's default pool of 100 connections (aiohttp's TCPConnector: gpt-oss-120b's C=512 runs on H100 with vLLM
#: 0.11.2 kept about 100 running, docs/fidelity.md), and vLLM's 256 on smaller GPUs
MAX_NUM_SEQS = (0, 100, 256)
#: where each launch choice a run may leave open (orchestrator.runs.LAUNCH_CHOICES) sits in a profile
LAUNCH_PLACES = {"max_batched_tokens": ("launch", "max_batched_tokens"), "max_num_seqs": ("launch", "max_num_seqs"),
                 "async_scheduling": ("async_scheduling",), "prefix_caching": ("prefix_caching",)}
#: the front end's time per response chunk tried for closed loops (us; 0 is the base's): 20,000 and 10,000
#: chunks a second, about where SGLang 0.5.6's and TensorRT-LLM 1.0's held-back campaigns streamed
#: (bench/littles_law.py; docs/fidelity.md); each where no run streamed faster than it can (`streamed`)
STREAM_PLACE = ("frontend", "stream_us")
STREAMS = (50.0, 100.0)
#: the measured requests per client tried for aiperf closed loops whose runs do not count them (0: aiperf's 20,
#: as AIConfigurator's bench_run.sh asks unless its AICONFIGURATOR_BENCH_MULTI_ROUND says otherwise; the silicon
#: format does not record it): fewer weigh the first wave, every client's prompt sent at once, more in the mean
#: TTFT. The measured vLLM MoE campaigns' TTFT grows with the clients as if they had 4-10 (docs/calibration.md)
ROUNDS_PLACE = ("frontend", "requests_per_client")
ROUNDS = (10, 5)
#: the share of its KV pool an engine's runs held, tried where the runs do not say it (1: the pool as the memory
#: picture prices it): a launch's own memory flag (--gpu-memory-utilization, --mem-fraction-static,
#: free_gpu_memory_fraction), or memory the engine holds that the picture does not count. Only runs that queue
#: for KV blocks tell it: elsewhere every share predicts alike and none is kept. Steps of about 0.85, as a queue
#: is a cliff in the pool: with steps of 0.75 MiniMax-M2.5 FP8's five runs on H100 kept 0.45 and its other runs
#: came out at 40.0 % TTFT, with these 0.42 and 18.8 % (29.9 % without; SGLang 0.5.8's Qwen3-32B runs keep 0.35:
#: bench/calibrate_campaigns.py, docs/calibration.md)
KV_SHARE_PLACE = ("memory", "kv_share")
KV_SHARES = (1.25, 0.85, 0.7, 0.6, 0.5, 0.42, 0.35, 0.3, 0.25)
#: a run that held this much of its pool at its fullest queued for blocks (or nearly): a larger pool is tried
KV_FULL = 0.97
#: a closed loop's engine that runs one request fewer than its clients, tried where two closed loops or more ran:
#: a batch limit set one below the clients, which no run states (TensorRT-LLM 1.0's Llama-3.1-8B runs on H100: their
#: TTFT grows with the output at C = 8, 16 and 32 on every tp as if C - 1 ran, bench/littles_law.py; its Qwen3-32B
#: runs, the same release and GPU, do not)
BELOW_PLACE = ("launch", "below_clients")
#: the choices no run states and the runs may tell (not the launch's a run may state), each with its values, the
#: first where a profile names none
PROFILE_CHOICES = {STREAM_PLACE: (0.0, *STREAMS), ROUNDS_PLACE: (0, *ROUNDS), KV_SHARE_PLACE: (1.0, *KV_SHARES),
                   BELOW_PLACE: (0, 1)}
CHOICE_DEFAULTS = {place: values[0] for place, values in PROFILE_CHOICES.items()}


def launch_options(runs: list[Run], data: dict, fullest: float = 1.0) -> list[dict]:
    """Profiles that differ from `data` in one launch choice the runs leave open: each other budget, each cap
    on requests in flight below the clients of two runs (MAX_NUM_SEQS), async scheduling flipped, the
    prefix cache flipped where the client reuses prompts (aiperf), and each other value of the profile's own
    choices the runs leave open (`profile_choices`); of the KV shares, those a run could feel, `fullest` being the
    largest share of its pool a run held under `data` (`kv_shares_felt`)."""
    open_ = open_launch(runs)
    loads = sorted(int(r.values.get("concurrency") or 0) for r in runs)
    clients = loads[-2] if len(loads) > 1 else 0  # a cap below it has two runs beyond it
    counts = {"max_batched_tokens": BUDGETS, "max_num_seqs": [n for n in MAX_NUM_SEQS if n < clients]}
    options = []
    for key, place in LAUNCH_PLACES.items():
        if key not in open_:
            continue
        own = value_at(data, place, unset(place))
        values = [n for n in counts[key] if n != own] if key in counts else [not own]
        options += [with_value(data, place, value) for value in values]
    for place, values in profile_choices(runs).items():
        own = value_at(data, place, values[0])
        if place == KV_SHARE_PLACE:
            values = kv_shares_felt(values, own, fullest)
        options += [with_value(data, place, value) for value in values if value != own]
    return options


def kv_shares_felt(shares: tuple, own: float, fullest: float) -> tuple:
    """The KV shares a run could feel where the fullest run held `fullest` of the pool at share `own`: a smaller
    pool than that run's peak, and a larger one only where a run queued (KV_FULL); the rest predict as `own`."""
    return tuple(s for s in shares if s < fullest * own or (s > own and fullest >= KV_FULL))


def open_launch(runs: list[Run]) -> set[str]:
    """The launch choices some run leaves open; the prefix cache only where a client reuses prompts (aiperf)."""
    open_ = {key for r in runs for key in LAUNCH_PLACES if key not in r.states}
    return open_ if any(r.values.get("benchmark") == "aiperf" for r in runs) else open_ - {"prefix_caching"}


def profile_choices(runs: list[Run]) -> dict[tuple[str, str], tuple]:
    """The profile's own choices the runs leave open, each with its values (the base's first): the streaming times
    no closed loop streamed faster than (`streamed`), the requests per client where some aiperf closed loop does
    not count them, the share of its KV pool the engine held, one request in flight fewer than the clients where
    two closed loops or more ran."""
    closed = _closed(runs)
    uncounted = any(r.values.get("benchmark") == "aiperf" and not r.values.get("num_prompts") for r in closed)
    ruled_out, _ = _streams_ruled_out(closed)
    streams = tuple(us for us in PROFILE_CHOICES[STREAM_PLACE] if us not in ruled_out)
    choices = {STREAM_PLACE: streams if closed and len(streams) > 1 else (),
               ROUNDS_PLACE: PROFILE_CHOICES[ROUNDS_PLACE] if uncounted else (),
               KV_SHARE_PLACE: PROFILE_CHOICES[KV_SHARE_PLACE],
               BELOW_PLACE: PROFILE_CHOICES[BELOW_PLACE] if len(closed) > 1 else ()}
    return {place: values for place, values in choices.items() if values}


def streams_ruled_out(runs: list[Run]) -> str:
    """Which streaming times the runs rule out, and by which run ("" where none): said beside the fit."""
    ruled_out, fastest = _streams_ruled_out(_closed(runs))
    if not ruled_out:
        return ""
    times = " and ".join(f"{us:g} us" for us in ruled_out)
    return (f"a front end of {times} a chunk not tried: {fastest.where}'s clients received "
            f"{streamed(fastest):,.0f} chunks a second, more than it lets through")


def _streams_ruled_out(closed: list[Run]) -> tuple[tuple[float, ...], Run | None]:
    """The streaming times (STREAMS) the fastest of the closed loops streamed faster than, and that loop."""
    fastest = max(closed, key=streamed, default=None)
    rate = 0.0 if fastest is None else streamed(fastest)
    return tuple(us for us in STREAMS if us * rate > 1e6), fastest


def _closed(runs: list[Run]) -> list[Run]:
    return [r for r in runs if r.values.get("arrival") == "closed"]


def launch_of(source: dict, data: dict) -> dict:
    """`data` with the launch choices, and the profile's own choices, of `source`."""
    out = copy.deepcopy(data)
    for place in LAUNCH_PLACES.values():
        set_at(out, place, value_at(source, place, unset(place)))
    for place, default in CHOICE_DEFAULTS.items():
        if value_at(source, place, default) != value_at(out, place, default):
            set_at(out, place, value_at(source, place, default))
    return out


def label_of(place: tuple[str, ...]) -> str:
    """A profile place as printed: `key`, or `[table] key`."""
    return place[0] if len(place) == 1 else f"[{place[0]}] {place[1]}"


def unset(place: tuple[str, ...]):
    """A launch place's value where a profile names none: off for a switch, 0 (the engine's default) for a count."""
    return False if len(place) == 1 else 0


def value_at(data: dict, place: tuple[str, ...], default):
    """The value at `place` of a profile's TOML data: a top-level key, or (table, key)."""
    return (data.get(place[0], {}) if len(place) == 2 else data).get(place[-1], default)


def set_at(data: dict, place: tuple[str, ...], value) -> None:
    (data.setdefault(place[0], {}) if len(place) == 2 else data)[place[-1]] = value


def with_value(data: dict, place: tuple[str, ...], value) -> dict:
    out = copy.deepcopy(data)
    set_at(out, place, value)
    return out
