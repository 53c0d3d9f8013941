"""A closed loop of more clients than the engine seats, planned as a smaller loop that keeps it as busy.

Clients beyond what the engine runs at once (its max_num_seqs, or fewer where the KV pool binds) wait in
its queue. `StandIn` plans the loop with `STAND_IN_SEATS` clients a seat instead, and adds the queue the
other clients make to each request's wait, so a loop of 10^8 clients costs what one of a few thousand does.

The claim that makes it exact in the steady window (measure "steady", its prompts the loop's default):
while the queue is never empty when the engine admits, the engine's steps do not depend on how many wait
(it takes requests in send order, and the i-th request sent is alike in both loops); every request then
waits in a loop of N clients (N - M) / X longer than in one of M, X the engine's throughput (Little's law:
N = X x (wait + time in the engine + the client's own time), and only the wait grows with N). The stand-in
keeps the queue full: it holds a whole engine's worth beyond the seats, so it empties only when more
requests than the engine runs finish within one client's round trip.

`plan(..., jumps=())` plans the loop itself; tests/simulator/test_standin.py compares the two.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.workload import PROMPTS_PER_CONCURRENCY

#: clients a seat of the engine in a stand-in loop: one engine's worth running, one waiting
STAND_IN_SEATS = 2
#: requests a stand-in loop sends at least (the loop's own default when smaller): its steady window then holds
#: thousands, so the completions its throughput gains or loses at the window's two edges weigh little
STAND_IN_PROMPTS = 4096
#: the name `plan(..., jumps=...)` knows it by
NAME = "stand-in"


def seats(scheduler) -> int | None:
    """The requests a policy runs at once (its max_num_seqs); None for a policy without a limit."""
    return getattr(scheduler, "max_num_seqs", None)


@dataclass(frozen=True)
class StandIn:
    """A loop of `clients` planned as one of `stand_in` clients (see the module docstring)."""

    clients: int
    stand_in: int

    @classmethod
    def make(cls, w, scheduler) -> StandIn | None:
        """The stand-in of a steady closed loop with more than STAND_IN_SEATS clients a seat; None otherwise
        (another measure counts a warm-up and drain whose length grows with the clients; a given num_prompts
        or a trace fixes what is sent)."""
        limit = seats(scheduler)
        trace = w.mix is not None and w.mix.trace is not None
        if w.arrival != "closed" or w.measure != "steady" or w.num_prompts or trace or not limit:
            return None
        stand_in = STAND_IN_SEATS * limit
        return cls(w.concurrency, stand_in) if w.concurrency > stand_in else None

    def workload(self, w):
        """The stand-in loop of the loop's workload `w`."""
        prompts = min(max(PROMPTS_PER_CONCURRENCY * self.stand_in, STAND_IN_PROMPTS), w.prompts)
        return replace(w, concurrency=self.stand_in, num_prompts=prompts)

    def workload_prompts(self, w) -> int:
        """The requests the loop itself sends (the stand-in's workload `w` otherwise alike)."""
        return replace(w, concurrency=self.clients, num_prompts=0).prompts

    def extra_wait_ms(self, request_throughput: float) -> float:
        """What the clients beyond the stand-in add to each request's wait, at the engine's throughput
        (requests per second)."""
        return 1000.0 * (self.clients - self.stand_in) / request_throughput
