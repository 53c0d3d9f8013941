"""What an engine leaves free of each GPU by its own rule, for a layout: the memory its launch keeps out of its
weights and KV pool (activations, CUDA graphs, its allocator's slack), named by an engine profile's
`[memory] rule` (RESERVE_RULES); an engine whose pool takes a fraction of what is then free
(`[memory] free_fraction`) leaves the rest of it free too (latency.memory)."""

from __future__ import annotations

MIB_PER_GIB = 1024
#: SGLang's defaults by the GPU's memory (server_args._handle_gpu_memory_settings, 0.5.6.post2 and 0.5.8.post1):
#: (HBM below, GiB; its chunked-prefill size; its largest CUDA-graph batch below tp 4, and from tp 4)
SGLANG_CLASSES = ((20, 2048, 8, 8), (35, 2048, 24, 80), (60, 4096, 32, 160), (160, 8192, 256, 512),
                  (float("inf"), 16384, 512, 512))
#: ... its floor above 60 GiB, and what attention DP adds a CUDA-graph batch and rank (MiB; 1.5 more above 300)
SGLANG_FLOOR_GIB, SGLANG_DP_MIB, SGLANG_DP_LARGE_MIB, SGLANG_DP_LARGE_BATCH = 10.0, 3.0, 1.5, 300


def sglang_reserved_gib(hbm_gib: float, tp: int = 1, pp: int = 1, attention_dp: int = 1) -> float:
    """SGLang's reserve (1 - its default --mem-fraction-static of the GPU): 512 MiB, 1.5 MiB a token of its chunk,
    2 MiB a request of its largest CUDA graph, 1/8 GiB a GPU of its tp x pp (its tp counts every GPU of the
    instance: ours x the attention-DP ranks), and with attention DP 3 MiB (4.5 above a batch of 300) a graph
    request and rank; at least 10 GiB above 60 GiB."""
    gpus = tp * attention_dp
    _, chunk, small, large = next(c for c in SGLANG_CLASSES if hbm_gib < c[0])
    graph = small if gpus < 4 else large
    mib = 512 + 1.5 * chunk + 2 * graph + gpus * pp / 8 * MIB_PER_GIB
    if attention_dp > 1:
        mib += graph * attention_dp * (SGLANG_DP_MIB + (SGLANG_DP_LARGE_MIB if graph > SGLANG_DP_LARGE_BATCH else 0))
    gib = mib / MIB_PER_GIB
    return max(gib, SGLANG_FLOOR_GIB) if hbm_gib > 60 else gib


#: TensorRT-LLM's memory outside its KV fraction (its profiling peak counts "torch + non-torch"): the CUDA context
#: and libraries' workspaces, 551 MB as AIConfigurator observed them (its systems/*.yaml other_mem, before its
#: safety margin), and NCCL's buffers by the GPUs of the group (its nccl_mem: 342 MiB at 2, 392 MiB from 4)
TRTLLM_CONTEXT_MIB = 551 * 1e6 / 2**20
TRTLLM_NCCL_MIB = ((1, 0.0), (2, 342.0), (float("inf"), 392.0))


def trtllm_reserved_gib(hbm_gib: float, tp: int = 1, pp: int = 1, attention_dp: int = 1) -> float:
    """What TensorRT-LLM holds beside weights and activations before its KV pool takes its fraction of the rest
    (`EngineProfile.kv_free_fraction`): the CUDA context and NCCL's buffers, whatever the GPU's memory."""
    gpus = tp * attention_dp
    nccl = next(mib for upto, mib in TRTLLM_NCCL_MIB if gpus <= upto)
    return (TRTLLM_CONTEXT_MIB + nccl) / MIB_PER_GIB


RESERVE_RULES = {"sglang": sglang_reserved_gib, "trtllm": trtllm_reserved_gib}
