"""Everything safe-serve knows about vLLM, one module per question (docs/architecture.md):

- `rules`: the version table, the flags, the length vLLM derives from a config;
- `architectures`: which layers each architecture caches, and which layouts are proven;
- `kv`: KV dtype, block size, layout and capacity, as the KV cache manager counts them;
- `budget`: the memory budget's terms (requested, weights, non-torch, activation, graphs);
- `checks`: what vLLM refuses at start; `planner`: the plan, in named steps;
- `runtime`: command line, retunes and measurements; `logs`: log lines as events;
- `adapter`: the one object the rest of safe-serve meets vLLM through.

This module only re-exports (the planner is imported on first plan, by the adapter).
"""

from launcher.engines.vllm.budget import utilization_for
from launcher.engines.vllm.kv import (
    KV_CACHE_DTYPES,
    block_size,
    in_flight_tokens,
    kv_dtype_bytes,
    layout_for,
)
from launcher.engines.vllm.rules import (
    ALL,
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
    TP_FLAG,
    VllmRules,
    derived_max_model_len,
    max_len_key,
    pinned_flags,
    ranks,
    rules_for,
    uses_v2_runner,
)

__all__ = [
    "ALL", "ALLOW_LONG_ENV", "AS_WRITTEN", "CALIBRATION_KEY_FLAGS", "ENV_KEYS", "FLAGS", "KV_CACHE_DTYPES",
    "MEMORY_FLAGS", "NEWEST", "NOT_MODELLED", "OTHER_FLAGS", "RULES", "TP_FLAG", "VllmRules", "block_size",
    "derived_max_model_len", "in_flight_tokens", "kv_dtype_bytes", "layout_for", "max_len_key", "pinned_flags",
    "ranks", "rules_for", "uses_v2_runner", "utilization_for",
]
