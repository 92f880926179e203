#!/usr/bin/env python3
"""Oracle: run vLLM's own config classes and validation over a grid of start configurations.

Runs in the vLLM CPU venv (vLLM 0.32.0):

    nice -n 10 .venv-vllm/bin/python tests/oracles/vllm_checks_oracle.py --output tests/data/vllm_checks_oracle.json

Each case writes a config.json (no weights) into a temp dir and asks vLLM's code whether it
accepts the configuration; the record holds "accept" or "refuse" and vLLM's exact message.
`tests/engines/vllm/test_checks.py` replays every record through `launcher.engines.vllm.checks`.

What runs for real, and what is patched (the CPU build reports no GPU):
  * heads vs TP, max_model_len, float16-unsupported models, unknown quantization methods:
    ``ModelConfig(...)`` and ``ModelConfig.verify_with_parallel_config(ParallelConfig(...))``;
  * the vocabulary, then KV heads, vs TP: ``vllm.distributed.utils.divide`` called as VocabParallelEmbedding
    (its 64-row padding, vocab_parallel_embedding.py:111) and QKVParallelLinear (linear.py:1053-1057) call it
    (the layers themselves need a process group);
  * TP x PP vs GPUs: ``ParallelConfig(...)`` with ``current_platform.is_cuda`` -> True and
    ``device_count`` -> the GPUs given, for that call only;
  * --quantization against the checkpoint's quant_method: ``ModelConfig(quantization=...)`` (its
    ``_verify_quantization`` and override classes, with the CUDA view below);
  * the checkpoint's quantization_config as its config class reads it (``from_config``: GPTQ and compressed-tensors
    activation ordering, AutoGPTQ's bit widths and sym, required keys), with and without the --quantization values
    that keep a GPTQ checkpoint's method, on a GPU and on the CPU build: ``VllmConfig._get_quantization_config``;
  * quantization x capability: ``ModelConfig`` (``is_cpu`` -> False so the override classes
    pick the CUDA method name) then ``VllmConfig._get_quantization_config`` with
    ``get_device_capability`` -> the case's capability; compressed-tensors schemes via
    ``CompressedTensorsConfig._get_scheme_from_parts`` + ``_check_scheme_supported``;
  * bf16 x capability: ``CudaPlatform.check_if_supports_dtype`` with the capability patched
    (the GPU worker calls it at init_device);
  * CPU attention head sizes: ``CPUAttentionBackend.supports_head_size`` (the C++ kernel that
    raises at the first request is proven by the real-engine test).
Cited, not run: CUDA attention-backend selection (flash-attn/flashinfer modules do not
import on the CPU build), Triton's fp8-KV capability check (triton_attn.py:490).
"""

# ruff: noqa: BLE001  (an oracle records whatever vLLM raises)
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
for _k in [k for k in os.environ if k.startswith("VLLM_") and k != "VLLM_LOGGING_LEVEL"]:
    del os.environ[_k]  # VLLM_ALLOW_LONG_MAX_MODEL_LEN must not relax the length check

QWEN = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
        "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28,
        "intermediate_size": 18944, "vocab_size": 152064, "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
         "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
         "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
         "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
         "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
GEMMA2 = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 2304,
          "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "num_hidden_layers": 26,
          "intermediate_size": 9216, "vocab_size": 256000, "max_position_embeddings": 8192,
          "sliding_window": 4096, "torch_dtype": "float32", "query_pre_attn_scalar": 256}
TINY16 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
          "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
          "intermediate_size": 128, "vocab_size": 1024, "max_position_embeddings": 2048,
          "torch_dtype": "bfloat16"}
