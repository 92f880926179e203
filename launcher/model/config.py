"""A model's KV geometry and real weight bytes, from config.json and checkpoint metadata.

`geometry_from_config` is pure: a config dict in, a `ModelGeometry` out, or one
`ModelConfigError` naming the field that is missing or wrong. Where a config class in
transformers fills defaults the raw JSON leaves out (Qwen2's `use_sliding_window`,
Gemma 2's alternating layers), we apply the same defaults, because the engines see the
config through transformers.

Resolution of what the operator typed (an alias, a local directory, a Hugging Face id)
lives in `launcher.model.resolve`; this module does no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.common.errors import ModelConfigError, UnsupportedModel

# Layer kinds that hold a KV cache, and the ones that hold a per-request state instead.
FULL = "full"
SLIDING = "sliding"
MLA = "mla"
LINEAR = "linear"  # linear attention / Mamba / SSM: a fixed-size state per request
NO_CACHE = "none"  # a decoder layer with neither KV cache nor state (Nemotron-H's MLP / MoE layers)

_LINEAR_LAYER_TYPES = {"linear_attention", "mamba", "mamba2", "ssm", "conv", "gated_delta_net", "short_conv"}
_HYBRID_MODEL_TYPES = {
    "jamba", "mamba", "mamba2", "falcon_mamba", "falcon_h1", "nemotron_h", "zamba", "zamba2",
    "bamba", "granitemoehybrid", "qwen3_next", "lfm2", "minimax", "minimax_m1", "plamo2",
    "qwen3_5", "qwen3_5_moe", "kimi_linear",
}

# Models with no attention layer at all (vLLM MambaModelConfig: every layer keeps a state).
ATTENTION_FREE_MODEL_TYPES = frozenset({"mamba", "mamba2", "falcon_mamba"})
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")  # n_heads: DBRX

# Keys an engine may read the maximum length from (vLLM takes the smallest present;
# SGLang the first in its own order). Kept here so both engines see one parsed config.
MAX_LEN_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
    "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len",
)

# torch dtype names a config.json may carry (transformers writes str(torch.dtype) without
# "torch."); anything else ("banana") is a broken config, not a dtype to plan with.
KNOWN_DTYPES = frozenset({
    "float32", "float", "fp32", "float16", "half", "fp16", "bfloat16", "bf16",
    "float8_e4m3fn", "float8_e5m2", "fp8", "float64", "double", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "int8", "uint8",
})

# Counts and sizes in config.json stay far below this (the largest vocabularies are ~10**6);
# a bound keeps a fuzzed 10**400 out of the planner's arithmetic.
_MAX_CONFIG_INT = 1 << 32
# Lengths may be larger: tokenizers write int(1e30) for "no limit", and vLLM reads it as such.
_MAX_CONFIG_LENGTH = 10**31
_MAX_ROPE_FACTOR = 1 << 16
# Layers are listed one by one (layer_kinds): 2**31 of them would take 16 GiB before any
# check, and the planners walk them per plan. The deepest published decoders have a few hundred.
_MAX_LAYERS = 1 << 12


@dataclass(frozen=True)
class MlaDims:
    """Multi-head latent attention: one compressed latent per token per layer."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int

    @property
    def latent_dim(self) -> int:
        """Elements cached per token per layer (no separate K and V)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class Quantization:
    method: str  # awq, gptq, fp8, compressed-tensors, bitsandbytes, mxfp4, ...
    bits: int | None = None
    kv_cache_scheme: str | None = None  # a checkpoint that asks for an fp8 KV cache


@dataclass(frozen=True)
class ModelGeometry:
    """What sizes the KV cache and the activations, read from config.json."""

    architecture: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    vocab_size: int
    # One of FULL, SLIDING, MLA, LINEAR per decoder layer, as config.json states them; an engine's
    # planner binds the layers its model code builds (launcher/engines/<engine>/architectures.py).
    layer_kinds: tuple[str, ...]
    sliding_window: int | None
    config_dtype: str | None  # as written in config.json (torch_dtype / dtype)
    intermediate_size: int | None = None
    mla: MlaDims | None = None
    quantization: Quantization | None = None
    num_experts: int | None = None
    experts_per_token: int | None = None
    is_multimodal: bool = False
    vision_layers: int | None = None
    vision_hidden_size: int | None = None
    tie_word_embeddings: bool = False
    # The text config as the engines read it, for engine-specific derivations
    # (maximum length and rope scaling differ between vLLM and SGLang).
    text_config: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # The vision tower's config as written (vision_config), for engine-specific encoder terms.
    vision_config: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # A multimodal wrapper's own scalar entries (Gemma 3's mm_tokens_per_image, Mistral 3's
    # spatial_merge_size, LLaVA's vision_feature_select_strategy): what sizes the encoder's dummy inputs.
    wrapper_config: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def expert_intermediate_size(self) -> Any:
        """One routed expert's intermediate size as written: `moe_intermediate_size`, else (Mixtral, gpt-oss,
        Llama 4) `intermediate_size`; not validated here (callers check it is a positive int)."""
        return self.text_config.get("moe_intermediate_size") or self.intermediate_size

    @property
    def kv_layers(self) -> int:
        return sum(1 for kind in self.layer_kinds if kind not in (LINEAR, NO_CACHE))

    @property
    def is_hybrid(self) -> bool:
        return len(set(self.layer_kinds) - {NO_CACHE}) > 1

    @property
    def has_linear_layers(self) -> bool:
        return LINEAR in self.layer_kinds

    def kv_bytes_per_token(self, kv_dtype_bytes: int, tp: int = 1) -> int:
        """Bytes one token occupies across all KV layers on one rank, ignoring windows.

        The plain formula the worked examples use: 2 (K and V) x layers x kv heads x
        head_dim x dtype bytes; MLA caches one latent of kv_lora_rank + rope dims.
        """
        if self.mla is not None:
            return self.kv_layers * self.mla.latent_dim * kv_dtype_bytes
        heads = kv_heads_per_rank(self.num_kv_heads, tp)
        return self.kv_layers * heads * (self.head_dim + self.v_head_dim) * kv_dtype_bytes


def kv_heads_per_rank(total_kv_heads: int, tp: int) -> int:
    """KV heads one tensor-parallel rank holds; fewer heads than ranks are replicated."""
    return max(1, total_kv_heads // tp)


# --------------------------------------------------------------------------- parsing


def partial_rotary_factor(text: Mapping[str, Any]) -> float | None:
    """The share of each head the rotary embedding covers: `partial_rotary_factor` as written (1.0 when absent), None
    where it is no number in (0, 1] (a string, a boolean, NaN, infinity, 0 or a negative: no head is that)."""
    factor = text.get("partial_rotary_factor", 1.0)
    return float(factor) if _is_number(factor) and 0 < factor <= 1 else None


def text_config_of(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's config: `text_config` of multimodal wrappers, else the config.

    Keys missing from the sub-config (a wrapper may keep `torch_dtype` at the top)
    fall back to the wrapper's.
    """
    for key in ("text_config", "llm_config", "language_config"):
        sub = config.get(key)
        if isinstance(sub, Mapping):
            merged = {k: v for k, v in config.items() if k not in ("text_config", "llm_config", "language_config")}
            merged.update(sub)
            return merged
    return config


