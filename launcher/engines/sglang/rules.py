"""SGLang's rules by version (0.5.1-0.5.23), its flags, and the length it derives from a config.

`RULES` is the version table: each rule set names its first release, states its fields by
keyword and cites the SGLang code it was read from (`source`, paths inside `sglang/srt/`);
docs/engine-versions.md has the derivations, tests/data/sglang_oracle.json SGLang's own output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.engines.flags import FlagSpec, SecretFlag, fraction, parse_pinned, positive_int
from launcher.model.config import ModelGeometry

NEWEST = "0.5.23"
# The flags safe-serve itself sets or suggests, in this engine's spelling (the adapter reads them here).
LENGTH_FLAG = "--context-length"
TP_FLAG = "--tp-size"
PP_FLAG = "--pp-size"
FP8_KV = "fp8_e4m3"
DEFAULT_PORT = 30000  # srt/server_args.py: port: int = 30000
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
    # 0.5.20+: Qwen3-VL on a Hopper card of 60 GiB or more raises the decode bs to a pinned
    # --max-running-requests of at most 512 (arg_groups/model_overrides/qwen3_vl.py:20-62, called
    # from memory_hook.py:194 in 0.5.23, :185 in 0.5.20-0.5.21; absent in 0.5.19).
    hopper_qwen3_vl_bs: bool = False
    source: str = dataclasses.field(default="", compare=False)  # the code of the set's first change


# 0.5.3-0.5.19 (server_args.py `_handle_gpu_memory_settings`; 0.5.19 arg_groups/memory_hook.py:63-130).
_TIERS_OLD: tuple[Tier, ...] = ((20480, 2048, 8, 8), (35840, 2048, 24, 80), (61440, 4096, 32, 160),
                                (92160, 8192, 256, 512), (163840, 8192, 256, 512))
# 0.5.3-0.5.4: 16 instead of 24 on 20-35 GiB cards with tp < 4 (0.5.3 server_args.py:583-586).
_TIERS_053: tuple[Tier, ...] = ((20480, 2048, 8, 8), (35840, 2048, 16, 80)) + _TIERS_OLD[2:]
# 0.5.20+ (arg_groups/memory_hook.py:88-140 in 0.5.21): 4096 / 48 on 20-35 GiB cards.
_TIERS_NEW: tuple[Tier, ...] = ((20480, 2048, 8, 8), (35840, 4096, 48, 160)) + _TIERS_OLD[2:]


def _set(first: str, last: int, previous: SglangRules | None = None, **changes: Any) -> list[SglangRules]:
    """The releases `first` .. x.y.`last`, sized alike: `previous`'s rules with `changes`."""
    major, minor, patch = (int(x) for x in first.split("."))
    base = dataclasses.replace(previous, **changes) if previous is not None else SglangRules(
        version=first, rule_set=first, **changes)
    return [dataclasses.replace(base, version=f"{major}.{minor}.{n}", rule_set=first) for n in range(patch, last + 1)]


def _history(*sets: tuple[str, int, dict[str, Any]]) -> tuple[SglangRules, ...]:
    """The table from its first rule set (every field) and each later set's changes."""
    rows: list[SglangRules] = []
    for first, last, changes in sets:
        rows += _set(first, last, rows[-1] if rows else None, **changes)
    return tuple(rows)


RULES: tuple[SglangRules, ...] = _history(
    ("0.5.1", 2, dict(fraction="table", decode_reserve_when_off=True, tiers=(), top_tier=(16384, 512),
                      prefill_graph="off", fallback_fraction=0.88,
                      source="0.5.2 server_args.py:449-500 (table), :505-530 (chunk, graph bs)")),
    ("0.5.3", 4, dict(fraction="reserve", tiers=_TIERS_053, source="0.5.3 server_args.py:542-683")),
    ("0.5.5", 9, dict(tiers=_TIERS_OLD, source="0.5.9 server_args.py:911-1070")),
    ("0.5.10", 12, dict(prefill_graph="piecewise",
                        source="0.5.10 server_args.py:1141-1330, :1076-1139 (piecewise auto-off)")),
    ("0.5.13", 14, dict(prefill_cap_context=True, source="0.5.13 server_args.py:1444-1640")),
    ("0.5.15", 16, dict(decode_reserve_when_off=False, source="0.5.15 server_args.py:3469-3690")),
    ("0.5.17", 19, dict(prefill_cap_context=False,
                        source="0.5.18 server_args.py:4802-4990; 0.5.19 arg_groups/memory_hook.py:26-270")),
    ("0.5.20", 21, dict(tiers=_TIERS_NEW, prefill_graph="breakable", fallback_fraction=FALLBACK_FRACTION,
                        hopper_qwen3_vl_bs=True,
                        source="0.5.21 arg_groups/memory_hook.py:47-330, :350")),
    ("0.5.22", 23, dict(mrr_shrinks_bs=True,
                        source="0.5.23 arg_groups/memory_hook.py:47-330, :357 reserve_for_graph_mb, "
                               ":417 adjust_mem_fraction_for_vlm")),
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
    FlagSpec("--moe-runner-backend", str),  # gpt-oss's MXFP4 expert layout (budget.py mxfp4_as_loaded)
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
# Quantizing an unquantized checkpoint to fp8 while loading, as an alternative (budget.py `online_quantized`).
ONLINE_QUANTIZATION = (("0.5.1", ("--quantization", "fp8")),)
CALIBRATION_KEY_FLAGS = ("--dtype", "--kv-cache-dtype", "--chunked-prefill-size", "--tp-size", "--pp-size",
                         "--cuda-graph-max-bs-decode", "--disable-cuda-graph", "--max-running-requests",
                         "--quantization",  # online fp8: other weights, other loader leftovers
                         "--moe-runner-backend")  # gpt-oss's MXFP4 experts as the MoE runner holds them
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
AS_WRITTEN: dict[tuple[str, bool | int | float | str], str] = {}


def pinned_flags(engine_args: Sequence[str]) -> dict[str, Any]:
    return parse_pinned(engine_args, FLAGS)


def ranks(pinned: Mapping[str, Any]) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes as pinned."""
    return int(pinned.get(TP_FLAG, 1)), int(pinned.get(PP_FLAG, 1))


# --------------------------------------------------------------------------- the length from the config


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