GPT_OSS = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 24,
           "intermediate_size": 2880, "vocab_size": 201088, "max_position_embeddings": 131072,
           "num_local_experts": 32, "num_experts_per_tok": 4, "sliding_window": 128,
           "layer_types": ["sliding_attention", "full_attention"] * 12, "torch_dtype": "bfloat16",
           "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                            "truncate": False, "original_max_position_embeddings": 4096},
           "quantization_config": {"quant_method": "mxfp4",
                                   "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}}

QUANTS: dict[str, dict[str, Any]] = {
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
    "fp8": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    "bitsandbytes": {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
    "fbgemm_fp8": {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": []},
    "modelopt_fp8": {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": None},
    "modelopt_nvfp4": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                       "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]},
    "ct_w8a8_fp8": {"quant_method": "compressed-tensors", "format": "float-quantized",
                    "config_groups": {"group_0": {
                        "targets": ["Linear"],
                        "weights": {"type": "float", "num_bits": 8, "strategy": "channel", "symmetric": True,
                                    "dynamic": False},
                        "input_activations": {"type": "float", "num_bits": 8, "strategy": "token",
                                              "symmetric": True, "dynamic": True}}},
                    "ignore": ["lm_head"]},
    "ct_w4a16": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                 "config_groups": {"group_0": {
                     "targets": ["Linear"],
                     "weights": {"type": "int", "num_bits": 4, "strategy": "group", "group_size": 128,
                                 "symmetric": True, "dynamic": False}}},
                 "ignore": ["lm_head"]},
    "ct_nvfp4": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                 "config_groups": {"group_0": {
                     "targets": ["Linear"],
                     "weights": {"type": "float", "num_bits": 4, "strategy": "tensor_group", "group_size": 16,
                                 "symmetric": True, "dynamic": False},
                     "input_activations": {"type": "float", "num_bits": 4, "strategy": "tensor_group",
                                           "group_size": 16, "symmetric": True, "dynamic": "local"}}},
                 "ignore": ["lm_head"]},
}
_GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
_CT_W4A16 = QUANTS["ct_w4a16"]


def _ct_actorder(order: object) -> dict[str, Any]:
    group = _CT_W4A16["config_groups"]["group_0"]
    return {**_CT_W4A16, "config_groups": {"group_0": {**group, "weights": {**group["weights"], "actorder": order}}}}


# What the config classes refuse in a checkpoint's quantization_config (from_config): GPTQ activation ordering with
# groups (also through a GPTQModel `dynamic` rule), compressed-tensors actorder, AutoGPTQ's bit widths and sym, and
# its required keys.
QUANT_CONFIGS: dict[str, dict[str, Any]] = {
    "gptq-desc-act": {**_GPTQ, "desc_act": True},
    "gptq-desc-act-channel": {**_GPTQ, "desc_act": True, "group_size": -1},
    "gptq-desc-act-channel-dynamic-group": {**_GPTQ, "desc_act": True, "group_size": -1,
                                            "dynamic": {"+:.*mlp.*": {"group_size": 64}}},
    "gptq-dynamic-desc-act": {**_GPTQ, "dynamic": {"+:.*down_proj.*": {"desc_act": True}}},
    "gptq-dynamic-skip": {**_GPTQ, "dynamic": {"-:.*lm_head.*": {"desc_act": True}, "+:.*o_proj.*": {"bits": 8}}},
    "gptq-8bit": {**_GPTQ, "bits": 8},
    "gptq-asym": {**_GPTQ, "sym": False},
    "gptq-3bit": {**_GPTQ, "bits": 3},
    "gptq-no-sym": {k: v for k, v in _GPTQ.items() if k != "sym"},
    "gptq-no-desc-act": {k: v for k, v in _GPTQ.items() if k != "desc_act"},
    "ct-actorder-group": _ct_actorder("group"),
    "ct-actorder-dynamic": _ct_actorder("dynamic"),
    "ct-actorder-true": _ct_actorder(True),
    "ct-actorder-weight": _ct_actorder("weight"),
    "ct-actorder-static": _ct_actorder("static"),
}
CAPS = [(7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0)]
QUANT_FLAGS = ("awq", "awq_marlin", "gptq", "gptq_marlin", "marlin", "moe_wna16", "fp8", "compressed-tensors",
               "bitsandbytes", "mxfp4", "modelopt")


def _configs() -> dict[str, dict[str, Any]]:
    out = {"qwen2.5-7b": QWEN, "llama-3.1-8b": LLAMA, "gemma2-2b": GEMMA2, "tiny-head16": TINY16,
           "gpt-oss-20b": GPT_OSS}
    for name, qc in QUANTS.items():
        out[f"qwen2.5-7b-{name}"] = {**QWEN, "quantization_config": qc}
    for name, qc in QUANT_CONFIGS.items():
        out[f"qwen2.5-7b-q-{name}"] = {**QWEN, "quantization_config": qc}
    for head in (32, 48, 64, 80, 100, 128, 256, 512):
        heads = 4
        out[f"tiny-head{head}"] = {**TINY16, "hidden_size": heads * head, "head_dim": head}
    return out


def grid() -> list[dict[str, Any]]:
    """The cases: {id, group, model, tp, pp, gpus, cc, dtype, kv_cache_dtype, max_model_len, device}."""
    cases: list[dict[str, Any]] = []

    def add(group: str, model: str, **kw: Any) -> None:
        case = {"group": group, "model": model, "device": "cuda", "tp": 1, "pp": 1, "gpus": 1,
                "cc": [9, 0], "dtype": None, "max_model_len": None}
        case.update(kw)
        case["id"] = "|".join(str(case[k]) for k in ("group", "model", "device", "tp", "pp", "gpus", "cc",
                                                      "dtype", "max_model_len"))
        if case.get("quantization"):
            case["id"] += f"|quantization={case['quantization']}"
        cases.append(case)

    for model in ("qwen2.5-7b", "llama-3.1-8b", "gemma2-2b", "gpt-oss-20b", "tiny-head16"):
        for tp in (1, 2, 3, 4, 5, 6, 7, 8, 16):
            add("parallel", model, tp=tp, gpus=max(tp, 1))
        for tp, pp, gpus in ((2, 2, 4), (2, 2, 3), (4, 2, 4), (1, 2, 1), (8, 1, 4), (2, 1, 1)):
            add("parallel", model, tp=tp, pp=pp, gpus=gpus)
    quantized = [m for m in _configs() if m.startswith("qwen2.5-7b-") and not m.startswith("qwen2.5-7b-q-")]
    for model in quantized + ["gpt-oss-20b"]:
        for cc in CAPS:
            add("quant", model, cc=list(cc), dtype="float16" if cc < (8, 0) else "bfloat16")
        for dtype in ("float16", "float32"):
            add("quant", model, cc=[9, 0], dtype=dtype)
        add("quant", model, device="cpu", cc=None, dtype="bfloat16")
    # --quantization against the checkpoint's own method (ModelConfig._verify_quantization, its override classes).
    for model in quantized:
        for flag in QUANT_FLAGS:
            add("quant-flag", model, cc=[9, 0], dtype="float16", quantization=flag)
    # The checkpoint's quantization_config read by its config class, on a GPU and on the CPU build, as resolved
    # without --quantization and with the flags that keep the checkpoint's method.
    for model in [m for m in _configs() if m.startswith("qwen2.5-7b-q-")]:
        flags: tuple[str | None, ...] = (None, "gptq_marlin", "moe_wna16") if "-gptq-" in model else (None,)
        for flag in flags:
            add("quant-config", model, cc=[9, 0], dtype="bfloat16", quantization=flag)
        add("quant-config", model, device="cpu", cc=None, dtype="bfloat16")
    for model in ("qwen2.5-7b", "gemma2-2b"):
        for cc in CAPS:
            for dtype in ("bfloat16", "float16", "float32"):
                add("dtype", model, cc=list(cc), dtype=dtype)
    for model, lengths in (("qwen2.5-7b", (4096, 32768, 32769, 65536, -1)),
                           ("llama-3.1-8b", (131072, 131073, 262144)),
                           ("gemma2-2b", (8192, 8193)), ("gpt-oss-20b", (131072, 131073))):
        for length in lengths:
            add("length", model, max_model_len=length)
    for head in (16, 32, 48, 64, 80, 100, 128, 256, 512):
        add("cpu-head", f"tiny-head{head}", device="cpu", cc=None)
    return cases


@contextlib.contextmanager
def patched(obj: Any, **attrs: Any) -> Iterator[None]:
    old = {k: obj.__dict__[k] for k in attrs if k in obj.__dict__}
    for k, v in attrs.items():
        setattr(obj, k, v)
    try:
        yield
    finally:
        for k in attrs:
            if k in old:
                setattr(obj, k, old[k])
            else:
                delattr(obj, k)


def _msg(exc: BaseException) -> str:
    # pydantic wraps ValueErrors raised in __post_init__: keep vLLM's own text.
    errors = getattr(exc, "errors", None)
    if callable(errors):
        with contextlib.suppress(Exception):
            first = errors()[0]
            ctx = first.get("ctx", {}).get("error")
            if ctx is not None:
                return str(ctx)
            return str(first.get("msg", "")).removeprefix("Value error, ")
    if exc.args and len(exc.args) > 1:
        return str(exc.args[0])  # vLLM's deprecated-method ValueError passes "%s" and the name apart
    return str(exc)


class Oracle:
    def __init__(self, tmp: str) -> None:
        import types

        from vllm.config import LoadConfig, ModelConfig, ParallelConfig, VllmConfig
        from vllm.distributed.utils import divide
        from vllm.model_executor.layers import quantization as me_quant
        from vllm.platforms import current_platform
        sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
        from vllm.platforms.cuda import CudaPlatform  # the CUDA kernels module is absent on the CPU build
        from vllm.platforms.interface import DeviceCapability
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
        from vllm.v1.executor import ray_utils  # noqa: F401  (imported before is_cuda is patched)

        for name in me_quant.QUANTIZATION_METHODS:  # import every config class on the real platform
            with contextlib.suppress(Exception):
                me_quant.get_quantization_config(name)
        self.ModelConfig, self.ParallelConfig, self.VllmConfig = ModelConfig, ParallelConfig, VllmConfig
        self.LoadConfig, self.divide, self.Cap = LoadConfig, divide, DeviceCapability
        self.platform_cls = type(current_platform)
        self.CudaPlatform, self.CPUAttentionBackend = CudaPlatform, CPUAttentionBackend
        self.dirs: dict[str, str] = {}
        for name, cfg in _configs().items():
            path = os.path.join(tmp, name)
            os.makedirs(path)
            with open(os.path.join(path, "config.json"), "w") as f:
                json.dump(cfg, f)
            self.dirs[name] = path

    def _cuda_view(self, cc: list[int] | None) -> contextlib.AbstractContextManager[None]:
        cap = self.Cap(*cc) if cc else None
        return patched(self.platform_cls, is_cpu=classmethod(lambda c: False),
                       get_device_capability=classmethod(lambda c, device_id=0: cap),
                       has_device_capability=classmethod(
                           lambda c, capability, device_id=0: cap is not None and cap.to_int() >= (
                               capability if isinstance(capability, int) else capability[0] * 10 + capability[1])),
                       get_device_name=classmethod(lambda c, device_id=0: "TEST"))

    def _model(self, case: dict[str, Any]) -> Any:
        kwargs: dict[str, Any] = {"model": self.dirs[case["model"]], "skip_tokenizer_init": True}
        if case["dtype"]:
            kwargs["dtype"] = case["dtype"]
        if case["max_model_len"] is not None:
            kwargs["max_model_len"] = case["max_model_len"]
        if case.get("quantization"):
            kwargs["quantization"] = case["quantization"]
        if case["device"] == "cuda":
            with self._cuda_view(case["cc"]):
                return self.ModelConfig(**kwargs)
        return self.ModelConfig(**kwargs)

    def run(self, case: dict[str, Any]) -> dict[str, Any]:
        try:
            self._run(case)
        except BaseException as exc:
            return {"decision": "refuse", "type": type(exc).__name__, "message": _msg(exc)}
        return {"decision": "accept"}

    def _run(self, case: dict[str, Any]) -> None:
        group = case["group"]
        mc = self._model(case)
        if group == "parallel":
            with patched(self.platform_cls, is_cuda=classmethod(lambda c: True),
                         device_count=classmethod(lambda c: case["gpus"])):
                pc = self.ParallelConfig(tensor_parallel_size=case["tp"], pipeline_parallel_size=case["pp"])
            mc.verify_with_parallel_config(pc)
            # VocabParallelEmbedding, built before the layers (vocab_parallel_embedding.py:304, :111)
            vocab = mc.get_vocab_size()
            self.divide(-(-vocab // 64) * 64, case["tp"])
            if not mc.use_mla:  # QKVParallelLinear (linear.py:1053)
                kv, tp = mc.get_total_num_kv_heads(), case["tp"]
                self.divide(tp, kv) if tp >= kv else self.divide(kv, tp)
        elif group in ("quant", "quant-config"):
            if case["device"] == "cuda":
                with self._cuda_view(case["cc"]):
                    qc = self.VllmConfig._get_quantization_config(mc, self.LoadConfig())
                    if qc is not None and qc.get_name() == "compressed-tensors":
                        self._ct_scheme(qc)
            else:
                self.VllmConfig._get_quantization_config(mc, self.LoadConfig())
        elif group == "quant-flag":
            pass  # ModelConfig's own _verify_quantization has run (above)
        elif group == "dtype":
            with self._cuda_view(case["cc"]):
                self.CudaPlatform.check_if_supports_dtype.__func__(self.platform_cls, mc.dtype)
        elif group == "cpu-head":
            # The kernel dispatch the first request meets: the ISA vLLM picks for the head size
            # (v1/attention/backends/cpu_attn.py `_get_attn_isa`) and the C++ op that selects the
            # compiled kernel (`torch.ops._C.get_scheduler_metadata`, csrc/cpu/cpu_attn.cpp), which
            # raises "Unsupported CPU attention configuration: head_dim=N ..." for a size it lacks.
            # (`CPUAttentionBackend.get_supported_head_sizes` is not what the engine enforces: 48 runs.)
            import torch
            from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

            head = mc.get_head_size()
            isa = _get_attn_isa(torch.bfloat16, 128, head, None)
            seq, starts = torch.tensor([8], dtype=torch.int32), torch.tensor([0, 8], dtype=torch.int32)
            torch.ops._C.get_scheduler_metadata(1, 4, 2, head, seq, torch.bfloat16, starts, True, -1, isa, False,
                                                None, "auto")

    @staticmethod
    def _ct_scheme(qc: Any) -> None:
        """Pick the scheme as vLLM does, then its capability check; scheme constructors are
        skipped (they pick CUDA kernels, which the CPU build does not have)."""
        from vllm.model_executor.layers.quantization.compressed_tensors import schemes

        base = schemes.CompressedTensorsScheme
        classes = [c for c in vars(schemes).values() if isinstance(c, type) and issubclass(c, base) and c is not base]
        with contextlib.ExitStack() as stack:
            for c in classes:
                stack.enter_context(patched(c, __init__=lambda self, *a, **k: None))
            group = next(iter(qc.target_scheme_map.values()))
            scheme = qc._get_scheme_from_parts(weight_quant=group.get("weights"),
                                               input_quant=group.get("input_activations"),
                                               output_quant=group.get("output_activations"),
                                               format=group.get("format"), layer_name="model.layers.0.mlp")
        qc._check_scheme_supported(type(scheme).get_min_capability())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--output", default="-")
    ap.add_argument("--limit", type=int, default=0)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    import vllm

    cases = grid()[: args.limit or None]
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        oracle = Oracle(tmp)
        results = []
        for case in cases:
            results.append({**case, **oracle.run(case)})
    doc = {
        "header": {
            "generator": "nice -n 10 .venv-vllm/bin/python tests/oracles/vllm_checks_oracle.py "
                         "--output tests/data/vllm_checks_oracle.json",
            "vllm": vllm.__version__,
            "seconds": round(time.time() - t0, 1),
            "record": "input fields, then decision accept|refuse, type and message of what vLLM raised",
            "configs": _configs(),
        },
        "cases": results,
    }
    text = json.dumps(doc, indent=None, separators=(",", ":"), sort_keys=False)
    text = text.replace(',{"group"', ',\n{"group"')
    if args.output == "-":
        sys.stdout.write(text + "\n")
    else:
        with open(args.output, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