def geometry_from_config(config: Mapping[str, Any]) -> ModelGeometry:
    """Parse config.json into a `ModelGeometry`, or raise one `ModelConfigError`."""
    if not isinstance(config, Mapping):
        raise ModelConfigError("config.json: expected a JSON object at the top level")
    text = text_config_of(config)
    architectures = config.get("architectures") or text.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ModelConfigError("config.json: 'architectures' must be a list of class names")
    model_type = _opt_str(text, "model_type") or _opt_str(config, "model_type") or ""
    architecture = architectures[0] if architectures else model_type or "unknown"

    pattern = _hybrid_pattern(text)
    if pattern is not None and _first_int(text, ("num_hidden_layers", "n_layer", "num_layers", "n_layers")) is None:
        num_layers = len(pattern)  # NemotronHConfig (transformers 5) writes only layers_block_type
    else:
        num_layers = _req_int(text, "num_hidden_layers", aliases=("n_layer", "num_layers", "n_layers"))
    if num_layers > _MAX_LAYERS:
        raise ModelConfigError(
            f"config.json: 'num_hidden_layers' of {num_layers} is beyond any model (at most {_MAX_LAYERS})")
    hidden = _req_int(text, "hidden_size", aliases=("n_embd", "d_model"))
    heads, kv_heads, head_dim = _attention_heads(text, model_type, hidden)
    v_head_dim = head_dim
    vocab = _opt_int(text, "vocab_size") or 0
    if vocab <= 0:
        raise ModelConfigError("config.json: missing 'vocab_size' (needed for the sampler's memory)")

    mla = _mla_dims(text, model_type)
    if mla is not None:
        v_head_dim = mla.v_head_dim

    layer_kinds, window = _layer_kinds(text, model_type, num_layers, mla is not None)
    _check_engine_numbers(text)

    is_multimodal, vision_layers, vision_hidden = _vision(config)

    return ModelGeometry(
        architecture=architecture,
        model_type=model_type,
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        vocab_size=vocab,
        layer_kinds=layer_kinds,
        sliding_window=window,
        config_dtype=_config_dtype(config, text),
        intermediate_size=_intermediate_size(text),
        mla=mla,
        quantization=_quantization(config, text),
        num_experts=(_first_int(text, ("num_local_experts", "n_routed_experts", "num_experts"))
                     or _moe_num_experts(text)),
        experts_per_token=_first_int(text, ("num_experts_per_tok", "moe_top_k", "top_k_experts")),
        is_multimodal=is_multimodal,
        vision_layers=vision_layers,
        vision_hidden_size=vision_hidden,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        text_config=dict(text),
        vision_config=dict(vision) if isinstance(vision := config.get("vision_config"), Mapping) else {},
        wrapper_config={key: value for key, value in config.items()
                        if is_multimodal and isinstance(value, (str, int, float, bool))},
    )


