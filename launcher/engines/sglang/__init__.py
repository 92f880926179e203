"""Everything safe-serve knows about SGLang 0.5.22/0.5.23: flags, the default fraction, the pool.

Sources (SGLang 0.5.23 wheel, `sglang/srt/...`):
- default `--mem-fraction-static`: `arg_groups/memory_hook.py` (`handle_gpu_memory_settings`,
  `reserve_for_graph_mb`, `adjust_mem_fraction_for_vlm`) and `arg_groups/cuda_graph_hook.py`;
- pool: `mem_cache/kv_cache_configurator.py` — rest = available_after_load - pre_load x (1 - f),
  tokens = rest // cell_size, floored to the page size, capped by `--max-total-tokens`;
- cell size: `n_kv_heads_per_rank x (head_dim + v_head_dim) x layers x dtype bytes`, MLA
  `(kv_lora_rank + qk_rope_head_dim) x layers x dtype bytes`;
- context length: `utils/hf_transformers/common.py:get_context_length`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.common.units import GiB
from launcher.engines.dtypes import auto_kv_bytes, kv_element_bytes
from launcher.engines.flags import FlagSpec, SecretFlag, fraction, parse_pinned, positive_int
from launcher.model.config import ModelGeometry

NAME = "sglang"
NEWEST = "0.5.23"
# The flags safe-serve itself sets or suggests, in this engine's spelling.
LENGTH_FLAG = "--context-length"
TP_FLAG = "--tp-size"
PP_FLAG = "--pp-size"
FP8_KV = "fp8_e4m3"
DEFAULT_PORT = 30000
FALLBACK_FRACTION = 0.95  # no device capacity known


Tier = tuple[int, int, int, int]  # (gpu MiB upper bound, exclusive; chunk; decode bs tp<4; tp>=4)


@dataclass(frozen=True)
class SglangRules:
    """How one SGLang release sizes memory. Releases that size memory identically share
    a `rule_set` (the first release of the set); docs/engine-versions.md has the table and
    tests/data/sglang_oracle.json SGLang's own output per checked release.

    fraction: "table" (0.5.1-0.5.2, reserve by GPU tier, server_args.py __post_init__) or
    "reserve" (0.5.3+: 512 + activation + graph + parallel, 10 GiB floor above 60 GiB).
    prefill_graph: "off" (no prefill graph by default, <= 0.5.9), "piecewise" (0.5.10-0.5.19,
    MLA captures 2048 tokens) or "breakable" (0.5.20+).
    """

    version: str
    rule_set: str
    fraction: str
    tiers: tuple[Tier, ...]
    top_tier: tuple[int, int]  # (chunk, decode bs) above the last bound
    prefill_graph: str
    fallback_fraction: float  # gpu capacity unknown
    prefill_cap_context: bool = False  # 0.5.13-0.5.16 cap the prefill graph at --context-length
    # <= 0.5.14: the decode term counts even under --disable-cuda-graph, which leaves the
    # piecewise prefill graph on (0.5.15 server_args.py:3639-3643 added the backend check).
    decode_reserve_when_off: bool = False
    # 0.5.22+: --max-running-requests below the tier's decode bs lowers it (oracle: <= 0.5.21 not).
    mrr_shrinks_bs: bool = False
    source: str = ""


# 0.5.3-0.5.19 (server_args.py `_handle_gpu_memory_settings`; 0.5.19 arg_groups/memory_hook.py:63-130).
_TIERS_OLD: tuple[Tier, ...] = ((20480, 2048, 8, 8), (35840, 2048, 24, 80), (61440, 4096, 32, 160),
                                (92160, 8192, 256, 512), (163840, 8192, 256, 512))
# 0.5.3-0.5.4: 16 instead of 24 on 20-35 GiB cards with tp < 4 (0.5.3 server_args.py:583-586).
_TIERS_053: tuple[Tier, ...] = ((20480, 2048, 8, 8), (35840, 2048, 16, 80)) + _TIERS_OLD[2:]
# 0.5.20+ (arg_groups/memory_hook.py:88-140 in 0.5.21): 4096 / 48 on 20-35 GiB cards.
_TIERS_NEW: tuple[Tier, ...] = ((20480, 2048, 8, 8), (35840, 4096, 48, 160)) + _TIERS_OLD[2:]


def _set(first: str, last: int, **fields: Any) -> list[SglangRules]:
    major, minor, patch = (int(x) for x in first.split("."))
    return [SglangRules(version=f"{major}.{minor}.{n}", rule_set=first, **fields) for n in range(patch, last + 1)]


RULES: tuple[SglangRules, ...] = tuple(
    _set("0.5.1", 2, fraction="table", decode_reserve_when_off=True, tiers=(),
         top_tier=(16384, 512), prefill_graph="off",
         fallback_fraction=0.88, source="0.5.2 server_args.py:449-500 (table), :505-530 (chunk, graph bs)")
    + _set("0.5.3", 4, fraction="reserve", decode_reserve_when_off=True, tiers=_TIERS_053,
           top_tier=(16384, 512), prefill_graph="off",
           fallback_fraction=0.88, source="0.5.3 server_args.py:542-683")
    + _set("0.5.5", 9, fraction="reserve", decode_reserve_when_off=True, tiers=_TIERS_OLD,
           top_tier=(16384, 512), prefill_graph="off",
           fallback_fraction=0.88, source="0.5.9 server_args.py:911-1070")
    + _set("0.5.10", 12, fraction="reserve", decode_reserve_when_off=True, tiers=_TIERS_OLD,
           top_tier=(16384, 512), prefill_graph="piecewise",
           fallback_fraction=0.88, source="0.5.10 server_args.py:1141-1330, :1076-1139 (piecewise auto-off)")
    + _set("0.5.13", 14, fraction="reserve", decode_reserve_when_off=True, tiers=_TIERS_OLD,
           top_tier=(16384, 512), prefill_graph="piecewise",
           fallback_fraction=0.88, prefill_cap_context=True, source="0.5.13 server_args.py:1444-1640")
    + _set("0.5.15", 16, fraction="reserve", tiers=_TIERS_OLD,
           top_tier=(16384, 512), prefill_graph="piecewise",
           fallback_fraction=0.88, prefill_cap_context=True, source="0.5.15 server_args.py:3469-3690")
    + _set("0.5.17", 19, fraction="reserve", tiers=_TIERS_OLD,
           top_tier=(16384, 512), prefill_graph="piecewise",
           fallback_fraction=0.88, source="0.5.18 server_args.py:4802-4990; 0.5.19 arg_groups/memory_hook.py:26-270")
    + _set("0.5.20", 21, fraction="reserve", tiers=_TIERS_NEW,
           top_tier=(16384, 512), prefill_graph="breakable",
           fallback_fraction=FALLBACK_FRACTION, source="0.5.21 arg_groups/memory_hook.py:47-330, :350")
    + _set("0.5.22", 23, fraction="reserve", tiers=_TIERS_NEW,
           top_tier=(16384, 512), prefill_graph="breakable",
           fallback_fraction=FALLBACK_FRACTION, mrr_shrinks_bs=True,
           source="0.5.23 arg_groups/memory_hook.py:47-330, :357 reserve_for_graph_mb, "
                  ":417 adjust_mem_fraction_for_vlm")
)


def rules_for(version: str | None) -> tuple[SglangRules, str | None]:
    from launcher.engines.versions import nearest_rules

    return nearest_rules(RULES, version, NEWEST)


FLAGS = (
    FlagSpec("--mem-fraction-static", fraction),
    FlagSpec("--context-length", positive_int),
    FlagSpec("--chunked-prefill-size", int),
    FlagSpec("--max-total-tokens", positive_int),
    FlagSpec("--max-running-requests", positive_int),
    FlagSpec("--max-prefill-tokens", positive_int),
    FlagSpec("--tp-size", positive_int, aliases=("--tensor-parallel-size", "--tp")),
    FlagSpec("--pp-size", positive_int, aliases=("--pipeline-parallel-size",)),
    FlagSpec("--dp-size", positive_int, aliases=("--data-parallel-size",)),
    FlagSpec("--page-size", positive_int),
    FlagSpec("--kv-cache-dtype", str),
    FlagSpec("--dtype", str),
    FlagSpec("--quantization", str),
    FlagSpec("--disable-cuda-graph", None),
    FlagSpec("--disable-prefill-cuda-graph", None),
    FlagSpec("--cuda-graph-max-bs-decode", positive_int),
    FlagSpec("--cuda-graph-max-bs", positive_int),  # <= 0.5.18 (ambiguous from 0.5.19 on)
    FlagSpec("--cuda-graph-backend-prefill", str),
    FlagSpec("--enable-dp-attention", None),
    FlagSpec("--nnodes", positive_int),
    FlagSpec("--port", int),
    FlagSpec("--host", str),
    FlagSpec("--language-only", None),
    FlagSpec("--disable-hybrid-swa-memory", None),
    FlagSpec("--swa-full-tokens-ratio", float),
    # Hybrid state models (arg_groups/fields/schedule.py:216-227, exec_.py:490-518, memory).
    FlagSpec("--mamba-full-memory-ratio", float),
    FlagSpec("--mamba-ssm-dtype", str),
    FlagSpec("--max-mamba-cache-size", positive_int),
    FlagSpec("--disable-radix-cache", None),
    FlagSpec("--disable-overlap-schedule", None),
    # Read only to say that the plan does not count what they add (NOT_MODELLED).
    FlagSpec("--speculative-algorithm", str),
    FlagSpec("--enable-lora", None),
)


# The flags whose values change what SGLang allocates besides the pool (see vLLM's twin).
CALIBRATION_KEY_FLAGS = ("--dtype", "--kv-cache-dtype", "--chunked-prefill-size", "--tp-size", "--pp-size",
                         "--cuda-graph-max-bs-decode", "--disable-cuda-graph", "--max-running-requests")
MEMORY_FLAGS = frozenset({"--mem-fraction-static", "--max-total-tokens"})
# Flags that add memory the plan does not model yet: said in the plan's warnings.
NOT_MODELLED = {
    "--speculative-algorithm": "the draft model's weights, KV pool and CUDA graphs",
    "--enable-lora": "the LoRA adapters' weights and their buffers",
}
ENV_KEYS: tuple[str, ...] = ()
ALLOW_LONG_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"  # srt/configs/model_config.py
OTHER_FLAGS = frozenset({"--served-model-name", "--trust-remote-code", "--api-key", "--chat-template"})
# Flags whose values are credentials: masked wherever safe-serve shows a command (the engine
# gets them as given). SGLang 0.5.23: `--api-key`, `--admin-api-key`, `--ssl-keyfile-password`
# (srt/arg_groups/fields/serving.py:148-166), and `--watermark-config`, whose inline JSON holds
# the watermark keys (srt/arg_groups/fields/exec_.py:78; SGLang redacts it in its own launch
# command, srt/server_args.py:715). `--ssl-keyfile` is a path, though a prefix of a secret flag.
SECRET_FLAGS = (SecretFlag("--api-key"), SecretFlag("--admin-api-key"), SecretFlag("--ssl-keyfile-password"),
                SecretFlag("--watermark-config"))
PLAIN_FLAGS_LIKE_SECRETS = frozenset({"--ssl-keyfile", "--ssl_keyfile"})
AS_WRITTEN: dict[tuple[str, Any], str] = {}


def verified_architectures() -> tuple[str, list[tuple[str, str]]]:
    from launcher.engines.sglang import architectures

    return (f"SGLang {architectures.ENGINE_VERSION}: cell size and pool equal SGLang's own ModelConfig and pool "
            f"code ({architectures.GOLDEN})",
            [(row.architecture, f"{row.layers}; golden: {', '.join(row.models)}")
             for row in architectures.verified_architectures()])


def pinned_flags(engine_args: Sequence[str]) -> dict[str, Any]:
    return parse_pinned(engine_args, FLAGS)


def ranks(pinned: Mapping[str, Any]) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes as pinned."""
    return int(pinned.get(TP_FLAG, 1)), int(pinned.get(PP_FLAG, 1))


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


