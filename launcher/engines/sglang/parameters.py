"""The tensors SGLang's loader allocates for one rank of a model, from SGLang's module code, and what
PyTorch's caching allocator holds for them.

SGLang builds the modules on the device (0.5.23 model_loader/loader.py:1012-1016), so every parameter
and registered buffer is one allocation, in the order the modules create them; the pool is measured
after `empty_cache()` (utils/common.py:446-447), so what stays beyond the tensors is the rounding of
the segments that hold them. The tensor lists below are checked, tensor by tensor, against the
modules SGLang 0.5.23 itself builds (tests/oracles/sglang_params.py -> tests/data/sglang_params.json).

Covered: Llama, Mistral, Qwen2, Qwen3, Phi-3/4, Granite 3, GLM-4 (unquantized, AWQ, compressed-tensors
FP8), Gemma 2, the fused MoE decoders Qwen3-MoE and Mixtral, DeepSeek-V2 without a q LoRA (unquantized).
Anything else is bounded by the caller (budget.load_overhead). The MLA models' w_kc / w_vc copies, made
after loading, are derived for every MLA model (mla_decode_copies), derived or bounded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from launcher.engines.sglang.architectures import stage_layers
from launcher.model.config import MLA, ModelGeometry, partial_rotary_factor
from launcher.model.linear_tensors import (
    Scheme,
    attention,
    deepseek_v2_moe,
    fused_experts,
    marlin_layer,
    marlin_leftovers,
    mla_projections,
    mlp,
    padded_vocab_rows,
    plain_mlp,
    qkv_bias,
    scheme,
    sparse_experts,
    vocab_padding_bytes,
)

ROPE_CACHE_DTYPE_BYTES = 4  # cos_sin_cache stays float32 on CUDA (layers/rotary_embedding/base.py:115-120)

# Dense decoders whose SGLang modules are the fused qkv_proj / o_proj / gate_up_proj / down_proj
# (models/llama.py, models/qwen2.py, models/qwen3.py, models/phi3.py, models/granite.py, models/glm4.py;
# Mistral runs llama.py's classes). GLM-4 adds two norms a layer (post_self_attn, post_mlp).
DENSE_DECODERS = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                            "Phi3ForCausalLM", "GraniteForCausalLM", "Glm4ForCausalLM"})
GEMMA2 = "Gemma2ForCausalLM"
FUSED_MOE = frozenset({"Qwen3MoeForCausalLM", "MixtralForCausalLM"})
DEEPSEEK_V2 = "DeepseekV2ForCausalLM"


@dataclass(frozen=True)
class LoaderTensors:
    """One rank's tensors in creation order, and the part of their bytes no checkpoint holds."""

    tensors: tuple[int, ...]
    engine_only_bytes: int  # rope cache, vocab padding rows, Gemma's second norm weights
    engine_only: tuple[str, ...]  # what those bytes are
    quantized_with: str | None  # the linear layers' scheme: None, "awq", "fp8-channel", "fp8-tensor"
    rule: str
    # The quantized linear layers' tensors (bias aside) of one layer, and the number of linear layers:
    # what a Marlin repack after loading replaces (repack_leftovers).
    layer_linear_tensors: tuple[int, ...] = ()
    linear_layers: int = 0
    layer_linear_rows: int = 0  # the output rows of one layer's linear layers (one rank)


# --------------------------------------------------------------------------- rope cache