def _attention_heads(text: Mapping[str, Any], model_type: str, hidden: int) -> tuple[int, int, int]:
    """(attention heads, KV heads, head_dim) under the names the config families use."""
    if model_type in ATTENTION_FREE_MODEL_TYPES and _first_int(text, _HEAD_KEYS) is None:
        heads = 1  # Mamba-1 configs name no attention heads: the model has no attention layer
    else:
        heads = _req_int(text, "num_attention_heads", aliases=_HEAD_KEYS[1:])
    kv_heads = _first_int(text, ("n_head_kv", "num_kv_heads", "num_key_value_heads",
                                 "multi_query_group_num", "num_attention_groups"))
    attn_config = text.get("attn_config")
    if kv_heads is None and isinstance(attn_config, Mapping):
        kv_heads = _opt_int(attn_config, "kv_n_heads")  # DBRX (vLLM DbrxModelArchConfigConvertor)
    if model_type in ("falcon", "RefinedWeb", "RefinedWebModel") and not text.get("new_decoder_architecture"):
        # Falcon's old decoder ignores num_kv_heads: multi_query means one KV head, else MHA
        # (vLLM models/falcon.py:116-121, FalconModelArchConfigConvertor).
        kv_heads = 1 if text.get("multi_query", True) else heads
    if kv_heads is None:
        kv_heads = 1 if text.get("multi_query") is True else heads
    elif kv_heads <= 0:
        raise ModelConfigError(f"config.json: 'num_key_value_heads' must be positive, not {kv_heads}")
    head_dim = _opt_int(text, "head_dim")
    if not head_dim:
        head_dim = _opt_int(text, "hidden_size_per_head") or 0
    if not head_dim:
        if hidden % heads:
            raise ModelConfigError(
                f"config.json: no 'head_dim', and hidden_size {hidden} is not a multiple of "
                f"num_attention_heads {heads}")
        head_dim = hidden // heads
    return heads, kv_heads, head_dim


