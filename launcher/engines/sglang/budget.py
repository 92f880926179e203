"""SGLang's memory budget: the default `--mem-fraction-static` and the pool it leaves.

Sources (SGLang 0.5.23 wheel, `sglang/srt/...`):
- default `--mem-fraction-static`: `arg_groups/memory_hook.py` (`handle_gpu_memory_settings`,
  `reserve_for_graph_mb`, `adjust_mem_fraction_for_vlm`) and `arg_groups/cuda_graph_hook.py`;
- pool: `mem_cache/kv_cache_configurator.py` - rest = available_after_load - pre_load x (1 - f),
  tokens = rest // cell_size, floored to the page size, capped by `--max-total-tokens`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from launcher.common.units import GiB
from launcher.engines.checks_common import lines_for
from launcher.engines.online_quant import ELEMENT_BYTES, kept_layers, quantized_weights
from launcher.engines.sglang import parameters
from launcher.engines.sglang.architectures import breakable_graph_multimodal_ok
from launcher.engines.sglang.rules import RULES, SglangRules
from launcher.engines.versions import version_key
from launcher.model import allocator
from launcher.model.config import ModelGeometry

# What a rank holds below the card's CUDA total at SGLang's pre-load baseline (P, taken right before
# "Load weight begin", distributed/bootstrap.py:193-223 in 0.5.23): the CUDA context, and with more
# than one rank NCCL's and the all-reduce buffers. From the first free-memory reading of the
# published starts (tests/data/startup-logs; bench/startup_logs.py derives and scores them):
# - one rank, H100 80GB: 522 MiB (SGLang 0.5.2 grok-2: 79.19 - 77.43 GiB free before load - 1.25
#   GiB "Init torch distributed"), 522 MiB (vLLM 0.19 llm-d sweep), 543 MiB (vLLM 0.10.2 llava),
#   625 MiB (vLLM, llm-d-benchmark write-up): "Free memory on device" is read after the same torch
#   context. Median 532 MiB; left out one source at a time the others' median misses by at most
#   102 MiB, + 15 MiB of two-decimal GiB prints: +/- 117 MiB. No one-rank reading on another card
#   class is clean (the RTX 3090 one is under WSL2 with a desktop), so every card carries this band.
CUDA_CONTEXT_BYTES = 532 * 1024**2
CONTEXT_ERROR_BYTES = 117 * 1024**2
# Measured at an earlier start of the setup (free at the plan - "Load weight begin. avail mem"): the
# print's two decimals of GiB, +/- 5 MiB, and as much for the free memory read at the plan.
MEASURED_CONTEXT_ERROR_BYTES = 10 * 1024**2
# - more ranks without NVLink SHARP (PCIe, GeForce, A100): 41 MiB beyond the context on 4 x RTX 4090
#   (SGLang 0.5.23, Qwen3-14B TP 4: the card's 23.640 GiB total - 16.00 - 7.08 GiB - the context), 11 MiB
#   on 4 x L4 (SGLang 0.4.3, QwQ-32B TP 4: the L4's published 22.16 GiB total - 21.63 GiB free before the
#   load - the context). Median of the two 26 MiB; each left out, the other misses it by 30 MiB, + 15 MiB
#   of prints.
NCCL_BYTES = 26 * 1024**2
NCCL_ERROR_BYTES = 45 * 1024**2
# - more ranks on NVSwitch Hopper/Blackwell boards (NCCL's NVLS multicast buffers): 1280 MiB on
#   8 x H100 (SGLang 0.5.2 "Init torch distributed ends. mem usage=1.25 GB"); 1035, 1035, 1526 MiB
#   on 2 x H100 (vLLM 0.19's startup free, read after its distributed init, less the context; one
#   sweep, median 1035); 1045 MiB on 2 x H100 (vLLM 0.13-0.14, llm-d-benchmark's Llama-3.3-70B-FP8 at
#   TP 2: 77.64 of 79.18 GiB free). Median of the three sources 1045 MiB; each left out, the others'
#   median misses it by at most 240 MiB (the 8 x H100 one), + 15 MiB of prints.
NVLS_NCCL_BYTES = 1045 * 1024**2
NVLS_NCCL_ERROR_BYTES = 255 * 1024**2
# SGLANG_VLM_CACHE_SIZE_MB: kept out of the KV budget for multimodal models.
MULTIMODAL_RESERVE_BYTES = 100 * 1024**2




def nvls_board(name: str, compute_capability: tuple[int, int] | None) -> bool:
    """A Hopper or Blackwell data-centre card on an NVSwitch board (SXM), where NCCL's NVLS is on by
    default: not the PCIe or NVL (bridged pairs) variants, nor GeForce/RTX (compute capability 12)."""
    return (compute_capability is not None and compute_capability[0] in (9, 10)
            and not any(word in name for word in ("PCIe", "NVL", "GH200")))


def parallel_bytes(name: str, compute_capability: tuple[int, int] | None, ranks: int) -> tuple[int, int]:
    """(bytes, +/- bytes) a rank holds at the baseline beyond the CUDA context: 0 on one rank."""
    if ranks <= 1:
        return 0, 0
    if nvls_board(name, compute_capability):
        return NVLS_NCCL_BYTES, NVLS_NCCL_ERROR_BYTES
    return NCCL_BYTES, NCCL_ERROR_BYTES


# --------------------------------------------------------------------------- default fraction


def prefill_graph_buckets(max_tokens: int) -> list[int]:
    """`generate_prefill_cuda_graph_batch_sizes`: token buckets up to `max_tokens`."""
    buckets = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
               + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_tokens + 1, 512)))
    return [b for b in buckets if b <= max_tokens]


@dataclass(frozen=True)
class FractionDerivation:
    """SGLang's default fraction and every term that went into it (MiB)."""

    gpu_mem_mib: float | None
    chunked_prefill_size: int
    decode_max_bs: int | None  # None: decode graph off
    prefill_buckets: int  # 0: prefill graph off
    activation_mib: float
    graph_mib: float
    parallel_mib: float
    reserved_mib: float
    floor_applied: bool
    vlm_factor: float | None
    fraction: float


