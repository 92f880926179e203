"""SGLang start-time checks with real values (read from SGLang 0.5.23; no oracle run yet)."""

from __future__ import annotations

from typing import Any

import pytest

from launcher.engines.checks_common import CheckInput, EngineRule
from launcher.engines.sglang.checks import start_checks
from launcher.model.config import ModelGeometry, geometry_from_config

QWEN = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
        "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064,
        "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}


def _inp(geo: ModelGeometry, *, cc: tuple[int, int] | None = (9, 0), tp: int = 1, gpus: int = 1,
         dtype: str = "bfloat16", max_len: int | None = None) -> CheckInput:
    return CheckInput(geometry=geo, device="cuda", compute_capability=cc, gpu_count=gpus, tp=tp, pp=1, dtype=dtype,
                      kv_cache_dtype=None, block_size=None, max_model_len=max_len, model_max_len=32768,
                      engine_version="0.5.23")


def _rules(inp: CheckInput) -> dict[str, EngineRule]:
    return {r.rule: r for r in start_checks(inp)}


def _quant(qc: dict[str, Any]) -> ModelGeometry:
    return geometry_from_config({**QWEN, "quantization_config": qc})


def test_tp3_refused_with_hint_and_tp4_accepted() -> None:
    geo = geometry_from_config(QWEN)
    rule = _rules(_inp(geo, tp=3, gpus=3))["tp-divides-heads"]
    assert "28 heads, tp_size 3" in rule.message and rule.hint == "--tp-size 1 or 2"
    assert rule.source == "sglang/srt/models/qwen2.py:167 (SGLang 0.5.23)"
    assert _rules(_inp(geo, tp=7, gpus=7))["kv-heads-vs-tp"].message == "7 is not divisible by 4"
    assert start_checks(_inp(geo, tp=4, gpus=4)) == ()


def test_awq_marlin_needs_sm80_plain_awq_sm75_and_fp16() -> None:
    awq = _quant({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True})
    assert "Minimum capability: 75. Current capability: 70." in _rules(_inp(awq, cc=(7, 0), dtype="float16"))[
        "quant-min-capability"].message
    assert start_checks(_inp(awq, cc=(7, 5), dtype="float16")) == ()
    assert _rules(_inp(awq, cc=(7, 5), dtype="bfloat16"))["quant-act-dtype"].message == (
        "torch.bfloat16 is not supported for quantization method awq. Supported dtypes: [torch.float16]")
    assert start_checks(_inp(awq, cc=(8, 0))) == ()  # awq_marlin


def test_fp8_needs_sm80_in_sglang() -> None:
    fp8 = _quant({"quant_method": "fp8", "activation_scheme": "dynamic"})
    assert "Minimum capability: 80. Current capability: 75." in _rules(_inp(fp8, cc=(7, 5), dtype="float16"))[
        "quant-min-capability"].message
    assert start_checks(_inp(fp8, cc=(8, 9))) == ()


def test_context_length_above_derived_refused() -> None:
    rule = _rules(_inp(geometry_from_config(QWEN), max_len=40000))["context-length"]
    assert rule.message.startswith("Warning: User-specified context_length (40000) is greater than the derived "
                                   "context_length (32768).")
    assert start_checks(_inp(geometry_from_config(QWEN), max_len=32768)) == ()


@pytest.mark.parametrize(("version", "kv", "refused"), [("0.5.23", "fp8", True), ("0.5.23", "float16", True),
                                                        ("0.5.23", "fp8_e4m3", False), ("0.5.2", "bf16", True),
                                                        ("0.5.4", "bf16", False), ("0.5.21", "fp4_e2m1", True)])
def test_kv_cache_dtype_choices_by_version(version: str, kv: str, refused: bool) -> None:
    from launcher.common.errors import UsageError
    from launcher.model.catalog import hypothetical_gpus
    from launcher.model.resolve import resolve_model
    from launcher.plan.planner import make_plan
    from launcher.plan.types import PlanRequest

    request = PlanRequest(model=resolve_model("qwen2.5-7b"), engine="sglang", gpus=hypothetical_gpus(["h100"]),
                          engine_version=version, engine_args=("--kv-cache-dtype", kv))
    if refused:
        with pytest.raises(UsageError, match="invalid choice"):  # SGLang's argparse: exit 2
            make_plan(request)
    else:
        assert make_plan(request).kv_cache_tokens > 0


def test_fp8_compressed_tensors_needs_sm80_in_sglang() -> None:
    from launcher.common.errors import WontFit
    from launcher.model.catalog import hypothetical_gpus
    from launcher.model.resolve import resolve_model
    from launcher.plan.planner import make_plan
    from launcher.plan.types import PlanRequest

    with pytest.raises(WontFit, match="Min capability: 80") as info:
        make_plan(PlanRequest(model=resolve_model("qwen2.5-7b-fp8"), engine="sglang", gpus=hypothetical_gpus(["t4"])))
    assert info.value.rule == "quant-scheme-capability"


def test_a_method_the_release_does_not_register_is_refused() -> None:
    """fbgemm_fp8 (Llama-3.1-405B-Instruct-FP8) is registered through 0.5.13 and not from 0.5.18
    (layers/quantization/__init__.py of each wheel); a release between them is taken to register what either
    does, so 0.5.16 is not refused. awq/gptq may be rewritten by another method's override: never refused."""
    from launcher.engines.sglang.checks import unregistered_method

    assert unregistered_method("fbgemm_fp8", "0.5.13") is None
    assert unregistered_method("fbgemm_fp8", "0.5.16") is None
    release, registry = unregistered_method("fbgemm_fp8", "0.5.18")  # type: ignore[misc]
    assert release == "0.5.18" and "fp8" in registry and "fbgemm_fp8" not in registry
    assert unregistered_method("fbgemm_fp8", None) is not None  # the newest release: 0.5.23
    assert unregistered_method("experts_int8", "0.5.2") is None and unregistered_method("experts_int8", "0.5.9")
    assert unregistered_method("gptq", "0.5.23") is None  # not registered, but rewritten to gptq_marlin on sm80+
    assert unregistered_method("fp8", "0.5.23") is None


def test_a_registered_checkpoint_name_is_not_refused_for_our_resolution_of_it() -> None:
    """0.5.2 registers `modelopt` but not `modelopt_fp8`, the name the plan resolves a ModelOpt FP8
    checkpoint to: SGLang 0.5.2 loads it under `modelopt`, so the plan does not refuse it."""
    import json
    from pathlib import Path

    from launcher.engines.checks_common import CheckInput
    from launcher.engines.sglang.checks import resolved_quant_method, start_checks
    from launcher.model.config import geometry_from_config

    path = Path(__file__).resolve().parents[2] / "data" / "configs" / "llama-3.1-8b-instruct.json"
    config = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8"}

    def inp(version: str) -> CheckInput:
        return CheckInput(geometry=geometry_from_config(config), device="cuda", compute_capability=(9, 0),
                          gpu_count=1, tp=1, pp=1, dtype="bfloat16", kv_cache_dtype=None, block_size=None,
                          max_model_len=None, model_max_len=131072, engine_version=version)

    assert resolved_quant_method(inp("0.5.2")) == "modelopt_fp8"
    assert not [r for r in start_checks(inp("0.5.2")) if r.rule == "quant-unknown-method"]
    config["quantization_config"] = {"quant_method": "fbgemm_fp8"}
    assert [r.rule for r in start_checks(inp("0.5.21"))] == ["quant-unknown-method"]
