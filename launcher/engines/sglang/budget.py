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
from launcher.engines.sglang.architectures import breakable_graph_multimodal_ok
from launcher.engines.sglang.rules import RULES, SglangRules
from launcher.model.config import ModelGeometry

# Memory SGLang holds before its "pre-load" baseline (CUDA context; NCCL with TP).
CUDA_CONTEXT_BYTES = 560 * 1024**2
NCCL_BYTES = 320 * 1024**2
# Allocated between the baseline and pool sizing besides the weights (loader buffers).
LOAD_OVERHEAD_BYTES = 96 * 1024**2
# Expected errors (+/-) of the two estimates above, from the published SGLang logs.
CONTEXT_ERROR_BYTES = 128 * 1024**2
LOAD_OVERHEAD_ERROR_BYTES = 96 * 1024**2
# SGLANG_VLM_CACHE_SIZE_MB: kept out of the KV budget for multimodal models.
MULTIMODAL_RESERVE_BYTES = 100 * 1024**2


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
                     device: str) -> int | None:
    """The decode CUDA-graph max batch size: pinned, the tier's, 32 on CPU, or --max-running-requests."""
    bs_flag = "--cuda-graph-max-bs" if rules.prefill_graph != "breakable" else "--cuda-graph-max-bs-decode"
    decode_bs: int | None = pinned.get(bs_flag, pinned.get("--cuda-graph-max-bs-decode", bs_default))
    if device == "cpu":
        decode_bs = 32  # torch_compile_max_bs: the "CPU graph" only with --enable-torch-compile
    mrr = pinned.get("--max-running-requests")
    if rules.mrr_shrinks_bs and bs_flag not in pinned and mrr is not None and mrr < (decode_bs or 0):
        decode_bs = mrr
    if pinned.get("--disable-cuda-graph", False) and not rules.decode_reserve_when_off:
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
                   decode_bs: int | None, prefill_on: bool) -> tuple[float, int]:
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
    buckets = len(prefill_graph_buckets(prefill_max))
    return graph + 8 * buckets, buckets


def _vlm_factor(geometry: ModelGeometry, pinned: Mapping[str, Any]) -> float | None:
    """`adjust_mem_fraction_for_vlm`: a vision tower larger than the reference lowers the fraction."""
    if not geometry.is_multimodal or pinned.get("--language-only", False):
        return None
    ratio = (geometry.vision_layers or 24) * (geometry.vision_hidden_size or 1024) ** 2 / (24 * 1024**2)
    return 0.95 * min(max(1 - 0.1 * (ratio - 1), 0.8), 1.05)


def default_fraction(geometry: ModelGeometry, *, gpu_mem_mib: float | None, tp: int, pp: int,
                     pinned: Mapping[str, Any], rules: SglangRules, device: str = "cuda") -> FractionDerivation:
    """`handle_gpu_memory_settings` for the common path (no DP attention, DeepEP or PD split)."""
    chunk_default, bs_default = tier_defaults(gpu_mem_mib, tp, rules)
    chunked = pinned.get("--chunked-prefill-size", chunk_default)
    decode_bs = _decode_graph_bs(pinned, rules, bs_default, device)
    prefill_on = _prefill_graph_on(geometry, pinned, rules, pp, device)
    max_prefill_tokens = pinned.get("--max-prefill-tokens", 16384)
    activation_tokens = max(chunked if chunked > 0 else max_prefill_tokens, 2048)
    graph, buckets = _graph_reserve(geometry, pinned, rules, chunked, decode_bs, prefill_on)
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
        gpu_mem_mib=gpu_mem_mib, chunked_prefill_size=chunked, decode_max_bs=decode_bs,
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


def max_running_requests(tokens: int, context_len: int, pinned: int | None) -> int:
    """`resolve_max_num_reqs`: estimated from capacity, clamped to [2048, 4096], <= tokens // 2."""
    if pinned is not None:
        return min(max(1, pinned), tokens // 2)
    estimated = min(max(int(tokens / context_len * 512), 2048), 4096)
    return min(estimated, tokens // 2)
