"""Our plan against what the real vLLM 0.32 CPU engine printed (tests/data/vllm_cpu_truth.json).

The truth file was recorded by `tests/engine_harness.py truth`, which starts the real engine
on tiny random models; the live twin of this test is tests/test_engine_vllm_cpu.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.common.units import GiB
from launcher.model.config import geometry_from_config
from launcher.model.gpu import HostMemory
from launcher.model.resolve import ResolvedModel
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest

TRUTH = json.loads((Path(__file__).parent / "data" / "vllm_cpu_truth.json").read_text())
CASES = [c for c in TRUTH["cases"] if c.get("tokens") is not None]
# Cases the engine printed a KV line for and then could not serve: our plan refuses them.
BROKEN = [c for c in CASES if not c.get("ok") or not c.get("completion_ok")]
SERVED = [c for c in CASES if c not in BROKEN]


def plan_for(case: dict, *, amx: bool) -> object:
    model = ResolvedModel(name=case["kind"], source="local", geometry=geometry_from_config(case["config"]),
                          weight_bytes=10 * 2**20, weight_bytes_source="tiny test model", config=case["config"])
    request = PlanRequest(model=model, engine="vllm", device="cpu",
                          host=HostMemory(total_bytes=24 * GiB, available_bytes=20 * GiB, cpu_amx=amx),
                          engine_args=tuple(case["args"]), engine_env=case["env"], engine_version="0.32.0")
    return make_plan(request)


@pytest.mark.parametrize("case", BROKEN, ids=[c["id"] for c in BROKEN])
def test_cases_the_engine_cannot_serve_are_refused(case: dict) -> None:
    """Where the engine sized its cache and then failed to start or to serve, we refuse first (exit 78)."""
    from launcher.common.errors import WontFit

    with pytest.raises(WontFit):
        plan_for(case, amx=TRUTH["meta"]["versions"]["amx"])


@pytest.mark.parametrize("case", SERVED, ids=[c["id"] for c in SERVED])
def test_tokens_and_concurrency_equal_the_engine(case: dict) -> None:
    """Predicted KV tokens and maximum concurrency equal the engine's own log line exactly."""
    plan = plan_for(case, amx=TRUTH["meta"]["versions"]["amx"])
    assert plan.kv_cache_tokens == case["tokens"]
    assert f"{plan.max_concurrency:.2f}" == case["concurrency_str"]
    if case.get("num_blocks") is not None:
        assert plan.num_blocks == case["num_blocks"]


def test_truth_covers_the_required_kinds() -> None:
    """The recorded matrix has GQA, Qwen2, sliding window, alternating, MLA, fp8 and a long length."""
    kinds = {c["kind"] for c in CASES}
    assert {"llama", "qwen2", "mistral", "gemma2", "deepseek_v2"} <= kinds
    assert any("fp8" in " ".join(c["args"]) for c in CASES)
    assert any(c["max_model_len"] and c["max_model_len"] > 4096 for c in CASES)


def test_window_models_print_more_than_bytes_over_bytes_per_token() -> None:
    """Sliding-window and MLA models print numbers that are not KV bytes / bytes per token."""
    for case in CASES:
        if case["kind"] in ("mistral", "gemma2") and "--disable-hybrid-kv-cache-manager" not in case["args"]:
            geometry = geometry_from_config(case["config"])
            naive = int(case["env"]["VLLM_CPU_KVCACHE_SPACE"]) * GiB // geometry.kv_bytes_per_token(2)
            assert case["tokens"] != naive
