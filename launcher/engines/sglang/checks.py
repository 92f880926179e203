"""SGLang's start-time refusals, as a pure function of the planned configuration (read from 0.5.23).

Read, not yet proven by an oracle run (SGLang's `ServerArgs`/`ModelConfig` would be the oracle,
see tests/oracles/README.md): heads vs TP (the model's own assert, then QKVParallelLinear),
KV heads vs TP, quantization x capability and activation dtype (model_loader/loader.py), and
the context length above the derived one.
"""

from __future__ import annotations

from collections.abc import Mapping

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
from launcher.engines.sglang.rules import QUANTIZATION_REGISTRY
from launcher.engines.versions import version_key, within

VERSION = "0.5.23"
_SRC = {
    "heads": "sglang/srt/models/qwen2.py:167",  # `assert self.total_num_heads % tp_size == 0` (llama.py:183 too)
    "kv_replicas": "sglang/srt/layers/linear.py:1142",
    "kv_split": "sglang/srt/layers/linear.py:1144",
    "quant_cap": "sglang/srt/model_loader/loader.py:261",
    "quant_act": "sglang/srt/model_loader/loader.py:269",
    "context": "sglang/srt/configs/model_config.py:1314",
    "ct_scheme": "sglang/srt/layers/quantization/compressed_tensors/compressed_tensors.py:407",
    "kv_dtype": "sglang/srt/server_args.py (--kv-cache-dtype choices)",
}
# get_min_capability() per method name after SGLang's override (Marlin variants need sm80;
# below that the override keeps the plain kernel).
MIN_CAPABILITY: Mapping[str, int] = {
    "awq": 75, "awq_marlin": 80,  # layers/quantization/awq/awq.py:116, :308
    "gptq": 60, "gptq_marlin": 80,  # gptq/gptq.py:140, :387
    "fp8": 80,  # fp8.py:339 (100 with mxfp8)
    "mxfp4": 80,  # mxfp4.py:339
    "modelopt": 89, "modelopt_fp8": 89, "modelopt_fp4": 80,  # modelopt_quant.py:463, :1550
    "compressed-tensors": 70, "bitsandbytes": 70,
}
# compressed-tensors schemes' get_min_capability() in SGLang
# (srt/layers/quantization/compressed_tensors/schemes/*.py; the FP8 W8A8 fallback at
# compressed_tensors.py:804-829 raises below 80 in _check_scheme_supported, :407).
CT_SCHEME_MINIMUMS = CtSchemeMinimums(w4a4_fp4=100, w8a8_fp8=89, w8a16_fp8=80, wna16=80, w8a8_int8=80)
# `--kv-cache-dtype` choices of each release's argument parser (server_args.py; from 0.5.20
# arg_groups/fields/model.py), first release of each change. argparse refuses anything else.
KV_CACHE_DTYPE_CHOICES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("0.5.1", ("auto", "fp8_e5m2", "fp8_e4m3")),
    ("0.5.4", ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16")),
    ("0.5.5", ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1")),
    ("0.5.16", ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16", "fp4_e2m1")),
    ("0.5.21", ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16")),
)


# Models whose release checks the attention backend before it picks the default one, so that they stop at
# start unless --attention-backend names one of these (SGLang's own ServerArgs run per release:
# tests/data/sglang_layouts_versions.json; ranges end at the last release checked to fail).
# (architecture, first release, last release, accepted backends, SGLang's message, source)
ATTENTION_BACKEND_REQUIRED: tuple[tuple[str, str, str, tuple[str, ...], str, str], ...] = (
    ("Llama4ForConditionalGeneration", "0.5.1", "0.5.5", ("fa3", "aiter", "triton"),
     "fa3, aiter, or triton is required for Llama4 model",
     "sglang/srt/server_args.py:2493-2498 (SGLang 0.5.2), :786-791 (0.5.3), :999-1003 (0.5.5; asserted before the "
     "default backend is picked, which 0.5.6 auto-selects, :1125)"),
    ("Exaone4ForCausalLM", "0.5.9", "0.5.21", ("fa3", "triton", "trtllm_mha"),
     "One of the attention backends in ['fa3', 'triton', 'trtllm_mha'] is required for Exaone4ForCausalLM, "
     "but got {backend}",
     "sglang/srt/server_args.py:5693-5702 (SGLang 0.5.18), arg_groups/model_hook.py:626-636 (SGLang 0.5.21)"),
)


def kv_cache_dtype_choices(version: str | None) -> tuple[str, tuple[str, ...]]:
    """(the release those choices were read from, the choices) for `version`."""
    return lines_for(KV_CACHE_DTYPE_CHOICES, version)


ACT_DTYPES: Mapping[str, tuple[str, ...]] = {
    "awq": ("float16",), "awq_marlin": ("float16", "bfloat16"),
    "gptq": ("float16",), "gptq_marlin": ("float16", "bfloat16"),
    "fp8": ("bfloat16", "float16"), "mxfp4": ("bfloat16", "float16"),
    "bitsandbytes": ("float32", "float16", "bfloat16"),
}


def _src(key: str) -> str:
    return f"{_SRC[key]} (SGLang {VERSION})"


def resolved_quant_method(inp: CheckInput) -> str | None:
    qc = quant_config(inp.geometry)
    method = str(qc.get("quant_method") or "").lower() if qc else ""
    if not method:
        return inp.quantization
    marlin = inp.device == "cuda" and inp.compute_capability is not None and inp.compute_capability >= (8, 0)
    if method in ("awq", "gptq") and marlin and inp.quantization in (None, method + "_marlin"):
        return method + "_marlin"
    if method == "modelopt":
        algo = str(qc.get("quant_algo") or "").upper()
        return "modelopt_fp4" if "FP4" in algo else "modelopt_fp8"
    return method


def start_checks(inp: CheckInput) -> tuple[EngineRule, ...]:
    """Every SGLang start-time rule this configuration breaks; empty means SGLang accepts it."""
    geo = inp.geometry
    out: list[EngineRule] = []
    heads, tp = geo.num_attention_heads, inp.tp
    good = tp_sizes_for_heads(geo, inp.gpu_count)
    hint = f"--tp-size {or_list(good)}" if good else None
    if heads % tp:
        out.append(EngineRule("tp-divides-heads", "assert self.total_num_heads % tp_size == 0 (AssertionError: "
                              f"{heads} heads, tp_size {tp})", _src("heads"), hint=hint))
    elif (split := kv_head_split(geo, tp)) is not None:
        out.append(EngineRule("kv-heads-vs-tp", split[1], _src(split[0]), hint=hint))

    read_from, choices = kv_cache_dtype_choices(inp.engine_version)
    if inp.kv_cache_dtype is not None and inp.kv_cache_dtype not in choices:
        out.append(EngineRule(
            "kv-cache-dtype-choice",
            f"argument --kv-cache-dtype: invalid choice: {inp.kv_cache_dtype!r} "
            f"(choose from {', '.join(repr(c) for c in choices)})",
            f"{_SRC['kv_dtype']} (SGLang {read_from} and later)",
            hint="--kv-cache-dtype fp8_e4m3" if "fp8" in inp.kv_cache_dtype else "--kv-cache-dtype auto",
            bad_argument=True))

    out.extend(_quant_rules(inp))
    out.extend(_attention_backend_rules(inp))

    pinned = inp.max_model_len
    if pinned is not None and pinned > inp.model_max_len and not inp.allow_long_max_model_len:
        out.append(EngineRule(
            "context-length",
            f"Warning: User-specified context_length ({pinned}) is greater than the derived context_length "
            f"({inp.model_max_len}). This may lead to incorrect model outputs or CUDA errors. Note that the derived "
            "context_length may differ from max_position_embeddings in the model's config. To allow overriding "
            "this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
            _src("context"), hint=f"--context-length {inp.model_max_len}"))
    return tuple(out)


def _attention_backend_rules(inp: CheckInput) -> list[EngineRule]:
    """`ATTENTION_BACKEND_REQUIRED` for the release planned (the newest when unknown: none)."""
    if inp.engine_version is None:
        return []
    for arch, first, last, accepted, message, source in ATTENTION_BACKEND_REQUIRED:
        if inp.geometry.architecture == arch and within(inp.engine_version, first, last) \
                and inp.attention_backend not in accepted and _backend_check_applies(arch, inp):
            return [EngineRule("attention-backend-required", message.format(backend=inp.attention_backend), source,
                               hint=f"--attention-backend {accepted[0]}")]
    return []


# Checkpoint methods another registered method's `override_quantization_method` may rewrite before the
# registry check (awq -> awq_marlin / moe_wna16, gptq -> gptq_marlin / moe_wna16; model_config.py:2092-2101 in
# 0.5.23): their absence from a registry is not a refusal the plan can see.
REWRITTEN_METHODS = frozenset({"awq", "gptq"})


def unregistered_method(method: str, version: str | None) -> tuple[str, tuple[str, ...]] | None:
    """(the release whose registry it was read from, what that registry holds) where SGLang at `version`
    registers no such quantization method on CUDA, else None. A release between two read ones is taken to
    register what either does; one after the newest read, what the newest does."""
    if method in REWRITTEN_METHODS:
        return None
    read = sorted(QUANTIZATION_REGISTRY, key=version_key)
    at = version_key(version or read[-1])
    below = [v for v in read if version_key(v) <= at]
    above = [v for v in read if version_key(v) >= at]
    neighbours = {below[-1] if below else read[0], above[0] if above else read[-1]}
    if any(method in QUANTIZATION_REGISTRY[v] for v in neighbours):
        return None
    nearest = max(neighbours, key=version_key)
    return nearest, tuple(sorted(QUANTIZATION_REGISTRY[nearest]))


def _unknown_method_rule(inp: CheckInput, method: str) -> EngineRule | None:
    """`ModelConfig._verify_quantization` (configs/model_config.py:2151-2155 in 0.5.23)."""
    qc = quant_config(inp.geometry)
    raw = str(qc.get("quant_method") or "").lower() if qc else ""
    found = unregistered_method(method, inp.engine_version)
    if found is None or (raw and raw != method and unregistered_method(raw, inp.engine_version) is None):
        return None  # the checkpoint's own name is registered: our resolution may differ from SGLang's
    release, registry = found
    last = max((v for v in QUANTIZATION_REGISTRY if method in QUANTIZATION_REGISTRY[v]), key=version_key, default=None)
    return EngineRule(
        "quant-unknown-method", f"Unknown quantization method: {method}. Must be one of {list(registry)}.",
        f"sglang/srt/configs/model_config.py _verify_quantization, layers/quantization/__init__.py (SGLang {release})",
        hint=f"--engine-version {last} or older registers {method}" if last else None)


def _backend_check_applies(architecture: str, inp: CheckInput) -> bool:
    """EXAONE 4's check runs only for a config with a sliding_window_pattern (0.5.9 server_args.py:1489,
    0.5.18 :5694, 0.5.21 arg_groups/model_hook.py:628: `hf_config.sliding_window_pattern is not None`)."""
    if architecture == "Exaone4ForCausalLM":  # Exaone4Config: 4 when absent, 0 without a window; None if null
        config = inp.geometry.text_config
        return "sliding_window_pattern" not in config or config["sliding_window_pattern"] is not None
    return True


def _quant_rules(inp: CheckInput) -> list[EngineRule]:
    """The quantization method against the release's registry, the GPU's compute capability and the model
    dtype."""
    out: list[EngineRule] = []
    method = resolved_quant_method(inp)
    cc = inp.compute_capability
    if method is not None and inp.device == "cuda" and (unknown := _unknown_method_rule(inp, method)) is not None:
        return [unknown]
    if method is not None and inp.device == "cuda" and cc is not None:
        cap = cc[0] * 10 + cc[1]
        need = MIN_CAPABILITY.get(method)
        if need is not None and cap < need:
            out.append(EngineRule(
                "quant-min-capability",
                f"The quantization method {method} is not supported for the current GPU. Minimum capability: "
                f"{need}. Current capability: {cap}.", _src("quant_cap"),
                hint=f"a GPU with compute capability {need // 10}.{need % 10} or newer"))
        if method == "compressed-tensors" and (not out or out[-1].rule != "quant-min-capability"):
            scheme = ct_scheme_min_capability(quant_config(inp.geometry), cap, CT_SCHEME_MINIMUMS)
            if scheme is not None and cap < scheme[1]:
                out.append(EngineRule(
                    "quant-scheme-capability",
                    f"Quantization scheme is not supported for the current GPU. Min capability: {scheme[1]}. "
                    f"Current capability: {cap}. ({scheme[0]})", _src("ct_scheme"),
                    hint=f"a GPU with compute capability {scheme[1] // 10}.{scheme[1] % 10} or newer"))
        acts = ACT_DTYPES.get(method)
        if not out or out[-1].rule != "quant-min-capability":
            if acts is not None and inp.dtype not in acts:
                out.append(EngineRule(
                    "quant-act-dtype",
                    f"torch.{inp.dtype} is not supported for quantization method {method}. Supported dtypes: "
                    f"[{', '.join('torch.' + d for d in acts)}]", _src("quant_act"), hint=f"--dtype {acts[0]}"))
    return out