def tier_defaults(gpu_mem_mib: float | None, tp: int, rules: SglangRules | None = None) -> tuple[int, int | None]:
    """(chunked_prefill_size, decode cuda-graph max bs) by GPU memory tier (`<` comparisons).

    0.5.1-0.5.2 set the chunk by three tiers and the graph bs only below 35 GiB (the
    runner's own default, 160, applies above: None here)."""
    rules = rules or RULES[-1]
    if rules.fraction == "table":
        if gpu_mem_mib is None:
            return 4096, None
        bs = (8 if tp < 4 else 80) if gpu_mem_mib < 35840 else None
        return (2048 if gpu_mem_mib < 35840 else 8192 if gpu_mem_mib < 163840 else 16384), bs
    if gpu_mem_mib is None:
        return 4096, 160
    for bound, chunk, bs_small, bs_large in rules.tiers:
        if gpu_mem_mib < bound:
            return chunk, bs_small if tp < 4 else bs_large
    return rules.top_tier


def _table_fraction(gpu_mem_mib: float, tp: int, pp: int) -> float:
    """0.5.1-0.5.2 (server_args.py:453-485 in 0.5.2): reserve by tier, no graph or chunk term."""
    parallel = tp * pp
    if gpu_mem_mib < 35840:
        reserved = (2.8 + parallel / 10) * 1024
    elif gpu_mem_mib < 92160:
        reserved = (9.5 + parallel / 2) * 1024
    elif gpu_mem_mib < 163840:
        reserved = (12 + parallel / 2) * 1024
    else:
        reserved = 32 * 1024
    return reserved


def _decode_graph_bs(pinned: Mapping[str, Any], rules: SglangRules, bs_default: int | None,
                     device: str, *, even_when_off: bool = False) -> int | None:
    """The decode CUDA-graph max batch size: pinned, the tier's, 32 on CPU, or --max-running-requests;
    `even_when_off`: the value SGLang resolves under --disable-cuda-graph too (its DP-attention reserve reads it)."""
    bs_flag = "--cuda-graph-max-bs" if rules.prefill_graph != "breakable" else "--cuda-graph-max-bs-decode"
    decode_bs: int | None = pinned.get(bs_flag, pinned.get("--cuda-graph-max-bs-decode", bs_default))
    if device == "cpu":
        decode_bs = 32  # torch_compile_max_bs: the "CPU graph" only with --enable-torch-compile
    mrr = pinned.get("--max-running-requests")
    if rules.mrr_shrinks_bs and bs_flag not in pinned and mrr is not None and mrr < (decode_bs or 0):
        decode_bs = mrr
    if pinned.get("--disable-cuda-graph", False) and not rules.decode_reserve_when_off and not even_when_off:
        decode_bs = None
    return decode_bs


def _prefill_graph_on(geometry: ModelGeometry, pinned: Mapping[str, Any], rules: SglangRules, pp: int,
                      device: str) -> bool:
    """Whether SGLang captures a prefill CUDA graph by default (its reserve grows with the buckets)."""
    graphs_off = pinned.get("--disable-cuda-graph", False)
    if rules.prefill_graph == "off":
        return False
    if rules.prefill_graph == "piecewise":
        # 0.5.10 server_args.py:1076-1139 `_handle_piecewise_cuda_graph` (runs before the
        # memory settings): off for pp > 1, multimodal, --disable-piecewise-cuda-graph, ...
        # --disable-cuda-graph does not turn it off there (0.5.13/0.5.18 oracle).
        return (device == "cuda" and pp == 1 and not geometry.is_multimodal
                and (rules.decode_reserve_when_off or not graphs_off)
                and not pinned.get("--disable-piecewise-cuda-graph", False)
                and not pinned.get("--disable-prefill-cuda-graph", False))
    return (device == "cuda" and not graphs_off and not pinned.get("--disable-prefill-cuda-graph", False)
            and pinned.get("--cuda-graph-backend-prefill", "breakable") != "disabled" and pp == 1
            and not (geometry.is_multimodal and not breakable_graph_multimodal_ok(geometry))
            and not (_uses_kda(geometry) and geometry.architecture != "Glm5NextForConditionalGeneration"))


def _uses_kda(geometry: ModelGeometry) -> bool:
    """KDA hybrids (Kimi-Linear; GLM-5 Next keeps it): the breakable prefill graph is off by default (0.5.23
    arg_groups/cuda_graph_hook.py:183-191, `uses_kda_attention`, configs/model_config.py:230-252)."""
    text = geometry.text_config
    linear = text.get("linear_attn_config")
    if isinstance(linear, Mapping) and linear.get("kda_layers"):
        return True
    types = text.get("layer_types")
    return (isinstance(types, list) and "linear_attention" in types and text.get("linear_num_heads") is not None
            and text.get("linear_head_dim") is not None)


