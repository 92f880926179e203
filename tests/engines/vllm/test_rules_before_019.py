"""vLLM before 0.19 by release, from the wheels: no fp16 fallback for bf16 checkpoints on GPUs
without bf16 before 0.9.0, compressed-tensors W4A16 needing compute capability 8.0 before 0.12.0
and W8A16-FP8 before 0.16.0 (0.32 takes 7.5 for both); the sort in the profile's sampler until 0.16 and the
CUDA-graph profile inside the measured non-torch memory in 0.18-0.26, against llm-d-planner's version sweep."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.common.errors import WontFit
from launcher.engines import vllm as vl
from launcher.engines.vllm import budget as vb
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.resolve import ResolvedModel, resolve_model
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
    assert versions[:9] == ["0.8.5", "0.9.0", "0.10.0", "0.10.1", "0.11.1", "0.12.0", "0.16.0", "0.17.0", "0.18.0"]
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


def test_sampler_and_graph_profile_by_release() -> None:
    """0.17 brings 0.19's Triton top-k/top-p (no sort); 0.18-0.26 profile CUDA-graph memory inside
    memory_profiling, 0.27 after it (read in the 0.17-0.32 wheels)."""
    assert [vl.rules_for(v)[0].sorting_sampler for v in ("0.15.0", "0.16.1", "0.17.0", "0.18.1", "0.19.0")] == [
        True, True, False, False, False]
    assert [vl.rules_for(v)[0].graphs_profiled_in_budget
            for v in ("0.16.0", "0.17.1", "0.18.0", "0.19.0", "0.26.1", "0.27.0", "0.32.0", "0.34.0")] == [
        False, False, True, True, True, False, False, False]


QWEN3_14B_SWEEP = {"0.15.0": 41.94, "0.16.0": 41.94, "0.17.0": 45.34, "0.18.0": 45.23}


def _qwen3_14b(version: str, *args: str) -> Any:
    return make_plan(PlanRequest(model=resolve_model("qwen3-14b"), engine="vllm", gpus=hypothetical_gpus(["h100"]),
                                 engine_version=version,
                                 engine_args=("--max-model-len", "8192", "--gpu-memory-utilization", "0.95",
                                              "--no-enable-prefix-caching", *args)))


@pytest.mark.parametrize("version", sorted(QWEN3_14B_SWEEP))
def test_qwen3_14b_version_sweep(version: str) -> None:
    """llm-d-planner's version sweep on one H100 (tests/data/startup-logs/startup-logs-3.yaml): the KV the
    engine printed, within 0.05 GiB, across the sampler change (0.17) and the graph profile's non-torch (0.18)."""
    plan = _qwen3_14b(version)
    assert abs(plan.kv_cache_bytes / 2**30 - QWEN3_14B_SWEEP[version]) <= 0.05
    assert plan.kv_cache_bytes_low <= QWEN3_14B_SWEEP[version] * 2**30 <= plan.kv_cache_bytes_high


def _non_torch(version: str, *args: str) -> int:
    return next(item.bytes for item in _qwen3_14b(version, *args).budget if item.key == "non_torch")


def test_an_eager_start_profiles_no_graphs() -> None:
    """--enforce-eager: no CUDA-graph profile inside the measurement, so 0.18-0.26's non-torch is the
    0.13-0.16 GiB of starts without it; from 0.27 the profile is outside it; 0.34's sizing after capture
    holds the capture's own."""
    assert _non_torch("0.19.0") == vb.NON_TORCH_BYTES_TP1_V019
    assert _non_torch("0.19.0", "--enforce-eager") == vb.NON_TORCH_BYTES_TP1
    assert _non_torch("0.17.0") == _non_torch("0.27.0") == vb.NON_TORCH_BYTES_TP1
    assert _non_torch("0.34.0") == vb.NON_TORCH_BYTES_TP1_V019
    assert _non_torch("0.34.0", "--enforce-eager") == vb.NON_TORCH_BYTES_TP1