def default_fraction(geometry: ModelGeometry, *, gpu_mem_mib: float | None, tp: int, pp: int,
                     pinned: Mapping[str, Any], rules: SglangRules, device: str = "cuda") -> FractionDerivation:
    """`handle_gpu_memory_settings` for the common path (no DP attention, DeepEP or PD split)."""
    chunk_default, bs_default = tier_defaults(gpu_mem_mib, tp, rules)
    chunked = pinned.get("--chunked-prefill-size", chunk_default)
    bs_flag = "--cuda-graph-max-bs" if rules.prefill_graph != "breakable" else "--cuda-graph-max-bs-decode"
    decode_bs: int | None = pinned.get(bs_flag, pinned.get("--cuda-graph-max-bs-decode", bs_default))
    if device == "cpu":
        decode_bs = 32  # torch_compile_max_bs: the "CPU graph" only with --enable-torch-compile
    mrr = pinned.get("--max-running-requests")
    if rules.mrr_shrinks_bs and bs_flag not in pinned and mrr is not None and mrr < (decode_bs or 0):
        decode_bs = mrr
    graphs_off = pinned.get("--disable-cuda-graph", False)
    if rules.prefill_graph == "off":
        prefill_on = False
    elif rules.prefill_graph == "piecewise":
        # 0.5.10 server_args.py:1076-1139 `_handle_piecewise_cuda_graph` (runs before the
        # memory settings): off for pp > 1, multimodal, --disable-piecewise-cuda-graph, ...
        # --disable-cuda-graph does not turn it off there (0.5.13/0.5.18 oracle).
        prefill_on = (device == "cuda" and pp == 1 and not geometry.is_multimodal
                      and (rules.decode_reserve_when_off or not graphs_off)
                      and not pinned.get("--disable-piecewise-cuda-graph", False)
                      and not pinned.get("--disable-prefill-cuda-graph", False))
    else:
        prefill_on = (device == "cuda" and not graphs_off and not pinned.get("--disable-prefill-cuda-graph", False)
                      and pinned.get("--cuda-graph-backend-prefill", "breakable") != "disabled" and pp == 1
                      and not (geometry.is_multimodal and not _bcg_multimodal_ok(geometry)))
    if graphs_off and not rules.decode_reserve_when_off:
        decode_bs = None

    max_prefill_tokens = pinned.get("--max-prefill-tokens", 16384)
    activation_tokens = max(chunked if chunked > 0 else max_prefill_tokens, 2048)
    buckets = 0
    graph = 0.0
    if decode_bs is not None:
        graph += decode_bs * 2
    if prefill_on:
        if geometry.mla is not None:
            graph += 1536
            buckets = -1  # flat reserve; the bucket count does not matter
        else:
            prefill_max = chunked if chunked > 0 else 0
            if "--max-total-tokens" in pinned:
                prefill_max = min(prefill_max, pinned["--max-total-tokens"])
            if rules.prefill_cap_context and "--context-length" in pinned:
                prefill_max = min(prefill_max, pinned["--context-length"])
            buckets = len(prefill_graph_buckets(prefill_max))
            graph += 8 * buckets
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
    vlm_factor = None
    if geometry.is_multimodal and not pinned.get("--language-only", False):
        ratio = (geometry.vision_layers or 24) * (geometry.vision_hidden_size or 1024) ** 2 / (24 * 1024**2)
        vlm_factor = 0.95 * min(max(1 - 0.1 * (ratio - 1), 0.8), 1.05)
        fraction_value = fraction_value * vlm_factor
    return FractionDerivation(
        gpu_mem_mib=gpu_mem_mib, chunked_prefill_size=chunked, decode_max_bs=decode_bs,
        prefill_buckets=max(buckets, 0), activation_mib=activation_tokens * 1.5, graph_mib=graph,
        parallel_mib=parallel, reserved_mib=reserved, floor_applied=floor, vlm_factor=vlm_factor,
        fraction=fraction_value,
    )


