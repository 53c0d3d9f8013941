"""The KV cache's unit: vLLM allocates it in blocks of BLOCK_SIZE tokens (its default `--block-size`),
which is what a prefix-cache hit and KV-bound admission count in."""

BLOCK_SIZE = 16