def rope_cache_bytes(geometry: ModelGeometry) -> int | None:
    """The float32 cos/sin cache of the model's rotary embedding (positions x rotary_dim), None where
    SGLang sizes it by a rule not derived here. Plain and llama3 ropes keep max_position_embeddings;
    YaRN (rotary_embedding/rope_variant.py, YaRNScalingRotaryEmbedding and DeepSeek's) caches
    original_max_position_embeddings x factor positions."""
    text = geometry.text_config
    positions = text.get("max_position_embeddings")
    factor = partial_rotary_factor(text)
    rotary = text.get("qk_rope_head_dim") if geometry.mla is not None else int(factor * geometry.head_dim) \
        if factor is not None else None
    if not isinstance(positions, int) or not isinstance(rotary, int) or positions <= 0 or rotary <= 0:
        return None
    scaling = text.get("rope_scaling")
    if scaling is None:
        return positions * rotary * ROPE_CACHE_DTYPE_BYTES
    if not isinstance(scaling, Mapping) or "mrope_section" in scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in ("llama3", "default"):
        return positions * rotary * ROPE_CACHE_DTYPE_BYTES
    if kind in ("yarn", "deepseek_yarn"):
        original, scale = scaling.get("original_max_position_embeddings", positions), scaling.get("factor")
        if isinstance(original, int) and isinstance(scale, (int, float)) and original > 0 and scale > 0:
            return int(original * scale) * rotary * ROPE_CACHE_DTYPE_BYTES
    return None


# --------------------------------------------------------------------------- decoders


def loader_tensors(geometry: ModelGeometry, *, element: int, tp: int) -> LoaderTensors | None:
    """The tensors SGLang creates for one rank (one pipeline stage holding every layer), or None."""
    method = scheme(geometry)
    rope = rope_cache_bytes(geometry)
    if method is None or rope is None or geometry.is_multimodal:
        return None
    architecture = geometry.architecture
    linear_tensors: list[int] = []
    linear_rows = 0
    layers: list[int] | None
    if architecture in DENSE_DECODERS and geometry.intermediate_size:
        layers = _dense_layers(geometry, element, tp, method, rope)
        if method.name is not None:
            linear_tensors, linear_rows = marlin_layer(geometry, element, tp, method)
    elif architecture == GEMMA2 and method.name is None and geometry.intermediate_size:
        layers = _gemma2_layers(geometry, element, tp, rope)
    elif architecture in FUSED_MOE and method.name is None:
        layers = _moe_layers(geometry, element, tp, rope)
    elif architecture == DEEPSEEK_V2 and method.name is None and geometry.mla is not None:
        layers = _deepseek_v2_layers(geometry, element, tp, rope)
    else:
        return None
    if layers is None:
        return None
    hidden = geometry.hidden_size
    # Embeddings and norms stay in the model dtype under every method (AWQ checkpoints are fp16).
    vocab = padded_vocab_rows(geometry.vocab_size, tp) * hidden * element
    gemma = architecture == GEMMA2
    before = [element, vocab] if gemma else [vocab]  # Gemma 2's `normalizer` buffer, a scalar
    final_norm = [hidden * element] * (2 if gemma else 1)
    tied = geometry.tie_word_embeddings or gemma  # Gemma2ForCausalLM has no lm_head (models/gemma2.py)
    after = final_norm + ([] if tied else [vocab])
    padding = vocab_padding_bytes(geometry, element=element, tp=tp, tied=tied)
    engine_only = rope + padding
    what = ("rope cache",) + (("vocab padding",) if padding else ()) + (("Gemma's norm copies",) if gemma else ())
    if gemma:
        # GemmaRMSNorm keeps `gemma_weight` (1 + weight) beside `weight` (layers/layernorm.py): four
        # norms a layer and the final one, plus the normalizer.
        engine_only += (4 * geometry.num_layers + 1) * hidden * element + element
    tensors = tuple(before + layers + after)
    return LoaderTensors(tensors, engine_only, what, method.name,
                         f"{len(tensors)} tensors of SGLang's {architecture} modules"
                         + (f" ({method.name} linear layers)" if method.name else ""),
                         tuple(linear_tensors), 4 * geometry.num_layers if linear_tensors else 0, linear_rows)


