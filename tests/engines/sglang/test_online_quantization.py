"""SGLang `--quantization fp8` on an unquantized checkpoint (sglang/budget.py `online_quantized`): the
16-bit weights are all allocated before any module is quantized, so they must fit at the load peak;
the pool is then sized from the fp8 model (the same arithmetic as vLLM's: linear and expert weights at
one byte, the embedding and lm_head in the model dtype)."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.common.errors import WontFit
from launcher.engines.sglang import budget as sb
from launcher.model.catalog import hypothetical_gpus
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import Plan, PlanRequest

QWEN_7B = resolve_model("qwen2.5-7b")
FP8_MODEL = 8_705_611_264  # 152064 x 3584 x 2 embedding elements at 2 B + the rest at 1 B (vLLM's test too)


def _plan(model: str, gpus: str, *args: str) -> Plan:
    base = PlanRequest(model=resolve_model(model), engine="sglang", gpus=hypothetical_gpus([gpus]))
    return make_plan(dataclasses.replace(base, engine_args=args), choices=True)


def test_the_weights_are_the_fp8_model_and_the_peak_the_checkpoint() -> None:
    online = sb.online_quantized(QWEN_7B.geometry, quantization="fp8", checkpoint_bytes=QWEN_7B.weight_bytes,
                                 model_dtype="bfloat16", tp=2, pp=1)
    assert online is not None
    assert (online.bytes, online.peak_bytes) == (FP8_MODEL // 2, QWEN_7B.weight_bytes // 2)
    assert "after loading" in online.rule and "embedding and lm_head kept in bfloat16" in online.rule


def test_only_fp8_on_an_unquantized_text_model() -> None:
    awq = resolve_model("qwen2.5-7b-awq")
    for geometry, method in ((QWEN_7B.geometry, None), (QWEN_7B.geometry, "w8a8_fp8"), (awq.geometry, "fp8"),
                             (dataclasses.replace(QWEN_7B.geometry, is_multimodal=True), "fp8")):
        assert sb.online_quantized(geometry, quantization=method, checkpoint_bytes=QWEN_7B.weight_bytes,
                                   model_dtype="bfloat16", tp=1, pp=1) is None


def test_the_pool_gains_what_the_weights_lose_less_the_wider_loader_term() -> None:
    plain, quantized = _plan("qwen2.5-7b", "l40s"), _plan("qwen2.5-7b", "l40s", "--quantization", "fp8")
    assert quantized.item("weights").bytes == FP8_MODEL and quantized.item("weights").source == "computed"
    lost = plain.item("weights").bytes - quantized.item("weights").bytes
    loader = quantized.item("load_overhead").bytes - plain.item("load_overhead").bytes
    assert "not derived for weights quantized while loading" in quantized.item("load_overhead").detail
    assert abs(quantized.kv_cache_bytes - plain.kv_cache_bytes - (lost - loader)) < 57344 * 2  # whole tokens


def test_the_16_bit_load_peak_is_refused_and_tensor_parallel_offers_fp8() -> None:
    with pytest.raises(WontFit, match="runs out of memory while loading: --quantization fp8 allocates the 16-bit"):
        _plan("llama-3.1-70b", "h100", "--quantization", "fp8")
    with pytest.raises(WontFit) as refused:
        _plan("llama-3.1-70b", "2xh100", "--tp-size", "2", "--context-length", "32768")
    offered = [a for a in refused.value.alternatives if a.engine_args[-2:] == ("--quantization", "fp8")]
    assert len(offered) == 1
    pinned = _plan("llama-3.1-70b", "2xh100", "--tp-size", "2", "--context-length", "32768", "--quantization", "fp8")
    assert offered[0].kv_cache_tokens == pinned.kv_cache_tokens
