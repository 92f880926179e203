"""The caching allocator's segments around the weights: counted in vLLM's KV budget from 0.27.

Up to 0.26 the budget takes the weights as allocated ("Model loading took": torch's allocated bytes
after the load less before, platforms/cuda.py get_current_memory_usage) and the non-torch increase
(CUDA memory in use less torch's reservation). From 0.27 it takes what cudaMemGetInfo saw consumed
from the worker's first snapshot to the end of the profile run, plus the transient peak (0.28.0
utils/mem_utils.py:317-326, v1/worker/gpu_worker.py:541-562; 0.34's extensible KV cache measures the
free memory after warmup the same way, v1/worker/extensible_kv_cache.py:605-614): what torch reserves
beyond the tensors it holds, after `empty_cache()`, is in the budget too. For the weights that is the
rounding and unused ends of the segments the modules' tensors sit in (launcher.model.allocator; vLLM
builds the modules on the device, one allocation per parameter and buffer: 0.28.0
model_executor/model_loader/base_loader.py:52-54), after the AWQ conversion and Marlin repack where
they run (replayed allocation by allocation, `awq_marlin_replay`; weight-only FP8 Marlin bounded,
linear_tensors.marlin_leftovers). The free blocks among them, which what the profile run keeps may
fill, are half counted and half the band: 0.8 +/- 0.7 MiB for Llama-3.1-8B, 85 +/- 28 for Qwen2.5-7B,
~0.1 +/- 0.05 GiB for the AWQ checkpoints on one card.

The tensor lists are checked against the modules vLLM 0.32 builds (tests/data/vllm_params.json,
tests/engines/vllm/test_weight_segments.py): the dense decoders, Gemma 1-3 (Gemma 3's wrapper with its SigLIP
tower on one rank) and the fused-MoE decoders (GLM-4 MoE, DeepSeek-V2's MLA without a q LoRA). Elsewhere the
term is bounded, not derived.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from launcher.common.units import MiB
from launcher.engines.vllm.architectures import cached_layers
from launcher.engines.vllm.kv import pp_partitions
from launcher.model import allocator
from launcher.model.config import SLIDING, ModelGeometry
from launcher.model.linear_tensors import (
    MARLIN_WORKSPACE_BYTES,
    Scheme,
    deepseek_v2_moe,
    fused_experts,
    layer_linears,
    marlin_layer,
    marlin_leftovers,
    mla_projections,
    padded_vocab_rows,
    plain_mlp,
    qkv_bias,
    scheme,
    sparse_experts,
)

# Dense decoders whose vLLM modules are the fused qkv_proj / o_proj / gate_up_proj / down_proj
# (models/llama.py, qwen2.py, qwen3.py, phi3.py, granite.py, glm4.py; Mistral runs llama.py's classes).
DENSE_DECODERS = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                            "Phi3ForCausalLM", "GraniteForCausalLM", "Glm4ForCausalLM"})
# Gemma and Gemma 2 (models/gemma.py, gemma2.py; unquantized): a `normalizer` scalar buffer in the model dtype
# ahead of the embedding, no lm_head (the embedding computes the logits), Gemma 2 four norms a layer.
GEMMA = frozenset({"GemmaForCausalLM", "Gemma2ForCausalLM"})
# Gemma 3 (models/gemma3.py, gemma3_mm.py; unquantized, one pipeline stage): Gemma 2's layer with q/k norms after
# o_proj, and two rotary tables: the sliding layers' (rope_local_base_freq, max_position_embeddings rows) built by
# the first sliding layer, the full layers' (rope_theta and its scaling) by the first full one. The wrapper builds
# its SigLIP tower and projector first (one rank: the tower's own split under TP is not derived here).
GEMMA3 = frozenset({"Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"})
TOWER_LAYERS_MAX = 1 << 12  # the decoder's own bound (launcher.model.config); vision_config's is not checked there
# Fused-MoE decoders, unquantized, every layer sparse (models/qwen3_moe.py, mixtral.py, qwen2_moe.py): the router
# [E, H], then FusedMoE's w13 [E, 2 I / T, H] and w2 [E, H, I / T] (Qwen2-MoE: its shared expert's gate, gate_up and
# down first). Triton, vLLM's backend on Hopper, keeps those tensors; the FlashInfer kernels other cards pick first
# (fused_moe/oracle/unquantized.py:67-93) replace them by tensors of the same size after loading, each a segment
# of its own, rounded alike.
FUSED_MOE = frozenset({"Qwen3MoeForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Glm4MoeForCausalLM",
                       "DeepseekV2ForCausalLM"})
# GLM-4.5/4.6/4.7 (models/glm4_moe.py): the first `first_k_dense_replace` layers dense, the rest a float32 router
# [E, H] with its float32 e_score_correction_bias [E], the shared experts' gate_up and down, then the fused experts;
# q/k norms after the attention's scalars where use_qk_norm.
GLM4_MOE = "Glm4MoeForCausalLM"
# DeepSeek-V2 without a q LoRA (models/deepseek_v2.py; DeepSeek-V2-Lite): MLA's kv_a_proj_with_mqa (replicated),
# q_proj, kv_a_layernorm, kv_b_proj, o_proj, then the rotary table and the attention's scalars; the first
# `first_k_dense_replace` layers dense, the rest a router in the model dtype, the shared experts and the fused
# experts. With a q LoRA (DeepSeek-V3, Kimi) the attention's tensors are not derived here.
DEEPSEEK_V2 = "DeepseekV2ForCausalLM"
# Each attention layer's float32 scalars, created on the device (torch.tensor under the loader's device
# context): the _k/_v/_q/_prob_scale buffers and the _k/_v_scale_cpu copies (0.28.0 model_executor/layers/
# attention/attention.py:124-143, set_default_quant_scales; 0.34.0 :151-167). Its `kv_cache` placeholder
# is empty and takes no block.
ATTENTION_SCALARS = 6
SCALAR_BYTES = 4
# compressed-tensors gives the attention its KV-cache method's parameters first: q/k/v scales (float32 [1])
# and zero points (model dtype [1]) in 0.32 (compressed_tensors.py:1173-1180; 0.28.0 quantization/kv_cache.py:
# 65-69 adds a prob scale: 512 B more a layer in the small pool).
KV_SCALE_PARAMETERS = 3
# Where the modules are not derived: up to 2 MiB of rounding for each of a layer's four large linear
# tensors (allocator.ROUND_LARGE), the centre at half.
BOUND_PER_LAYER = 4 * allocator.ROUND_LARGE
# Marlin runs AWQ checkpoints from sm75 (0.28.0 quantization/auto_awq.py:307-328, utils/marlin_utils.py:65;
# the user's `--quantization awq` is AutoAWQ from 0.24, checks.py), and compressed-tensors FP8 below sm89 as
# weight-only W8A16. FP8 on sm89+ requantizes in place (utils/w8a8_utils.py:76-107): only temporaries, which
# empty_cache releases.
MARLIN_MIN_CAPABILITY = 75
FP8_W8A8_MIN_CAPABILITY = 89


def runs_marlin(method: str | None, compute_capability: tuple[int, int] | None) -> bool:
    """Whether the linear layers are repacked for Marlin after loading; a card not known does (the safe side)."""
    if method is None:
        return False
    if compute_capability is None:
        return True
    capability = compute_capability[0] * 10 + compute_capability[1]
    if method == "awq":
        return capability >= MARLIN_MIN_CAPABILITY
    return capability < FP8_W8A8_MIN_CAPABILITY


# A pinned --quantization that builds the checkpoint's own modules (checks.py resolves these to the
# checkpoint's method); any other builds modules not derived here.
_PINNED_SAME = {"awq": frozenset({"awq", "awq_marlin", "auto_awq", "marlin"}),
                "fp8-channel": frozenset({"compressed-tensors"}), "fp8-tensor": frozenset({"compressed-tensors"})}


@dataclass(frozen=True)
class WeightSegments:
    bytes: int
    error: int
    rule: str
    derived: bool = True  # from the modules' tensors; else half the rounding bound
    # What loading holds beyond the weights at its peak: the AWQ conversion's copies (awq_marlin_replay);
    # 0 where nothing is replayed beyond the tensors' own segments.
    load_peak_extra: int = 0


def _stage(geometry: ModelGeometry, *, element: int, tp: int, rope: int, layers: int, first: bool,
           last: bool, experts_tp: int | None = None, start: int = 0) -> tuple[list[int], list[list[int]]] | None:
    """(the tensors, and for each quantized linear layer the positions of its tensors in that list).
    `experts_tp`: the ranks a MoE model's experts are split over (data x tensor parallel); None (expert
    parallelism, or not given): its whole experts per rank are not derived here. `start`: the stage's first
    layer in the model (GLM-4 MoE's dense layers are the model's first)."""
    method = scheme(geometry)
    architecture = geometry.architecture
    gemma3 = architecture in GEMMA3 and first and last
    gemma = architecture in GEMMA or gemma3
    moe = _moe_tensors(geometry, element=element, tp=experts_tp) if architecture in FUSED_MOE \
        and method is not None and method.name is None and experts_tp is not None else None
    if method is None or not (architecture in DENSE_DECODERS or gemma and method.name is None or moe is not None) \
            or not geometry.intermediate_size or (geometry.is_multimodal and not gemma3):
        return None
    tower = _siglip_tower(geometry, element=element, tp=tp) if gemma3 and geometry.is_multimodal else []
    ropes = _gemma3_ropes(geometry, rope=rope, element=element) if gemma3 else {0: rope}
    if tower is None or ropes is None:
        return None
    hidden = geometry.hidden_size
    qkv, out, gate_up, down = layer_linears(geometry, element, tp, method, qkv_bias(geometry))
    if geometry.mla is not None:  # MLA's projections in place of qkv_proj (DeepSeek-V2 without a q LoRA)
        mla = _mla_attention(geometry, element=element, tp=tp) if architecture == DEEPSEEK_V2 else None
        if mla is None:
            return None
        qkv, out = mla
    dense_mlp = (gate_up, down)
    if moe is not None:  # the MoE block in place of the dense MLP
        gate_up, down = moe, []
    dense_layers = _dense_layers(geometry) if moe is not None else 0
    scalars = [SCALAR_BYTES] * ATTENTION_SCALARS
    if method.name is not None and method.name.startswith("fp8"):
        scalars = [SCALAR_BYTES] * KV_SCALE_PARAMETERS + [element] * KV_SCALE_PARAMETERS + scalars
    qk_norms = [geometry.head_dim * element] * 2 if architecture in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM") \
        or architecture == GLM4_MOE and geometry.text_config.get("use_qk_norm") else []
    norms = [hidden * element] * (4 if architecture in ("Glm4ForCausalLM", "Gemma2ForCausalLM") or gemma3 else 2)
    vocab = padded_vocab_rows(geometry.vocab_size, tp) * hidden * element  # the model dtype under AWQ too
    tensors = tower + ([element] if gemma else []) + ([vocab] if first else [])
    linears: list[list[int]] = []

    def add(sizes: list[int], quantized: bool) -> None:
        if quantized:
            linears.append(list(range(len(tensors), len(tensors) + len(sizes))))
        tensors.extend(sizes)

    for index in range(layers):
        add(qkv, True)
        add(out, True)
        if gemma3:  # q/k norms ahead of the rope (gemma3.py Gemma3Attention)
            add([geometry.head_dim * element] * 2 + ([ropes[index]] if index in ropes else []) + scalars, False)
        else:
            add(([rope] if index == 0 else []) + scalars + qk_norms, False)
        mlp = dense_mlp if start + index < dense_layers else (gate_up, down)
        add(mlp[0], True)
        add(mlp[1], True)
        add(norms, False)
    if last:
        tied = (geometry.tie_word_embeddings or gemma) and first
        tensors.extend([hidden * element] + ([] if tied else [vocab]))
    return tensors, linears if method.name is not None else []


def _gemma3_ropes(geometry: ModelGeometry, *, rope: int, element: int) -> dict[int, int] | None:
    """{layer: its rotary table's bytes} for the layers that build one (Gemma 3, one stage): the first sliding
    layer the local table (max_position_embeddings x head_dim), the first full layer the rest of `rope` (the
    two tables' total, budget.rope_tables); None where the layer kinds leave it open."""
    kinds = cached_layers(geometry).layer_kinds
    positions = geometry.text_config.get("max_position_embeddings")
    if SLIDING not in kinds or not isinstance(positions, int):
        return None
    local = positions * geometry.head_dim * element if rope else 0
    full = [index for index, kind in enumerate(kinds) if kind != SLIDING]
    if rope and (not full or rope <= local):
        return None
    return {kinds.index(SLIDING): local, **({full[0]: rope - local} if full else {})}


def _siglip_tower(geometry: ModelGeometry, *, element: int, tp: int) -> list[int] | None:
    """Gemma 3's vision tower and projector tensors in creation order (models/siglip.py, gemma3_mm.py), or None
    where not derived (TP > 1, a size missing): the patch embedding and its bias, the position embedding, its
    position ids (int64); each layer's qkv_proj, out_proj, layer_norm1, fc1, fc2, layer_norm2 (weight, bias
    each); the post layernorm; the projector's input projection [H_vision, H_text] and its soft-embedding norm."""
    vision = geometry.vision_config
    sizes = [vision.get(key) for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "image_size",
                                         "patch_size")]
    channels = vision.get("num_channels") or 3
    if tp != 1 or not all(isinstance(size, int) and size > 0 for size in sizes) or not isinstance(channels, int):
        return None
    hidden, inter, layers, image, patch = (int(size) for size in sizes)  # type: ignore[arg-type]
    if layers > TOWER_LAYERS_MAX:  # a stranger's config: the list below is 12 entries a layer
        return None
    patches = (image // patch) ** 2
    layer = [3 * hidden * hidden * element, 3 * hidden * element, hidden * hidden * element, hidden * element,
             hidden * element, hidden * element, inter * hidden * element, inter * element,
             hidden * inter * element, hidden * element, hidden * element, hidden * element]
    # siglip.py SiglipVisionEmbeddings: the patch convolution, the position embedding, then its position ids
    # (registered first, created last; a small-pool tensor, so the order beside the large ones changes nothing).
    return ([hidden * channels * patch * patch * element, hidden * element, patches * hidden * element, patches * 8]
            + layer * layers + [hidden * element] * 2 + [hidden * geometry.hidden_size * element, hidden * element])


def _moe_tensors(geometry: ModelGeometry, *, element: int, tp: int) -> list[int] | None:
    """One rank's MoE block of a layer (FUSED_MOE), the experts split over `tp` ranks; None where a layer may
    be dense or a size is missing (linear_tensors.sparse_experts, deepseek_v2_moe)."""
    shape = sparse_experts(geometry)
    if shape is None:
        return None
    experts, inter = shape
    hidden = geometry.hidden_size
    router = experts * hidden * element
    shared: list[int] = []
    if geometry.architecture == DEEPSEEK_V2:
        moe = deepseek_v2_moe(geometry)
        if moe is None:
            return None
        shared = plain_mlp(moe.shared_experts * inter // tp, hidden, element) if moe.shared_experts else []
    elif geometry.architecture == GLM4_MOE:
        shared_experts = geometry.text_config.get("n_shared_experts") or 0
        if not isinstance(shared_experts, int):
            return None
        # its router and the router's e_score_correction_bias in float32 (glm4_moe.py Glm4MoE: the gate's
        # params_dtype), not the model dtype
        router = experts * hidden * SCALAR_BYTES
        shared = [experts * SCALAR_BYTES] + (plain_mlp(shared_experts * inter // tp, hidden, element)
                                             if shared_experts else [])
    elif geometry.architecture == "Qwen2MoeForCausalLM":
        shared_inter = geometry.text_config.get("shared_expert_intermediate_size")
        if not isinstance(shared_inter, int):
            return None
        shared = [hidden * element, *plain_mlp(shared_inter // tp, hidden, element)]
    return [router, *shared, *fused_experts(experts, inter // tp, hidden, element)]


def _dense_layers(geometry: ModelGeometry) -> int:
    """How many of the model's first layers are dense (GLM-4 MoE's and DeepSeek's first_k_dense_replace)."""
    value = geometry.text_config.get("first_k_dense_replace") if geometry.architecture in (GLM4_MOE, DEEPSEEK_V2) \
        else 0
    return value if isinstance(value, int) and value > 0 else 0


def _mla_attention(geometry: ModelGeometry, *, element: int, tp: int) -> tuple[list[int], list[int]] | None:
    """DeepSeek-V2's attention tensors without a q LoRA in vLLM's order: ([kv_a_proj_with_mqa, q_proj,
    kv_a_layernorm, kv_b_proj], [o_proj]); None with a q LoRA (linear_tensors.mla_projections)."""
    projections = mla_projections(geometry, element, tp)
    if projections is None:
        return None
    return ([projections.kv_a_proj_with_mqa, projections.q_proj, projections.kv_a_layernorm, projections.kv_b_proj],
            [projections.o_proj])


def stage_tensors(geometry: ModelGeometry, *, element: int, tp: int, rope: int, layers: int, first: bool,
                  last: bool, experts_tp: int | None = None, start: int = 0) -> list[int] | None:
    """One rank's tensors of a pipeline stage of `layers` decoder layers, in the order vLLM's modules
    create them, or None where they are not derived: Gemma's normalizer, the embedding (first stage),
    each layer's qkv_proj and o_proj, the rotary table (built by the stage's first attention layer;
    get_rope caches it), the attention's scalars, Qwen3's q/k norms, gate_up_proj and down_proj, two
    norms (four for GLM-4 and Gemma 2), then the final norm and the lm_head (last stage; tied, it is the
    embedding)."""
    stage = _stage(geometry, element=element, tp=tp, rope=rope, layers=layers, first=first, last=last,
                   experts_tp=experts_tp, start=start)
    return stage[0] if stage is not None else None


def awq_marlin_replay(tensors: list[int], linears: list[list[int]]) -> allocator.CachingAllocator:
    """Torch's reservation beyond the live tensors after vLLM 0.27+ loads an AWQ checkpoint for Marlin and
    empties the cache: the modules' tensors in order, then, linear layer by linear layer in module order,
    every allocation and free `process_weights_after_loading` makes (0.28.0 quantization/auto_awq.py:531-537):

    - `_convert_awq_to_standard_format` (auto_awq.py:93-168): the AWQ order undone on int32 copies eight times
      the packed tensor (`>>` then `&`, the reorder, `<<`; each expression's operand freed once the next
      exists), summed into the repacked qweight, which replaces the checkpoint's; the same for qzeros; the
      unpacked copies, the reverse order and the shifts freed at the end;
    - MarlinLinearKernel.process_weights_after_loading (kernels/linear/mixed_precision/marlin.py:89-216): the
      workspace, kept; the zero points unpacked to the device (quant_utils.py:912-940, eight times qzeros),
      permuted and interleaved (two more copies, marlin_utils.py:512-533) and packed back (one qzeros); the
      repacked qweight (gptq_marlin_repack); the permuted scales (:470-480); the permuted bias (:483-487), each
      replacing the previous tensor (_transform_param, MPLinearKernel.py:69-79).

    Views, `.contiguous()` of a contiguous tensor and host copies allocate nothing on the device."""
    replay = allocator.CachingAllocator()
    handles = [replay.malloc(size) for size in tensors]
    for positions in linears:
        q, z, s = (tensors[i] for i in positions[:3])
        weight, zeros, scales = positions[:3]
        bias = positions[3] if len(positions) > 3 else None
        order, shifts = replay.malloc(8 * 8), replay.malloc(8 * 4)  # long[8], int32[8]
        kept_q, new_q = _unpacked(replay, q)
        replay.free(handles[weight])
        kept_z, new_z = _unpacked(replay, z)
        replay.free(handles[zeros])
        handles[weight], handles[zeros] = new_q, new_z
        for handle in (kept_q, kept_z, order, shifts):
            replay.free(handle)
        replay.malloc(MARLIN_WORKSPACE_BYTES)
        first = replay.malloc(8 * z)  # unpack_cols(...).to(device)
        second = replay.malloc(8 * z)  # [:, scale_perm]
        replay.free(first)
        third = replay.malloc(8 * z)  # [:, interleave]
        replay.free(second)
        packed = replay.malloc(z)  # pack_cols(...).to(device)
        replay.free(third)
        replay.free(handles[zeros])
        handles[zeros] = packed
        for position, size in ((weight, q), (scales, s)) + (((bias, tensors[bias]),) if bias is not None else ()):
            new = replay.malloc(size)
            replay.free(handles[position])
            handles[position] = new
    replay.empty_cache()
    return replay


def _replayed(tensors: list[int], linears: list[list[int]]) -> tuple[int, int, int]:
    """(bytes reserved beyond the tensors, free blocks among them, the load's peak beyond the tensors) of a
    stage's tensors, through the AWQ conversion and Marlin repack where `linears` are given."""
    if linears:
        replay = awq_marlin_replay(tensors, linears)
        return replay.reserved - replay.allocated, replay.free_bytes, replay.peak - sum(tensors)
    replay = allocator.replay(tensors)
    return replay.reserved - replay.allocated, replay.free_bytes, 0


def _unpacked(replay: allocator.CachingAllocator, packed: int) -> tuple[int, int]:
    """One tensor through `_convert_awq_to_standard_format`: (the unpacked copy, freed at the function's end;
    the repacked tensor). The reshapes split or transpose dimensions: views (qzeros' transpose too, whose
    reshape only splits its first dimension)."""
    shifted = replay.malloc(8 * packed)
    masked = replay.malloc(8 * packed)
    replay.free(shifted)
    kept = replay.malloc(8 * packed)  # the reorder
    replay.free(masked)
    widened = replay.malloc(8 * packed)  # <<
    repacked = replay.malloc(packed)  # .sum
    replay.free(widened)
    return kept, repacked


def weight_segments(geometry: ModelGeometry, *, element: int, tp: int, pp: int, rope: int,
                    compute_capability: tuple[int, int] | None, quantization: str | None,
                    experts_tp: int | None = None) -> WeightSegments:
    """What torch reserves around one rank's weights, on the heaviest stage: derived where the modules are,
    else half the rounding bound with the other half as the band. `quantization`: a pinned --quantization
    (another method's modules than the checkpoint's are not derived); `experts_tp` as `_stage`'s."""
    method = scheme(geometry)
    pinned_other = quantization is not None and (method is None or method.name is None
                                                 or quantization not in _PINNED_SAME[method.name])
    marlin = method is not None and runs_marlin(method.name, compute_capability)
    awq = method is not None and method.name == "awq" and marlin
    # The geometry's config dicts are not in its hash: what the tensors take from them is (scheme, bias).
    replayed = None if pinned_other or method is None else _stages_replayed(
        geometry, method, qkv_bias(geometry), element=element, tp=tp, pp=pp, rope=rope, awq=awq, experts_tp=experts_tp)
    if replayed is None or method is None:
        bound = BOUND_PER_LAYER * max(len(stage) for stage in pp_partitions(geometry.num_layers, max(pp, 1)))
        return WeightSegments(bound // 2, bound // 2, f"not derived for {geometry.architecture}: up to "
                              f"{bound // MiB} MiB of rounding (2 MiB per large linear tensor), half counted",
                              derived=False)
    count, linears, slack, holes, load_peak_extra = replayed
    rule = f"around {count} tensors of vLLM's {geometry.architecture} modules" + (
        f", replayed through the AWQ conversion and Marlin repack of {linears} linear layers after loading"
        if awq else "")
    repack = error = 0
    repack_rule = ""
    if marlin and not awq:  # weight-only FP8 below sm89: bounded (linear_tensors.marlin_leftovers)
        layer, rows = marlin_layer(geometry, element, tp, method)
        most = max(len(stage) for stage in pp_partitions(geometry.num_layers, max(pp, 1)))
        repack, error, repack_rule = marlin_leftovers(layer, linear_layers=4 * most, layer_rows=rows,
                                                      row_scales=True)
    return WeightSegments(slack - holes // 2 + repack, holes // 2 + error,
                          f"{slack / MiB:.1f} MiB of segments {rule}, {holes / MiB:.1f} MiB of them free blocks "
                          "that what the profile run keeps may fill (half counted)"
                          + (f"; {repack_rule}" if repack_rule else ""), load_peak_extra=load_peak_extra)


@functools.lru_cache(maxsize=256)
def _stages_replayed(geometry: ModelGeometry, method: Scheme, bias: bool, *, element: int, tp: int, pp: int,
                     rope: int, awq: bool, experts_tp: int | None) -> tuple[int, int, int, int, int] | None:
    """(tensors, linear layers, bytes reserved beyond the tensors, free blocks among them, the load's peak beyond
    the tensors) on the stage whose counted share (reserved less half the free blocks) is the largest; None where
    not derived. Kept per shape: `fit` plans one model on many cards and layouts, a plan sizes it several times,
    and a replay walks every tensor (about 1 s at 4,096 layers)."""
    del method, bias  # in the key only (scheme(geometry), qkv_bias(geometry))
    stages = pp_partitions(geometry.num_layers, max(pp, 1))
    derived = [_stage(geometry, element=element, tp=tp, rope=rope, layers=len(stage), first=index == 0,
                      last=index == len(stages) - 1, experts_tp=experts_tp, start=stage.start)
               for index, stage in enumerate(stages)]
    if any(stage is None for stage in derived):
        return None
    built = [stage for stage in derived if stage is not None]
    # The profile run comes between loading and vLLM's measurement: what it keeps may sit in the free blocks
    # around the weights instead of new segments. Half of them counted, the other half the band.
    replays = [_replayed(tensors, linears if awq else []) for tensors, linears in built]
    slack, holes, _ = max(replays, key=lambda replay: replay[0] - replay[1] // 2)
    return (max(len(tensors) for tensors, _ in built), max(len(linears) for _, linears in built), slack, holes,
            max(replay[2] for replay in replays))
