"""The checkpoints AIConfigurator's support matrix names, read as what they are: each one we read has the
architecture its own config.json publishes (AIConfigurator ships those configs), and none is refused."""

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from latency import load_model
from latency.model import ModelSpec, known_models
from orchestrator.measured_runs import our_model

AIC = importlib.util.find_spec("aiconfigurator_core")
pytestmark = pytest.mark.skipif(AIC is None, reason="servesweep[kernels] not installed")
#: what a config says of the architecture (the checkpoint's own weight format is the run's label's to say)
FORMAT_FIELDS = {"name", "checkpoint_quantization"}
#: the matrix's checkpoints of the models the issue's unseen campaigns name, and their kin
READ = {
    "meta-llama/Meta-Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-405B",
    "nvidia/Llama-3.1-70B-Instruct-FP8", "deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-R1",
    "nvidia/DeepSeek-V3.1-NVFP4", "Qwen/Qwen3-235B-A22B", "Qwen/Qwen3-235B-A22B-FP8", "nvidia/Qwen3-235B-A22B-NVFP4",
    "Qwen/Qwen3-32B", "Qwen/Qwen3-32B-FP8", "Qwen/Qwen3-32B-FP8-Static-PerTensor", "Qwen/Qwen3-30B-A3B",
    "Qwen/Qwen3-30B-A3B-FP8", "Qwen/Qwen3-8B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-0.6B",
    "Qwen/Qwen3-Coder-480B-A35B-Instruct", "openai/gpt-oss-120b", "openai/gpt-oss-20b", "moonshotai/Kimi-K2.5",
    "nvidia/Kimi-K2.5-NVFP4", "nvidia/Kimi-K2.6-NVFP4", "MiniMaxAI/MiniMax-M2.5", "nvidia/MiniMax-M2.5-NVFP4",
    "MiniMaxAI/MiniMax-M2.7", "nvidia/MiniMax-M2.7-NVFP4", "nvidia/Kimi-K2.7-Code-NVFP4", "Qwen/Qwen3-VL-2B-Instruct",
    "Qwen/Qwen3-VL-8B-Instruct", "Qwen/Qwen3-VL-32B-Instruct", "Qwen/Qwen3-VL-32B-Thinking",
    "Qwen/Qwen3-VL-30B-A3B-Instruct", "Qwen/Qwen3-VL-235B-A22B-Instruct", "Qwen/Qwen3-VL-4B-Instruct",
    "XiaomiMiMo/MiMo-7B-Base", "stepfun-ai/Step-3.7-Flash", "stepfun-ai/Step-3.7-Flash-FP8",
    "deepseek-ai/DeepSeek-V3.2", "nvidia/DeepSeek-V3.2-NVFP4", "zai-org/GLM-5.2", "zai-org/GLM-5.2-FP8",
    "nvidia/GLM-5.2-NVFP4", "nvidia/GLM-5.3-NVFP4", "zai-org/GLM-5.3", "nvidia/GLM-5-NVFP4", "zai-org/GLM-5.1",
    "meta-llama/Llama-4-Scout-17B-16E-Instruct", "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
    "Qwen/Qwen3.5-27B", "Qwen/Qwen3.5-35B-A3B", "Qwen/Qwen3.5-397B-A17B", "nvidia/Qwen3.5-122B-A10B-NVFP4",
    "nvidia/Qwen3.5-397B-A17B-NVFP4", "nvidia/Qwen3.6-27B-NVFP4", "nvidia/Qwen3.6-35B-A3B-NVFP4",
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4",
    "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8", "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4",
    "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16", "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-FP8",
    "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4", "google/gemma-4-26B-A4B", "nvidia/Gemma-4-26B-A4B-NVFP4",
    "nvidia/Gemma-4-31B-IT-NVFP4", "XiaomiMiMo/MiMo-V2-Flash", "MiniMaxAI/MiniMax-M3", "nvidia/MiniMax-M3-NVFP4",
    "deepseek-ai/DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V4-Pro", "nvidia/DeepSeek-V4-Flash-NVFP4",
    "nvidia/DeepSeek-V4-Pro-NVFP4", "sgl-project/DeepSeek-V4-Flash-FP8", "sgl-project/DeepSeek-V4-Pro-FP8",
    "moonshotai/Kimi-K3", "zai-org/GLM-5.3-FP8"}



def their_config(name: str) -> dict:
    folder = Path(AIC.submodule_search_locations[0]) / "model_configs"
    return json.loads((folder / f"{name.replace('/', '--')}_config.json").read_text())


def architecture(spec: ModelSpec, context: bool = True) -> dict:
    left_out = FORMAT_FIELDS | (set() if context else {"max_position_embeddings"})
    return {k: v for k, v in dataclasses.asdict(spec).items() if k not in left_out}


@pytest.mark.parametrize("name", sorted(READ))
def test_a_checkpoint_of_the_matrix_loads_the_architecture_its_config_publishes(name):
    """A name of ours has its config's every dimension and context; another publisher's quantised copy its
    dimensions (nvidia's NVFP4 MiniMax-M2.7 declares 196,608 positions, MiniMax's own 204,800)."""
    ours = load_model(our_model(name))
    own = name in known_models()
    assert architecture(ours, own) == architecture(ModelSpec.from_config(their_config(name), name), own)


#: the aiconfigurator-core release whose support matrix was read whole (another may add checkpoints:
#: python bench/aic_matrix.py says which)
MATRIX_READ = "0.12.0"


def test_every_checkpoint_of_the_matrix_is_read():
    """AIConfigurator's support matrix names no checkpoint we refuse (Kimi-K3 was the last, session 42)."""
    from importlib.metadata import version

    if version("aiconfigurator-core") != MATRIX_READ:
        pytest.skip(f"aiconfigurator-core {version('aiconfigurator-core')}: its matrix was not read whole "
                    "(python bench/aic_matrix.py)")
    rows = (Path(AIC.submodule_search_locations[0]) / "systems" / "support_matrix").glob("*.csv")
    names = {line.split(",")[0] for f in rows for line in f.read_text().splitlines()[1:] if line.count(",") > 2}
    assert names and names <= READ, sorted(names - READ)
