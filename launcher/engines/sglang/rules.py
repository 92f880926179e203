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
    # --- KV layouts (architectures.py), SGLang's own code run per release in
    # tests/data/sglang_layouts_versions.json; the defaults are 0.5.21-0.5.23's.
    # 0.5.18+: a multimodal model's 100 MiB embedding cache comes out of the KV budget
    # (0.5.18 mem_cache/kv_cache_configurator.py:130-150, :1785); before, the budget keeps it.
    mm_kv_reserve: bool = True
    # Hybrid SWA pools: "ratio" (0.5.11+, HybridSWAPoolConfigurator: full + ratio x sliding layers per
    # token), "split" (0.5.9-0.5.10: tokens over full + sliding layers, then split by the ratio,
    # model_runner_kv_cache_mixin.py), "off" (0.5.1-0.5.2: every such model is pooled whole) or
    # "unchecked" (0.5.3-0.5.8: split by the loaded model's layers or another formula; planned unverified).
    swa_pool: str = "ratio"
    # 0.5.7-0.5.20: a pipeline stage's full/SWA layer ids run to `end_layer + 1`, one layer of the
    # next stage (0.5.9 model_runner.py:538-551, 0.5.18 layer_setup.py:223-234; 0.5.21 layer_setup.py:167-197).
    swa_stage_extra_layer: bool = False
    # 0.5.17+: a DSA model's fp8 cell is the scaled latent (calculate_mla_kv_cache_dim); before it is
    # kv_lora_rank + rope at one byte (0.5.13 pool_configurator.py:134-161).
    dsa_fp8_scaled_cell: bool = True
    # The state pool of hybrid linear-attention / Mamba models: "padded" (0.5.17+: the ratio split with a
    # padding slot, the fullest stage's share under PP), "ratio" (0.5.9-0.5.16: no padding slot, the
    # whole model's state per slot), "fixed" (0.5.1-0.5.2: --max-running-requests or 512 slots, one per
    # request) or "unchecked" (0.5.3-0.5.8; planned unverified).
    mamba_pool: str = "padded"
    # Two extra state slots per request (extra_buffer) by default: "off" (<= 0.5.13, no_buffer),
    # "without_kimi" (0.5.14-0.5.15), "with_kimi" (0.5.16+).
    mamba_extra_buffer: str = "with_kimi"
    kimi_linear_radix: bool = True  # 0.5.5-0.5.13 turn the radix cache off for Kimi-Linear (one slot per request)
    # <= 0.5.9: max_running_requests from this stage's profiled tokens, before the pipeline minimum
    # and the SWA split (0.5.9 model_runner_kv_cache_mixin.py:364-386; 0.5.10 :828-858 takes them after).
    requests_before_pp_min: bool = False
    # 0.5.22+: data-parallel attention sized (launcher/engines/sglang/planner.py `_attention_dp`): the fraction's
    # max_bs x D x 3 (+1.5 above 300) reserve, the pool's KV heads over T / D, --max-running-requests // D, the
    # attention and embedding over T / D; SGLang's own resolution run on 0.5.22 and 0.5.23 agrees (oracle).
    # Releases before are not read: planned as "not sized by safe-serve yet".
    dp_attention_sized: bool = False
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
                      mm_kv_reserve=False, swa_pool="off", swa_stage_extra_layer=False, dsa_fp8_scaled_cell=False,
                      mamba_pool="fixed", mamba_extra_buffer="off", kimi_linear_radix=False,
                      requests_before_pp_min=True,
                      source="0.5.2 server_args.py:449-500 (table), :505-530 (chunk, graph bs); layouts: "
                             "model_runner.py:1092-1140 (profile), :308-322 (GDN state), :1224-1300 (pool)")),
    ("0.5.3", 4, dict(fraction="reserve", tiers=_TIERS_053, swa_pool="unchecked", mamba_pool="unchecked",
                      source="0.5.3 server_args.py:542-683")),
    ("0.5.5", 6, dict(tiers=_TIERS_OLD, source="0.5.9 server_args.py:911-1070")),
    ("0.5.7", 8, dict(swa_stage_extra_layer=True,
                      source="0.5.7 model_runner.py:472-478, 0.5.8 :506-512 (stage layer ids to end_layer + 1)")),
    ("0.5.9", 9, dict(swa_pool="split", swa_stage_extra_layer=True, mamba_pool="ratio",
                      source="0.5.9 model_runner_kv_cache_mixin.py:116-177 (profile, state), :262-420 "
                             "(SWA split, pool), model_runner.py:538-551 (stage layer ids)")),
    ("0.5.10", 10, dict(prefill_graph="piecewise", requests_before_pp_min=False,
                        source="0.5.10 server_args.py:1141-1330, :1076-1139 (piecewise auto-off); "
                               "model_runner_kv_cache_mixin.py:828-858, :880-884 (requests after the PP minimum)")),
    ("0.5.11", 12, dict(swa_pool="ratio",
                        source="0.5.11 model_executor/pool_configurator.py:184-270 (HybridSWAPoolConfigurator), "
                               "model_runner_kv_cache_mixin.py:730-760")),
    ("0.5.13", 13, dict(prefill_cap_context=True, source="0.5.13 server_args.py:1444-1640")),
    ("0.5.14", 14, dict(mamba_extra_buffer="without_kimi", kimi_linear_radix=True,
                        source="0.5.14 server_args.py:4338-4400 (_handle_mamba_radix_cache: extra_buffer)")),
    ("0.5.15", 15, dict(decode_reserve_when_off=False, source="0.5.15 server_args.py:3469-3690")),
    ("0.5.16", 16, dict(mamba_extra_buffer="with_kimi",
                        source="0.5.16 arg_groups/overrides.py:1128-1145 (_MAMBA_EXTRA_BUFFER_ARCHS)")),
    ("0.5.17", 17, dict(prefill_cap_context=False, dsa_fp8_scaled_cell=True, mamba_pool="padded",
                        source="0.5.18 server_args.py:4802-4990; 0.5.17 pool_configurator.py:199-210, "
                               "mem_cache/kv_cache_configurator.py:1826-1839, :1978")),
    ("0.5.18", 19, dict(mm_kv_reserve=True,
                        source="0.5.18 mem_cache/kv_cache_configurator.py:130-150, :1785; "
                               "0.5.19 arg_groups/memory_hook.py:26-270")),
    ("0.5.20", 20, dict(tiers=_TIERS_NEW, prefill_graph="breakable", fallback_fraction=FALLBACK_FRACTION,
                        hopper_qwen3_vl_bs=True,
                        source="0.5.21 arg_groups/memory_hook.py:47-330, :350")),
    ("0.5.21", 21, dict(swa_stage_extra_layer=False,
                        source="0.5.21 model_runner_components/layer_setup.py:167-197 (owned layers)")),
    ("0.5.22", 23, dict(mrr_shrinks_bs=True, dp_attention_sized=True,
                        source="0.5.23 arg_groups/memory_hook.py:47-330, :357 reserve_for_graph_mb, "
                               ":417 adjust_mem_fraction_for_vlm")),
)