def _graph_reserve(geometry: ModelGeometry, pinned: Mapping[str, Any], rules: SglangRules, chunked: int,
                   decode_bs: int | None, prefill_on: bool, model_path: str = "") -> tuple[float, int]:
    """(graph reserve MiB, prefill buckets; -1: MLA's flat reserve) as `reserve_for_graph_mb` counts them."""
    graph, buckets = 0.0, 0
    if decode_bs is not None:
        graph += decode_bs * 2
    if not prefill_on:
        return graph, buckets
    if geometry.mla is not None:
        return graph + 1536, -1  # flat reserve; the bucket count does not matter
    prefill_max = chunked if chunked > 0 else 0
    if "--max-total-tokens" in pinned:
        prefill_max = min(prefill_max, pinned["--max-total-tokens"])
    if rules.prefill_cap_context and "--context-length" in pinned:
        prefill_max = min(prefill_max, pinned["--context-length"])
    if rules.prefill_graph == "breakable" and "llama-2" in model_path.lower():
        # "For Llama2 series models, max_bs is limited to 4096" (0.5.23 memory_hook.py:258-263, by the
        # model path; 0.5.20-0.5.22 alike, also seen in 0.5.19): fewer buckets on cards of 60 GiB or more.
        prefill_max = min(prefill_max, 4096)
    buckets = len(prefill_graph_buckets(prefill_max))
    return graph + 8 * buckets, buckets


def _vlm_factor(geometry: ModelGeometry, pinned: Mapping[str, Any]) -> float | None:
    """`adjust_mem_fraction_for_vlm`: a vision tower larger than the reference lowers the fraction."""
    if not geometry.is_multimodal or pinned.get("--language-only", False):
        return None
    ratio = (geometry.vision_layers or 24) * (geometry.vision_hidden_size or 1024) ** 2 / (24 * 1024**2)
    return 0.95 * min(max(1 - 0.1 * (ratio - 1), 0.8), 1.05)


QWEN3_VL_ARCHITECTURES = frozenset({"Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration"})


def _hopper_qwen3_vl_bs(geometry: ModelGeometry, pinned: Mapping[str, Any], rules: SglangRules,
                        decode_bs: int | None, gpu_mem_mib: float | None,
                        compute_capability: tuple[int, int] | None) -> int | None:
    """`expand_multimodal_decode_graph_to_running_limit`: Qwen3-VL on Hopper (sm90, 60 GiB or more)
    captures decode graphs up to a pinned --max-running-requests of at most 512."""
    mrr = pinned.get("--max-running-requests")
    if (not rules.hopper_qwen3_vl_bs or decode_bs is None or mrr is None or not decode_bs < mrr <= 512
            or gpu_mem_mib is None or gpu_mem_mib < 60 * 1024 or compute_capability is None
            or compute_capability[0] != 9 or not geometry.is_multimodal
            or geometry.architecture not in QWEN3_VL_ARCHITECTURES
            or {"--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"} & set(pinned)):
        return decode_bs
    return int(mrr)


def default_fraction(geometry: ModelGeometry, *, gpu_mem_mib: float | None, tp: int, pp: int,
                     pinned: Mapping[str, Any], rules: SglangRules, device: str = "cuda",
                     compute_capability: tuple[int, int] | None = None, model_path: str = "",
                     attn_dp: int = 1) -> FractionDerivation:
    """`handle_gpu_memory_settings` (no DeepEP or PD split). Data-parallel attention over `attn_dp` groups adds
    max_bs x D x 3 MiB, and as much again x 1.5 above 300, to the graph reserve before the 10 GiB floor, with the
    decode max_bs as resolved even under --disable-cuda-graph (0.5.23 arg_groups/memory_hook.py:371-378); the
    tier reads the plain T and the activation term the undivided chunk (the DP division comes after,
    parallel_hook.py:326-336)."""
    chunk_default, bs_default = tier_defaults(gpu_mem_mib, tp, rules)
    chunked = pinned.get("--chunked-prefill-size", chunk_default)
    decode_bs = _decode_graph_bs(pinned, rules, bs_default, device)
    decode_bs = _hopper_qwen3_vl_bs(geometry, pinned, rules, decode_bs, gpu_mem_mib, compute_capability)
    prefill_on = _prefill_graph_on(geometry, pinned, rules, pp, device)
    max_prefill_tokens = pinned.get("--max-prefill-tokens", 16384)
    activation_tokens = max(chunked if chunked > 0 else max_prefill_tokens, 2048)
    graph, buckets = _graph_reserve(geometry, pinned, rules, chunked, decode_bs, prefill_on, model_path)
    if attn_dp > 1:
        dp_bs = _hopper_qwen3_vl_bs(geometry, pinned, rules, _decode_graph_bs(pinned, rules, bs_default, device,
                                                                              even_when_off=True),
                                    gpu_mem_mib, compute_capability) or 0
        graph += dp_bs * attn_dp * 3 + (dp_bs * attn_dp * 1.5 if dp_bs > 300 else 0)
    parallel = tp * pp / 8 * 1024
    reserved = 512 + activation_tokens * 1.5 + parallel + graph
    floor = gpu_mem_mib is not None and gpu_mem_mib > 61440 and reserved < 10240
    if floor:
        reserved = 10240.0
    if rules.fraction == "table" and gpu_mem_mib is not None:
        activation_tokens, graph, parallel, floor, buckets = 0, 0.0, 0.0, False, 0
        reserved = _table_fraction(gpu_mem_mib, tp, pp)
    if gpu_mem_mib is None:
        fraction_value = rules.fallback_fraction
    else:
        fraction_value = round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
    vlm_factor = _vlm_factor(geometry, pinned)
    if vlm_factor is not None:
        fraction_value = fraction_value * vlm_factor
    return FractionDerivation(
        gpu_mem_mib=gpu_mem_mib, chunked_prefill_size=chunked if chunked <= 0 else chunked // attn_dp,
        decode_max_bs=decode_bs,
        prefill_buckets=max(buckets, 0), activation_mib=activation_tokens * 1.5, graph_mib=graph,
        parallel_mib=parallel, reserved_mib=reserved, floor_applied=floor, vlm_factor=vlm_factor,
        fraction=fraction_value,
    )