def _dense_layers(geometry: ModelGeometry, element: int, tp: int, method: Scheme, rope: int) -> list[int]:
    hidden = geometry.hidden_size
    qkv, out = attention(geometry, element, tp, method, qkv_bias(geometry))
    # Qwen3Attention creates q_norm / k_norm first (models/qwen3.py).
    qk_norms = [geometry.head_dim * element] * 2 if geometry.architecture == "Qwen3ForCausalLM" else []
    feed = mlp(geometry, element, tp, method)
    norms = [hidden * element] * (4 if geometry.architecture == "Glm4ForCausalLM" else 2)
    first = qk_norms + qkv + out + [rope] + feed + norms  # the rope cache: built once, by layer 0
    return first + (qk_norms + qkv + out + feed + norms) * (geometry.num_layers - 1)


def _gemma2_layers(geometry: ModelGeometry, element: int, tp: int, rope: int) -> list[int]:
    hidden, inter = geometry.hidden_size, (geometry.intermediate_size or 0) // tp
    qkv, out = attention(geometry, element, tp, Scheme(None), bool(geometry.text_config.get("attention_bias")))
    feed = plain_mlp(inter, hidden, element)
    norms = [hidden * element] * 8  # input, post-attention, pre- and post-feedforward: weight and gemma_weight
    return qkv + out + [rope] + feed + norms + (qkv + out + feed + norms) * (geometry.num_layers - 1)


