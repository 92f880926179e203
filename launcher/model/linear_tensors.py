"""The tensors one rank's linear layers and vocabulary tables allocate, per quantization scheme, as
vLLM's and SGLang's modules create them: SGLang's linear layers and these quantization methods are
vLLM's (layers/linear.py, vocab_parallel_embedding.py, AWQ, compressed-tensors FP8), and both
engines' goldens check them tensor by tensor (tests/data/vllm_params.json, sglang_params*.json).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from launcher.model import allocator
from launcher.model.config import ModelGeometry

VOCAB_PADDING = 64  # DEFAULT_VOCAB_PADDING_SIZE (vocab_parallel_embedding.py in both engines)


def padded_vocab_rows(vocab: int, tp: int) -> int:
    """Rows of one rank's embedding: the vocab padded to 64 (64 x tp when that does not split)."""
    pad = VOCAB_PADDING if -(-vocab // VOCAB_PADDING) * VOCAB_PADDING % tp == 0 else VOCAB_PADDING * tp
    return -(-vocab // pad) * pad // tp


def vocab_padding_bytes(geometry: ModelGeometry, *, element: int, tp: int, tied: bool) -> int:
    """Rows the engine adds to the embedding (and an untied lm_head) beyond the checkpoint's share."""
    extra = (padded_vocab_rows(geometry.vocab_size, tp) * tp - geometry.vocab_size) // tp
    return extra * geometry.hidden_size * element * (1 if tied else 2)


@dataclass(frozen=True)
class Scheme:
    name: str | None  # None (model dtype), "awq", "fp8-channel", "fp8-tensor"
    group_size: int = 0


def scheme(geometry: ModelGeometry) -> Scheme | None:
    """The linear layers' tensors per quantization method, None where not derived."""
    if geometry.quantization is None:
        return Scheme(None)
    config = geometry.text_config.get("quantization_config")
    if not isinstance(config, Mapping):
        return None
    method = geometry.quantization.method
    if method == "awq" and config.get("bits", config.get("w_bit")) == 4 and config.get("zero_point", True):
        group = config.get("group_size", config.get("q_group_size"))
        # AWQ GEMM (SGLang 0.5.23 layers/quantization/awq/awq.py create_weights): qweight int32 [in, out/8],
        # qzeros int32 [in/group, out/8], scales fp16 [in/group, out]; awq_marlin (sm80+) creates the same.
        return Scheme("awq", group) if isinstance(group, int) and group > 0 else None
    if method == "compressed-tensors":
        groups = config.get("config_groups")
        if not isinstance(groups, Mapping) or len(groups) != 1:
            return None
        group_config = next(iter(groups.values()))
        weights, inputs = group_config.get("weights") or {}, group_config.get("input_activations") or {}
        if weights.get("type") != "float" or weights.get("num_bits") != 8 or config.get("ignore") not in (
                ["lm_head"], None) or weights.get("dynamic"):
            return None
        # compressed_tensors/schemes/compressed_tensors_w8a8_fp8.py create_weights: fp8 weight; a float32
        # weight_scale per output row (channel) or per fused part (tensor); a static input scale per part.
        if weights.get("strategy") == "channel" and inputs.get("dynamic"):
            return Scheme("fp8-channel")
        if weights.get("strategy") == "tensor" and inputs.get("dynamic") is False:
            return Scheme("fp8-tensor")
    return None


def linear(rows: int, cols: int, parts: int, element: int, scheme: Scheme, bias: bool) -> list[int]:
    """One rank's tensors of a linear layer of `rows` outputs and `cols` inputs (after the split),
    fused from `parts` checkpoint matrices, in the order its quantization method creates them."""
    if scheme.name == "awq":
        groups = cols // scheme.group_size
        tensors = [cols * rows // 8 * 4, groups * rows // 8 * 4, groups * rows * 2]
    elif scheme.name == "fp8-channel":
        tensors = [rows * cols, rows * 4]
    elif scheme.name == "fp8-tensor":
        tensors = [rows * cols, parts * 4, parts * 4]
    else:
        tensors = [rows * cols * element]
    return tensors + ([rows * element] if bias else [])


def layer_linears(geometry: ModelGeometry, element: int, tp: int, method: Scheme, bias: bool) -> list[list[int]]:
    """One rank's qkv_proj, o_proj, gate_up_proj and down_proj, each its tensors in creation order: QKVParallelLinear
    replicates KV heads below one per rank (linear.py); gate_up_proj is merged and column-parallel, down_proj
    row-parallel. `bias`: qkv_proj's."""
    hidden, head = geometry.hidden_size, geometry.head_dim
    heads, kv_heads = geometry.num_attention_heads // tp, max(geometry.num_kv_heads // tp, 1)
    inter = (geometry.intermediate_size or 0) // tp
    return [linear((heads + 2 * kv_heads) * head, hidden, 3, element, method, bias),
            linear(hidden, heads * head, 1, element, method, False),
            linear(2 * inter, hidden, 2, element, method, False),
            linear(hidden, inter, 1, element, method, False)]


def attention(geometry: ModelGeometry, element: int, tp: int, method: Scheme, bias: bool) -> tuple[list[int],
                                                                                                  list[int]]:
    """qkv_proj and o_proj (layer_linears)."""
    qkv, out, _, _ = layer_linears(geometry, element, tp, method, bias)
    return qkv, out


def mlp(geometry: ModelGeometry, element: int, tp: int, method: Scheme) -> list[int]:
    """gate_up_proj and down_proj (layer_linears)."""
    _, _, gate_up, down = layer_linears(geometry, element, tp, method, False)
    return gate_up + down


def sparse_experts(geometry: ModelGeometry) -> tuple[int, int] | None:
    """(experts, the experts' intermediate size) of a MoE model whose every layer is sparse; None where a layer
    may be dense (mlp_only_layers, a sparse step) or a size is missing."""
    text = geometry.text_config
    experts, inter = geometry.num_experts, text.get("moe_intermediate_size", geometry.intermediate_size)
    if not isinstance(experts, int) or not isinstance(inter, int) or text.get("mlp_only_layers") \
            or text.get("decoder_sparse_step", 1) != 1:
        return None
    return experts, inter


def fused_experts(experts: int, inter: int, hidden: int, element: int) -> list[int]:
    """FusedMoE (fused_moe layer.py in both engines): w13 [E, 2 x I, H] and w2 [E, H, I], I one rank's share of
    the intermediate size (expert parallelism off)."""
    return [experts * 2 * inter * hidden * element, experts * hidden * inter * element]


def plain_mlp(width: int, hidden: int, element: int) -> list[int]:
    """An unquantized gate_up_proj [2 x width, hidden] and down_proj [hidden, width], width one rank's share."""
    return [2 * width * hidden * element, hidden * width * element]


@dataclass(frozen=True)
class MlaProjections:
    """One rank's MLA projections without a q LoRA (models/deepseek_v2.py in both engines), in bytes:
    kv_a_proj_with_mqa and kv_a_layernorm replicated, q_proj and kv_b_proj split by heads, o_proj by its input."""

    q_proj: int
    kv_a_proj_with_mqa: int
    kv_a_layernorm: int
    kv_b_proj: int
    o_proj: int


def mla_projections(geometry: ModelGeometry, element: int, tp: int) -> MlaProjections | None:
    """MLA's projections, None for a model without MLA or with a q LoRA (DeepSeek-V3, Kimi: not derived)."""
    mla = geometry.mla
    if mla is None or geometry.text_config.get("q_lora_rank") is not None:
        return None
    hidden, heads = geometry.hidden_size, max(geometry.num_attention_heads // max(tp, 1), 1)
    return MlaProjections(
        q_proj=heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim) * hidden * element,
        kv_a_proj_with_mqa=(mla.kv_lora_rank + mla.qk_rope_head_dim) * hidden * element,
        kv_a_layernorm=mla.kv_lora_rank * element,
        kv_b_proj=heads * (mla.qk_nope_head_dim + mla.v_head_dim) * mla.kv_lora_rank * element,
        o_proj=hidden * heads * mla.v_head_dim * element)


@dataclass(frozen=True)
class DeepseekMoe:
    experts: int
    intermediate: int  # one routed expert's (moe_intermediate_size)
    shared_experts: int
    dense_layers: int  # first_k_dense_replace: the model's first layers are dense


def deepseek_v2_moe(geometry: ModelGeometry) -> DeepseekMoe | None:
    """DeepSeek-V2's MoE layout where both engines' tensors are derived: every layer from `dense_layers` on
    sparse (moe_layer_freq 1), no routing correction bias (topk_method noaux_tc adds one); None otherwise."""
    text = geometry.text_config
    experts, inter = geometry.num_experts, text.get("moe_intermediate_size")
    shared, dense = text.get("n_shared_experts"), text.get("first_k_dense_replace", 0)
    if not all(isinstance(value, int) for value in (experts, inter, shared, dense)) \
            or text.get("moe_layer_freq", 1) != 1 or text.get("topk_method") == "noaux_tc":
        return None
    return DeepseekMoe(experts, inter, shared, dense)  # type: ignore[arg-type]


def qkv_bias(geometry: ModelGeometry) -> bool:
    """Qwen2's and Qwen2-MoE's attention always has biases; the others where the config says so."""
    return geometry.architecture in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM") \
        or bool(geometry.text_config.get("attention_bias"))


def marlin_layer(geometry: ModelGeometry, element: int, tp: int, method: Scheme) -> tuple[list[int], int]:
    """(the quantized tensors of one layer's four linear layers, bias aside; their output rows), what a
    Marlin repack after loading replaces (`marlin_leftovers`)."""
    heads, kv_heads = geometry.num_attention_heads // tp, max(geometry.num_kv_heads // tp, 1)
    inter = (geometry.intermediate_size or 0) // tp
    rows = (heads + 2 * kv_heads) * geometry.head_dim + 2 * geometry.hidden_size + 2 * inter
    return [size for tensors in layer_linears(geometry, element, tp, method, False) for size in tensors], rows


MARLIN_WORKSPACE_BYTES = 1024  # marlin_make_workspace(_new): SMs x int32 per linear layer (<= 256 SMs), one block


def marlin_leftovers(layer_tensors: tuple[int, ...] | list[int], *, linear_layers: int, layer_rows: int,
                     row_scales: bool) -> tuple[int, int, str]:
    """(bytes, error, rule) a Marlin repack after loading leaves in the caching allocator's segments.

    The Marlin kernels' process_weights_after_loading (the same code in both engines: vLLM 0.28.0
    model_executor/kernels/linear/mixed_precision/marlin.py:89-175, SGLang 0.5.23 hardware_backend/gpu/
    quantization/awq_kernels.py:109-141) allocate a workspace per linear layer, then replace the weight,
    scales and zeros by tensors of the same size, each allocated before the old one is freed; the
    weight-only FP8 scheme does the same with the weight and its scales, a per-tensor scale first widened
    to one per output row (`row_scales`). The caching allocator hands each layer the block the previous
    layer freed (best fit), so at the end one block per distinct size is free: a segment of its own from
    10 MiB (released by empty_cache), else it may hold a 20 MiB segment (1-10 MiB) or a 2 MiB one (up to
    1 MiB) that live tensors share. The conversion's temporaries (AWQ's unpacked zeros, FP8's widened
    scales) may hold one more 20 MiB segment, and per-row scales up to 4 B a row. Counted: the workspaces
    and half of the rest; the band: the other half."""
    sizes = {allocator.rounded(size) for size in layer_tensors}
    bound = allocator.LARGE_BUFFER + sum(0 if size >= allocator.MIN_LARGE_ALLOC else allocator.segment_for(size)
                                         for size in sizes)
    if row_scales:
        bound += layer_rows * 4 * (linear_layers // 4)
    workspaces = -(-linear_layers * MARLIN_WORKSPACE_BYTES // allocator.SMALL_BUFFER) * allocator.SMALL_BUFFER
    return workspaces + bound // 2, bound // 2, (
        f"Marlin repack: {linear_layers} workspaces {workspaces >> 20} MiB + 0-{bound >> 20} MiB of segments "
        f"the replaced tensors ({len(sizes)} sizes) may leave")
