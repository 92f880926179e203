"""How SGLang 0.5.23 lays out each architecture's KV pool, and which layouts are proven.

`layout` reads a parsed config the way SGLang's `ModelConfig` does
(`srt/configs/model_config.py`): MHA or MLA by class name, KV heads and head sizes, the
layers of the full pool, the sliding-window layers of a hybrid SWA pool, and the
per-request state of hybrid linear-attention / Mamba models from SGLang's own config
classes (`srt/configs/<family>.py`, `mamba2_cache_params`). `cell_size_bytes` is what the
pool configurator divides the budget by (`model_executor/pool_configurator.py`), and
`state_slot_bytes` what one state slot takes (`configs/mamba_utils.py:116-125`).

`VERIFIED` is the table of architectures whose layout equals SGLang's own code on every
case of tests/data/sglang_layouts.json (tests/oracles/sglang_layouts.py runs SGLang's
ModelConfig, pool configurators and KVCacheConfigurator without a GPU);
tests/engines/sglang/test_architectures.py replays them. Paths are inside the sglang 0.5.23 wheel.
Older releases lay some pools out otherwise: the `SglangRules` layout fields (rules.py) say how, and
tests/engines/sglang/test_layouts_versions.py replays 0.5.2, 0.5.9, 0.5.13, 0.5.18 and 0.5.21's own
code (tests/data/sglang_layouts_versions.json) through the functions here with each release's rules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.common.errors import UnsupportedModel
from launcher.engines.layers import LayerPattern
from launcher.engines.layers import cached_layers as _bind
from launcher.engines.sglang.rules import RULES, STATE_MODEL_CLASSES, UNREADABLE_CONFIGS, SglangRules
from launcher.engines.versions import version_key, within
from launcher.model.config import MlaDims, ModelGeometry, kv_heads_per_rank, refuse_unsupported

ENGINE_VERSION = "0.5.23"
GOLDEN = "tests/data/sglang_layouts.json"

# `ModelConfig._derive_model_shapes` (configs/model_config.py:1371-1503): MLA by class name only.
MLA_ARCHITECTURES = frozenset({
    "DeepseekV2ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV3ForCausalLMNextN",
    "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM", "Glm5NextForConditionalGeneration", "LongcatFlashForCausalLM",
    "HYV4ForCausalLM", "DotsVLMForCausalLM", "Dots3NoteForCausalLM", "MistralLarge3ForCausalLM",
    "KimiK25ForConditionalGeneration", "GigaChat35ForCausalLM", "MiniCPM3ForCausalLM", "DeepseekVL2ForCausalLM",
    "KimiVLForConditionalGeneration", "KimiLinearForCausalLM", "BailingMoeV2_5ForCausalLM",
    "BailingMoeV3ForCausalLM", "SarvamMLAForCausalLM",
})
# `is_deepseek_dsa` (configs/model_config.py:191-210): these with `index_topk` add an FP8 index-K cache.
DSA_ARCHITECTURES = frozenset({
    "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "MistralLarge3ForCausalLM", "GlmMoeDsaForCausalLM",
    "Glm5NextForConditionalGeneration", "LongcatFlashForCausalLM", "Dots3NoteForCausalLM", "HYV4ForCausalLM",
})
DSA_QUANT_BLOCK = 128  # DSATokenToKVPool.quant_block_size (mem_cache/memory_pool.py:5280)

# `is_hybrid_swa_model` (configs/model_config.py:2651-2700) with the layer split of
# `get_hybrid_layer_ids`: Llama 4 every 4th layer full, the rest by `layer_types`.
SWA_BY_LAYER_TYPES = frozenset({
    "GptOssForCausalLM", "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "LagunaForCausalLM",
    "MellumForCausalLM", "Step3p5ForCausalLM", "Step3p7ForConditionalGeneration",
})
SWA_EVERY_FOURTH_FULL = frozenset({"Llama4ForConditionalGeneration"})

# Hybrid state models: SGLang's config class, its full-attention layers and its state shape.
QWEN3_NEXT_FAMILY = frozenset({"Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
                               "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"})
# `_MAMBA_RADIX_CACHE_ARCHS` with extra-buffer support on the triton linear-attention backend
# (arg_groups/overrides.py:369-450): two tracking slots per request beside the base three.
EXTRA_BUFFER_ARCHITECTURES = QWEN3_NEXT_FAMILY | {"NemotronHForCausalLM", "FalconH1ForCausalLM",
                                                  "GraniteMoeHybridForCausalLM", "KimiLinearForCausalLM"}
# Pure state-space models: no attention at all (ModelConfig PURE_SSM_ARCHITECTURES, head_dim 0).
PURE_SSM = frozenset({"MambaForCausalLM", "FalconMambaForCausalLM"})
MAMBA_BASE_SLOTS = 3  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO (mem_cache/kv_cache_configurator.py:228)
DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9  # arg_groups/fields/schedule.py:220-227 (fallback)
UNVERIFIED_KV_ERROR_FRACTION = 0.33  # as for vLLM: a layout not proven may be off as a whole
_STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class StateLayout:
    """One request's state per linear/Mamba layer (`Mamba2StateShape.create`, configs/mamba_utils.py:195-245)."""

    config_class: str
    layers: tuple[int, ...]
    intermediate_size: int
    n_groups: int
    num_heads: int
    head_dim: int
    state_size: int
    conv_kernel: int
    heads_follow_tp: bool = True  # LFM2 passes num_heads = tp (one conv per rank, no SSM state)
    ssm_dtype: str = "float32"  # mamba2_state_dtype: default, else config mamba_ssm_dtype
    # "mamba2" (Mamba2StateShape.create), "full_rank" (Mamba-1: create_full_rank, mamba_utils.py:247-290)
    # or "kda" (Kimi Delta Attention: KimiLinearStateShape.create, q/k/v short convs and a D x D state).
    kind: str = "mamba2"


@dataclass(frozen=True)
class SglangLayout:
    """What SGLang's pool holds per token and per request for one architecture."""

    attention: str  # "MHA" or "MLA"
    num_kv_heads: int  # all ranks together (MLA: unused)
    head_dim: int
    v_head_dim: int
    num_layers: int
    full_layers: tuple[int, ...]  # layers in the full pool
    swa_layers: tuple[int, ...] = ()  # hybrid SWA: layers in the sliding-window pool
    mla_rank: int = 0  # kv_lora_rank
    mla_rope: int = 0  # qk_rope_head_dim
    dsa_index_head_dim: int | None = None
    dsa_index_kpool: int = 1
    state: StateLayout | None = None
    swa_kv_heads: int | None = None  # sliding layers' own shape (swa_num_key_value_heads, swa_head_dim)
    swa_head_dim: int | None = None