def _moe_layers(geometry: ModelGeometry, element: int, tp: int, rope: int) -> list[int] | None:
    text: Mapping[str, Any] = geometry.text_config
    shape = sparse_experts(geometry)
    if shape is None:
        return None
    experts, inter = shape
    hidden = geometry.hidden_size
    qwen3 = geometry.architecture == "Qwen3MoeForCausalLM"
    qkv, out = attention(geometry, element, tp, Scheme(None), bool(text.get("attention_bias")))
    gate = [experts * hidden * element]
    moe = fused_experts(experts, inter // tp, hidden, element)
    norms = [hidden * element] * 2
    if qwen3:  # models/qwen3_moe.py: q_norm / k_norm after the rope; the router after the experts
        qk_norms = [geometry.head_dim * element] * 2
        first = qkv + out + [rope] + qk_norms + moe + gate + norms
        rest = qkv + out + qk_norms + moe + gate + norms
    else:  # models/mixtral.py: the router, then the experts
        first = qkv + out + [rope] + gate + moe + norms
        rest = qkv + out + gate + moe + norms
    return first + rest * (geometry.num_layers - 1)


def _deepseek_v2_layers(geometry: ModelGeometry, element: int, tp: int, rope: int) -> list[int] | None:
    """models/deepseek_v2.py without a q LoRA (DeepSeek-V2-Lite): q_proj, the replicated
    kv_a_proj_with_mqa, kv_b_proj, o_proj, kv_a_layernorm; dense MLPs for the first layers, then the
    router, the routed experts and the shared experts."""
    projections, moe = mla_projections(geometry, element, tp), deepseek_v2_moe(geometry)
    if projections is None or moe is None:
        return None
    hidden = geometry.hidden_size
    attention = [projections.q_proj, projections.kv_a_proj_with_mqa, projections.kv_b_proj, projections.o_proj,
                 projections.kv_a_layernorm]
    dense = plain_mlp((geometry.intermediate_size or 0) // tp, hidden, element)
    sparse = [moe.experts * hidden * element, *fused_experts(moe.experts, moe.intermediate // tp, hidden, element),
              *plain_mlp(moe.intermediate * moe.shared_experts // tp, hidden, element)]
    norms = [hidden * element] * 2
    layers: list[int] = []
    for index in range(geometry.num_layers):
        layers += attention + ([rope] if index == 0 else []) + (dense if index < moe.dense_layers else sparse) + norms
    return layers


def mla_decode_copies(geometry: ModelGeometry, *, element: int, tp: int, pp: int = 1) -> tuple[list[int], str]:
    """MLA's decode weights: after loading, post_load_weights splits each MLA layer's kv_b_proj into w_kc
    and w_vc and stores contiguous copies of both (0.5.23 models/deepseek_common/deepseek_weight_loader.py:
    550, :586-820, `w_kc.transpose(1, 2).contiguous()`, `w_vc.contiguous()`; the wrappers call it too,
    kimi_vl.py:361), while kv_b_proj stays for the prefill: [heads, qk_nope, kv_lora_rank] and [heads,
    kv_lora_rank, v_head] per rank, layer by layer, on the stage that holds the most MLA layers. In the
    model dtype, also for block FP8 (block_quant_dequant: SGLANG_USE_DEEPGEMM_BMM is off by default);
    FP8 per tensor or channel keeps them in fp8."""
    mla = geometry.mla
    if mla is None:
        return [], ""
    config = geometry.text_config.get("quantization_config")
    block = isinstance(config, Mapping) and config.get("weight_block_size") is not None
    if geometry.quantization is not None and geometry.quantization.method == "fp8" and not block:
        element = 1
    mla_layers = {index for index, kind in enumerate(geometry.layer_kinds) if kind == MLA}
    layers = max(sum(1 for index in stage if index in mla_layers)
                 for stage in stage_layers(len(geometry.layer_kinds), max(pp, 1)))
    heads = geometry.num_attention_heads // tp
    copies = [heads * mla.qk_nope_head_dim * mla.kv_lora_rank * element,
              heads * mla.kv_lora_rank * mla.v_head_dim * element] * layers
    return copies, f"MLA w_kc/w_vc copies of kv_b_proj {sum(copies) / 2**20:.0f} MiB"


# --------------------------------------------------------------------------- after loading

# Marlin: AWQ checkpoints on sm80+ run awq_marlin (0.5.23 awq/awq.py:333-354, check_marlin_supported);
# compressed-tensors FP8 below sm89 runs the weight-only W8A16 Marlin scheme, whose modules hold the
# same tensors (compressed_tensors.py `_check_scheme_supported(..., error=False)`; the oracle's sm80 and
# sm86 builds match the derivation as the sm90 one does).
MARLIN_MIN_CAPABILITY = 80
FP8_W8A8_MIN_CAPABILITY = 89


def _runs_marlin(loader: LoaderTensors, compute_capability: tuple[int, int] | None) -> bool:
    """AWQ on sm80+, compressed-tensors FP8 below sm89; a card not known runs it (the safe side)."""
    if compute_capability is None:
        return loader.quantized_with is not None
    capability = compute_capability[0] * 10 + compute_capability[1]
    if loader.quantized_with == "awq":
        return capability >= MARLIN_MIN_CAPABILITY
    return loader.quantized_with in ("fp8-channel", "fp8-tensor") and capability < FP8_W8A8_MIN_CAPABILITY


def repack_leftovers(loader: LoaderTensors, compute_capability: tuple[int, int] | None) -> tuple[int, int, str]:
    """(bytes, error, rule) the Marlin repack leaves in the allocator's segments, 0 where none runs
    (linear_tensors.marlin_leftovers): AWQMarlinLinearKernel.process_weights_after_loading
    (hardware_backend/gpu/quantization/awq_kernels.py:109-141) for AWQ, the W8A16 FP8 scheme below
    sm89 (compressed_tensors_w8a16_fp8.py:42-62, prepare_fp8_layer_for_marlin) for FP8."""
    if not _runs_marlin(loader, compute_capability):
        return 0, 0, ""
    return marlin_leftovers(loader.layer_linear_tensors, linear_layers=loader.linear_layers,
                            layer_rows=loader.layer_linear_rows, row_scales=loader.quantized_with != "awq")


# --------------------------------------------------------------------------- data-parallel attention

# The models whose attention (and embedding) SGLang builds on the attention-TP group, T / D ranks, under
# data-parallel attention (0.5.23 `parallel_group="attn_tp"`: models/deepseek_v2.py:2051-2161 with the
# embedding by get_embedding_tp_kwargs, vocab_parallel_embedding.py:166-185; models/qwen3_moe.py:502-541 and
# qwen2_moe.py:1115-1121; glm4_moe.py:880-884). The rest of the model (dense MLPs, shared and routed experts,
# lm_head) keeps the T split. Dense decoders (llama.py, qwen2.py) build their projections on the whole TP group.
DP_ATTENTION_ARCHITECTURES = frozenset({"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Qwen2MoeForCausalLM",
                                        "Qwen3MoeForCausalLM", "Glm4MoeForCausalLM"})
FP8_BLOCK = 128  # the block of DeepSeek-style fp8 checkpoints' weight_scale_inv (weight_block_size)


def _linear_bytes(rows: int, cols: int, element: int, block: bool) -> int:
    """A checkpoint linear layer: its weight, and a block-fp8 one's float32 scale per 128 x 128 block."""
    scales = -(-rows // FP8_BLOCK) * -(-cols // FP8_BLOCK) * 4 if block else 0
    return rows * cols * element + scales


def attention_dp_extra(geometry: ModelGeometry, *, tp: int, attn_tp: int,
                       dtype_element: int) -> tuple[int, str] | None:
    """(bytes, rule) one rank holds beyond its T share of the checkpoint under data-parallel attention: the
    attention projections and the embedding split by T / D instead of T. None where it is not derived (another
    architecture, a checkpoint quantized otherwise than fp8 or not at all)."""
    if geometry.architecture not in DP_ATTENTION_ARCHITECTURES or attn_tp >= tp:
        return None if geometry.architecture not in DP_ATTENTION_ARCHITECTURES else (0, "")
    quant = geometry.quantization
    config = geometry.text_config.get("quantization_config")
    block = isinstance(config, Mapping) and config.get("weight_block_size") is not None
    if quant is None:
        element, block = dtype_element, False
    elif quant.method == "fp8" and not _attention_kept_16_bit(config):
        element = 1
    else:
        return None
    hidden, heads = geometry.hidden_size, geometry.num_attention_heads
    mla = geometry.mla
    if mla is not None:
        q_lora = geometry.text_config.get("q_lora_rank")
        q_in = q_lora if isinstance(q_lora, int) and q_lora > 0 else hidden
        qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        whole = (_linear_bytes(heads * qk, q_in, element, block)
                 + _linear_bytes(heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank, element, block)
                 + _linear_bytes(hidden, heads * mla.v_head_dim, element, block))
        per_layer = whole // attn_tp - whole // tp
        what = "q_b/kv_b/o_proj"
    else:
        head_dim, kv = geometry.head_dim, geometry.num_kv_heads
        q_o = _linear_bytes(heads * head_dim, hidden, element, block) + _linear_bytes(hidden, heads * head_dim,
                                                                                       element, block)

        def kv_rank(group: int) -> int:  # a rank's K and V heads: split, or one head copied (qwen3_moe.py:509-517)
            return 2 * _linear_bytes(max(1, kv // group) * head_dim, hidden, element, block)

        per_layer = q_o // attn_tp - q_o // tp + kv_rank(attn_tp) - kv_rank(tp)
        what = "qkv/o_proj"
    layers = len(geometry.layer_kinds)
    embed = (padded_vocab_rows(geometry.vocab_size, attn_tp) - padded_vocab_rows(geometry.vocab_size, tp)) \
        * hidden * dtype_element
    return per_layer * layers + embed, (
        f"data-parallel attention: {what} of {layers} layers and the embedding over T/D = {attn_tp} ranks, "
        f"not {tp} (+{per_layer * layers / 2**30:.2f} + {embed / 2**30:.2f} GiB)")


def _attention_kept_16_bit(config: Any) -> bool:
    """An fp8 checkpoint that names its attention among the modules it left unquantized."""
    if not isinstance(config, Mapping):
        return False
    kept = config.get("ignored_layers") or config.get("modules_to_not_convert") or ()
    return isinstance(kept, list) and any(isinstance(name, str) and "attn" in name for name in kept)