def _vision(config: Mapping[str, Any]) -> tuple[bool, int | None, int | None]:
    """(is multimodal, vision tower depth, its width)."""
    vision = config.get("vision_config")
    is_multimodal = isinstance(vision, Mapping) or "text_config" in config
    vision_layers = vision_hidden = None
    if isinstance(vision, Mapping):
        # Only num_hidden_layers: SGLang's VLM adjustment reads that key and falls back to 24
        # (Qwen2.5-VL names its depth "depth").
        vision_layers = _opt_int(vision, "num_hidden_layers")
        vision_hidden = _opt_int(vision, "hidden_size")
    return is_multimodal, vision_layers, vision_hidden


def refuse_unsupported(geometry: ModelGeometry) -> None:
    """Raise `UnsupportedModel` for layouts whose KV size we would only guess."""
    # A hybrid class whose config lists every layer as attention (Granite 4.0 micro) is not hybrid.
    all_attention = isinstance(geometry.text_config.get("layer_types"), list) and not geometry.has_linear_layers
    if geometry.has_linear_layers or (geometry.model_type in _HYBRID_MODEL_TYPES and not all_attention):
        linear = sum(1 for kind in geometry.layer_kinds if kind == LINEAR)
        raise UnsupportedModel(
            f"{geometry.architecture} is a hybrid model ({linear} of {geometry.num_layers} layers keep a "
            "linear-attention/Mamba state per request); safe-serve does not size that state yet",
            hint="pin --kv-cache-memory-bytes (vLLM) or --max-total-tokens (SGLang), or pass --trust-engine",
        )


def _mla_dims(text: Mapping[str, Any], model_type: str) -> MlaDims | None:
    rank = _opt_int(text, "kv_lora_rank")
    if not rank:
        return None
    rope = _req_int(text, "qk_rope_head_dim")
    nope = _opt_int(text, "qk_nope_head_dim") or 0
    v_head = _opt_int(text, "v_head_dim") or nope
    return MlaDims(kv_lora_rank=rank, qk_rope_head_dim=rope, qk_nope_head_dim=nope, v_head_dim=v_head)


def _layer_kinds(text: Mapping[str, Any], model_type: str, num_layers: int,
                 is_mla: bool) -> tuple[tuple[str, ...], int | None]:
    """Per-layer attention kind and the sliding window, as config.json states them."""
    if model_type in ATTENTION_FREE_MODEL_TYPES:
        return (LINEAR,) * num_layers, None
    hybrid = _hybrid_layer_kinds(text, model_type, num_layers, is_mla)
    if hybrid is not None:
        return hybrid, None
    window = _opt_int(text, "sliding_window")
    if window == 0:
        window = None  # some checkpoints write 0 for "no window"; vLLM treats it so
    layer_types = text.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise ModelConfigError(
                f"config.json: 'layer_types' must list one type per layer ({num_layers} layers)")
        kinds = []
        for entry in layer_types:
            if not isinstance(entry, str):
                raise ModelConfigError(f"config.json: 'layer_types' entries must be names, not {_short(entry)}")
            if entry in _LINEAR_LAYER_TYPES:
                kinds.append(LINEAR)
            elif entry in ("sliding_attention", "chunked_attention") and window:
                kinds.append(SLIDING)
            else:
                kinds.append(MLA if is_mla else FULL)
        return tuple(kinds), window if SLIDING in kinds else None

    # Without layer_types: one kind for every layer. Which layers an engine's model code makes
    # slide (Gemma 2's alternation, Qwen2's use_sliding_window) is that engine's table:
    # LAYER_PATTERNS in launcher/engines/<engine>/architectures.py.
    kinds = [SLIDING if window else MLA if is_mla else FULL] * num_layers
    if is_mla:
        kinds = [MLA if kind == FULL else kind for kind in kinds]
    return tuple(kinds), window if SLIDING in kinds else None


