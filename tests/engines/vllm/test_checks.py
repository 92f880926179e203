"""vLLM start-time checks: every golden case decided as vLLM decided it, plus each rule with real values."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from launcher.engines.checks_common import CheckInput, EngineRule
from launcher.engines.dtypes import resolve_dtype
from launcher.engines.vllm import RULES, derived_max_model_len
from launcher.engines.vllm.checks import start_checks
from launcher.model.config import ModelGeometry, geometry_from_config

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "vllm_checks_oracle.json"
DOC = json.loads(GOLDEN.read_text())
CONFIGS: dict[str, dict[str, Any]] = DOC["header"]["configs"]

# The rules each oracle group exercised (the oracle runs only that part of vLLM per case).
GROUP_RULES = {
    "parallel": {"tp-divides-heads", "vocab-vs-tp", "kv-heads-vs-tp", "world-size-vs-gpus"},
    "quant": {"quant-unknown-method", "quant-deprecated", "quant-min-capability", "quant-act-dtype",
              "quant-scheme-capability", "quant-config-key", "quant-act-order", "quant-gptq-type"},
    "quant-flag": {"quant-mismatch", "quant-unknown-method", "quant-deprecated"},
    "quant-config": {"quant-mismatch", "quant-unknown-method", "quant-deprecated", "quant-min-capability",
                     "quant-act-dtype", "quant-scheme-capability", "quant-config-key", "quant-act-order",
                     "quant-gptq-type"},
    "dtype": {"dtype-bf16-capability", "dtype-float16-model"},
    "length": {"max-model-len"},
    "cpu-head": {"cpu-attn-head-size"},
}


def _geometry(name: str) -> ModelGeometry:
    return geometry_from_config(CONFIGS[name])


def _inp(geometry: ModelGeometry, *, device: str = "cuda", cc: tuple[int, int] | None = (9, 0), gpus: int = 1,
         tp: int = 1, pp: int = 1, dtype: str | None = None, kv: str | None = None, block: int | None = None,
         max_len: int | None = None, **extra: Any) -> CheckInput:
    if dtype is None:
        dtype = resolve_dtype(geometry, compute_capability=cc, device=device, pinned=None)[0]
    return CheckInput(
        geometry=geometry, device=device, compute_capability=cc, gpu_count=gpus, tp=tp, pp=pp, dtype=dtype,
        kv_cache_dtype=kv, block_size=block, max_model_len=max_len,
        model_max_len=derived_max_model_len(geometry, rules=RULES[-1])[0], engine_version="0.32.0", **extra)


def _case_input(case: dict[str, Any]) -> CheckInput:
    cc = (case["cc"][0], case["cc"][1]) if case["cc"] else None
    return _inp(_geometry(case["model"]), device=case["device"], cc=cc, gpus=case["gpus"],
                tp=case["tp"], pp=case["pp"], dtype=case["dtype"], max_len=case["max_model_len"], gpu_name="TEST",
                quantization=case.get("quantization"))


def test_golden_file_is_a_real_grid() -> None:
    cases = DOC["cases"]
    assert DOC["header"]["vllm"].startswith("0.32.0")
    assert len(cases) >= 200
    assert {c["decision"] for c in cases} == {"accept", "refuse"}
    assert GOLDEN.stat().st_size < 2_000_000


@pytest.mark.parametrize("case", DOC["cases"], ids=[c["id"] for c in DOC["cases"]])
def test_golden_case_decided_as_vllm_decides(case: dict[str, Any]) -> None:
    rules = [r for r in start_checks(_case_input(case)) if r.rule in GROUP_RULES[case["group"]]]
    if case["decision"] == "accept":
        assert rules == [], f"vLLM accepts, we refuse: {rules[0].message}"
        return
    assert rules, f"vLLM refuses ({case['message']}), we accept"
    assert any(r.message in case["message"] for r in rules), (rules[0].message, case["message"])


# --------------------------------------------------------------------------- rules with real values

QWEN = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
        "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064,
        "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}


def _rules(inp: CheckInput) -> dict[str, EngineRule]:
    return {r.rule: r for r in start_checks(inp)}


def test_qwen_tp3_refused_with_vllm_message_and_hint() -> None:
    rule = _rules(_inp(geometry_from_config(QWEN), tp=3, gpus=3))["tp-divides-heads"]
    assert rule.message == "Total number of attention heads (28) must be divisible by tensor parallel size (3)."
    assert rule.source == "vllm/config/model.py:1549 (vLLM 0.32.0)"
    assert rule.hint == "--tensor-parallel-size 1 or 2"
    assert _rules(_inp(geometry_from_config(QWEN), tp=8, gpus=8))["tp-divides-heads"].hint == \
        "--tensor-parallel-size 1, 2 or 4"


def test_kv_heads_replication_needs_tp_multiple_of_kv_heads() -> None:
    geo = geometry_from_config(QWEN)
    assert _rules(_inp(geo, tp=7, gpus=7))["kv-heads-vs-tp"].message == "7 is not divisible by 4"
    assert start_checks(_inp(geo, tp=4, gpus=4)) == ()
    six_kv = geometry_from_config({**QWEN, "hidden_size": 3072, "num_attention_heads": 24, "num_key_value_heads": 6})
    assert _rules(_inp(six_kv, tp=4, gpus=4))["kv-heads-vs-tp"].message == "6 is not divisible by 4"
    assert start_checks(_inp(six_kv, tp=3, gpus=3)) == ()


def test_world_size_above_gpus_refused_on_cuda_only() -> None:
    geo = geometry_from_config(QWEN)
    rule = _rules(_inp(geo, tp=2, pp=2, gpus=3))["world-size-vs-gpus"]
    assert rule.message.startswith("World size (4) is larger than the number of available GPUs (3) in this node.")
    assert "world-size-vs-gpus" not in _rules(_inp(geo, device="cpu", cc=None, tp=2, pp=2, gpus=0))


def _quantized(qc: dict[str, Any], **over: Any) -> ModelGeometry:
    return geometry_from_config({**QWEN, **over, "quantization_config": qc})


def test_awq_on_v100_refused_min_capability_75() -> None:
    awq = _quantized({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True})
    rule = _rules(_inp(awq, cc=(7, 0)))["quant-min-capability"]
    assert rule.message == ("The quantization method auto_awq is not supported for the current GPU. "
                            "Minimum capability: 75. Current capability: 70.")
    assert start_checks(_inp(awq, cc=(7, 5))) == ()  # T4 runs AWQ
    assert start_checks(_inp(awq, device="cpu", cc=None)) == ()


def test_mxfp4_gpt_oss_on_v100_refused_min_capability_80_and_needs_bf16() -> None:
    gpt_oss = geometry_from_config(CONFIGS["gpt-oss-20b"])
    rule = _rules(_inp(gpt_oss, cc=(7, 0), dtype="float16"))["quant-min-capability"]
    assert "gpt_oss_mxfp4" in rule.message and "Minimum capability: 80. Current capability: 70." in rule.message
    assert _rules(_inp(gpt_oss, cc=(8, 0), dtype="float16"))["quant-act-dtype"].message == (
        "torch.float16 is not supported for quantization method gpt_oss_mxfp4. Supported dtypes: [torch.bfloat16]")
    assert start_checks(_inp(gpt_oss, cc=(8, 0), dtype="bfloat16")) == ()


def test_bitsandbytes_is_unknown_to_vllm_032() -> None:
    bnb = _quantized({"quant_method": "bitsandbytes", "load_in_4bit": True})
    assert _rules(_inp(bnb))["quant-unknown-method"].message.startswith(
        "Unknown quantization method: bitsandbytes. Must be one of ['awq', 'auto_awq', 'fp8'")


def test_compressed_tensors_fp8_falls_back_below_sm89_and_refuses_below_sm75() -> None:
    ct = _quantized(CONFIGS["qwen2.5-7b-ct_w8a8_fp8"]["quantization_config"])
    assert start_checks(_inp(ct, cc=(8, 0))) == ()  # W8A16 FP8 (Marlin)
    assert _rules(_inp(ct, cc=(7, 0), dtype="float16"))["quant-scheme-capability"].message == (
        "Quantization scheme is not supported for the current GPU. Min capability: 75. Current capability: 70.")


def test_bf16_before_sm80_refused_and_gemma2_refuses_fp16() -> None:
    geo = geometry_from_config(QWEN)
    rule = _rules(_inp(geo, cc=(7, 0), dtype="bfloat16", gpu_name="Tesla V100-SXM2-16GB"))["dtype-bf16-capability"]
    assert "Your Tesla V100-SXM2-16GB GPU has compute capability 7.0." in rule.message
    assert rule.hint == "--dtype half"
    gemma = geometry_from_config(CONFIGS["gemma2-2b"])
    assert _rules(_inp(gemma, cc=(7, 5), dtype="float16"))["dtype-float16-model"].hint == "--dtype float32"


def test_cpu_head_size_16_refused_64_accepted() -> None:
    tiny = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1024, "torch_dtype": "bfloat16"}
    head16 = geometry_from_config({**tiny, "hidden_size": 64})
    rule = _rules(_inp(head16, device="cpu", cc=None))["cpu-attn-head-size"]
    assert rule.message == "Unsupported CPU attention configuration: head_dim=16"
    assert start_checks(_inp(geometry_from_config({**tiny, "hidden_size": 256}), device="cpu", cc=None)) == ()
    head80 = geometry_from_config({**tiny, "hidden_size": 320})
    assert start_checks(_inp(head80, device="cpu", cc=None)) == ()
    assert _rules(_inp(head80, device="cpu", cc=None, kv="fp8"))[
        "cpu-fp8-kv-head-size"].message == "FP8 KV cache requires head_size divisible by 32 on CPU."


def test_fp8_kv_cache_by_gpu_and_backend() -> None:
    geo = geometry_from_config(QWEN)  # head 128
    v100 = _rules(_inp(geo, cc=(7, 0), dtype="float16", kv="fp8"))["fp8-kv-capability"]
    assert v100.hint == "--kv-cache-dtype float16" and "(compute capability 7.0)" in v100.message
    assert start_checks(_inp(geo, cc=(8, 0), kv="fp8")) == ()  # FlashInfer carries fp8 at head 128
    head80 = geometry_from_config({**QWEN, "hidden_size": 2240})  # 28 x 80: FlashInfer has no 80 -> Triton
    assert "fp8-kv-capability" in _rules(_inp(head80, cc=(8, 0), kv="fp8"))
    assert start_checks(_inp(head80, cc=(8, 9), kv="fp8")) == ()  # Triton fp8 from sm89
    assert "bf16-kv-capability" in _rules(_inp(geo, cc=(7, 5), dtype="float16", kv="bfloat16"))


def test_block_size_not_multiple_of_16_has_no_backend() -> None:
    rule = _rules(_inp(geometry_from_config(QWEN), block=8))["attention-backend"]
    assert rule.message.startswith("No valid attention backend found for cuda")
    assert "FLEX_ATTENTION: [block_size not supported]" in rule.message
    assert start_checks(_inp(geometry_from_config(QWEN), block=32)) == ()


def test_max_model_len_above_derived_refused_unless_allowed() -> None:
    geo = geometry_from_config(QWEN)
    rule = _rules(_inp(geo, max_len=65536))["max-model-len"]
    assert rule.message.startswith("User-specified max_model_len (65536) is greater than the derived "
                                   "max_model_len (max_position_embeddings=32768.0 or model_max_length=None")
    assert rule.hint == "--max-model-len 32768"
    assert start_checks(_inp(geo, max_len=65536, allow_long_max_model_len=True)) == ()
    assert start_checks(_inp(geo, max_len=-1)) == ()


def test_unknown_dtype_and_kv_dtype_refused() -> None:
    geo = geometry_from_config(QWEN)
    assert _rules(_inp(geo, pinned_dtype="banana"))["dtype-unknown"].message == "Unknown dtype: 'banana'"
    assert "invalid choice: 'fp4'" in _rules(_inp(geo, kv="fp4"))["kv-cache-dtype-unknown"].message


def test_sources_follow_the_engine_version() -> None:
    inp = _inp(geometry_from_config(QWEN), tp=3, gpus=3)
    newer = CheckInput(**{**inp.__dict__, "engine_version": "0.33.0"})
    assert start_checks(newer)[0].source == "vllm/config/model.py:1562 (vLLM 0.33.0)"
    newest = CheckInput(**{**inp.__dict__, "engine_version": "0.34.0"})
    assert start_checks(newest)[0].source == "vllm/config/model.py:1582 (vLLM 0.34.0)"
    assert start_checks(CheckInput(**{**inp.__dict__, "engine_version": None}))[0].source.endswith("(vLLM 0.34.0)")


def test_start_checks_costs_under_a_millisecond() -> None:
    inp = _inp(geometry_from_config(CONFIGS["gpt-oss-20b"]), cc=(7, 0), tp=3, gpus=2, dtype="bfloat16",
               kv="fp8", block=8, max_len=10**6)
    start_checks(inp)
    t0 = time.perf_counter()
    for _ in range(200):
        start_checks(inp)
    assert (time.perf_counter() - t0) / 200 < 1e-3


@pytest.mark.parametrize(("version", "refused"), [("0.24.0", False), ("0.27.1", False), ("0.28.0", True),
                                                  ("0.32.0", True)])
def test_bitsandbytes_is_a_method_until_0_28(version: str, refused: bool) -> None:
    """bitsandbytes is in QuantizationMethods up to 0.27 (each wheel's quantization/__init__.py)."""
    config = {**CONFIGS[next(iter(CONFIGS))], "quantization_config": {"quant_method": "bitsandbytes"}}
    geometry = geometry_from_config(config)
    rules = start_checks(dataclasses.replace(_inp(geometry), engine_version=version))
    assert ("quant-unknown-method" in {r.rule for r in rules}) is refused


# vLLM 0.34.0's refusal of a method it does not know, read from its own classes (the oracle grid run on the 0.34.0
# tree: `ModelConfig` with a bitsandbytes checkpoint; every other case of the grid decides as 0.32.0 does).
UNKNOWN_034 = (
    "Unknown quantization method: bitsandbytes. Must be one of ['awq', 'auto_awq', 'fp8', 'w4afp8', 'fbgemm_fp8', "
    "'modelopt', 'modelopt_fp4', 'modelopt_mxfp8', 'modelopt_mixed', 'auto_gptq', 'gptq', 'gptq_marlin', "
    "'awq_marlin', 'humming', 'compressed-tensors', 'experts_int8', 'quark', 'moe_wna16', 'torchao', 'inc', "
    "'mxfp4', 'gpt_oss_mxfp4', 'deepseek_v4_fp8', 'online', 'fp8_per_tensor', 'fp8_per_block', 'fp8_per_channel', "
    "'int8_per_channel_weight_only', 'nvfp4_per_token', 'mxfp8', 'lut_b_moe', 'mxfp4_hadamard32'].")


def _on(version: str | None, geometry: ModelGeometry, **kw: Any) -> dict[str, EngineRule]:
    return _rules(dataclasses.replace(_inp(geometry, **kw), engine_version=version))


def test_vllm_034_lists_its_own_quantization_methods() -> None:
    """0.34.0 quantization/__init__.py:15-56: fp_quant is gone, w4afp8 and two online shorthands are new, only
    fbgemm_fp8 is deprecated; the message lists the methods in vLLM's order."""
    bnb = _quantized({"quant_method": "bitsandbytes", "load_in_4bit": True})
    rule = _on("0.34.0", bnb)["quant-unknown-method"]
    assert rule.message == UNKNOWN_034 and rule.source == "vllm/config/model.py:1487 (vLLM 0.34.0)"
    assert _on(None, bnb)["quant-unknown-method"].message == UNKNOWN_034  # unknown version: the newest lists
    assert "'fp_quant'" in _on("0.33.0", bnb)["quant-unknown-method"].message
    fp_quant = _quantized({"quant_method": "fp_quant"})
    assert "quant-deprecated" in _on("0.33.0", fp_quant)
    assert _on("0.34.0", fp_quant)["quant-unknown-method"].message.startswith("Unknown quantization method: fp_quant.")
    fbgemm = _quantized({"quant_method": "fbgemm_fp8"})
    assert _on("0.34.0", fbgemm)["quant-deprecated"].source == "vllm/config/model.py:1501 (vLLM 0.34.0)"


def test_vllm_034_w4afp8_is_an_fp8_config() -> None:
    """W4AFP8Config extends Fp8Config (0.34.0 w4afp8.py:50): capability 75, bfloat16/float16 activations."""
    w4afp8 = _quantized({"quant_method": "w4afp8", "group_size": 128, "weight_block_size": [128, 128]})
    assert "quant-unknown-method" in _on("0.33.0", w4afp8)
    assert _on("0.34.0", w4afp8) == {}
    assert _on("0.34.0", w4afp8, cc=(7, 0), dtype="float16")["quant-min-capability"].message == (
        "The quantization method w4afp8 is not supported for the current GPU. Minimum capability: 75. "
        "Current capability: 70.")
    assert _on("0.34.0", w4afp8, dtype="float32")["quant-act-dtype"].message == (
        "torch.float32 is not supported for quantization method w4afp8. Supported dtypes: "
        "[torch.bfloat16, torch.float16]")
    online = _on("0.34.0", geometry_from_config(QWEN), quantization="mxfp4_hadamard32", cc=(7, 0), dtype="float16")
    assert "Minimum capability: 75. Current capability: 70." in online["quant-min-capability"].message


def test_kv_cache_dtype_is_validated_by_cache_config_from_0_33() -> None:
    """Up to 0.32 --kv-cache-dtype has argparse choices; from 0.33 it takes any string and CacheConfig refuses an
    unknown one (0.33.0 config/cache.py:470-475, 0.34.0 :505-510), listing KV_CACHE_DTYPES with ROCm's octave
    dtypes (the text is vLLM's own, from CacheConfig(cache_dtype='fp4') on each tree)."""
    geo = geometry_from_config(QWEN)
    old = _on("0.32.0", geo, kv="fp4")["kv-cache-dtype-unknown"]
    assert old.message.startswith("argument --kv-cache-dtype: invalid choice: 'fp4' (choose from auto, float16")
    for version, line in (("0.33.0", 473), ("0.34.0", 508)):
        rule = _on(version, geo, kv="fp4")["kv-cache-dtype-unknown"]
        assert rule.message == (
            "Invalid kv_cache_dtype: 'fp4'. Valid values are: ['auto', 'float16', 'bfloat16', 'fp8', 'fp8_e4m3', "
            "'fp8_e5m2', 'fp8_inc', 'fp8_ds_mla', 'nvfp4_ds_mla', 'turboquant_k8v4', 'turboquant_4bit_nc', "
            "'turboquant_k3v4_nc', 'turboquant_3bit_nc', 'octave_k3v4', 'octave_k3v3', 'octave_k3v3_compact', "
            "'ultraquant_4bit', 'int4_per_token_head', 'int8_per_token_head', 'fp8_per_token_head', 'nvfp4', "
            "'nvfp4_4over6']")
        assert rule.source == f"vllm/config/cache.py:{line} (vLLM {version})" and rule.bad_argument
        assert "kv-cache-dtype-unknown" not in _on(version, geo, kv="octave_k3v4")  # a name 0.33+ knows
    assert "kv-cache-dtype-unknown" in _on("0.32.0", geo, kv="octave_k3v4")  # not before


def test_quantization_flag_against_the_checkpoints_method() -> None:
    """llm-d-planner's 0.19 H100 sweep: --quantization awq on RedHatAI's compressed-tensors W4A16 Llama-3.1-8B and
    --quantization fp8 on its W8A8 one both exited 1; vLLM 0.32's ModelConfig decides every such pair alike
    (the quant-flag group of the oracle). The Marlin and moe_wna16 names an override class maps to the
    checkpoint's method start."""
    w4a16 = _quantized(CONFIGS["qwen2.5-7b-ct_w4a16"]["quantization_config"])
    rule = _on("0.19.0", w4a16, quantization="awq", dtype="float16")["quant-mismatch"]
    assert rule.message == ("Quantization method specified in the model config (compressed-tensors) does not match "
                            "the quantization method specified in the `quantization` argument (awq).")
    assert rule.source == "vllm/config/model.py:1446 (vLLM 0.32.0)" and rule.hint.startswith("leave --quantization out")
    on_033 = _on("0.33.0", w4a16, quantization="fp8")["quant-mismatch"]
    assert on_033.source == "vllm/config/model.py:1459 (vLLM 0.33.0)"
    assert "quant-mismatch" not in _on("0.19.0", w4a16, quantization="compressed-tensors")
    awq = _quantized({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True})
    for accepted in ("awq", "awq_marlin", "marlin", "moe_wna16"):
        assert "quant-mismatch" not in _on("0.32.0", awq, quantization=accepted), accepted
    assert "quant-mismatch" in _on("0.32.0", awq, quantization="gptq_marlin")
    assert "quant-mismatch" not in _on("0.32.0", awq, quantization="inc")  # outside the decided grid: not refused


def test_the_vocabulary_splits_before_the_kv_heads() -> None:
    """llm-d-planner's 0.19 H100 sweep, Qwen3-14B at TP 5: every rank stopped on "AssertionError: 151936 is not
    divisible by 5" (VocabParallelEmbedding, built before the layers), though its 40 heads split and its 8 KV
    heads do not."""
    qwen3_14b = geometry_from_config({**QWEN, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                                      "hidden_size": 5120, "num_attention_heads": 40, "num_key_value_heads": 8,
                                      "head_dim": 128, "num_hidden_layers": 40, "vocab_size": 151936})
    rules = start_checks(_inp(qwen3_14b, tp=5, gpus=5))
    assert [r.rule for r in rules][:2] == ["vocab-vs-tp", "kv-heads-vs-tp"]
    assert rules[0].message == "151936 is not divisible by 5"
    assert rules[0].source == "vllm/model_executor/layers/vocab_parallel_embedding.py:111 (vLLM 0.32.0)"
    assert "vocab-vs-tp" not in _rules(_inp(qwen3_14b, tp=4, gpus=4))  # padded to 64 rows: any power of two
    odd = geometry_from_config({**QWEN, "vocab_size": 32001})  # padded to 32,064 = 2^6 x 501: 3 divides it
    assert "vocab-vs-tp" not in _rules(_inp(odd, tp=2, gpus=2))


# --------------------------------------------------------------------------- the checkpoint's quantization_config

GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}