# The first release whose model registry has a class for each hybrid linear-attention / Mamba
# architecture (the `EntryClass` of sglang/srt/models/*.py in each wheel, 0.5.1-0.5.23). Before it,
# SGLang falls back to its Transformers backend, which keeps no state, or cannot load the model: the
# plan refuses, as for the architectures no release has a class for (architectures.NO_SGLANG_CLASS).
STATE_MODEL_CLASSES: tuple[tuple[str, str, str], ...] = (
    ("Qwen3NextForCausalLM", "0.5.2", "models/qwen3_next.py"),
    ("FalconH1ForCausalLM", "0.5.3", "models/falcon_h1.py"),
    ("NemotronHForCausalLM", "0.5.4", "models/nemotron_h.py"),
    ("KimiLinearForCausalLM", "0.5.5", "models/kimi_linear.py"),
    ("GraniteMoeHybridForCausalLM", "0.5.9", "models/granitemoehybrid.py"),
    ("Lfm2ForCausalLM", "0.5.9", "models/lfm2.py"),
    ("Qwen3_5ForConditionalGeneration", "0.5.9", "models/qwen3_5.py"),
    ("Qwen3_5MoeForConditionalGeneration", "0.5.9", "models/qwen3_5.py"),
    ("Qwen3_5ForCausalLM", "0.5.17", "models/qwen3_5_text.py"),
    ("Qwen3_5MoeForCausalLM", "0.5.17", "models/qwen3_5_text.py"),
    ("MambaForCausalLM", "0.5.20", "models/mamba.py"),
    ("FalconMambaForCausalLM", "0.5.20", "models/falcon_mamba.py"),
)
# Configs a release cannot read, as its own ModelConfig run showed (tests/data/sglang_layouts_versions.json):
# (model_type, first release that fails, last release that fails, SGLang's words; a wrapper's text config
# `<model_type>_text` too). The model types are
# those of the pinned transformers (0.5.1-0.5.2 4.55/4.56, 0.5.3-0.5.9 4.57, 0.5.13-0.5.14 5.8.1,
# 0.5.15-0.5.21 5.12.1, 0.5.22+ 5.19.0); ranges end at the last release checked to fail.
UNREADABLE_CONFIGS: tuple[tuple[str, str, str, str], ...] = (
    ("minicpm3", "0.5.1", "0.5.21", "Transformers does not recognize this architecture (model type `minicpm3`)"),
    ("dbrx", "0.5.13", "0.5.21", "transformers' DbrxConfig refuses an integer moe_jitter_eps (strict dataclass "
                                 "validation: expected float, got int)"),
    ("kimi_k2", "0.5.1", "0.5.9", "Transformers does not recognize this architecture (model type `kimi_k2`)"),
    ("minimax_m2", "0.5.1", "0.5.9", "Transformers does not recognize this architecture (model type `minimax_m2`)"),
    ("gemma4", "0.5.1", "0.5.9", "Transformers does not recognize this architecture (model type `gemma4`)"),
    ("deepseek_v32", "0.5.1", "0.5.2", "Transformers does not recognize this architecture (model type "
                                       "`deepseek_v32`)"),
    ("olmo3", "0.5.1", "0.5.2", "Transformers does not recognize this architecture (model type `olmo3`)"),
    ("qwen3_vl", "0.5.1", "0.5.2", "Transformers does not recognize this architecture (model type `qwen3_vl`)"),
    ("qwen3_vl_moe", "0.5.1", "0.5.2", "Transformers does not recognize this architecture (model type "
                                       "`qwen3_vl_moe`)"),
    ("qwen3_5", "0.5.1", "0.5.2", "Transformers does not recognize this architecture (model type `qwen3_5`)"),
    ("qwen3_5_moe", "0.5.1", "0.5.2", "Transformers does not recognize this architecture (model type "
                                      "`qwen3_5_moe`)"),
    ("nemotron_h", "0.5.1", "0.5.2", "Transformers does not recognize this architecture (model type `nemotron_h`)"),
    ("kimi_linear", "0.5.1", "0.5.2", "Transformers does not recognize this architecture (model type "
                                      "`kimi_linear`)"),
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
    # Data-parallel attention and expert parallelism (data_parallel below): not sized yet, said so.
    FlagSpec("--attn-dp-size", positive_int, aliases=("--attention-data-parallel-size",)),
    FlagSpec("--ep-size", positive_int, aliases=("--expert-parallel-size",)),
    FlagSpec("--moe-a2a-backend", str),
    FlagSpec("--ep-num-redundant-experts", int),
    FlagSpec("--enable-dp-lm-head", None),  # the lm_head over T / D under attention DP: not sized
    FlagSpec("--moe-dense-tp-size", positive_int),  # dense MLPs replicated under attention DP: not sized
    FlagSpec("--attn-cp-size", positive_int, aliases=("--attention-context-parallel-size",)),  # not sized
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
    FlagSpec("--attention-backend", str),  # some releases refuse a model without it (checks.py)
    FlagSpec("--nnodes", positive_int),
    FlagSpec("--node-rank", int),  # a worker node: no HTTP server, no KV summary line (worker_node)
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
                         "--attn-dp-size", "--enable-dp-attention", "--dp-size",  # attention over T / D
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


def gpus_on_node(pinned: Mapping[str, Any]) -> int:
    """The GPUs this node's ranks take (the start lock covers them): tensor x pipeline ranks, for each
    data-parallel replica."""
    tp, pp = ranks(pinned)
    return tp * pp * data_parallel(pinned)[0]


DP_ATTENTION_FLAG, ATTN_DP_FLAG = "--enable-dp-attention", "--attn-dp-size"


def worker_node(pinned: Mapping[str, Any]) -> bool:
    """A node after the first of a multi-node launch (`--node-rank` >= 1) runs its schedulers but no HTTP server,
    and its ranks log their pool ("KV Cache is allocated") but not the summary line global TP rank 0 logs
    (0.5.23 entrypoints/engine.py: the HTTP server on node 0 only; managers/scheduler.py:1264-1270)."""
    return int(pinned.get("--node-rank") or 0) > 0


def data_parallel(pinned: Mapping[str, Any]) -> tuple[int, int]:
    """(replicas, attention-DP groups) as SGLang resolves `--dp-size`: with `--enable-dp-attention` the D groups
    split one TP group's attention (no more GPUs; 0.5.23 rewrites it to `--attn-dp-size D`,
    arg_groups/parallel_hook.py:39-61), else D replicas of the whole TP x PP group, each its own engine on the
    next T x PP GPUs (managers/data_parallel_controller.py:420-467, :746-752 in 0.5.23; :222-270 in 0.5.9)."""
    dp = int(pinned.get("--dp-size", 1))
    if pinned.get(DP_ATTENTION_FLAG) and dp > 1 and ATTN_DP_FLAG not in pinned:
        return 1, dp
    # Both spellings: --dp-size stays replicas beside --attn-dp-size (parallel_hook.py:39-61 rewrites only
    # without it), which SGLang then refuses (:287-292).
    return dp, int(pinned.get(ATTN_DP_FLAG, 1))


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


# The quantization methods SGLang registers on CUDA, per release run (layers/quantization/__init__.py:
# BASE_QUANTIZATION_METHODS with its is_cuda() updates, and 0.5.2's VLLM_QUANTIZATION_METHODS, read from each
# wheel): `ModelConfig._verify_quantization` refuses a method outside it ("Unknown quantization method: X.
# Must be one of [...]", configs/model_config.py:2151-2155 in 0.5.23). A release between two of these is
# taken to register what either of them does (checks.py refuses only what both lack).
QUANTIZATION_REGISTRY: Mapping[str, frozenset[str]] = {
    "0.5.2": frozenset({
        "aqlm", "awq", "awq_marlin", "bitsandbytes", "blockwise_int8", "compressed-tensors", "deepspeedfp",
        "experts_int8", "fbgemm_fp8", "fp8", "gguf", "gptq", "gptq_marlin", "gptq_marlin_24", "marlin",
        "modelopt", "modelopt_fp4", "moe_wna16", "mxfp4", "petit_nvfp4", "qoq", "qqq", "quark", "tpu_int8",
        "w4afp8", "w8a8_fp8", "w8a8_int8"
    }),
    "0.5.9": frozenset({
        "auto-round", "awq", "awq_marlin", "bitsandbytes", "blockwise_int8", "compressed-tensors", "fbgemm_fp8",
        "fp8", "gguf", "gptq", "gptq_marlin", "modelopt", "modelopt_fp4", "modelopt_fp8", "modelslim",
        "moe_wna16", "mxfp4", "mxfp8", "petit_nvfp4", "qoq", "quark", "quark_int4fp8_moe", "w4afp8", "w8a8_fp8",
        "w8a8_int8"
    }),
    "0.5.13": frozenset({
        "auto-round", "awq", "awq_marlin", "bitsandbytes", "blockwise_int8", "compressed-tensors", "fbgemm_fp8",
        "fp8", "gguf", "gptq", "gptq_marlin", "modelopt", "modelopt_fp4", "modelopt_fp8", "modelopt_mixed",
        "modelslim", "moe_wna16", "mxfp4", "mxfp8", "petit_nvfp4", "qoq", "quark", "quark_int4fp8_moe",
        "quark_mxfp4", "w4afp8", "w8a8_fp8", "w8a8_int8"
    }),
    "0.5.18": frozenset({
        "auto-round", "auto-round-int8", "awq", "awq_marlin", "bitsandbytes", "blockwise_int8",
        "compressed-tensors", "fp8", "gguf", "gptq", "gptq_marlin", "humming", "modelopt", "modelopt_fp4",
        "modelopt_fp8", "modelopt_mixed", "modelslim", "moe_wna16", "mxfp4", "mxfp8", "mxfp_w4a8",
        "nvfp4_online", "petit_nvfp4", "quark", "quark_int4fp8_moe", "quark_mxfp4", "w4afp8", "w8a8_fp8",
        "w8a8_int8"
    }),
    "0.5.21": frozenset({
        "auto-round", "auto-round-int8", "awq", "awq_marlin", "bitsandbytes", "blockwise_int8",
        "compressed-tensors", "fp8", "gguf", "gptq_marlin", "humming", "modelopt", "modelopt_fp4",
        "modelopt_fp8", "modelopt_mixed", "modelslim", "moe_wna16", "mxfp4", "mxfp8", "mxfp_w4a8",
        "nvfp4_online", "petit_nvfp4", "quark", "quark_int4fp8_moe", "quark_mxfp4", "w4afp8", "w8a8_fp8",
        "w8a8_int8"
    }),
    "0.5.23": frozenset({
        "auto-round", "auto-round-int8", "awq", "awq_marlin", "bitsandbytes", "blockwise_int8",
        "compressed-tensors", "fp8", "gguf", "gptq_marlin", "humming", "minimax_m3_nvfp4", "modelopt",
        "modelopt_fp4", "modelopt_fp8", "modelopt_mixed", "modelslim", "moe_wna16", "mxfp4", "mxfp8",
        "mxfp_w4a8", "nvfp4_online", "petit_nvfp4", "quark", "quark_int4fp8_moe", "quark_mxfp4", "w4afp8",
        "w8a8_fp8", "w8a8_int8"
    }),
}