# Nemotron-H's pattern letters (vLLM models/nemotron_h.py:549-554) and transformers 5's names for them.
_PATTERN_KINDS = {"M": LINEAR, "*": FULL, "-": NO_CACHE, "E": NO_CACHE, "linear_attention": LINEAR, "mamba": LINEAR,
                  "full_attention": FULL, "attention": FULL, "mlp": NO_CACHE, "moe": NO_CACHE}


def _hybrid_pattern(text: Mapping[str, Any]) -> list[str] | None:
    """Nemotron-H's layer pattern: `hybrid_override_pattern` ("M-M*") or transformers 5's `layers_block_type`."""
    if text.get("model_type") != "nemotron_h":
        return None
    raw = text.get("hybrid_override_pattern")
    if isinstance(raw, str) and raw:
        return list(raw)
    listed = text.get("layers_block_type")
    if isinstance(listed, list) and listed and all(isinstance(x, str) for x in listed):
        return list(listed)
    return None


def _hybrid_layer_kinds(text: Mapping[str, Any], model_type: str, num_layers: int,
                        is_mla: bool) -> tuple[str, ...] | None:
    """Layer kinds of the hybrid families whose configs do not say them with `layer_types`: each
    family's config class reads its own keys (`_HYBRID_READERS`)."""
    pattern = _hybrid_pattern(text)
    if pattern is not None:
        unknown = sorted({p for p in pattern if p not in _PATTERN_KINDS})
        if unknown or len(pattern) != num_layers:
            raise ModelConfigError(f"config.json: Nemotron-H layer pattern must name {num_layers} layers with "
                                   f"M, *, - or E, not {_short(pattern)}")
        return tuple(_PATTERN_KINDS[p] for p in pattern)
    reader = _HYBRID_READERS.get(model_type)
    return reader(text, num_layers, is_mla) if reader is not None else None


def _jamba_kinds(text: Mapping[str, Any], num_layers: int, is_mla: bool) -> tuple[str, ...] | None:
    period, offset = _opt_int(text, "attn_layer_period") or 8, _opt_int(text, "attn_layer_offset") or 0
    return tuple(FULL if i % period == offset else LINEAR for i in range(num_layers))


def _zamba2_kinds(text: Mapping[str, Any], num_layers: int, is_mla: bool) -> tuple[str, ...] | None:
    hybrid = text.get("hybrid_layer_ids")
    listed = text.get("layers_block_type")
    if isinstance(listed, list) and len(listed) == num_layers:
        return tuple(FULL if entry == "hybrid" else LINEAR for entry in listed)
    if isinstance(hybrid, list):
        return tuple(FULL if i in hybrid else LINEAR for i in range(num_layers))
    return None


def _qwen3_next_kinds(text: Mapping[str, Any], num_layers: int, is_mla: bool) -> tuple[str, ...] | None:
    if text.get("layer_types") is not None:
        return None
    interval = _opt_int(text, "full_attention_interval") or 4  # Qwen3NextConfig.__post_init__
    return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers))


def _lfm2_kinds(text: Mapping[str, Any], num_layers: int, is_mla: bool) -> tuple[str, ...] | None:
    if text.get("layer_types") is not None:
        return None
    full = text.get("full_attn_idxs")
    idxs = full if isinstance(full, list) else list(range(num_layers))  # Lfm2Config.__post_init__
    return tuple(FULL if i in idxs else LINEAR for i in range(num_layers))