def _at(inp: CheckInput, version: str) -> CheckInput:
    return dataclasses.replace(inp, engine_version=version)


def test_gptq_group_act_order_refused_from_0_30_on_any_device() -> None:
    act_order = _quantized({**GPTQ, "desc_act": True})
    for device, cc in (("cuda", (9, 0)), ("cpu", None)):
        rule = _rules(_at(_inp(act_order, device=device, cc=cc), "0.30.0"))["quant-act-order"]
        assert rule.message == ("GPTQ group activation ordering (desc_act=True) is no longer supported. Use a "
                                "checkpoint with static activation ordering or desc_act=False.")
        assert rule.source == "vllm/model_executor/layers/quantization/utils/gptq_utils.py:33 (vLLM 0.30.0)"
        assert "0.29" in (rule.hint or "")
    assert start_checks(_at(_inp(act_order), "0.29.0")) == ()  # Marlin's act-order kernel ran it
    # One group per output channel: act order is a no-op, vLLM clears it.
    assert start_checks(_at(_inp(_quantized({**GPTQ, "desc_act": True, "group_size": -1})), "0.34.0")) == ()


def test_gptq_dynamic_rule_enables_act_order() -> None:
    dynamic = _quantized({**GPTQ, "dynamic": {"-:.*lm_head": {"desc_act": True},
                                              "+:.*down_proj.*": {"desc_act": True}}})
    rule = _rules(_at(_inp(dynamic), "0.34.0"))["quant-act-order"]
    assert "enabled by dynamic rule '+:.*down_proj.*'" in rule.message  # the negative rule is skipped
    assert rule.source.endswith("gptq_utils.py:45 (vLLM 0.34.0)")
    # The checkpoint's desc_act as read (before a group of -1 cleared it) applies to a rule that sets a group.
    channel = _quantized({**GPTQ, "desc_act": True, "group_size": -1, "dynamic": {"+:.*mlp.*": {"group_size": 64}}})
    assert "quant-act-order" in _rules(_at(_inp(channel), "0.32.0"))


