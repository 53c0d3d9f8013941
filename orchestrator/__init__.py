"""Search, Ray fan-out, shared latency cache, Parquet results and the `servesweep` CLI."""
