"""`--quantization fp8` (and fp8_per_tensor / fp8_per_block / fp8_per_channel) on an unquantized
checkpoint: vLLM 0.16+ quantizes the linear and expert weights while loading them, so the weights the
budget counts are the fp8 model, not the checkpoint's bytes (launcher/engines/vllm/budget.py
`online_quant_delta_bytes`); before 0.16 the 16-bit model is allocated whole first. The alternative
"would fit with --quantization fp8_per_tensor" is a plan made with the flag."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.common.errors import WontFit
from launcher.common.units import GiB
from launcher.engines.vllm import budget as vb
from launcher.model.catalog import hypothetical_gpus
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import Plan, PlanRequest

QWEN_7B = resolve_model("qwen2.5-7b")  # bf16, vocab 152064 x hidden 3584, untied lm_head, 28 layers
CHECKPOINT = QWEN_7B.weight_bytes
EMBEDDING_ELEMENTS = 152064 * 3584 * 2  # embed_tokens and lm_head


def _delta(quantization: str, version: str = "0.32.0", model: object = QWEN_7B) -> tuple[int, int, str]:
    resolved = model if not isinstance(model, str) else resolve_model(model)
    return vb.online_quant_delta_bytes(resolved.geometry, quantization=quantization,  # type: ignore[attr-defined]
                                       checkpoint_bytes=resolved.weight_bytes,  # type: ignore[attr-defined]
                                       model_dtype="bfloat16", version=version)


class TestWeightsAsLoaded:
    def test_linear_weights_become_one_byte_the_embeddings_stay_bf16(self) -> None:
        delta, error, rule = _delta("fp8")
        quantized = CHECKPOINT // 2 - EMBEDDING_ELEMENTS
        assert CHECKPOINT + delta == EMBEDDING_ELEMENTS * 2 + quantized == 8_705_611_264  # 8.11 GiB of 14.19
        assert "embedding and lm_head kept in bfloat16" in rule
        # norms and q/k/v biases counted among the quantized: 28 x (2 x 3584 + (28 + 2 x 4) x 128) elements
        assert error == 28 * (2 * 3584 + 36 * 128)

    def test_each_fp8_spelling_and_the_block_scales(self) -> None:
        per_tensor = _delta("fp8_per_tensor")[0]
        assert _delta("fp8")[0] == per_tensor == _delta("fp8_per_channel")[0]
        quantized = CHECKPOINT // 2 - EMBEDDING_ELEMENTS
        assert _delta("fp8_per_block")[0] - per_tensor == int(quantized * (1 + 4 / 16384)) - quantized

    def test_before_0_32_one_layers_16_bit_weights_may_stay_cached(self) -> None:
        quantized = CHECKPOINT // 2 - EMBEDDING_ELEMENTS
        assert _delta("fp8", "0.31.0")[1] - _delta("fp8", "0.32.0")[1] == quantized // 28 * 2

    def test_before_0_16_the_whole_16_bit_model_is_the_load_peak(self) -> None:
        delta, error, rule = _delta("fp8", "0.15.0")
        assert (delta, error) == (0, 0) and "allocates the whole model in 16 bits" in rule
        assert _delta("fp8", "0.16.0")[0] == _delta("fp8")[0]

    def test_quantized_checkpoints_moe_only_schemes_and_no_flag_change_nothing(self) -> None:
        assert _delta("fp8", model="qwen2.5-7b-awq") == (0, 0, "")  # the checkpoint's method decides
        assert _delta("int8_per_channel_weight_only") == (0, 0, "")  # experts only: a dense model keeps bf16
        assert vb.online_quant_delta_bytes(QWEN_7B.geometry, quantization=None, checkpoint_bytes=CHECKPOINT,
                                           model_dtype="bfloat16", version="0.32.0") == (0, 0, "")

    def test_a_multimodal_wrapper_keeps_its_checkpoint_bytes_and_says_why(self) -> None:
        wrapper = dataclasses.replace(QWEN_7B.geometry, is_multimodal=True)
        delta, _error, rule = vb.online_quant_delta_bytes(wrapper, quantization="fp8", checkpoint_bytes=CHECKPOINT,
                                                          model_dtype="bfloat16", version="0.32.0")
        assert delta == 0 and "not derived here" in rule


def _plan(model: str, gpus: str, *args: str, version: str | None = None) -> Plan:
    base = PlanRequest(model=resolve_model(model), engine="vllm", gpus=hypothetical_gpus([gpus]),
                       engine_version=version)
    return make_plan(dataclasses.replace(base, engine_args=args), choices=True)


class TestThePlan:
    def test_the_kv_cache_gains_what_the_weights_lose(self) -> None:
        plain, quantized = _plan("qwen2.5-7b", "l40s"), _plan("qwen2.5-7b", "l40s", "--quantization", "fp8")
        assert plain.item("weights").bytes - quantized.item("weights").bytes == CHECKPOINT - 8_705_611_264
        assert quantized.item("weights").source == "computed"
        assert "- 6.07 GiB as loaded (--quantization fp8" in quantized.item("weights").detail
        gained = quantized.kv_cache_bytes - plain.kv_cache_bytes
        assert 6.0 * GiB < gained < 6.2 * GiB  # 6.08 GiB, in whole blocks

    def test_an_old_version_plans_the_checkpoint_and_says_so(self) -> None:
        old = _plan("qwen2.5-7b", "l40s", "--quantization", "fp8", version="0.15.0")
        rope = 32768 * 128 * 2  # vLLM's rotary table, counted with the weights
        assert old.item("weights").bytes == CHECKPOINT + rope and "load peak" in old.item("weights").detail

    @pytest.mark.parametrize(("version", "spelling"), [("0.32.0", "fp8_per_tensor"), ("0.19.0", "fp8")])
    def test_online_fp8_is_offered_when_the_bf16_model_does_not_fit(self, version: str, spelling: str) -> None:
        with pytest.raises(WontFit) as refused:
            _plan("llama-3.1-70b", "2xh100", "-tp", "2", "--max-model-len", "32768", version=version)
        offered = [a for a in refused.value.alternatives if a.engine_args[-2:] == ("--quantization", spelling)]
        assert len(offered) == 1
        pinned = _plan("llama-3.1-70b", "2xh100", "-tp", "2", "--max-model-len", "32768", "--quantization", spelling,
                       version=version)
        assert offered[0].kv_cache_tokens == pinned.kv_cache_tokens > 4 * 32768

    def test_not_offered_where_quantization_is_pinned_or_the_checkpoint_is_quantized(self) -> None:
        for plan in (_plan("llama-3.1-70b", "2xh100", "-tp", "2", "--quantization", "fp8"),
                     _plan("llama-3.1-70b-awq", "l40s")):
            assert not [a for a in plan.alternatives if "fp8_per_tensor" in a.engine_args]
