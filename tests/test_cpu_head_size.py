"""vLLM's CPU attention runs only the head sizes its kernels are compiled for (48 runs although
cpu_attn.py:70 does not list it; 16 and 40 do not): a model the CPU engine would size and then
fail on its first request is refused before launch, and only that.

The served side (a head-64 model that answers a completion on the real CPU engine) is
tests/test_serve_engine.py; the engine's own decision over head sizes is in
tests/data/vllm_checks_oracle.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def tiny_llama(directory: Path, head_dim: int) -> Path:
    heads = 4
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": heads * head_dim,
              "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": heads,
              "num_key_value_heads": 2, "head_dim": head_dim, "vocab_size": 512, "max_position_embeddings": 2048,
              "torch_dtype": "bfloat16"}
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 4 << 20},
                                                                        "weight_map": {}}))
    return directory


def plan_cpu(model: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *extra, str(model), "--device", "cpu",
                           "--", "--max-model-len", "1024"], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("head_dim", [16, 40])
def test_unsupported_cpu_head_size_is_refused_before_launch(tmp_path: Path, head_dim: int) -> None:
    result = plan_cpu(tiny_llama(tmp_path / "m", head_dim), "plan")
    assert result.returncode == 78
    assert f"{head_dim}" in result.stderr and "head" in result.stderr.lower()
    # serve refuses the same way and never starts an engine (the command would not exist).
    served = plan_cpu(tiny_llama(tmp_path / "s", head_dim), "serve", "--engine-cmd", "/nonexistent/engine")
    assert served.returncode == 78 and "engine exited" not in served.stderr


@pytest.mark.parametrize("head_dim", [32, 48, 64, 80, 112, 128])
def test_supported_cpu_head_sizes_plan(tmp_path: Path, head_dim: int) -> None:
    result = plan_cpu(tiny_llama(tmp_path / "m", head_dim), "plan")
    assert result.returncode == 0, result.stderr