def test_compressed_tensors_actorder_group_refused_from_0_30() -> None:
    base = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"]}

    def ct(order: object, targets: list[str] | None = None) -> ModelGeometry:
        weights = {"type": "int", "num_bits": 4, "strategy": "group", "group_size": 128, "symmetric": True,
                   "dynamic": False, "actorder": order}
        return _quantized({**base, "config_groups": {"g": {"targets": ["Linear"] if targets is None else targets,
                                                           "weights": weights}}})

    rule = _rules(_at(_inp(ct(True)), "0.31.0"))["quant-act-order"]
    assert rule.message.startswith("Compressed-tensors group/dynamic activation ordering (actorder='group') is no "
                                   "longer supported.")
    assert rule.source.endswith("compressed_tensors.py:334 (vLLM 0.31.0)")
    assert "actorder='dynamic'" in _rules(_at(_inp(ct("Dynamic")), "0.34.0"))["quant-act-order"].message
    for accepted in ("weight", "static", None):
        assert start_checks(_at(_inp(ct(accepted)), "0.34.0")) == ()
    assert start_checks(_at(_inp(ct("group", targets=[])), "0.34.0")) == ()  # a group with no targets is not read
    assert start_checks(_at(_inp(ct("group")), "0.29.0")) == ()


def test_gptq_bits_and_sym_autogptq_takes_from_0_22() -> None:
    asym = _quantized({**GPTQ, "sym": False})
    rule = _rules(_at(_inp(asym), "0.26.0"))["quant-gptq-type"]
    assert rule.message == "Unsupported quantization config: bits=4, sym=False"
    assert rule.source == "vllm/model_executor/layers/quantization/auto_gptq.py:156 (vLLM 0.22.0)"
    assert _rules(_at(_inp(_quantized({**GPTQ, "bits": 3})), "0.34.0"))["quant-gptq-type"].source.endswith(
        "auto_gptq.py:161 (vLLM 0.34.0)")
    assert start_checks(_at(_inp(asym), "0.21.0")) == ()  # gptq.py's ExLlama kernels took it
    assert start_checks(_at(_inp(_quantized({**GPTQ, "bits": 8})), "0.34.0")) == ()
    # moe_wna16 reads sym as zero points: vLLM's config takes an asymmetric checkpoint under that flag.
    assert start_checks(_at(_inp(asym, quantization="moe_wna16"), "0.32.0")) == ()
    missing = _rules(_at(_inp(_quantized({k: v for k, v in GPTQ.items() if k != "desc_act"})), "0.32.0"))
    assert missing["quant-config-key"].message == "Cannot find any of ['desc_act'] in the model's quantization config."