def pool_tokens(*, pre_load_bytes: int, after_load_bytes: int, fraction_value: float, cell_bytes: float,
                page_size: int, max_total_tokens: int | None) -> tuple[int, int]:
    """(tokens, budget bytes): rest = A - P x (1 - f), // cell, floored to the page."""
    slack_gib = pre_load_bytes / GiB * (1 - fraction_value)
    rest_gib = after_load_bytes / GiB - slack_gib
    budget = int(rest_gib * GiB)
    if budget <= 0:
        return 0, budget
    tokens = int(budget // cell_bytes) // page_size * page_size
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens) // page_size * page_size
    return tokens, budget


# --------------------------------------------------------------------------- loader leftovers

# What is allocated between SGLang's baseline (P) and the pool's measure (A) besides the checkpoint's
# bytes. SGLang builds the model's modules on the device (model_loader/loader.py:1012-1016), one tensor
# per parameter, through PyTorch's caching allocator (no expandable segments by default), and
# `get_available_gpu_memory` empties the cache before A (utils/common.py:446-447): what remains beyond
# the tensors is the allocator's rounding of the segments that hold them, and the buffers the model
# code adds (the rotary cos/sin cache).
# The tensors and the allocator's rules: launcher/engines/sglang/parameters.py.
# Beyond the parameters and the rope cache: kernels loaded lazily during the load, the sampler and
# the small buffers of the modules. Three published starts (tests/data/startup-logs: R1-Distill-Qwen-7B
# on an RTX 3090, Qwen3-14B and QwQ-32B at TP 4) left 0-46 MiB beyond the derived figure (each
# read from two-decimal GiB prints, +/- 10 MiB): 24 +/- 32 MiB covers them.
LOAD_RESIDUAL_BYTES = 24 << 20
LOAD_RESIDUAL_ERROR_BYTES = 32 << 20


# Online fp8: `--quantization fp8` on a checkpoint without a quantization config. SGLang 0.5.23 creates
# the linear and expert weights in the model dtype (layers/quantization/fp8.py:653-664: float8 only for
# an fp8-serialized checkpoint) and quantizes each module after the whole model has loaded
# (model_loader/loader.py:1089, fp8.py:1150-1175, per-channel or per-tensor scales), so the 16-bit
# weights must fit at the load peak; the pool is sized from the memory left after loading, read through
# `get_available_gpu_memory`, which empties the allocator's cache first (model_runner.py:1364,
# utils/common.py:428-446): from the fp8 model.
ONLINE_FP8_BYTES_PER_ELEMENT = {"fp8": 1.0}


@dataclass(frozen=True)
class OnlineQuantized:
    """One rank's weights after SGLang quantized them while loading, and the 16-bit peak before."""

    bytes: int
    error_bytes: int
    peak_bytes: int  # the checkpoint's share, all allocated before any module is quantized
    rule: str


def online_quantized(geometry: ModelGeometry, *, quantization: str | None, checkpoint_bytes: int,
                     model_dtype: str, tp: int, pp: int) -> OnlineQuantized | None:
    """The weights SGLang holds under `--quantization fp8` on an unquantized checkpoint, or None."""
    per_element = ONLINE_FP8_BYTES_PER_ELEMENT.get(quantization or "")
    if per_element is None or geometry.quantization is not None or geometry.is_multimodal:
        return None
    weights = quantized_weights(geometry, checkpoint_bytes=checkpoint_bytes, model_dtype=model_dtype,
                                bytes_per_element=per_element)
    if weights is None:
        return None
    ranks = max(tp * pp, 1)
    return OnlineQuantized(
        bytes=weights.loaded // ranks, error_bytes=weights.small_error // ranks, peak_bytes=checkpoint_bytes // ranks,
        rule=f"--quantization {quantization}: linear and expert weights quantized to fp8 after loading, "
             f"{kept_layers(geometry)} kept in {model_dtype}")