def _bcg_multimodal_ok(geometry: ModelGeometry) -> bool:
    """Multimodal architectures whose breakable prefill graph SGLang keeps on."""
    return geometry.architecture in {"Qwen3_5ForConditionalGeneration", "KimiK25ForConditionalGeneration"}


# --------------------------------------------------------------------------- lengths and cells


def derived_context_length(geometry: ModelGeometry) -> tuple[int, str]:
    """`get_context_length`: the first key in SGLang's order, times a rope factor unless llama3/original."""
    text = geometry.text_config
    for key in ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings"):
        value = text.get(key)
        if isinstance(value, (int, float)) and value:
            length = int(value)
            break
    else:
        return 2048, "no length key in config.json (SGLang assumes 2048)"
    from launcher.engines.sglang import architectures
    from launcher.model.config import rope_scaling_entries

    factor = 1.0
    for entry in rope_scaling_entries(text):
        rope_type = entry.get("rope_type") or entry.get("type")
        # transformers 5 fills original_max_position_embeddings into YaRN configs that lack it,
        # so YaRN never multiplies (oracle: "rope-yarn-4-no-original" stays 4096).
        if "original_max_position_embeddings" in entry or rope_type in ("llama3", "yarn") \
                or not architectures.rope_factor_applies(geometry):
            continue
        if isinstance(entry.get("factor"), (int, float)):
            factor = float(entry["factor"])
    reason = f"config.json {key}={length}" + (f" x rope factor {factor:g}" if factor != 1.0 else "")
    return int(length * factor), reason