def layout(geometry: ModelGeometry, rules: SglangRules | None = None) -> SglangLayout:
    """SGLang's layout for this config; `UnsupportedModel` with SGLang's words where its config class refuses,
    or where the release (`rules`, default the newest) cannot read the config or has no class for the model."""
    rules = rules or RULES[-1]
    _refuse_unreadable(geometry, rules)
    geometry = cached_layers(geometry)
    state = _state_layout(geometry)
    if state is None:
        refuse_unsupported(geometry)  # a state model of a family whose SGLang state is not modelled
    else:
        _refuse_without_class(geometry, rules)
    full, swa = _pool_layers(geometry, state)
    if geometry.architecture in MLA_ARCHITECTURES and geometry.mla is not None:
        return _mla_layout(geometry, geometry.mla, full, swa, state)
    return _mha_layout(geometry, full, swa, state)


def _pool_layers(geometry: ModelGeometry, state: StateLayout | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(full-pool layers, sliding-window-pool layers) as `get_hybrid_layer_ids` splits them."""
    arch, n = geometry.architecture, geometry.num_layers
    if arch in SWA_EVERY_FOURTH_FULL:
        return tuple(i for i in range(n) if (i + 1) % 4 == 0), tuple(i for i in range(n) if (i + 1) % 4 != 0)
    if arch in SWA_BY_LAYER_TYPES:
        types = _layer_types(geometry.text_config, n)
        return (tuple(i for i, t in enumerate(types) if t == "full_attention"),
                tuple(i for i, t in enumerate(types) if t == "sliding_attention"))
    return (_state_full_layers(geometry) if state is not None else tuple(range(n))), ()


def _mla_layout(geometry: ModelGeometry, mla: MlaDims, full: tuple[int, ...], swa: tuple[int, ...],
                state: StateLayout | None) -> SglangLayout:
    text = geometry.text_config
    index_dim = text.get("index_head_dim") if is_dsa(geometry) else None
    kpool = text.get("index_kpool", 1)
    return SglangLayout(attention="MLA", num_kv_heads=1, head_dim=geometry.head_dim,
                        v_head_dim=mla.v_head_dim, num_layers=geometry.num_layers, full_layers=full,
                        swa_layers=swa, mla_rank=mla.kv_lora_rank, mla_rope=mla.qk_rope_head_dim,
                        dsa_index_head_dim=index_dim if isinstance(index_dim, int) else None,
                        dsa_index_kpool=kpool if isinstance(kpool, int) and kpool > 0 else 1, state=state)


def _mha_layout(geometry: ModelGeometry, full: tuple[int, ...], swa: tuple[int, ...],
                state: StateLayout | None) -> SglangLayout:
    """Plain K/V of head_dim per layer (a config with kv_lora_rank outside the MLA list included)."""
    text, n = geometry.text_config, geometry.num_layers
    head = _int(text, "head_dim") or geometry.head_dim
    v_head = _int(text, "v_head_dim") or head
    if geometry.architecture in GEMMA4:
        full_head, full_kv = _gemma4_full_shape(text, head, geometry.num_kv_heads, full)
        return SglangLayout(attention="MHA", num_kv_heads=full_kv, head_dim=full_head, v_head_dim=full_head,
                            num_layers=n, full_layers=full, swa_layers=swa, state=state,
                            swa_kv_heads=geometry.num_kv_heads, swa_head_dim=head)
    return SglangLayout(attention="MHA", num_kv_heads=geometry.num_kv_heads, head_dim=head, v_head_dim=v_head,
                        num_layers=n, full_layers=full, swa_layers=swa, state=state)


GEMMA4 = frozenset({"Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"})


def _gemma4_full_shape(text: Mapping[str, Any], head: int, kv_heads: int,
                       full: tuple[int, ...]) -> tuple[int, int]:
    """(head_dim, KV heads) of Gemma 4's full-attention layers as SGLang flattens them
    (utils/hf_transformers/config.py:117-143): the per_layer_config override of a full layer, or
    what transformers builds it from (configuration_gemma4.py:210-223: global_head_dim, default 512)."""
    per_layer = text.get("per_layer_config")
    if isinstance(per_layer, Mapping) and full:
        overrides = per_layer.get(f"{full[0]:02d}", per_layer.get(str(full[0]), {}))
        overrides = overrides if isinstance(overrides, Mapping) else {}
        return _int(overrides, "head_dim", head) or head, _int(overrides, "num_key_value_heads", kv_heads) or kv_heads
    global_kv = _int(text, "num_global_key_value_heads")
    return _int(text, "global_head_dim", 512) or 512, global_kv if global_kv and text.get("attention_k_eq_v") \
        else kv_heads


# Hybrid state models SGLang 0.5.23 has no model class for (no srt/models entry): its Transformers
# fallback sizes every layer as attention and keeps no state. Refused, as the generic rule does.
NO_SGLANG_CLASS = frozenset({"JambaForCausalLM", "Zamba2ForCausalLM", "BambaForCausalLM"})


def _refuse_unreadable(geometry: ModelGeometry, rules: SglangRules) -> None:
    """A config the release's own ModelConfig cannot read (its pinned transformers), as it fails
    (`UNREADABLE_CONFIGS`); a checkpoint with remote code (auto_map) brings its own class."""
    if "auto_map" in geometry.text_config:
        return
    for model_type, first, last, words in UNREADABLE_CONFIGS:
        if model_type == "dbrx" and not _integer_jitter_eps(geometry.text_config):
            continue
        if geometry.model_type in (model_type, f"{model_type}_text") and within(rules.version, first, last):
            raise UnsupportedModel(f"SGLang {rules.version} cannot read this config.json: {words} "
                                   f"[tests/data/sglang_layouts_versions.json]",
                                   hint=f"SGLang {_after(last)} or later, or --engine vllm")


def _integer_jitter_eps(config: Mapping[str, Any]) -> bool:
    """DbrxConfig's strict validation (transformers 5.12.1) refuses only an integer moe_jitter_eps: a float, a
    null or none at all is read."""
    ffn = config.get("ffn_config")
    value = ffn.get("moe_jitter_eps") if isinstance(ffn, Mapping) else None
    return isinstance(value, int) and not isinstance(value, bool)


def _after(version: str) -> str:
    major, minor, patch = version.split(".")
    return f"{major}.{minor}.{int(patch) + 1}"


def _refuse_without_class(geometry: ModelGeometry, rules: SglangRules) -> None:
    """A hybrid state architecture the release has no model class for (`STATE_MODEL_CLASSES`)."""
    for architecture, first, where in STATE_MODEL_CLASSES:
        if geometry.architecture == architecture and version_key(rules.version) < version_key(first):
            raise UnsupportedModel(
                f"SGLang {rules.version} has no model class for {architecture} (sglang/srt/{where} arrives in "
                f"{first}): its Transformers fallback keeps no linear-attention/Mamba state",
                hint=f"SGLang {first} or later, or --engine vllm")


def is_hybrid_swa(lay: SglangLayout, pinned: Mapping[str, Any], rules: SglangRules | None = None) -> bool:
    """Whether the sliding layers get their own pool: not with --disable-hybrid-swa-memory, nor in
    0.5.1-0.5.2, which turn hybrid SWA memory off for every such model (`swa_pool` "off")."""
    if rules is not None and rules.swa_pool == "off":
        return False
    return bool(lay.swa_layers) and not pinned.get("--disable-hybrid-swa-memory", False)


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """`get_pp_indices`: layers per pipeline stage, the remainder to the last stages (13 + 14 for 27 on 2)."""
    base, extra = divmod(num_layers, pp)
    sizes = [base + (1 if rank >= pp - extra else 0) for rank in range(pp)]
    starts = [sum(sizes[:rank]) for rank in range(pp)]
    return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def _mla_dim(lay: SglangLayout, kv_fp8: bool, scaled: bool = True) -> int:
    """`calculate_mla_kv_cache_dim` (mem_cache/kv_cache_configurator.py:3418-3475), CUDA default backends;
    before 0.5.17 the cell counts kv_lora_rank + rope even for DSA's fp8 layout (`dsa_fp8_scaled_cell`)."""
    if lay.dsa_index_head_dim is not None and kv_fp8 and scaled:
        return lay.mla_rank + lay.mla_rank // DSA_QUANT_BLOCK * 4 + lay.mla_rope * 2  # bf16 rope
    return lay.mla_rank + lay.mla_rope


def _dsa_index_bytes(lay: SglangLayout) -> int:
    """`_compute_dsa_indexer_cell_size` (pool_configurator.py:560-635): uint8 index K + scales per layer."""
    if lay.dsa_index_head_dim is None:
        return 0
    dim = lay.dsa_index_head_dim
    return -(-(dim + dim // DSA_QUANT_BLOCK * 4) // lay.dsa_index_kpool)


def cell_size_bytes(lay: SglangLayout, *, kv_bytes: int, kv_fp8: bool, tp: int, pp: int,
                    pinned: Mapping[str, Any] | None = None, rules: SglangRules | None = None) -> float:
    """Bytes per token of `max_total_num_tokens` on the fullest pipeline stage.

    DefaultPoolConfigurator (pool_configurator.py:340-535) for a plain or state-hybrid
    pool, HybridSWAPoolConfigurator._recompute_cell_size (:786-803) for a hybrid SWA one:
    full layers plus `--swa-full-tokens-ratio` x the sliding layers (a float). In 0.5.9-0.5.10
    (`swa_pool` "split") the pool is profiled over full + sliding layers and split afterwards.
    """
    return max(stage_cells(lay, kv_bytes=kv_bytes, kv_fp8=kv_fp8, tp=tp, pp=pp, pinned=pinned, rules=rules),
               key=lambda cell: cell.total).total


@dataclass(frozen=True)
class StageCell:
    """One pipeline stage's bytes per token: all of it, and its full- and sliding-layer parts."""

    total: float
    full_part: float = 0.0
    swa_part: float = 0.0  # the sliding layers at one token each (no ratio)

    def split_full(self, tokens: int, ratio: float) -> int:
        """0.5.9-0.5.10's full pool from the tokens profiled over both layer kinds: the same bytes at
        `ratio` sliding tokens a full one, before the page floor (0.5.9 model_runner_kv_cache_mixin.py:312-325)."""
        return int(tokens * (self.full_part + self.swa_part) / (self.full_part + ratio * self.swa_part))

    def split_total(self, full: int, ratio: float) -> int:
        """The tokens over both layer kinds whose split is a full pool of about `full` (split_full's inverse)."""
        return int(full * (self.full_part + ratio * self.swa_part) / (self.full_part + self.swa_part))


def stage_cells(lay: SglangLayout, *, kv_bytes: int, kv_fp8: bool, tp: int, pp: int,
                pinned: Mapping[str, Any] | None = None, rules: SglangRules | None = None) -> list[StageCell]:
    """`cell_size_bytes` of every pipeline stage, in stage order."""
    pinned, rules = pinned or {}, rules or RULES[-1]
    hybrid = is_hybrid_swa(lay, pinned, rules)
    ratio = float(pinned.get("--swa-full-tokens-ratio", 0.8)) if rules.swa_pool != "split" else 1.0
    cells = []
    for stage in stage_layers(lay.num_layers, pp):
        if hybrid:
            # 0.5.7-0.5.20 take a stage's full/SWA layer ids up to end_layer + 1 (`swa_stage_extra_layer`).
            ids = range(stage.start, stage.stop + 1) if rules.swa_stage_extra_layer else stage
            full = sum(1 for i in lay.full_layers if i in ids)
            sliding = sum(1 for i in lay.swa_layers if i in ids)
        else:
            full = sum(1 for i in (lay.full_layers + lay.swa_layers) if i in stage)
            sliding = 0
        if lay.attention == "MLA":
            per_layer = _mla_dim(lay, kv_fp8, rules.dsa_fp8_scaled_cell) * kv_bytes
            cell = float(per_layer * full + _dsa_index_bytes(lay) * full)
            cells.append(StageCell(cell, cell))
            continue
        per_layer = kv_heads_per_rank(lay.num_kv_heads, tp) * (lay.head_dim + lay.v_head_dim) * kv_bytes
        swa_layer = per_layer if lay.swa_head_dim is None else \
            kv_heads_per_rank(lay.swa_kv_heads or lay.num_kv_heads, tp) * 2 * lay.swa_head_dim * kv_bytes
        if not hybrid and lay.swa_head_dim is not None:  # one pool of the full shape (swa-off)
            swa_layer = per_layer
        cell = per_layer * full + (ratio * swa_layer * sliding if sliding else 0.0)
        if hybrid and full == 0:
            cell = float(swa_layer * sliding)  # all-SWA: no ratio (:787-795)
        cells.append(StageCell(float(cell), float(per_layer * full), float(swa_layer * sliding)))
    return cells


# `ModelConfig.__init__` (configs/model_config.py:690-717): multimodal is off for these unless
# --enable-multimodal; SGLang then serves the text backbone only (no VLM fraction, no VLM reserve).
MULTIMODAL_OFF_BY_DEFAULT = frozenset({"Gemma3ForConditionalGeneration", "Llama4ForConditionalGeneration",
                                       "Step3VLForConditionalGeneration", "InklingForConditionalGeneration"})
# transformers 5 nests these text configs' rope parameters by layer type, so get_context_length's
# `rope_scaling.get("factor", 1)` reads 1 (utils/hf_transformers/common.py:677-694; golden gemma-3-12b-it).
ROPE_BY_LAYER_TYPE = frozenset({"gemma3", "gemma3_text", "gemma3n", "gemma3n_text"})


def multimodal(geometry: ModelGeometry, pinned: Mapping[str, Any]) -> bool:
    """Whether SGLang runs this wrapper as multimodal (its vision tower, VLM fraction and reserve)."""
    if not geometry.is_multimodal or pinned.get("--language-only", False):
        return False
    if geometry.architecture in MULTIMODAL_OFF_BY_DEFAULT:
        return bool(pinned.get("--enable-multimodal", False))
    return True


def rope_factor_applies(geometry: ModelGeometry) -> bool:
    return geometry.model_type not in ROPE_BY_LAYER_TYPE


def is_dsa(geometry: ModelGeometry) -> bool:
    return geometry.architecture in DSA_ARCHITECTURES and geometry.text_config.get("index_topk") is not None


def dsa_page_size(geometry: ModelGeometry) -> int | None:
    """arg_groups/model_overrides/deepseek_v2.py:161-173: DSA pages hold 64 x index_kpool tokens (CUDA)."""
    if not is_dsa(geometry):
        return None
    kpool = geometry.text_config.get("index_kpool", 1)
    return 64 * (kpool if isinstance(kpool, int) and kpool > 0 else 1)


# --------------------------------------------------------------------------- hybrid state models


def _int(cfg: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = cfg.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _layer_types(text: Mapping[str, Any], n: int) -> list[str]:
    types = text.get("layer_types")
    return [str(t) for t in types] if isinstance(types, list) and len(types) == n else []


def _state_full_layers(geometry: ModelGeometry) -> tuple[int, ...]:
    """`full_attention_layer_ids` of SGLang's config class for a state-hybrid model."""
    rule = _STATE_FULL_LAYERS.get(geometry.architecture)
    return rule(geometry.text_config, geometry.num_layers) if rule else tuple(range(geometry.num_layers))


def _qwen3_next_full_layers(text: Mapping[str, Any], n: int) -> tuple[int, ...]:
    """configs/qwen3_next.py:260-286: layer_types, else every full_attention_interval-th layer."""
    types = _layer_types(text, n)
    if types:
        return tuple(i for i, t in enumerate(types) if t == "full_attention")
    interval = _int(text, "full_attention_interval", 4) or 4
    return tuple(i for i in range(n) if (i + 1) % interval == 0)


def _nemotron_full_layers(text: Mapping[str, Any], n: int) -> tuple[int, ...]:
    """configs/nemotron_h.py:409-423: '*' in hybrid_override_pattern is attention."""
    pattern = str(text.get("hybrid_override_pattern", ""))
    return tuple(i for i in range(min(n, len(pattern))) if pattern[i] == "*")


def _typed_full_layers(kind: str) -> Callable[[Mapping[str, Any], int], tuple[int, ...]]:
    """The layers whose `layer_types` entry is `kind`."""
    def full_layers(text: Mapping[str, Any], n: int) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(_layer_types(text, n)) if t == kind)
    return full_layers


def _kimi_full_layers(text: Mapping[str, Any], n: int) -> tuple[int, ...]:
    """configs/kimi_linear.py:158-171: every layer not in kda_layers (1-based)."""
    kda = set(_kimi_kda_layers(text))
    return tuple(i for i in range(n) if i not in kda)


def _no_full_layers(text: Mapping[str, Any], n: int) -> tuple[int, ...]:
    return ()


_STATE_FULL_LAYERS: Mapping[str, Callable[[Mapping[str, Any], int], tuple[int, ...]]] = {
    **dict.fromkeys(QWEN3_NEXT_FAMILY, _qwen3_next_full_layers),
    "NemotronHForCausalLM": _nemotron_full_layers,
    "FalconH1ForCausalLM": lambda text, n: tuple(range(n)),  # configs/falcon_h1.py:292-295: attention and mamba
    "GraniteMoeHybridForCausalLM": _typed_full_layers("attention"),  # configs/granitemoehybrid.py:279-296
    "Lfm2ForCausalLM": _typed_full_layers("full_attention"),  # configs/lfm2.py:42-45
    "KimiLinearForCausalLM": _kimi_full_layers,
    **dict.fromkeys(PURE_SSM, _no_full_layers),
}


def _kimi_kda_layers(text: Mapping[str, Any]) -> tuple[int, ...]:
    linear = text.get("linear_attn_config")
    layers = linear.get("kda_layers") if isinstance(linear, Mapping) else None
    return tuple(i - 1 for i in layers if isinstance(i, int)) if isinstance(layers, list) else ()


def _ssm_dtype(text: Mapping[str, Any]) -> str:
    value = text.get("mamba_ssm_dtype")
    return value if isinstance(value, str) and value in _STATE_DTYPE_BYTES else "float32"


def _state_layout(geometry: ModelGeometry) -> StateLayout | None:
    """The state SGLang's config class keeps per request (`mamba2_cache_params`), or None."""
    text, arch, n = geometry.text_config, geometry.architecture, geometry.num_layers
    dtype = _ssm_dtype(text)
    if arch in QWEN3_NEXT_FAMILY:  # configs/qwen3_next.py:288-313
        full = set(_state_full_layers(geometry))
        heads, v_dim = _int(text, "linear_num_value_heads", 32), _int(text, "linear_value_head_dim", 128)
        return StateLayout("Qwen3NextConfig", tuple(i for i in range(n) if i not in full), heads * v_dim,
                           _int(text, "linear_num_key_heads", 16), heads, v_dim,
                           _int(text, "linear_key_head_dim", 128), _int(text, "linear_conv_kernel_dim", 4),
                           ssm_dtype=dtype)
    if arch == "NemotronHForCausalLM":  # configs/nemotron_h.py:409-439
        pattern = str(text.get("hybrid_override_pattern", ""))
        heads, head = _int(text, "mamba_num_heads", 128), _int(text, "mamba_head_dim", 64)
        return StateLayout("NemotronHConfig", tuple(i for i in range(min(n, len(pattern))) if pattern[i] == "M"),
                           heads * head, _int(text, "n_groups", 8), heads, head, _int(text, "ssm_state_size", 128),
                           _int(text, "conv_kernel", 4), ssm_dtype=dtype)
    if arch == "FalconH1ForCausalLM":  # configs/falcon_h1.py:211-225, :302-315
        d_ssm = text.get("mamba_d_ssm")
        inner = d_ssm if isinstance(d_ssm, int) else _int(text, "mamba_expand", 2) * geometry.hidden_size
        heads = _int(text, "mamba_n_heads", 128)
        return StateLayout("FalconH1Config", tuple(range(n)), inner, _int(text, "mamba_n_groups", 1), heads,
                           _int(text, "mamba_d_head", inner // max(heads, 1)), _int(text, "mamba_d_state", 256),
                           _int(text, "mamba_d_conv", 4), ssm_dtype=dtype)
    if arch == "GraniteMoeHybridForCausalLM":  # configs/granitemoehybrid.py:239-252, :279-310
        return _granite_state(geometry, dtype)
    if arch == "KimiLinearForCausalLM":  # configs/kimi_linear.py:173-185
        linear = text.get("linear_attn_config")
        linear = linear if isinstance(linear, Mapping) else {}
        heads, head = _int(linear, "num_heads", 32), _int(linear, "head_dim", 128)
        return StateLayout("KimiLinearConfig", _kimi_kda_layers(text), heads * head, 0, heads, head, head,
                           _int(linear, "short_conv_kernel_size", 4), ssm_dtype=dtype, kind="kda")
    if arch in PURE_SSM:  # configs/mamba.py: Mamba-1 mixers, create_full_rank
        inner = _int(text, "intermediate_size") or _int(text, "expand", 2) * geometry.hidden_size
        return StateLayout("MambaConfig", tuple(range(n)), inner, 1, inner, 1, _int(text, "state_size", 16),
                           _int(text, "conv_kernel", 4), ssm_dtype=dtype, kind="full_rank")
    if arch == "Lfm2ForCausalLM":  # configs/lfm2.py:59-98: a short conv over hidden_size, no SSM state
        conv = tuple(i for i, t in enumerate(_layer_types(text, n)) if t in ("conv", "short_conv"))
        return StateLayout("Lfm2Config", conv, geometry.hidden_size, 1, 1, geometry.hidden_size, 0,
                           _int(text, "conv_L_cache", 3), heads_follow_tp=False, ssm_dtype=dtype)
    return None


def _granite_state(geometry: ModelGeometry, dtype: str) -> StateLayout:
    text, n = geometry.text_config, geometry.num_layers
    inner = _int(text, "mamba_expand", 2) * geometry.hidden_size
    # GraniteMoeHybridConfig's defaults (configs/granitemoehybrid.py:160-168) fill keys a config leaves out.
    heads, head = _int(text, "mamba_n_heads", 64), _int(text, "mamba_d_head", 64)
    if heads and inner % heads:
        raise UnsupportedModel(f"SGLang refuses this config: mamba_intermediate_size ({inner}) must be divisible "
                               f"by mamba_n_heads ({heads}) [configs/granitemoehybrid.py:242-246]")
    if head * heads != inner:
        raise UnsupportedModel(f"SGLang refuses this config: mamba_d_head ({head}) * mamba_n_heads ({heads}) "
                               f"must equal mamba_intermediate_size ({inner}) [configs/granitemoehybrid.py:248-252]",
                               hint="serve it with vLLM (--engine vllm)")
    return StateLayout("GraniteMoeHybridConfig", tuple(i for i, t in enumerate(_layer_types(text, n)) if t == "mamba"),
                       inner, _int(text, "mamba_n_groups", 1), heads, head, _int(text, "mamba_d_state", 128),
                       _int(text, "mamba_d_conv", 4), ssm_dtype=dtype)


def state_slot_bytes(state: StateLayout, *, tp: int, ssm_dtype: str | None = None, pp: int = 1,
                     num_layers: int = 0, rules: SglangRules | None = None) -> int:
    """Bytes of one state slot on the fullest stage: `mamba_cache_per_req` x the stage's share
    (`_handle_max_mamba_cache`, kv_cache_configurator.py:3229-3260; before 0.5.17 every stage charges
    the whole model's state, `mamba_pool` "ratio"/"fixed"). conv state in bfloat16
    (SGLANG_MAMBA_CONV_DTYPE default), SSM state in `--mamba-ssm-dtype`, else the config's, else float32."""
    conv, temporal = _state_elements(state, tp)
    per_layer = conv * 2 + temporal * _STATE_DTYPE_BYTES[ssm_dtype or state.ssm_dtype]
    total = per_layer * len(state.layers)
    if pp > 1 and state.layers and (rules or RULES[-1]).mamba_pool == "padded":
        most = max(sum(1 for i in state.layers if i in stage) for stage in stage_layers(num_layers, pp))
        return int(total * (most / len(state.layers)))
    return total


def _state_elements(state: StateLayout, tp: int) -> tuple[int, int]:
    """(conv, SSM) elements of one layer's state on one rank, as the shape classes build them."""
    if state.kind == "kda":  # q, k and v short convs over heads x head_dim, a head_dim x head_dim state per head
        return 3 * state.intermediate_size // tp * (state.conv_kernel - 1), \
            state.num_heads // tp * state.head_dim * state.state_size
    if state.kind == "full_rank":  # conv over intermediate only; (intermediate, 1, state) SSM state
        return state.intermediate_size // tp * (state.conv_kernel - 1), state.intermediate_size // tp * state.state_size
    groups = state.n_groups
    if groups % tp:
        groups += tp - groups  # extra_groups_for_head_shards (configs/mamba_utils.py:29-38)
    conv_dim = state.intermediate_size + 2 * groups * state.state_size
    heads = state.num_heads if state.heads_follow_tp else tp
    return conv_dim // tp * (state.conv_kernel - 1), heads // tp * state.head_dim * state.state_size


def state_slots_per_request(arch: str, pinned: Mapping[str, Any], *, pp: int, rules: SglangRules | None = None) -> int:
    """`_calculate_mamba_ratio` (kv_cache_configurator.py:3062-3088): state slots one request holds.
    0.5.1-0.5.2 keep one (`mamba_pool` "fixed", radix cache off); 0.5.5-0.5.13 turn Kimi-Linear's radix
    cache off (`kimi_linear_radix`); the two extra_buffer slots by default from 0.5.14 (`mamba_extra_buffer`)."""
    rules = rules or RULES[-1]
    if pinned.get("--disable-radix-cache", False) or rules.mamba_pool == "fixed":
        return 1
    if arch == "KimiLinearForCausalLM" and not rules.kimi_linear_radix:
        return 1
    extra = {"off": frozenset(), "with_kimi": EXTRA_BUFFER_ARCHITECTURES,
             "without_kimi": EXTRA_BUFFER_ARCHITECTURES - {"KimiLinearForCausalLM"}}[rules.mamba_extra_buffer]
    if arch in extra:
        overlap = pp == 1 and not pinned.get("--disable-overlap-schedule", False)
        return MAMBA_BASE_SLOTS + (2 if overlap else 1)  # get_mamba_tracking_slots (allocation_sizing.py:11-19)
    return MAMBA_BASE_SLOTS


def state_pool(rest_bytes: int, slot_bytes: int, ratio: float, padded: bool = True) -> tuple[int, int]:
    """(slots, bytes) of the state pool `_handle_max_mamba_cache` carves out of the KV budget
    (kv_cache_configurator.py:3348-3395): rest x r / (1 + r) in slots, plus one padding slot
    (before 0.5.17 no padding slot: 0.5.13 model_runner_kv_cache_mixin.py:140-150, :170-175)."""
    budget = rest_bytes / (1 << 30) * ratio / (1 + ratio) * (1 << 30)
    if not padded:
        slots = int(budget // slot_bytes) if slot_bytes else 0
        return slots, slots * slot_bytes
    if budget < slot_bytes:
        return 0, slot_bytes
    slots = int((budget - slot_bytes) // slot_bytes) if slot_bytes else 0
    return slots, (slots + 1) * slot_bytes


FIXED_STATE_SLOTS = 512  # 0.5.1-0.5.2 model_runner.py:308-322: --max-running-requests, else 512


# --------------------------------------------------------------------------- the verified table


@dataclass(frozen=True)
class ArchitectureRow:
    """One architecture whose SGLang layout equals SGLang's code on the golden cases named."""

    architecture: str
    layers: str
    models: tuple[str, ...]  # model names in tests/data/sglang_layouts.json
    engine: str = "sglang"
    engine_version: str = ENGINE_VERSION

    def as_dict(self) -> dict[str, Any]:
        return {"architecture": self.architecture, "engine": self.engine, "engine_version": self.engine_version,
                "layers": self.layers, "models": list(self.models), "proof": f"engine code golden file {GOLDEN}"}


_MHA = "MHA: every layer, KV heads x (head_dim + v_head_dim)"
_MHA_SW = _MHA + " (SGLang ignores sliding_window outside its hybrid SWA list)"
_MLA = "MLA: kv_lora_rank + qk_rope_head_dim per layer"
_VL = " (text backbone of the wrapper)"
_STATE = "full-attention layers in the KV pool; conv + SSM state per request in the state pool"


def _rows(spec: Sequence[tuple[str, str, tuple[str, ...]]]) -> tuple[ArchitectureRow, ...]:
    return tuple(ArchitectureRow(arch, layers, models) for arch, layers, models in spec)


VERIFIED: tuple[ArchitectureRow, ...] = _rows((
    ("ArceeForCausalLM", _MHA, ("afm-4.5b",)),
    ("ChatGLMModel", _MHA + "; multi_query_group_num KV heads, kv_channels", ("glm-4-9b-chat",)),
    ("Cohere2ForCausalLM", _MHA_SW, ("command-r7b",)),
    ("CohereForCausalLM", _MHA, ("command-r-v01",)),
    ("DbrxForCausalLM", _MHA + "; attn_config.kv_n_heads", ("dbrx-instruct",)),
    ("DeepseekV2ForCausalLM", _MLA, ("deepseek-v2-lite",)),
    ("DeepseekV32ForCausalLM", _MLA + " + FP8 index K (index_head_dim + scales) per layer; fp8: scaled latent",
     ("deepseek-v3.2-exp",)),
    ("DeepseekV3ForCausalLM", _MLA, ("deepseek-v3", "kimi-k2")),
    ("Ernie4_5_ForCausalLM", _MHA, ("ernie-4.5-0.3b",)),
    ("Ernie4_5_MoeForCausalLM", _MHA, ("ernie-4.5-21b-a3b",)),
    ("Exaone4ForCausalLM", _MHA_SW, ("exaone-4.0-32b",)),
    ("ExaoneForCausalLM", _MHA, ("exaone-3.5-7.8b",)),
    ("FalconH1ForCausalLM", "attention and mamba on every layer; " + _STATE, ("falcon-h1-7b",)),
    ("Gemma2ForCausalLM", _MHA_SW, ("gemma-2-9b",)),
    ("Gemma3ForCausalLM", _MHA_SW, ("gemma-3-1b",)),
    ("Gemma3ForConditionalGeneration", _MHA_SW + _VL, ("gemma-3-12b-it", "gemma-3-27b")),
    ("Gemma3nForConditionalGeneration", _MHA + " (KV-shared layers still get their own cache)" + _VL,
     ("gemma-3n-e4b-it",)),
    ("Gemma4ForConditionalGeneration", "hybrid SWA by layer_types: full layers at the global head size "
     "(per_layer_config / global_head_dim), sliding layers at head_dim, 0.8 per token" + _VL, ("gemma-4-e2b-it",)),
    ("GemmaForCausalLM", _MHA, ("gemma-7b",)),
    ("Glm4ForCausalLM", _MHA, ("glm-4-9b-0414",)),
    ("Glm4MoeForCausalLM", _MHA, ("glm-4.5-air", "glm-4.6")),
    ("Glm4vForConditionalGeneration", _MHA + _VL, ("glm-4.1v-9b",)),
    ("GptOssForCausalLM", "hybrid SWA by layer_types: full + 0.8 x sliding layers per token",
     ("gpt-oss-20b", "gpt-oss-120b")),
    ("GraniteForCausalLM", _MHA, ("granite-3.3-8b",)),
    ("GraniteMoeForCausalLM", _MHA, ("granite-3.1-3b-a800m",)),
    ("GraniteMoeHybridForCausalLM", "layer_types attention / mamba; " + _STATE, ("granite-4.0-h-small",)),
    ("HunYuanDenseV1ForCausalLM", _MHA, ("hunyuan-7b",)),
    ("KimiVLForConditionalGeneration", _MLA + _VL, ("kimi-vl-a3b-instruct",)),
    ("KimiLinearForCausalLM", "MLA on the full_attn_layers; q/k/v short convs + a head_dim^2 KDA state per "
     "request on kda_layers", ("kimi-linear-48b-a3b-instruct",)),
    ("Lfm2ForCausalLM", "layer_types full_attention / conv; short-conv state per request", ("lfm2-1.2b",)),
    ("Llama4ForConditionalGeneration", "hybrid SWA: every 4th layer full, the rest sliding at 0.8 per token",
     ("llama-4-scout",)),
    ("LlamaForCausalLM", _MHA, ("llama-3.1-8b", "llama-3.1-8b-instruct", "llama-3.3-70b-instruct-fp8-dynamic")),
    ("LlavaForConditionalGeneration", _MHA + _VL, ("llava-1.5-7b",)),
    ("MiniCPM3ForCausalLM", _MLA + " (SGLang treats it as MLA)", ("minicpm3-4b",)),
    ("MiniMaxM2ForCausalLM", _MHA, ("minimax-m2",)),
    ("Mistral3ForConditionalGeneration", _MHA + _VL, ("mistral-small-3.1-24b-instruct-2503",)),
    ("MistralForCausalLM", _MHA_SW, ("mistral-7b-v0.3", "mistral-small-24b-2501", "mistral-7b-v0.1-swa")),
    ("MambaForCausalLM", "pure SSM: no KV pool (tokens = context length); conv + (intermediate, 1, state) SSM "
     "state per request", ("mamba-2.8b-hf",)),
    ("MixtralForCausalLM", _MHA, ("mixtral-8x7b",)),
    ("MllamaForConditionalGeneration", _MHA + " (cross-attention layers included)" + _VL,
     ("llama-3.2-11b-vision",)),
    ("NemotronHForCausalLM", "hybrid_override_pattern '*' attention, 'M' mamba; " + _STATE,
     ("nemotron-nano-9b-v2",)),
    ("Olmo2ForCausalLM", _MHA, ("olmo-2-7b",)),
    ("Olmo3ForCausalLM", _MHA_SW, ("olmo-3-7b-instruct",)),
    ("OlmoForCausalLM", _MHA, ("olmo-7b",)),
    ("OlmoeForCausalLM", _MHA, ("olmoe-1b-7b",)),
    ("Phi3ForCausalLM", _MHA_SW, ("phi-4", "phi-4-mini")),
    ("PhiForCausalLM", _MHA, ("phi-2",)),
    ("Qwen2ForCausalLM", _MHA, ("qwen2.5-7b",)),
    ("Qwen2MoeForCausalLM", _MHA, ("qwen2-57b-a14b",)),
    ("Qwen2VLForConditionalGeneration", _MHA + _VL, ("qwen2-vl-7b",)),
    ("Qwen2_5_VLForConditionalGeneration", _MHA + _VL, ("qwen2.5-vl-7b",)),
    ("Qwen3ForCausalLM", _MHA, ("qwen3-8b", "qwen3-32b", "qwen3-4b-instruct-2507")),
    ("Qwen3MoeForCausalLM", _MHA, ("qwen3-30b-a3b", "qwen3-235b-a22b")),
    ("Qwen3NextForCausalLM", "every full_attention_interval-th layer full; " + _STATE, ("qwen3-next-80b-a3b",)),
    ("Qwen3VLForConditionalGeneration", _MHA + _VL, ("qwen3-vl-8b",)),
    ("Qwen3_5ForConditionalGeneration", "layer_types full_attention / linear_attention (GDN); " + _STATE + _VL,
     ("qwen3.5-27b", "qwen3.6-27b")),
    ("Qwen3_5MoeForConditionalGeneration", "layer_types full_attention / linear_attention (GDN); " + _STATE + _VL,
     ("qwen3.5-35b-a3b", "qwen3.5-397b-a17b")),
    ("Qwen3VLMoeForConditionalGeneration", _MHA + _VL, ("qwen3-vl-30b-a3b",)),
    ("SeedOssForCausalLM", _MHA, ("seed-oss-36b",)),
    ("SmolLM3ForCausalLM", _MHA, ("smollm3-3b",)),
    ("StableLmForCausalLM", _MHA, ("stablelm-2-1.6b",)),
    ("Starcoder2ForCausalLM", _MHA_SW, ("starcoder2-15b",)),
))
_BY_NAME: Mapping[str, ArchitectureRow] = {row.architecture: row for row in VERIFIED}


def verified_row(architecture: str) -> ArchitectureRow | None:
    return _BY_NAME.get(architecture)


def verified_architectures() -> list[ArchitectureRow]:
    return sorted(VERIFIED, key=lambda row: row.architecture)


def architecture_status(geometry: ModelGeometry, rules: SglangRules | None = None) -> tuple[bool, str]:
    """(verified, note) for SGLang's layout of this architecture in the release of `rules`."""
    row = _BY_NAME.get(geometry.architecture)
    if row is None:
        return False, (f"unverified architecture {geometry.architecture}: its KV cell size in SGLang "
                       f"{ENGINE_VERSION} was not checked against SGLang's code; the pool figure may be wrong")
    rules = rules or RULES[-1]
    try:
        lay: SglangLayout | None = layout(geometry, rules)
    except UnsupportedModel:  # refused where it is planned; the status is the row's
        lay = None
    unchecked = None if lay is None else (
        "hybrid SWA pool" if lay.swa_layers and rules.swa_pool == "unchecked" else
        "state pool" if lay.state is not None and rules.mamba_pool == "unchecked" else None)
    if unchecked is not None:
        return False, (f"unverified layout: SGLang {rules.version}'s {unchecked} for {geometry.architecture} was "
                       "not run against its code (0.5.3-0.5.8 split it another way); the pool figure may be wrong")
    return True, (f"verified architecture {geometry.architecture}: cell size and pool equal SGLang {ENGINE_VERSION}'s "
                  f"own code on {', '.join(row.models)} ({GOLDEN})")


@dataclass(frozen=True)
class PoolSizing:
    tokens: int
    budget_bytes: int  # what the KV pool divides by the cell size
    state_slots: int | None = None  # max_mamba_cache_size
    state_bytes: int = 0
    swa_tokens: int | None = None  # the sliding-window pool of a hybrid SWA model
    profiled_tokens: int = 0  # budget // cell before the cap, the page floor and the SWA split


def pool(*, pre_load_bytes: int, after_load_bytes: int, fraction_value: float, cell_bytes: float, page_size: int,
         max_total_tokens: int | None, state_slot: int | None = None,
         state_ratio: float = DEFAULT_MAMBA_FULL_MEMORY_RATIO, context_len: int = 0,
         rules: SglangRules | None = None, swa_ratio: float | None = None, swa_split: StageCell | None = None,
         state_fixed_slots: int | None = None) -> PoolSizing:
    """`_profile_available_bytes` then the configurator, in SGLang's GiB floats
    (kv_cache_configurator.py:2990-3060): rest = A - P x (1 - f), the state pool carved out first.

    `swa_ratio` (a hybrid SWA pool) gives the sliding pool `int(tokens x ratio)`; under `swa_pool` "split"
    (0.5.9-0.5.10) the tokens profiled over `swa_split` (the stage's full + sliding parts) are split
    afterwards (0.5.9 model_runner_kv_cache_mixin.py:262-360). `state_fixed_slots`: 0.5.1-0.5.2's fixed
    state pool (`mamba_pool` "fixed")."""
    rules = rules or RULES[-1]
    rest_gib = after_load_bytes / (1 << 30) - pre_load_bytes / (1 << 30) * (1 - fraction_value)
    slots, state_bytes = None, 0
    if state_slot is not None and state_fixed_slots is not None:
        slots, state_bytes = state_fixed_slots, state_fixed_slots * state_slot
        rest_gib -= state_bytes / (1 << 30)
    elif state_slot is not None and rest_gib > 0:
        slots, state_bytes = state_pool(int(rest_gib * (1 << 30)), state_slot, state_ratio,
                                        padded=rules.mamba_pool == "padded")
        rest_gib -= state_bytes / (1 << 30)
    budget = int(rest_gib * (1 << 30))
    if cell_bytes <= 0 and budget > 0:
        # No KV layer on this stage (pure SSM): the token pool is --max-total-tokens or the context
        # length (DefaultPoolConfigurator._zero_kv_max_tokens, pool_configurator.py:244-251).
        return PoolSizing((max_total_tokens or context_len) // page_size * page_size, budget, slots, state_bytes)
    if budget <= 0 or cell_bytes <= 0:
        return PoolSizing(0, budget, slots, state_bytes)
    profiled = int(budget // cell_bytes)
    tokens = profiled // page_size * page_size
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens) // page_size * page_size
    if swa_ratio is None:
        return PoolSizing(tokens, budget, slots, state_bytes, profiled_tokens=profiled)
    unaligned = tokens
    if rules.swa_pool == "split" and swa_split is not None and swa_split.full_part > 0:
        # The sliding pool is the ratio of the full pool before either is floored to the page (0.5.9
        # model_runner_kv_cache_mixin.py:325-331); from 0.5.11 of the floored full pool.
        unaligned = swa_split.split_full(tokens, swa_ratio)
        tokens = unaligned // page_size * page_size
    elif swa_split is not None and swa_split.full_part <= 0:  # every layer slides: one pool
        return PoolSizing(tokens, budget, slots, state_bytes, tokens, profiled)
    swa = int(unaligned * swa_ratio) // page_size * page_size
    return PoolSizing(tokens, budget, slots, state_bytes, swa, profiled)


def pool_rules(lay: SglangLayout, *, rules: SglangRules, pinned: Mapping[str, Any], kv_bytes: int, tp: int,
               pp: int) -> dict[str, Any]:
    """The keyword arguments of `pool` that the release's arithmetic needs beyond the cell size."""
    hybrid = is_hybrid_swa(lay, pinned, rules)
    out: dict[str, Any] = {"rules": rules, "swa_ratio": float(pinned.get("--swa-full-tokens-ratio", 0.8))
                           if hybrid else None}
    if hybrid and rules.swa_pool == "split":
        cells = stage_cells(lay, kv_bytes=kv_bytes, kv_fp8=kv_bytes == 1, tp=tp, pp=pp, pinned=pinned, rules=rules)
        out["swa_split"] = max(cells, key=lambda cell: cell.total)
    if lay.state is not None and rules.mamba_pool == "fixed":
        out["state_fixed_slots"] = int(pinned.get("--max-running-requests") or FIXED_STATE_SLOTS)
    return out


def running_requests(tokens: int, context_len: int, pinned: int | None, rules: SglangRules | None = None) -> int:
    """max_running_requests from the pool's tokens: `resolve_max_num_reqs` (<= tokens // 2 from 0.5.11); before,
    init_memory_pool's estimate without that cap, from the tokens profiled before the pipeline minimum and the
    SWA split (0.5.9 model_runner_kv_cache_mixin.py:364-374; 0.5.2 model_runner.py:1252-1262)."""
    if rules is not None and rules.requests_before_pp_min:
        return pinned if pinned is not None else min(max(int(tokens / context_len * 512), 2048), 4096)
    if pinned is not None:
        return min(max(1, pinned), tokens // 2)
    return min(min(max(int(tokens / context_len * 512), 2048), 4096), tokens // 2)


# --------------------------------------------------------------------------- which layers slide

# Which layers slide when config.json lists no `layer_types`: SGLang reads the config through the
# same transformers config classes (srt/configs/model_config.py). Only hybrid SWA architectures
# size their sliding layers apart; the others pool every layer as full attention.
LAYER_PATTERNS: tuple[LayerPattern, ...] = (
    LayerPattern(("qwen2*", "qwen3*"), "transformers Qwen2Config: use_sliding_window, max_window_layers",
                 window_switch="use_sliding_window", first_sliding_key="max_window_layers"),
    LayerPattern(("gemma2",), "transformers Gemma2Config (even layers slide)", every=2),
    LayerPattern(("gemma3", "gemma3_text"), "transformers Gemma3TextConfig sliding_window_pattern", every=6,
                 every_key="sliding_window_pattern"),
    LayerPattern(("cohere2",), "transformers Cohere2Config sliding_window_pattern", every=4,
                 every_key="sliding_window_pattern"),
    LayerPattern(("olmo3",), "transformers Olmo3Config (3 sliding : 1 full)", every=4),
    LayerPattern(("exaone4",), "transformers Exaone4Config sliding_window_pattern", every=4,
                 every_key="sliding_window_pattern", strict=False),
)


def cached_layers(geometry: ModelGeometry) -> ModelGeometry:
    """`geometry` with the layer kinds and window SGLang's model code builds (`LAYER_PATTERNS`)."""
    return _bind(geometry, LAYER_PATTERNS)


# SGLang 0.5.23 configs/model_config.py:2501-2516 `multimodal_breakable_cuda_graph_supported_model_archs`
# (cuda_graph_hook.py:229-238 turns the prefill graph off for any other multimodal architecture).
_MULTIMODAL_BREAKABLE_GRAPH = frozenset({
    "MiniMaxM3SparseForConditionalGeneration", "Cohere2VisionForConditionalGeneration",
    "Glm5NextForConditionalGeneration", "InternS2MobiusForConditionalGeneration", "PaddleOCRVLForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "Qwen4ExpForConditionalGeneration",
    "MuseGlimmerForConditionalGeneration", "MuseSparkForConditionalGeneration", "KimiK3ForConditionalGeneration",
    "KimiK25ForConditionalGeneration", "MiniMaxM3SparseForCausalLM",
})


def breakable_graph_multimodal_ok(geometry: ModelGeometry) -> bool:
    """Multimodal architectures whose breakable prefill graph SGLang keeps on."""
    return geometry.architecture in _MULTIMODAL_BREAKABLE_GRAPH


def proof_summary() -> tuple[str, list[tuple[str, str]]]:
    """(how they were proven, [(architecture, its proof)]) for `safe-serve models --architectures`."""
    return (f"SGLang {ENGINE_VERSION}: cell size and pool equal SGLang's own ModelConfig and pool "
            f"code ({GOLDEN})",
            [(row.architecture, f"{row.layers}; golden: {', '.join(row.models)}") for row in verified_architectures()])
