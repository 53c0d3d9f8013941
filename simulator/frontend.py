"""The serving front end between a benchmark client and the engine's scheduler.

A client's request does not reach the scheduler when it is sent, nor does a token reach the client
when its step ends. The API server handles requests one at a time (HTTP parsing, tokenisation,
hand-off to the engine core): a request waits for the ones before it, then takes `request_ms` +
`prompt_token_us` per prompt token. A token reaches the client `return_ms` after its step ends
(detokenisation, the streamed chunk). With async scheduling the engine schedules step k+1 while
step k runs, so a request must have arrived before step k began (`lookahead_steps` = 1).

The same server streams the responses: each step hands it one chunk per request that got a token
(`stream_us` each, after the requests sent by the step's end), and a token reaches the client when its
chunk has gone out, `return_ms` later. At a few thousand tokens a second this costs nothing; near the
server's rate (1 / `stream_us`) tokens reach the clients late, a closed loop's replacements go out late,
fewer requests run than the clients hold, and a new request waits behind the chunks (TTFT grows with
the output length at a fixed concurrency: `bench/littles_law.py`).

What this does to a closed loop: when a cohort of requests finishes in one step, the client
sends their replacements together, the API server lets them through one after another, and the
scheduler sees them over the next steps, not all at once. The loop's phase spread comes out of
the simulation from these times; nothing spreads it by assumption.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latency.checks import check_int, check_number


@dataclass(frozen=True)
class Frontend:
    """Times a request spends outside the engine's forward steps (ms, µs per prompt token)."""

    request_ms: float = 0.0       # API server time per request, serial (HTTP, hand-off to the engine)
    prompt_token_us: float = 0.0  # tokenisation per prompt token, serial with the above
    return_ms: float = 0.0        # a token from the end of its step to the client (detokenise, stream)
    lookahead_steps: int = 0      # 1: async scheduling, a step is scheduled while the one before runs
    client_ms: float = 0.0        # mean time a closed-loop client takes to send a replacement (exponential)
    stream_us: float = 0.0        # API server time per response chunk (a request's tokens of one step), serial

    def __post_init__(self) -> None:
        for name in ("request_ms", "prompt_token_us", "return_ms", "client_ms", "stream_us"):
            check_number(name, getattr(self, name), low=0)
        check_int("lookahead_steps", self.lookahead_steps, 0, 1)

    @property
    def active(self) -> bool:
        """Whether it changes any time (a zero front end leaves a plan as the engine alone plays it)."""
        return bool(self.request_ms or self.prompt_token_us or self.return_ms or self.lookahead_steps
                    or self.client_ms or self.stream_us)

    def client_delay(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """How long after it may send each of n requests the client sends it (not in its TTFT: the
        client's clock starts at the send): exponential with mean `client_ms`, drawn in order from
        the workload's seeded stream."""
        if not self.client_ms:
            return np.zeros(n)
        return rng.exponential(self.client_ms, n)

    def service_ms(self, prompt_tokens: int) -> float:
        """API server time of one request of `prompt_tokens` tokens."""
        return self.request_ms + self.prompt_token_us * 1e-3 * prompt_tokens


NONE = Frontend()
