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


def test_head_48_with_an_fp8_cache_is_refused(tmp_path: Path) -> None:
    """48 runs on VEC16, which has no fp8 cache kernel (cpu_attn.py _get_attn_isa raises)."""
    model = tiny_llama(tmp_path / "m", 48)
    result = subprocess.run([sys.executable, "-m", "launcher", "plan", str(model), "--device", "cpu", "--",
                             "--max-model-len", "1024", "--kv-cache-dtype", "fp8"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 78 and "divisible by 32" in result.stderr


HEAD_CASES = ("llama_h16-base", "llama_h40-base", "llama_h48-base", "llama_h48-kv-fp8")


@pytest.mark.parametrize("case_id", HEAD_CASES)
def test_recorded_head_size_runs(case_id: str) -> None:
    """The real 0.32 CPU engine (tests/data/vllm_cpu_truth.json): what it serves is planned exactly,
    what it sizes and then fails (16, 40; 48 with fp8) is refused."""
    from launcher.common.errors import WontFit
    from launcher.common.units import GiB
    from launcher.model.config import geometry_from_config
    from launcher.model.gpu import HostMemory
    from launcher.model.resolve import ResolvedModel
    from launcher.plan.planner import make_plan
    from launcher.plan.types import PlanRequest

    truth = json.loads((Path(__file__).parent / "data" / "vllm_cpu_truth.json").read_text())
    case = next(c for c in truth["cases"] if c["id"] == case_id)
    model = ResolvedModel(name=case["kind"], source="local", geometry=geometry_from_config(case["config"]),
                          weight_bytes=10 * 2**20, weight_bytes_source="tiny test model", config=case["config"])
    request = PlanRequest(model=model, engine="vllm", device="cpu", engine_version="0.32.0",
                          host=HostMemory(total_bytes=24 * GiB, available_bytes=20 * GiB, cpu_amx=False),
                          engine_args=tuple(case["args"]), engine_env=case["env"])
    if not (case["ok"] and case["completion_ok"]):
        with pytest.raises(WontFit):
            make_plan(request)
        return
    plan = make_plan(request)
    assert (plan.kv_cache_tokens, f"{plan.max_concurrency:.2f}") == (case["tokens"], case["concurrency_str"])