def _kimi_linear_kinds(text: Mapping[str, Any], num_layers: int, is_mla: bool) -> tuple[str, ...] | None:
    linear_cfg = text.get("linear_attn_config")
    kda = linear_cfg.get("kda_layers") if isinstance(linear_cfg, Mapping) else None  # 1-based layer numbers
    if not isinstance(kda, list):
        return None
    return tuple(LINEAR if i + 1 in kda else (MLA if is_mla else FULL) for i in range(num_layers))


def _minimax_kinds(text: Mapping[str, Any], num_layers: int, is_mla: bool) -> tuple[str, ...] | None:
    attn_types = text.get("attn_type_list")
    if not isinstance(attn_types, list) or len(attn_types) != num_layers:
        return None
    return tuple(FULL if entry == 1 else LINEAR for entry in attn_types)  # 0: lightning (linear) attention


_HYBRID_READERS: Mapping[str, Callable[[Mapping[str, Any], int, bool], tuple[str, ...] | None]] = {
    "jamba": _jamba_kinds, "zamba2": _zamba2_kinds, "qwen3_next": _qwen3_next_kinds, "lfm2": _lfm2_kinds,
    "kimi_linear": _kimi_linear_kinds, "minimax": _minimax_kinds, "minimax_text_01": _minimax_kinds,
    "minimax_m1": _minimax_kinds,
}


def _config_dtype(config: Mapping[str, Any], text: Mapping[str, Any]) -> str | None:
    found = None
    for source in (config, text):
        for key in ("dtype", "torch_dtype"):
            value = source.get(key)
            if value is None:
                continue
            name = value.removeprefix("torch.") if isinstance(value, str) else None
            if name not in KNOWN_DTYPES:
                raise ModelConfigError(f"config.json: '{key}' must be a torch dtype name such as bfloat16, "
                                       f"not {_short(value)}")
            found = found or name
    return found


def _quantization(config: Mapping[str, Any], text: Mapping[str, Any]) -> Quantization | None:
    qc = config.get("quantization_config") or text.get("quantization_config")
    if not isinstance(qc, Mapping):
        return None
    method = str(qc.get("quant_method") or qc.get("quant_type") or "unknown").lower()
    bits = qc.get("bits") or qc.get("w_bit") or qc.get("num_bits")
    if method == "bitsandbytes":
        bits = 4 if qc.get("load_in_4bit") else 8 if qc.get("load_in_8bit") else bits
    kv_scheme = None
    if str(qc.get("kv_cache_quant_algo", "")).upper() == "FP8" or qc.get("kv_cache_scheme"):
        kv_scheme = "fp8"
    if bits is not None and not (_is_number(bits) and bits == int(bits) and 1 <= bits <= 64):
        raise ModelConfigError(f"config.json: 'quantization_config' bits must be a whole number from 1 to 64, "
                               f"not {_short(bits)}")
    return Quantization(method=method, bits=int(bits) if bits is not None else None, kv_cache_scheme=kv_scheme)


def _intermediate_size(text: Mapping[str, Any]) -> int | None:
    """The MLP width; Gemma 3n lists one per layer (Gemma3nTextConfig), the widest is kept."""
    value = text.get("intermediate_size")
    if isinstance(value, list) and value:
        return max(_opt_int({"intermediate_size": entry}, "intermediate_size") or 0 for entry in value)
    return _opt_int(text, "intermediate_size")