def test_moe_wna16_claims_only_what_it_can_run() -> None:
    mismatch = ("Quantization method specified in the model config (gptq) does not match the quantization method "
                "specified in the `quantization` argument (moe_wna16).")
    act_order = _quantized({**GPTQ, "desc_act": True})
    assert _rules(_at(_inp(act_order, quantization="moe_wna16"), "0.32.0"))["quant-mismatch"].message == mismatch
    channel = _quantized({**GPTQ, "desc_act": True, "group_size": -1})
    assert start_checks(_at(_inp(channel, quantization="moe_wna16"), "0.32.0")) == ()
    # Before 0.30 any desc_act kept the checkpoint's method.
    assert "quant-mismatch" in _rules(_at(_inp(channel, quantization="moe_wna16"), "0.29.0"))
    assert "quant-mismatch" in _rules(_inp(_quantized({**GPTQ, "bits": 3}), quantization="moe_wna16"))
    awq = _quantized({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"})
    assert start_checks(_inp(awq, cc=(7, 5), dtype="float16", quantization="moe_wna16")) == ()
    for device, cc in (("cuda", (7, 0)), ("cpu", None)):  # AWQ's capability, which the CPU build does not have
        rule = _rules(_inp(awq, device=device, cc=cc, dtype="float16", quantization="moe_wna16"))["quant-mismatch"]
        assert rule.message.startswith("Quantization method specified in the model config (awq)")