# The `--kv-cache-dtype` values safe-serve sizes, as SGLang's model runner stores them.
KV_CACHE_DTYPES = {
    "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2", "fp8": "float8_e4m3fn",
    "bf16": "bfloat16", "bfloat16": "bfloat16", "float16": "float16",
}


def kv_dtype_bytes(kv_cache_dtype: str | None, model_dtype: str, geometry: ModelGeometry) -> tuple[int, str]:
    value = (kv_cache_dtype or "auto").lower()
    if value == "auto":
        if geometry.quantization is not None and geometry.quantization.kv_cache_scheme == "fp8":
            return 1, "checkpoint asks for an FP8 KV cache (kv_cache_quant_algo)"
        return auto_kv_bytes(model_dtype), f"kv-cache-dtype auto = model dtype {model_dtype}"
    size = kv_element_bytes(value, KV_CACHE_DTYPES)
    if size is None:
        raise ValueError(f"kv-cache-dtype {value!r} is not one safe-serve can size yet")
    return size, f"kv-cache-dtype {value}"


def cell_size_bytes(geometry: ModelGeometry, *, kv_bytes: int, tp: int, pp: int,
                    pinned: Mapping[str, Any] | None = None) -> float:
    """Bytes one token takes in the pool on the fullest pipeline stage (`architectures.cell_size_bytes`)."""
    from launcher.engines.sglang import architectures

    return architectures.cell_size_bytes(architectures.layout(geometry), kv_bytes=kv_bytes, kv_fp8=kv_bytes == 1,
                                         tp=tp, pp=pp, pinned=pinned)


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


def default_page_size(geometry: ModelGeometry, compute_capability: tuple[int, int] | None) -> tuple[int, str]:
    """Page size of the default attention backend (`arg_groups` attention/page-size hooks).

    Hopper: fa3, page 1. Blackwell (sm100): trtllm_mha for MHA models, page 64; MLA uses
    flashinfer, page 1. Ampere/Ada: flashinfer (MHA) or triton (MLA), page 1.
    """
    if compute_capability is not None and compute_capability[0] == 10 and geometry.mla is None:
        return 64, "trtllm_mha backend on Blackwell (page 64)"
    return 1, "default attention backend (page 1)"


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