def _check_engine_numbers(text: Mapping[str, Any]) -> None:
    """Lengths and rope factors the engine modules read from text_config: finite, non-negative, bounded.

    They read them with `isinstance(v, (int, float))`, so NaN, inf, true or 1e400 would reach
    `int(length * factor)` there; a list would be skipped silently where transformers fails.
    """
    for key in MAX_LEN_KEYS:
        _check_number(text, key, _MAX_CONFIG_LENGTH, where=key)
    # The rotary embedding's share of a head: rotary_dim = int(head_dim x factor) in both engines.
    _check_number(text, "partial_rotary_factor", 1, where="partial_rotary_factor", positive=True)
    for key in ("rope_scaling", "rope_parameters"):
        value = text.get(key)
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise ModelConfigError(f"config.json: '{key}' must be an object, not {_short(value)}")
        entries = [value, *(v for v in value.values() if isinstance(v, Mapping))]
        for entry in entries:
            # A factor of 0 leaves no length and no table (transformers' rope validation wants >= 1).
            _check_number(entry, "factor", _MAX_ROPE_FACTOR, where=f"{key}.factor", positive=True)
            _check_number(entry, "original_max_position_embeddings", _MAX_CONFIG_LENGTH,
                          where=f"{key}.original_max_position_embeddings")


def _check_number(cfg: Mapping[str, Any], key: str, limit: float, *, where: str, positive: bool = False) -> None:
    value = cfg.get(key)
    if value is not None and not (_is_number(value) and (0 < value if positive else 0 <= value) and value <= limit):
        low = "above 0" if positive else "from 0"
        raise ModelConfigError(f"config.json: '{where}' must be a number {low} to {limit:.3g}, not {_short(value)}")


def _is_number(value: Any) -> bool:
    """A JSON number Python can do arithmetic with: not a bool, not NaN or inf, not beyond float range."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) <= _MAX_CONFIG_LENGTH  # 10**400 would overflow float() and math.isfinite
    return isinstance(value, float) and math.isfinite(value)


def _short(value: Any) -> str:
    """A bad value for the error line, cut short: a fuzzed config may hold megabytes in one field."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}..."


# --------------------------------------------------------------------------- field access


def _opt_int(cfg: Mapping[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    if value is None:
        return None
    # bool is an int in Python but not in JSON; 2.0 is accepted, as transformers' configs do.
    if not _is_number(value) or value != int(value) or not 0 <= value <= _MAX_CONFIG_INT:
        raise ModelConfigError(
            f"config.json: '{key}' must be a whole number from 0 to {_MAX_CONFIG_INT}, not {_short(value)}")
    return int(value)


def whole_number(cfg: Mapping[str, Any], key: str) -> int | None:
    """A whole number from config.json (absent: None), or the `ModelConfigError` naming the key;
    the engines' layer tables read their keys through it."""
    return _opt_int(cfg, key)


def _req_int(cfg: Mapping[str, Any], key: str, aliases: tuple[str, ...] = ()) -> int:
    value = _first_int(cfg, (key, *aliases))
    if value is None:
        raise ModelConfigError(f"config.json: missing '{key}' (needed to size the KV cache)")
    if value <= 0:
        raise ModelConfigError(f"config.json: '{key}' must be positive, not {value}")
    return value


def _first_int(cfg: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = _opt_int(cfg, key)
        if value is not None:
            return value
    return None


def _moe_num_experts(text: Mapping[str, Any]) -> int | None:
    """ERNIE 4.5's expert count, one of the keys vLLM reads (transformers_utils/config.py:65-70); its VL
    configs give a list per modality, not read here."""
    value = text.get("moe_num_experts")
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _MAX_CONFIG_INT else None


def _opt_str(cfg: Mapping[str, Any], key: str) -> str | None:
    value = cfg.get(key)
    return value if isinstance(value, str) else None


def rope_scaling_entries(text: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """rope_scaling (transformers 4) or rope_parameters (transformers 5), possibly per layer type."""
    entries: list[Mapping[str, Any]] = []
    for key in ("rope_scaling", "rope_parameters"):
        value = text.get(key)
        if isinstance(value, Mapping):
            nested = [v for v in value.values() if isinstance(v, Mapping)]
            entries.extend(nested if nested and all(isinstance(v, Mapping) for v in value.values()) else [value])
    return entries
