"""The KV cache's unit and how an engine admits requests into it.

vLLM allocates the cache in blocks of BLOCK_SIZE tokens (its default `--block-size`), which is what a
prefix-cache hit and KV-bound admission count in. When the cache is full, an engine admits requests by one
of KV_ADMISSIONS: "max-utilization" (vLLM's, and TensorRT-LLM's MAX_UTILIZATION: admit a request when its
prompt's blocks fit, preempt the newest running request when a decode needs a block) or
"guaranteed-no-evict" (TensorRT-LLM's default GUARANTEED_NO_EVICT capacity scheduler: admit a request only
when its KV to the last token it may generate fits beside what every running request may reach; nothing
is ever preempted)."""

BLOCK_SIZE = 16
KV_ADMISSIONS = ("max-utilization", "guaranteed-no-evict")
