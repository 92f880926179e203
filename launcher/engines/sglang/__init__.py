"""Everything safe-serve knows about SGLang, one module per question (docs/architecture.md):

- `rules`: the version table, the flags, the context length SGLang derives from a config;
- `architectures`: which layers each architecture caches (hybrid SWA), which layouts are proven;
- `kv`: KV dtype, cell size per token and page size of the pool;
- `budget`: the default `--mem-fraction-static` and the pool it leaves;
- `checks`: what SGLang refuses at start; `planner`: the plan, in named steps;
- `runtime`: command line, retunes and measurements; `logs`: log lines as events;
- `adapter`: the one object the rest of safe-serve meets SGLang through.

This module only re-exports (the planner is imported on first plan, by the adapter).
"""

from launcher.engines.sglang.architectures import (
    UNVERIFIED_KV_ERROR_FRACTION,
    architecture_status,
    is_hybrid_swa,
    stage_layers,
)
from launcher.engines.sglang.budget import (
    CONTEXT_ERROR_BYTES,
    CUDA_CONTEXT_BYTES,
    MULTIMODAL_RESERVE_BYTES,
    NCCL_BYTES,
    NVLS_NCCL_BYTES,
    FractionDerivation,
    default_fraction,
    pool_tokens,
    prefill_graph_buckets,
    tier_defaults,
)
from launcher.engines.sglang.kv import (
    KV_CACHE_DTYPES,
    cell_size_bytes,
    default_page_size,
    kv_dtype_bytes,
)
from launcher.engines.sglang.rules import (
    ALLOW_LONG_ENV,
    AS_WRITTEN,
    CALIBRATION_KEY_FLAGS,
    ENV_KEYS,
    FLAGS,
    MEMORY_FLAGS,
    NEWEST,
    NOT_MODELLED,
    OTHER_FLAGS,
    RULES,
    STATE_MODEL_CLASSES,
    TP_FLAG,
    SglangRules,
    derived_context_length,
    pinned_flags,
    ranks,
    rules_for,
)

__all__ = [
    "ALLOW_LONG_ENV", "AS_WRITTEN", "CALIBRATION_KEY_FLAGS", "CONTEXT_ERROR_BYTES", "CUDA_CONTEXT_BYTES",
    "ENV_KEYS", "FLAGS", "KV_CACHE_DTYPES",
    "MEMORY_FLAGS", "MULTIMODAL_RESERVE_BYTES", "NCCL_BYTES", "NVLS_NCCL_BYTES",
    "NEWEST", "NOT_MODELLED", "OTHER_FLAGS", "STATE_MODEL_CLASSES", "RULES", "TP_FLAG", "UNVERIFIED_KV_ERROR_FRACTION",
    "FractionDerivation", "SglangRules", "architecture_status", "cell_size_bytes",
    "default_fraction", "default_page_size", "derived_context_length", "is_hybrid_swa", "kv_dtype_bytes",
    "pinned_flags", "pool_tokens", "prefill_graph_buckets", "ranks", "rules_for",
    "stage_layers", "tier_defaults",
]