# --------------------------------------------------------------------------- weights as loaded
#
# gpt-oss's MXFP4 experts (GptOssForCausalLM, quant_method mxfp4) are re-laid out for the MoE kernels
# after loading (model_loader/loader.py:1089 runs each module's process_weights_after_loading), before A
# is read: what they hold then, beyond the checkpoint's share, shrinks the pool by as much. SGLang 0.5.23
# `sglang/srt/...` unless said; triton_kernels as SGLang 0.5.18+ calls it (layout instances,
# matmul.PrecisionConfig with b_microblock_size) read from tokenspeed-triton-kernels 1.0.0.post20260510
# (tensor_details/layout_details/*.py), the older API (triton_kernels.matmul_ogs, SGLang <= 0.5.17) from
# vLLM 0.33's vendored copy (third_party/triton_kernels).
# The MoE runner by card (arg_groups/model_overrides/gpt_oss.py:64-120; is_sm90/100/120 test the major,
# utils/common.py:297-335):
# - sm100 (B200/B300): flashinfer_mxfp4, TRT-LLM kernels (0.5.1+);
# - sm120 (RTX 5090, RTX PRO 6000): flashinfer_mxfp4, CUTLASS kernels from 0.5.17 (marlin 0.5.14-0.5.16,
#   triton_kernel before: not derived here);
# - sm80-sm90: triton_kernel, chosen where the triton_kernels package imports (no Requires-Dist of SGLang
#   brings it; without it "auto" reaches the dequantizing branch, which imports it too,
#   layers/quantization/mxfp4.py:1115-1131: gpt-oss MXFP4 does not load without it).
# Sizes per rank: FusedMoE asserts intermediate % tp == 0 and creates intermediate / tp
# (layers/moe/fused_moe_triton/layer.py:427-428); the checkpoint stores per expert gate_up [2I, H/2] u8
# blocks, [2I, H/32] u8 scales, [2I] bf16 bias, down [H, I/2], [H, I/32], [H].
GPT_OSS = "GptOssForCausalLM"
TRITON_PAD_64_SINCE = "0.5.10"  # create_weights pads I to 64 for triton_kernels (mxfp4.py:548-551); 32 before
FLASHINFER_PAD_128_SINCE = "0.5.17"  # sm100 pads I to 128 (mxfp4.py:478-488); 256 in 0.5.2-0.5.16
SM120_CUTLASS_SINCE = "0.5.17"
TRITON_KERNELS_NEW_API_SINCE = "0.5.18"  # triton_kernels.matmul; every convert_layout copies
HOPPER_SCALE_K_PAD_SINCE = "0.5.19"  # _pad_hopper_mxfp4_scale (mxfp4.py:220-228)


@dataclass(frozen=True)
class Mxfp4AsLoaded:
    """What gpt-oss's MXFP4 experts hold on a rank after SGLang re-laid them out, beyond the checkpoint's
    share (bytes), the error where the layout depends on a package version, and the rule."""

    extra_bytes: int
    error_bytes: int
    rule: str


def _up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _experts_bytes(experts: int, hidden: int, inter: int, bias_bytes: int) -> int:
    """One layer's experts as [E, 2I, H/2] + [E, 2I, H/32] + [E, H, I/2] + [E, H, I/32] u8 and two biases."""
    return experts * (inter * hidden + 2 * inter * hidden // 32 + hidden * inter // 2 + hidden * inter // 32
                      + bias_bytes * (2 * inter + hidden))


def _triton_inter(version: str, share: int) -> int:
    """The per-rank intermediate size the experts are created at for triton_kernels (and for the bf16 upcast)."""
    return _up(share, 64 if version_key(version) >= version_key(TRITON_PAD_64_SINCE) else 32)


