"""vLLM before 0.19 by release, from the wheels: no fp16 fallback for bf16 checkpoints on GPUs
without bf16 before 0.9.0, compressed-tensors W4A16 needing compute capability 8.0 before 0.12.0
and W8A16-FP8 before 0.16.0 (0.32 takes 7.5 for both)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.common.errors import WontFit
from launcher.engines import vllm as vl
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.resolve import ResolvedModel
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest

LLAMA = Path(__file__).resolve().parents[2] / "data" / "startup-logs" / "models" / "llama-3.1-8b-instruct"


def _model(quantization: dict[str, Any] | None = None, weight_gib: float = 5.0) -> ResolvedModel:
    config = json.loads((LLAMA / "config.json").read_text())
    if quantization is not None:
        config["quantization_config"] = quantization
    return ResolvedModel(name="llama", source="local", geometry=geometry_from_config(config),
                         weight_bytes=int(weight_gib * 2**30), weight_bytes_source="test", config=config)


def _plan(model: ResolvedModel, version: str, gpu: str = "t4") -> Any:
    return make_plan(PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus([gpu]), engine_version=version,
                                 engine_args=("--max-model-len", "2048")))


W4A16 = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
    "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}, "input_activations": None}}}
W8A16_FP8 = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
    "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}, "input_activations": None}}}


def test_bf16_on_a_t4_is_refused_before_the_fallback_landed() -> None:
    with pytest.raises(WontFit) as refused:
        _plan(_model(), "0.8.5")
    assert refused.value.rule == "dtype-bf16-capability"
    assert "vllm/v1/worker/gpu_worker.py:345 (vLLM 0.8.5)" in refused.value.message
    plan = _plan(_model(), "0.9.0")
    assert any("falls back to float16" in n for n in plan.notes)


@pytest.mark.parametrize(("quantization", "refused_on", "planned_on"), [
    (W4A16, "0.11.0", "0.12.0"), (W8A16_FP8, "0.15.0", "0.16.0")], ids=["w4a16", "w8a16-fp8"])
def test_compressed_tensors_capability_by_release(quantization: dict[str, Any], refused_on: str,
                                                  planned_on: str) -> None:
    model = _model(quantization)
    with pytest.raises(WontFit) as refused:
        _plan(model, refused_on, gpu="t4")
    assert "compute capability 8.0" in (refused.value.hint or ""), refused.value.message
    line = {"0.11.0": 626, "0.15.0": 784}[refused_on]  # _check_scheme_supported in that wheel
    assert refused.value.source == f"{vl_ct()}:{line} (vLLM {refused_on})"
    assert _plan(model, planned_on, gpu="t4").kv_cache_bytes > 0
    assert _plan(model, "0.32.0", gpu="t4").kv_cache_bytes > 0


def vl_ct() -> str:
    return "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py"


def test_rule_sets_before_019() -> None:
    versions = [r.version for r in vl.RULES]
    assert versions[:7] == ["0.8.5", "0.9.0", "0.10.0", "0.10.1", "0.11.1", "0.12.0", "0.16.0"]
    assert [vl.rules_for(v)[0].flashinfer_version_as_string for v in ("0.8.5", "0.10.0", "0.10.1")] == [
        True, True, False]
    assert [vl.rules_for(v)[0].flashinfer_sampler for v in ("0.8.5", "0.9.0", "0.11.0", "0.11.1", "0.18.1")] == [
        "below_0.2.3", "installed", "installed", "opt_in", "opt_in"]
    assert vl.rules_for("0.13.2")[0].ct_wna16_min_capability == 75
    assert vl.rules_for("0.13.2")[0].ct_w8a16_fp8_min_capability == 80
    assert not vl.rules_for("0.8.5")[0].bf16_fallback and vl.rules_for("0.9.2")[0].bf16_fallback


QWEN3_MOE = Path(__file__).resolve().parents[2] / "data" / "startup-logs" / "models" / "qwen3-30b-a3b"


def _moe_plan(version: str, *args: str) -> Any:
    config = json.loads((QWEN3_MOE / "config.json").read_text())
    model = ResolvedModel(name="Qwen/Qwen3-30B-A3B", source="local", geometry=geometry_from_config(config),
                          weight_bytes=int(56.9 * 2**30), weight_bytes_source="test", config=config)
    return make_plan(PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["4xa10"]), engine_version=version,
                                 engine_args=("--tensor-parallel-size", "4", "--max-model-len", "4096", *args)))


def test_graphs_captured_outside_the_request_on_085() -> None:
    """4 x A10, Qwen3-30B-A3B on vLLM 0.8.5: graphs are captured after the KV cache from what vLLM
    did not request (reported: OOM in capture, fine with --enforce-eager). At the default 0.9 the
    unrequested ~1.4 GiB per rank is less than the graphs' unfavourable end: the plan says so; when
    safe-serve picks the utilization it leaves that much out; --enforce-eager has no graphs."""
    pinned = _moe_plan("0.8.5", "--gpu-memory-utilization", "0.9")
    assert pinned.may_not_fit is not None and "captures CUDA graphs after sizing the KV cache" in pinned.may_not_fit
    chosen = _moe_plan("0.8.5")
    assert chosen.engine_figures["gpu_memory_utilization"] is not None
    assert chosen.engine_figures["gpu_memory_utilization"] < 0.9
    assert chosen.may_not_fit is None
    assert _moe_plan("0.8.5", "--gpu-memory-utilization", "0.9", "--enforce-eager").may_not_fit is None
    # From 0.20 the estimate is subtracted inside the request: no doubt about capture.
    assert _moe_plan("0.20.0", "--gpu-memory-utilization", "0.9").may_not_fit is None
