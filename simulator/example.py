"""A small end-to-end simulation: prints the metrics of one chunked-prefill workload."""

from __future__ import annotations

from simulator import Workload, simulate


def toy_latency(keys):
    """A stand-in step cost: 5 ms + 0.02 ms per token + 1e-6 ms per context token read."""
    return [5.0 + 0.02 * k.tokens + 1e-6 * k.concurrency * k.seq_len for k in keys]


def main() -> None:
    w = Workload(input_length=32768, output_length=1024, max_batched_tokens=8192, concurrency=16)
    m = simulate(w, toy_latency)
    for name, value in m.as_dict().items():
        print(f"{name:>28}: {value:,.2f}" if isinstance(value, float) else f"{name:>28}: {value}")


if __name__ == "__main__":
    main()