def _scale_bytes(experts: int, hidden: int, inter: int) -> int:
    """One layer's [E, 2I, H/32] + [E, H, I/32] e8m0 block scales."""
    return experts * (2 * inter * hidden // 32 + hidden * inter // 32)


def _triton_layer(version: str, major: int, experts: int, hidden: int, share: int) -> tuple[int, int, str]:
    """(bytes, +/- bytes, rule) of one layer on triton_kernels (sm80-sm90): mxfp4.py:1046-1075 turns the
    biases to fp32, swizzles values and scales (`_swizzle_mxfp4`, :244-281) and deletes the loaded values
    but not the loaded scales, which stay registered beside the swizzled copies the kernels read."""
    inter = _triton_inter(version, share)
    held = _experts_bytes(experts, hidden, inter, 4)  # biases fp32 (:1049-1053)
    new_api = version_key(version) >= version_key(TRITON_KERNELS_NEW_API_SINCE)
    scales = _scale_bytes(experts, hidden, inter)
    if major < 9:
        # StridedLayout(-2) both (layout.py make_default_matmul_mxfp4_*): values and scales keep their
        # size; since 0.5.18 convert_layout (tensor.py:235-244) writes a copy, so the scales are held twice
        # (the old API's StridedLayout.swizzle_data returned its input).
        return held + (scales if new_api else 0), 0, (
            "MXFP4 experts on triton_kernels (sm80-sm89): biases fp32"
            + (", block scales copied into the kernels' layout beside the loaded ones" if new_api else ""))
    values = experts * (inter * hidden + hidden * inter // 2)
    # HopperMXValueLayout (hopper_value.py:61-148): both dims of [K/2, N] padded to 64, then tiles of 16 x 32
    # (no-ops after that); vLLM 0.33's vendored copy pads to 16 x 32 only: the difference is the error.
    padded = experts * (_up(2 * inter, 64) * _up(hidden // 2, 64) + _up(hidden, 64) * _up(inter // 2, 64))
    tiled = experts * (_up(2 * inter, 16) * _up(hidden // 2, 32) + _up(hidden, 16) * _up(inter // 2, 32))
    # HopperMXScaleLayout (hopper_scale.py:53-84): [N, K/32] with N padded to 2 x 8 warps x 2 x 8 = 256 and
    # K/32 to 2; 0.5.19+ first pads K/32 to K rounded to 128 (`_pad_hopper_mxfp4_scale`).
    k13, k2 = hidden // 32, inter // 32
    if version_key(version) >= version_key(HOPPER_SCALE_K_PAD_SINCE):
        k13, k2 = max(k13, _up(hidden, 128) // 32), max(k2, _up(inter, 128) // 32)
    swizzled = experts * (_up(2 * inter, 256) * _up(k13, 2) + _up(hidden, 256) * _up(k2, 2))
    return held - values + padded + swizzled, padded - tiled, (
        "MXFP4 experts swizzled for Hopper's triton_kernels: values padded to 64, block scales swizzled "
        "(rows padded to 256) beside the loaded ones, biases fp32")


def _flashinfer_layer(version: str, major: int, experts: int, hidden: int, share: int) -> tuple[int, str]:
    """(bytes, rule) of one layer on FlashInfer (sm100 TRT-LLM, sm120 CUTLASS): FusedMoE rounds the hidden
    size up to 256 for flashinfer_mxfp4 (fused_moe_triton/layer.py:452-457); the shuffles keep the shapes."""
    padded_hidden = _up(hidden, 256)
    if major == 10:
        # create_weights pads I to 128 (256 before 0.5.17) and H to 128 (mxfp4.py:478-488); the shuffled
        # weights replace the loaded ones, the biases fp32 (:799-800, :936-949), + 3 x E fp32 (:741-755).
        inter = _up(share, 128 if version_key(version) >= version_key(FLASHINFER_PAD_128_SINCE) else 256)
        return _experts_bytes(experts, padded_hidden, inter, 4) + 3 * experts * 4, (
            f"MXFP4 experts for FlashInfer's TRT-LLM MoE (sm100): hidden padded to {padded_hidden}, "
            f"intermediate to {inter} per rank, biases fp32")
    # sm120: created unpadded (mxfp4.py:493-516), then rebuilt as [up; gate] halves padded to 128 with bf16
    # biases and 4 x E fp32 (`_process_weights_for_sm120_cutlass`, :1340-1431), replacing the loaded ones.
    inter = _up(share, 128)
    return _experts_bytes(experts, padded_hidden, inter, 2) + 4 * experts * 4, (
        f"MXFP4 experts for FlashInfer's CUTLASS MoE (sm120): hidden padded to {padded_hidden}, "
        f"intermediate to {inter} per rank")


# A pinned --moe-runner-backend replaces "auto", which the gpt-oss override then leaves alone
# (arg_groups/model_overrides/gpt_oss.py:64 `if cfg.moe_runner_backend == "auto"`). A pinned --quantization
# keeps sm80-sm90 off triton_kernel from 0.5.9 (server_args.py:1393 in 0.5.9, gpt_oss.py:101-105 in 0.5.23:
# `and cfg.quantization is None`; 0.5.1-0.5.8 server_args.py do not test it): "auto" stays, and
# Mxfp4MoEMethod, neither triton_kernels nor flashinfer nor marlin, upcasts the experts to bf16
# (layers/quantization/mxfp4.py:1115-1136: `upcast_from_mxfp`, the loaded values and scales deleted; the
# intermediate padded as for triton_kernels, :560-563) - so does a pinned `triton` on any card (sm100 pads
# the same, :495-498). Where SGLang refuses the pin (`mxfp4_runner_refusal`), the plan refuses it.
QUANTIZATION_SKIPS_TRITON_KERNEL_SINCE = "0.5.9"
# The triton_kernels SIGSEGV fallback of the gpt-oss defaults (0.5.10 server_args.py:1772-1781, not in 0.5.9;
# 0.5.23 arg_groups/model_overrides/gpt_oss.py:108-114): sm100 and sm120 are matched before it.
BLACKWELL_DRIVER_595_TRITON_SINCE = "0.5.10"
DEQUANTIZING_RUNNERS = frozenset({"triton"})
# Where SGLang stops a pinned runner, by release: (first release, line of mxfp4.py, message, the majors it
# runs on; is_sm90/100/120_supported test the major exactly, utils/common.py:282-296 in 0.5.13).
_SM90_OR_ABOVE = "MXFP4 Marlin requires Hopper/SM90 or above."
_Refusal = tuple[int, str, tuple[int, ...]]
MARLIN_SM90_REFUSAL: tuple[tuple[str, _Refusal], ...] = (
    ("0.5.12", (564, _SM90_OR_ABOVE, (9,))), ("0.5.13", (572, _SM90_OR_ABOVE, (9,))),
    ("0.5.14", (521, "MXFP4 Marlin requires SM90 or SM120.", (9, 12))),
    ("0.5.17", (560, "MXFP4 Marlin requires SM90+.", (9, 10, 12))),
    ("0.5.18", (565, "MXFP4 Marlin requires SM90+.", (9, 10, 12))),
    ("0.5.21", (636, "MXFP4 Marlin requires SM90+.", (9, 10, 12))),
    ("0.5.23", (655, "MXFP4 Marlin requires SM90+.", (9, 10, 12))))
_SM90_SM100 = "moe_runner_backend=flashinfer_mxfp4 requires SM90 or SM100."
_SM90_SM100_SM120 = "moe_runner_backend=flashinfer_mxfp4 requires SM90, SM100, or SM120."
FLASHINFER_SM_REFUSAL: tuple[tuple[str, _Refusal], ...] = (
    ("0.5.12", (413, _SM90_SM100, (9, 10))), ("0.5.13", (421, _SM90_SM100, (9, 10))),
    ("0.5.14", (359, _SM90_SM100, (9, 10))), ("0.5.17", (370, _SM90_SM100_SM120, (9, 10, 12))),
    ("0.5.18", (375, _SM90_SM100_SM120, (9, 10, 12))), ("0.5.21", (426, _SM90_SM100_SM120, (9, 10, 12))),
    ("0.5.23", (439, _SM90_SM100_SM120, (9, 10, 12))))


def _runner(value: object) -> str | None:
    return value.strip().lower() if isinstance(value, str) and value.strip().lower() not in ("", "auto") else None


def mxfp4_runner_refusal(geometry: ModelGeometry, *, version: str, moe_runner_backend: object,
                         compute_capability: tuple[int, int] | None) -> tuple[str, str] | None:
    """(SGLang's message, file:line) where it stops loading gpt-oss's MXFP4 experts under this pin, else None."""
    runner = _runner(moe_runner_backend)
    method = (geometry.quantization.method if geometry.quantization else "") or ""
    if geometry.architecture != GPT_OSS or method.lower() != "mxfp4" or runner is None or compute_capability is None:
        return None
    path = "sglang/srt/layers/quantization/mxfp4.py"
    table = {"marlin": MARLIN_SM90_REFUSAL, "flashinfer_mxfp4": FLASHINFER_SM_REFUSAL}.get(runner)
    if table is None or version_key(version) < version_key(table[0][0]):  # no such check before its first release
        return None
    release, (line, message, majors) = lines_for(table, version)
    return None if compute_capability[0] in majors else (message, f"{path}:{line} (SGLang {release})")


def _dequantized_layer(version: str, experts: int, hidden: int, share: int) -> tuple[int, str]:
    """The experts upcast to bf16: [E, 2I, H] + [E, H, I] bf16 and bf16 biases, I padded to 64 (32 before
    0.5.10)."""
    inter = _triton_inter(version, share)
    return experts * (2 * (2 * inter * hidden + hidden * inter) + 2 * (2 * inter + hidden)), (
        f"MXFP4 experts upcast to bf16 (intermediate {inter} per rank), the packed values and scales freed")


def _triton_blackwell_layer(version: str, experts: int, hidden: int, share: int) -> int:
    """One layer on triton_kernel where the card is Blackwell-class but not sm100/sm120 (sm110: is_sm100/120
    test the major, gpt_oss.py:103-120, so triton_kernel runs, and triton_kernels takes its Blackwell layouts
    from capability 10): not read from SGLang's code here, so the larger of the layouts it may take is
    counted: values in rows padded to 128 bytes, scales to K % 8 x N % 128 (the Blackwell layouts as vLLM's
    third_party copy pads them), the loaded scales kept beside them (:1046-1075), biases fp32."""
    inter = _triton_inter(version, share)
    values = experts * (2 * inter * _up(hidden // 2, 128) + hidden * _up(inter // 2, 128))
    scales = experts * (_up(hidden // 32, 8) * _up(2 * inter, 128) + _up(inter // 32, 8) * _up(hidden, 128))
    return values + scales + _scale_bytes(experts, hidden, inter) + experts * 4 * (2 * inter + hidden)


def _span(high: int, low: int, rule: str) -> Mxfp4AsLoaded:
    """The middle of two layouts' extra bytes, so that the band's unfavourable end is the larger."""
    extra = (high + low) // 2
    return Mxfp4AsLoaded(extra, high - extra, rule)


def mxfp4_as_loaded(geometry: ModelGeometry, *, version: str, tp: int, pp: int,
                    compute_capability: tuple[int, int] | None, moe_runner_backend: object = None,
                    quantization: object = None) -> Mxfp4AsLoaded | None:
    """gpt-oss's MXFP4 experts as SGLang holds them after loading on this card, or None where this does
    not apply (another model or quantization, a card before sm80, where SGLang's MXFP4 code does not run).
    Where the layout is not known to one (an optional package's version, a card not known or not derived, a
    pinned runner whose layout is not derived), the plan counts the middle and the band spans the layouts:
    the larger at its unfavourable end. A pinned --moe-runner-backend or --quantization changes the runner
    (see above)."""
    method = (geometry.quantization.method if geometry.quantization else "") or ""
    experts, hidden, inter = geometry.num_experts, geometry.hidden_size, geometry.intermediate_size
    if (geometry.architecture != GPT_OSS or method.lower() != "mxfp4" or not experts or not inter
            or inter % max(tp, 1) or (compute_capability is not None and compute_capability[0] < 8)):
        return None
    share = inter // max(tp, 1)
    layers = -(-geometry.num_layers // max(pp, 1))
    checkpoint = layers * _experts_bytes(experts, hidden, inter, 2) // max(tp, 1)
    runner = _runner(moe_runner_backend)
    pinned_quant = isinstance(quantization, str) and quantization.strip().lower() == "mxfp4"
    skips_triton_kernel = version_key(version) >= version_key(QUANTIZATION_SKIPS_TRITON_KERNEL_SINCE)
    major = compute_capability[0] if compute_capability is not None else None
    if runner in DEQUANTIZING_RUNNERS or (runner is None and pinned_quant and major in (8, 9) and skips_triton_kernel):
        held, rule = _dequantized_layer(version, experts, hidden, share)
        why = f"--moe-runner-backend {runner}" if runner else "--quantization pinned (no triton_kernel)"
        return Mxfp4AsLoaded(layers * held - checkpoint, 0, f"{why}: {rule}")
    if major not in (8, 9, 10, 12):  # a card not known (a bare --gpu size), or sm110
        spans = [_card_layout(version, m, experts, hidden, share) for m in (8, 9, 10, 12)]
        bw = _triton_blackwell_layer(version, experts, hidden, share)
        highs = [h for h, _, _ in spans] + [bw]
        lows = [lo for _, lo, _ in spans] + [bw]
        if major == 11 and version_key(version) >= version_key(BLACKWELL_DRIVER_595_TRITON_SINCE):
            # With an NVIDIA driver >= 595 a Blackwell card that is neither sm100 nor sm120 gets runner `triton`
            # (BLACKWELL_DRIVER_595_TRITON_SINCE), which upcasts the experts to bf16.
            highs.append(_dequantized_layer(version, experts, hidden, share)[0])
        what = "the card is not known" if major is None else f"sm{major}0 is not derived"
        return _span(layers * max(highs) - checkpoint, layers * min(lows) - checkpoint,
                     f"{what}: the band spans the MXFP4 expert layouts SGLang {version} holds on the cards it runs")
    high, low, rule = _card_layout(version, major, experts, hidden, share)
    extra_high, extra_low = layers * high - checkpoint, layers * low - checkpoint
    default = "triton_kernel" if major in (8, 9) else "flashinfer_mxfp4"
    if runner is not None and runner != default:
        return _span(2 * max(extra_high, 0), 0, (
            f"--moe-runner-backend {runner}: its layout is not derived here; the band spans twice the card's "
            f"default ({default}) down to the checkpoint's: {rule}"))
    if major == 12 and version_key(version) < version_key(SM120_CUTLASS_SINCE):
        # triton_kernel (<= 0.5.13) or marlin (0.5.14-0.5.16) on sm120: not derived; the band spans twice the
        # CUTLASS layout down to the checkpoint's.
        return _span(2 * max(extra_high, 0), 0,
                     f"not derived for SGLang {version} on sm120: {rule} (0.5.17+), the band from the checkpoint's "
                     "to twice it")
    if extra_high != extra_low:
        rule += "; the plan counts the middle of the two, the band spans both"
    return _span(extra_high, extra_low, rule)


def _card_layout(version: str, major: int, experts: int, hidden: int, share: int) -> tuple[int, int, str]:
    """(largest, smallest, rule) of one layer's experts as the card's default runner holds them."""
    if major in (8, 9):
        held, error, rule = _triton_layer(version, major, experts, hidden, share)
        return held, held - error, rule
    held, rule = _flashinfer_layer(version, major, experts, hidden, share)
    return held, held, rule


@dataclass(frozen=True)
class LoadOverhead:
    """The loader's leftovers (P - A beyond the weights), their expected error and how they were found."""

    bytes: int
    error_bytes: int
    detail: str


def load_overhead(geometry: ModelGeometry, *, dtype: str, tp: int, pp: int, quantized_online: bool = False,
                  compute_capability: tuple[int, int] | None = None, attn_tp: int | None = None) -> LoadOverhead:
    """Derived from SGLang's modules where their tensors are known (parameters.loader_tensors, one
    pipeline stage, not quantized while loading), else bounded by the layer count, with the wider error
    that leaves. `attn_tp`: the attention's ranks under data-parallel attention (the MLA copies' heads)."""
    element = ELEMENT_BYTES.get(dtype)
    loader = None if quantized_online or pp != 1 or element is None else \
        parameters.loader_tensors(geometry, element=element, tp=tp)
    # The MLA models' w_kc / w_vc, allocated after every loaded tensor, whether those are derived or bounded.
    copies, copies_rule = parameters.mla_decode_copies(geometry, element=element or 2, tp=attn_tp or tp, pp=pp)
    if loader is None:
        bounded = _bounded_overhead(geometry, parameters.rope_cache_bytes(geometry), pp,
                                    "weights quantized while loading" if quantized_online else "this model")
        if not copies:
            return bounded
        return LoadOverhead(bounded.bytes + sum(copies), bounded.error_bytes, f"{bounded.detail}; + {copies_rule}")
    rounding = allocator.slack_bytes(loader.tensors + tuple(copies))
    repack, repack_error, repack_rule = parameters.repack_leftovers(loader, compute_capability)
    return LoadOverhead(
        loader.engine_only_bytes + sum(copies) + rounding + repack + LOAD_RESIDUAL_BYTES,
        LOAD_RESIDUAL_ERROR_BYTES + repack_error,
        f"derived: {loader.rule}: {loader.engine_only_bytes / 2**20:.0f} MiB no checkpoint holds ("
        + ", ".join(loader.engine_only) + ")" + (f" + {copies_rule}" if copies else "")
        + f" + allocator rounding {rounding / 2**20:.0f} MiB"
        + (f" + {repack_rule}" if repack_rule else "") + f" + {LOAD_RESIDUAL_BYTES >> 20} MiB residual")


def _bounded_overhead(geometry: ModelGeometry, rope: int | None, pp: int, what: str) -> LoadOverhead:
    """Where SGLang's tensors are not derived: up to one 2 MiB rounding per large tensor, four per
    layer (attention in and out, MLP in and out), eight with routed experts or MLA; a rope cache of
    up to 64 MiB (131072 positions x 128 float32) where its length is not derived."""
    per_layer = 8 if geometry.num_experts or geometry.mla is not None else 4
    rounding = per_layer * -(-geometry.num_layers // pp) * (1 << 20)  # half a rounding per tensor, +/- as much
    rope_bytes, rope_error = (rope, 0) if rope is not None else (32 << 20, 32 << 20)
    return LoadOverhead(
        rounding + rope_bytes + LOAD_RESIDUAL_BYTES, rounding + rope_error + LOAD_RESIDUAL_ERROR_BYTES,
        f"estimated: SGLang's parameter tensors are not derived for {what}; up to {2 * per_layer} MiB "
        "of allocator rounding per layer" + ("" if rope is not None else ", a rope cache of 0-64 MiB"))
