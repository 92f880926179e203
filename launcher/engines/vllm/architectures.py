"""How vLLM 0.32 builds each architecture's attention layers, and which of them are proven.

`vllm_layer_specs` is the per-layer KV spec vLLM's own model code builds (kind, window as the
engine passes it, KV heads and head sizes as the engine derives them, whether the layer's
cache follows `--kv-cache-dtype`). `launcher.engines.vllm.kv` groups these specs the way the
KV cache manager does.

`VERIFIED` is the table of architectures whose layout was checked against the real vLLM
0.32 CPU engine: each row names the cases in `tests/data/vllm_cpu_truth.json` (tiny random
checkpoints from `tests/tinymodels.py`, started by `tests/engine_harness.py`) that prove it,
and `tests/engines/vllm/test_architectures.py` replays them. Any other architecture is planned with the
generic rules and marked unverified by `architecture_status`.

Paths cited are inside the vLLM 0.32.0 package (`vllm/...`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from launcher.engines.layers import LayerPattern
from launcher.engines.layers import cached_layers as _bind
from launcher.engines.versions import version_key
from launcher.engines.vllm.hybrid import STATE_FAMILIES
from launcher.model.config import FULL, LINEAR, MLA, NO_CACHE, SLIDING, ModelGeometry

ENGINE_VERSION = "0.32.0"
CHUNKED = "chunked"  # chunked local attention (Llama 4): ChunkedLocalAttentionSpec

# vLLM treats a model as MLA only for these model types (and only with kv_lora_rank):
# `ModelArchConfigConvertorBase.is_deepseek_mla`, transformers_utils/model_arch_config_convertor.py:330-375.
# MiniCPM3 carries kv_lora_rank too but is not listed: it caches plain K/V (models/minicpm3.py:126-133).
_MLA_MODEL_TYPES = frozenset({
    "axk1", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_mtp", "dots3_note", "k3_dspark",
    "glm5_next", "glm5_next_text", "glm_moe_dsa", "glm4_moe_lite", "glm4_moe_lite_mtp", "kimi_k2", "kimi_linear",
    "longcat_flash", "pangu_ultra_moe", "pangu_ultra_moe_mtp", "bailing_hybrid", "hy_v4",
})
# Served by vLLM's Transformers MoE backend (`TransformersMoEForCausalLM`, model_executor/models/registry.py:
# 711-726; "PhimoeForCausalLM" is transformers 5's name for Phi-3.5-MoE, absent from vLLM's registry).
# On CPU its routing hook fails the first request (models/transformers/moe.py:392-394, `assert dp_metadata`),
# seen on the real engine in cases phimoe_tf-base and phimoe_tf-bs64.
TRANSFORMERS_MOE = frozenset({"PhimoeForCausalLM", "HunYuanMoEV1ForCausalLM", "FlexOlmoForCausalLM",
                              "MellumForCausalLM"})
# The CPU MLA decode kernel compiles one latent size only (v1/attention/backends/mla/cpu_mla.py:61-64).
CPU_MLA_HEAD_SIZES = (576,)

# vLLM's `_PREVIOUSLY_SUPPORTED_MODELS` (model_executor/models/registry.py:883-939 in 0.34.0, :797-849 in
# 0.32.0): each architecture with the last release that served it ("was supported in vLLM until v{version}",
# :1310-1318), gone from the next minor release on (MPTForCausalLM is registered in 0.28.0, not in 0.29.0;
# BambaForCausalLM in 0.23.0, not in 0.24.0). Newer removals are added as releases list them.
SUPPORTED_UNTIL: Mapping[str, str] = {
    "MPTForCausalLM": "0.28.0", "MptForCausalLM": "0.28.0", "RWForCausalLM": "0.28.0",
    "StableLMEpochForCausalLM": "0.28.0", "ArcticForCausalLM": "0.28.0", "ChameleonForConditionalGeneration": "0.28.0",
    "BaiChuanForCausalLM": "0.23.0", "BaichuanForCausalLM": "0.23.0", "QWenLMHeadModel": "0.23.0",
    "InternLMForCausalLM": "0.23.0", "XverseForCausalLM": "0.23.0", "Dots1ForCausalLM": "0.23.0",
    "JAISLMHeadModel": "0.22.0", "AquilaForCausalLM": "0.24.0", "AquilaModel": "0.24.0",
    "Grok1ForCausalLM": "0.24.0", "PersimmonForCausalLM": "0.25.0", "TeleChatForCausalLM": "0.25.0",
    "Plamo2ForCausalLM": "0.26.0", "Phi3SmallForCausalLM": "0.9.2", "Phi4FlashForCausalLM": "0.10.2",
    "BambaForCausalLM": "0.23.0", "MiniMaxForCausalLM": "0.23.0", "MiniMaxText01ForCausalLM": "0.23.0",
    "MiniMaxM1ForCausalLM": "0.23.0", "MiniMaxVL01ForConditionalGeneration": "0.23.0",
    "KeyeForConditionalGeneration": "0.33.0", "KeyeVL1_5ForConditionalGeneration": "0.33.0",
}


def removed_in(architecture: str) -> str | None:
    """The first release that no longer serves `architecture` (the minor release after its last), or None."""
    until = SUPPORTED_UNTIL.get(architecture)
    if until is None:
        return None
    major, minor = until.split(".")[:2]
    return f"{major}.{int(minor) + 1}.0"


# Which layers slide when config.json lists no `layer_types` (the config classes fill them as the
# model code reads them); with layer_types, or without a window, the config's own reading stands.
# The first row whose model types match decides (qwen2* before the others, as the model code is shared).
LAYER_PATTERNS: tuple[LayerPattern, ...] = (
    # Qwen2Config keeps a window only with use_sliding_window, from max_window_layers on.
    LayerPattern(("qwen2*", "qwen3*"), "models/qwen2.py:196-205", window_switch="use_sliding_window",
                 first_sliding_key="max_window_layers"),
    LayerPattern(("gemma2",), "models/gemma2.py:150-166 (even layers slide)", every=2),
    LayerPattern(("gemma3", "gemma3_text"), "models/gemma3.py:150-185 (5 sliding : 1 full)", every=6,
                 every_key="sliding_window_pattern"),
    LayerPattern(("cohere2",), "models/commandr.py:234-255 (3 sliding : 1 full)", every=4,
                 every_key="sliding_window_pattern"),
    # Olmo3Config / Exaone4Config without layer_types: 3 sliding : 1 full (an int pattern for EXAONE).
    LayerPattern(("olmo3",), "Transformers backend: Olmo3Config (3 sliding : 1 full)", every=4),
    LayerPattern(("exaone4",), "models/exaone4.py:172-193 (3 sliding : 1 full)", every=4,
                 every_key="sliding_window_pattern", strict=False),
)


def cached_layers(geometry: ModelGeometry) -> ModelGeometry:
    """`geometry` with the layer kinds and window vLLM's model code builds (`LAYER_PATTERNS`)."""
    return _bind(geometry, LAYER_PATTERNS)


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer's KV cache as vLLM builds it (`Attention.get_kv_cache_spec`)."""

    kind: str  # FULL, SLIDING, CHUNKED or MLA
    num_kv_heads: int  # all ranks together; a rank holds max(1, n // tp) (MLA: 1, replicated)
    head_size: int
    head_size_v: int  # 0 for MLA (one latent, no separate V): v1/kv_cache_interface.py:698
    window: int | None = None  # sliding window or attention chunk, as passed to the layer
    kv_dtype_honoured: bool = True  # False: the layer gets no cache_config and keeps "auto"


@dataclass(frozen=True)
class ArchitectureRow:
    """One verified architecture (for `safe-serve models --architectures`)."""

    architecture: str  # the class name in config.json "architectures"
    vllm_model: str  # where vLLM builds the attention layers
    layers: str  # what each layer caches
    heads: str  # where KV heads and head size come from
    kv_dtype_honoured: bool
    cases: tuple[str, ...]  # ids in tests/data/vllm_cpu_truth.json that prove the row
    engine: str = "vllm"
    engine_version: str = ENGINE_VERSION

    @property
    def switches(self) -> tuple[str, ...]:
        """The layout switches (SWITCHES) this row is proven with: those its cases use, plus the
        layer patterns a transformers config class turns into layer_types (PATTERN_SWITCHES)."""
        return tuple(sorted(set(ROW_SWITCHES.get(self.architecture, ())) | set(PATTERN_SWITCHES.get(
            self.architecture, ()))))

    def as_dict(self) -> dict[str, Any]:
        return {"architecture": self.architecture, "engine": self.engine, "engine_version": self.engine_version,
                "vllm_model": self.vllm_model, "layers": self.layers, "heads": self.heads,
                "kv_dtype_honoured": self.kv_dtype_honoured, "cases": list(self.cases),
                "switches": list(self.switches)}


# The switches each row's recorded runs use (tests/engines/vllm/test_architectures.py recomputes them from the runs).
ROW_SWITCHES: Mapping[str, tuple[str, ...]] = {
    "MistralForCausalLM": ("sliding_window",), "Phi3ForCausalLM": ("sliding_window",),
    "Starcoder2ForCausalLM": ("sliding_window",), "Gemma2ForCausalLM": ("layer_types",),
    "Gemma3ForCausalLM": ("layer_types", "sliding_window", "sliding_window_pattern"),
    "Cohere2ForCausalLM": ("layer_types",), "Olmo3ForCausalLM": ("layer_types",),
    "Exaone4ForCausalLM": ("layer_types",), "GptOssForCausalLM": ("layer_types",),
    "Llama4ForCausalLM": ("attention_chunk_size",), "Qwen2MoeForCausalLM": ("layer_types", "use_sliding_window"),
    "Gemma4ForCausalLM": ("layer_types", "per_layer_head_sizes"),
}
# A pattern the transformers config class turns into the layer_types vLLM reads (Gemma3TextConfig,
# Cohere2Config, Olmo3Config: `(i + 1) % pattern`), the same rule launcher/model/config.py applies.
PATTERN_SWITCHES: Mapping[str, tuple[str, ...]] = {
    "Gemma3ForCausalLM": ("sliding_window_pattern",), "Cohere2ForCausalLM": ("sliding_window_pattern",),
}

_GQA = "num_key_value_heads (else num_attention_heads); head_dim (else hidden_size // heads)"
_PLAIN = "every layer full attention"
_BY_TYPES = "layer_types: sliding_attention layers slide with sliding_window, the rest full"
_ALL_SW = "sliding_window without layer_types slides every layer (engine/arg_utils.py:2248-2254)"
_TF = "Transformers backend (models/transformers/base.py:590-676): "

VERIFIED: tuple[ArchitectureRow, ...] = (
    ArchitectureRow("LlamaForCausalLM", "models/llama.py:185-220", _BY_TYPES + "; else " + _PLAIN, _GQA, True,
                    ("llama-base", "llama-mml32768", "llama-mml5000", "llama-mml-default", "llama-bs32")),
    ArchitectureRow("Qwen2ForCausalLM", "models/qwen2.py:196-205", "sliding only with use_sliding_window; " + _PLAIN,
                    _GQA, True, ("qwen2-base", "qwen2-kv-fp8", "qwen2-kv-bfloat16", "qwen2-kv2GiB", "qwen2-bs16")),
    ArchitectureRow("Qwen3ForCausalLM", "models/qwen3.py:141-150", _BY_TYPES, _GQA, True,
                    ("qwen3-base", "qwen3-kv-fp8")),
    ArchitectureRow("Qwen3MoeForCausalLM", "models/qwen3_moe.py:315-323", _PLAIN, _GQA, True,
                    ("qwen3_moe-base", "qwen3_moe-kv-fp8")),
    ArchitectureRow("Qwen2MoeForCausalLM", "models/qwen2_moe.py:262-270",
                    _PLAIN + " (use_sliding_window is ignored: no per-layer window is passed)", _GQA, True,
                    ("qwen2_moe-base", "qwen2_moe-bs64", "qwen2_moe_sw-base", "qwen2_moe_sw-mml1024")),
    ArchitectureRow("MistralForCausalLM", "models/mistral.py (LlamaForCausalLM)", _ALL_SW, _GQA, True,
                    ("mistral-base", "mistral-mnbt512", "mistral-mml1024", "mistral-bs64", "mistral-bs16")),
    ArchitectureRow("MixtralForCausalLM", "models/mixtral.py:202-210", _ALL_SW + "; null window: full", _GQA, True,
                    ("mixtral-base", "mixtral-kv-fp8")),
    ArchitectureRow("GemmaForCausalLM", "models/gemma.py:183-191", _PLAIN, _GQA, True,
                    ("gemma-base", "gemma-kv-fp8")),
    ArchitectureRow("Gemma2ForCausalLM", "models/gemma2.py:150-166", _BY_TYPES + " (default: even layers slide)",
                    _GQA, True, ("gemma2-base", "gemma2-bs16", "gemma2-mnbt1024", "gemma2-disable-hybrid")),
    ArchitectureRow("Gemma3ForCausalLM", "models/gemma3.py:150-185", _BY_TYPES + " (default 5 sliding : 1 full)",
                    _GQA, True, ("gemma3-base", "gemma3-mml1024", "gemma3_swp-base", "gemma3_swp-mml1024")),
    ArchitectureRow("Phi3ForCausalLM", "models/phi3.py (LlamaForCausalLM)", _ALL_SW, _GQA, True,
                    ("phi3-base", "phi3-mml1024")),
    ArchitectureRow("PhiForCausalLM", _TF + "phi", _PLAIN, _GQA, True, ("phi-base", "phi-kv-fp8")),
    ArchitectureRow("GraniteForCausalLM", "models/granite.py:90-110, :225-235", _BY_TYPES, _GQA, True,
                    ("granite-base", "granite-bs64")),
    ArchitectureRow("GraniteMoeForCausalLM", "models/granitemoe.py:195-223", _BY_TYPES, _GQA, True,
                    ("granitemoe-base", "granitemoe-mml1000")),
    ArchitectureRow("CohereForCausalLM", "models/commandr.py:234-255", _PLAIN + " (v1 ignores layer_types)", _GQA,
                    True, ("cohere-base", "cohere-kv-fp8")),
    ArchitectureRow("Cohere2ForCausalLM", "models/commandr.py:234-255",
                    "layer_types sliding layers with window sliding_window + 1 (default 3 sliding : 1 full)",
                    _GQA, True, ("cohere2-base", "cohere2-mml1024", "cohere2-mnbt513")),
    ArchitectureRow("Starcoder2ForCausalLM", _TF + "starcoder2", _ALL_SW, _GQA, True,
                    ("starcoder2-base", "starcoder2-mml1024")),
    ArchitectureRow("GPTBigCodeForCausalLM", _TF + "gpt_bigcode", _PLAIN,
                    "multi_query: 1 KV head (the config class writes num_key_value_heads); n_head, n_embd", True,
                    ("gpt_bigcode-base", "gpt_bigcode-kv-fp8")),
    ArchitectureRow("FalconForCausalLM", "models/falcon.py:113-130, :164-181", _PLAIN + "; no window",
                    "new_decoder_architecture: num_kv_heads; else multi_query: 1; else all heads; "
                    "head = hidden_size // heads", False,
                    ("falcon-base", "falcon-kv-fp8", "falcon_ndarch-base", "falcon_ndarch-bs64")),
    ArchitectureRow("GPTNeoXForCausalLM", _TF + "gpt_neox", _PLAIN, _GQA, True,
                    ("gpt_neox-base", "gpt_neox-kv-fp8")),
    ArchitectureRow("GPTJForCausalLM", "models/gpt_j.py:104-111", _PLAIN, "n_head (MHA), n_embd // n_head", True,
                    ("gptj-base", "gptj-mml2048")),
    ArchitectureRow("OlmoForCausalLM", _TF + "olmo", _PLAIN, _GQA, True, ("olmo-base", "olmo-kv-fp8")),
    ArchitectureRow("Olmo2ForCausalLM", _TF + "olmo2", _PLAIN, _GQA, True, ("olmo2-base", "olmo2-bs64")),
    ArchitectureRow("Olmo3ForCausalLM", _TF + "olmo3", _BY_TYPES, _GQA, True, ("olmo3-base", "olmo3-mml1024")),
    ArchitectureRow("Glm4ForCausalLM", "models/glm4.py:117-126", _PLAIN, _GQA, True, ("glm4-base", "glm4-kv-fp8")),
    ArchitectureRow("DeepseekV2ForCausalLM", "models/deepseek_v2.py:580-590",
                    "MLA: one latent of kv_lora_rank + qk_rope_head_dim per token (CPU kernel: 576 only)",
                    "1 latent head (replicated on every rank)", True,
                    ("deepseek_v2-base", "deepseek_v2-bs128", "deepseek_v2-mml1000", "deepseek_v2-kv-fp8")),
    ArchitectureRow("DeepseekV3ForCausalLM", "models/deepseek_v2.py:580-590", "MLA, as DeepseekV2ForCausalLM",
                    "1 latent head (replicated on every rank)", True, ("deepseek_v3-base", "deepseek_v3-mml1000")),
    ArchitectureRow("MiniCPM3ForCausalLM", "models/minicpm3.py:126-133",
                    "full attention with plain K/V although the config has kv_lora_rank (not MLA in vLLM)",
                    "num_attention_heads KV heads; head = qk_nope_head_dim + qk_rope_head_dim", True,
                    ("minicpm3-base", "minicpm3-kv-fp8")),
    ArchitectureRow("Llama4ForCausalLM", "models/llama4.py:251-265",
                    "RoPE layers chunked local attention (attention_chunk_size), NoPE layers (no_rope_layers 0) "
                    "full; hybrid manager kept (VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1)",
                    _GQA, True, ("llama4-base", "llama4-mml8192", "llama4-mml200")),
    ArchitectureRow("Exaone4ForCausalLM", "models/exaone4.py:172-193", _BY_TYPES, _GQA, True,
                    ("exaone4-base", "exaone4-mml1024")),
    ArchitectureRow("StableLmForCausalLM", "models/stablelm.py:154-161", _PLAIN, _GQA, True,
                    ("stablelm-base", "stablelm-kv-fp8")),
    ArchitectureRow("Ernie4_5ForCausalLM", "models/ernie45.py (LlamaForCausalLM)", _PLAIN, _GQA, True,
                    ("ernie4_5-base", "ernie4_5-bs64")),
    ArchitectureRow("HunYuanDenseV1ForCausalLM", _TF + "hunyuan_v1_dense", _PLAIN, _GQA, True,
                    ("hunyuan_dense-base", "hunyuan_dense-kv-fp8")),
    ArchitectureRow("BloomForCausalLM", "models/bloom.py:127-134", _PLAIN + " (ALiBi)", "n_head (MHA)", True,
                    ("bloom-base", "bloom-kv-fp8")),
    ArchitectureRow("OPTForCausalLM", "models/opt.py:106-112", _PLAIN, "num_attention_heads (MHA)", True,
                    ("opt-base", "opt-kv-fp8")),
    ArchitectureRow("GPT2LMHeadModel", "models/gpt2.py:95-101", _PLAIN, "n_head (MHA), n_embd // n_head", True,
                    ("gpt2-base", "gpt2-kv-fp8")),
    ArchitectureRow("SmolLM3ForCausalLM", _TF + "smollm3", _BY_TYPES, _GQA, True, ("smollm3-base", "smollm3-kv-fp8")),
    ArchitectureRow("PhiMoEForCausalLM", "models/phimoe.py:356-364", _ALL_SW + "; null window: full", _GQA, True,
                    ("phimoe-base", "phimoe-bs64")),
    ArchitectureRow("DbrxForCausalLM", "models/dbrx.py:200, :248-256", _PLAIN,
                    "attn_config.kv_n_heads (DbrxModelArchConfigConvertor); n_heads, d_model", True,
                    ("dbrx-base", "dbrx-kv-fp8")),
    ArchitectureRow("SeedOssForCausalLM", _TF + "seed_oss", _BY_TYPES, _GQA, True,
                    ("seed_oss-base", "seed_oss-kv-fp8")),
    ArchitectureRow("Glm4MoeForCausalLM", "models/glm4_moe.py:286-295", _PLAIN, _GQA, True,
                    ("glm4_moe-base", "glm4_moe-kv-fp8")),
    ArchitectureRow("GlmForCausalLM", _TF + "glm", _PLAIN, _GQA, True, ("glm-base", "glm-kv-fp8")),
    ArchitectureRow("Ernie4_5_MoeForCausalLM", "models/ernie45_moe.py:278-286", _PLAIN, _GQA, True,
                    ("ernie4_5_moe-base", "ernie4_5_moe-bs64")),
    ArchitectureRow("OlmoeForCausalLM", "models/olmoe.py:180-188", _PLAIN, _GQA, True,
                    ("olmoe-base", "olmoe-kv-fp8")),
    ArchitectureRow("NemotronForCausalLM", "models/nemotron.py:232-240", _PLAIN, _GQA, True,
                    ("nemotron-base", "nemotron-mml2048")),
    ArchitectureRow("ApertusForCausalLM", "models/apertus.py:180-200", _BY_TYPES, _GQA, True,
                    ("apertus-base", "apertus-kv-fp8")),
    ArchitectureRow("ArceeForCausalLM", _TF + "arcee", _PLAIN, _GQA, True, ("arcee-base", "arcee-bs64")),
    ArchitectureRow("GraniteMoeSharedForCausalLM", "models/granitemoeshared.py:91 (GraniteMoeAttention)",
                    _BY_TYPES, _GQA, True, ("granitemoeshared-base", "granitemoeshared-kv-fp8")),
    ArchitectureRow("MiniMaxM2ForCausalLM", "models/minimax_m2.py:204-210",
                    _PLAIN + " (attn_window_size is never passed); CPU: sigmoid routing refused", _GQA, True,
                    ("minimax_m2-base", "minimax_m2-mml2048", "minimax_m2_softmax-base", "minimax_m2_softmax-kv-fp8")),
    ArchitectureRow("Gemma4ForCausalLM", "models/gemma4.py:403-509, :576-593",
                    _BY_TYPES + "; full layers take per_layer_config's head (global_head_dim, default 512) and "
                    "KV heads; the last num_kv_shared_layers cache nothing", _GQA + " per layer", True,
                    ("gemma4_text-base", "gemma4_text-mml1024")),
    ArchitectureRow("GptOssForCausalLM", "models/gpt_oss.py:170-188",
                    "even layers slide with sliding_window (layer_types ignored), odd layers full", _GQA, True,
                    ("gpt_oss-base", "gpt_oss-mml8192")),
)
# Hybrid / state-space families served by the CPU engine at two settings (launcher.engines.vllm.hybrid):
# their attention layers are plain GQA, their state layers sized as the table there says.
VERIFIED += tuple(
    ArchitectureRow(family.architecture, family.vllm_model, f"{family.mixer} state: {family.layers}",
                    f"attention {_GQA}; state {family.shape}", True, family.cases)
    for family in STATE_FAMILIES.values() if family.cases and family.cpu_failure is None)
_BY_NAME: Mapping[str, ArchitectureRow] = {row.architecture: row for row in VERIFIED}


def verified_architectures() -> list[ArchitectureRow]:
    """The verified table, sorted by architecture name (for `safe-serve models --architectures`)."""
    return sorted(VERIFIED, key=lambda row: row.architecture)


def verified_row(architecture: str) -> ArchitectureRow | None:
    return _BY_NAME.get(architecture)


# Multimodal wrappers whose language model vLLM 0.32 builds from `text_config` as a registered text
# architecture (the KV layers are that backbone's; the vision tower caches nothing). A wrapper is
# verified where its backbone row is verified for this config's switches. The backbone: a fixed
# class, or None for "text_config's own architecture" (by its model_type where it names none).
WRAPPERS: Mapping[str, tuple[str | None, str]] = {
    "Gemma3ForConditionalGeneration": ("Gemma3ForCausalLM", "models/gemma3_mm.py:561-565"),
    "Mistral3ForConditionalGeneration": (None, "models/mistral3.py:485-489"),
    "LlavaForConditionalGeneration": (None, "models/llava.py:569-573"),
    "KimiVLForConditionalGeneration": ("DeepseekV2ForCausalLM", "models/kimi_vl.py:336-340"),
    "Qwen2VLForConditionalGeneration": ("Qwen2ForCausalLM", "models/qwen2_vl.py:1422-1425"),
    "Qwen2_5_VLForConditionalGeneration": ("Qwen2ForCausalLM", "models/qwen2_5_vl.py:1444-1447"),
    "Qwen3VLForConditionalGeneration": ("Qwen3ForCausalLM", "models/qwen3_vl.py:2043-2046"),
    "Qwen3VLMoeForConditionalGeneration": ("Qwen3MoeForCausalLM", "models/qwen3_vl_moe.py:285-288"),
    "Llama4ForConditionalGeneration": ("Llama4ForCausalLM", "models/mllama4.py:780-786"),
    "Qwen3_5ForConditionalGeneration": ("Qwen3_5ForCausalLM", "models/qwen3_5.py:522-525"),
    "Qwen3_5MoeForConditionalGeneration": ("Qwen3_5MoeForCausalLM", "models/qwen3_5.py:745-748"),
}
_TEXT_ARCHITECTURE_BY_MODEL_TYPE = {"mistral": "MistralForCausalLM", "llama": "LlamaForCausalLM",
                                    "qwen2": "Qwen2ForCausalLM"}


def wrapper_backbone(geometry: ModelGeometry) -> tuple[str, str] | None:
    """(text architecture, where vLLM builds it) for a known multimodal wrapper, else None."""
    entry = WRAPPERS.get(geometry.architecture)
    if entry is None:
        return None
    backbone, source = entry
    if backbone is None:
        # The merged text config keeps text_config's own "architectures" where it has one.
        named = geometry.text_config.get("architectures")
        own = named[0] if isinstance(named, list) and named and isinstance(named[0], str) else None
        backbone = own if own and own != geometry.architecture else \
            _TEXT_ARCHITECTURE_BY_MODEL_TYPE.get(geometry.model_type)
    return (backbone, source) if backbone else None


def architecture_status(geometry: ModelGeometry) -> tuple[bool, str]:
    """(verified, note); a multimodal wrapper is read through to its text backbone's row."""
    wrapped = wrapper_backbone(geometry)
    if wrapped is None:
        return _own_status(geometry)
    backbone, source = wrapped
    verified, note = _own_status(dataclasses.replace(geometry, architecture=backbone))
    if not verified:
        return False, f"{geometry.architecture} wraps {backbone} ({source}): {note}"
    return True, (f"verified wrapper {geometry.architecture}: vLLM builds its language model as {backbone} from "
                  f"text_config ({source}); {note}")


def _own_status(geometry: ModelGeometry) -> tuple[bool, str]:
    """(verified, note): whether vLLM 0.32's KV layout for this architecture is proven.

    The note is one line for the plan notes and JSON. Unverified architectures are planned
    with the generic rules; their KV figure may be wrong and deserves a wide uncertainty band.
    """
    geometry = cached_layers(geometry)
    arch = geometry.architecture
    gone = removed_in(arch)
    if gone is not None and version_key(ENGINE_VERSION) >= version_key(gone):
        return False, (f"vLLM {ENGINE_VERSION} does not serve {arch} any more (supported until "
                       f"{SUPPORTED_UNTIL[arch]}): the engine will refuse it at start")
    row = _BY_NAME.get(arch)
    family = STATE_FAMILIES.get(arch)
    if row is None and family is not None and family.golden:
        return True, (f"verified architecture {arch}: its per-request state equals vLLM {ENGINE_VERSION}'s own "
                      "classmethods (golden file tests/data/vllm_hybrid_golden.json, no CPU engine run serves it); "
                      f"page unification and groups as proven on the CPU engine for the other hybrids "
                      f"({family.vllm_model})")
    if row is None:
        return False, (f"unverified architecture {arch}: its KV layout in vLLM {ENGINE_VERSION} was not checked "
                       "against the engine; the KV figure may be wrong")
    unproven = sorted(config_switches(geometry) - set(row.switches))
    if unproven:
        return False, (f"unverified for this config: {arch} is verified on {len(row.cases)} engine runs, but not "
                       f"with {', '.join(unproven)} (this config turns it on); the KV figure may be wrong")
    return True, (f"verified architecture {arch}: KV layout equals vLLM {ENGINE_VERSION} on "
                  f"{len(row.cases)} recorded engine runs ({row.vllm_model})")


# --------------------------------------------------------------------------- config switches

# Switches a config can turn that change the layout vLLM builds. A row is verified only for the
# switches its recorded engine runs used (`ArchitectureRow.switches`, checked against the runs by
# tests/engines/vllm/test_architectures.py); a config using another one is planned unverified, with the wide band.
# Rope scaling changes the length, not the layout: its rules are proven for every architecture by
# the engine's own length check (tests/data/vllm_checks_oracle.json, group "length").
SWITCHES = ("use_sliding_window", "sliding_window", "layer_types", "sliding_window_pattern",
            "attention_chunk_size", "kv_sharing", "per_layer_head_sizes")
GLOBAL_SWITCHES = ("rope_scaling",)


def config_switches(geometry: ModelGeometry) -> frozenset[str]:
    """The layout switches this config turns (see SWITCHES)."""
    geometry = cached_layers(geometry)
    text = geometry.text_config
    sliding = SLIDING in geometry.layer_kinds
    on = {
        "use_sliding_window": text.get("use_sliding_window") is True,
        "sliding_window": sliding and not isinstance(text.get("layer_types"), list)
        and text.get("use_sliding_window") is not True,
        "layer_types": sliding and isinstance(text.get("layer_types"), list),
        "sliding_window_pattern": sliding and text.get("sliding_window_pattern") is not None
        and not isinstance(text.get("layer_types"), list),
        "attention_chunk_size": bool(text.get("attention_chunk_size")),
        "kv_sharing": isinstance(text.get("num_kv_shared_layers"), int) and text.get("num_kv_shared_layers", 0) > 0,
        "per_layer_head_sizes": bool(text.get("per_layer_config") or text.get("global_head_dim")),
    }
    return frozenset(name for name, value in on.items() if value)


# --------------------------------------------------------------------------- per-layer specs


def uses_mla(geometry: ModelGeometry) -> bool:
    """vLLM's `ModelConfig.use_mla` (config/model.py:2050-2063), VLLM_MLA_DISABLE unset."""
    return geometry.mla is not None and geometry.model_type in _MLA_MODEL_TYPES


def vllm_layer_specs(geometry: ModelGeometry) -> tuple[LayerSpec | None, ...]:
    """The spec of every decoder layer as vLLM 0.32 builds it; None for layers with no KV cache."""
    # Keyed by model_type, not class name, so a multimodal wrapper's text stack gets the same layers
    # (its status stays unverified until a row names the wrapper).
    geometry = cached_layers(geometry)
    kinds = geometry.layer_kinds
    if geometry.mla is not None and uses_mla(geometry):
        latent = LayerSpec(MLA, 1, geometry.mla.latent_dim, 0)
        return tuple(None if kind in (LINEAR, NO_CACHE) else latent for kind in kinds)
    attention = _attention_of(geometry)
    shared_from = _first_kv_shared_layer(geometry.text_config, geometry.model_type, len(kinds))
    # None: no cache, a state instead, or the KV of an earlier layer (KV sharing).
    return tuple(None if kind in (LINEAR, NO_CACHE) or i >= shared_from else _attention_spec(attention, i, kind)
                 for i, kind in enumerate(kinds))


@dataclass(frozen=True)
class _Attention:
    """What every attention layer of one model shares, as vLLM's model code passes it."""

    model_type: str
    text: Mapping[str, Any]
    heads: int  # KV heads
    head: int  # head size
    window: int | None
    honoured: bool  # the cache follows --kv-cache-dtype


def _attention_of(geometry: ModelGeometry) -> _Attention:
    model_type = geometry.model_type
    heads, head = _attention_heads(geometry)
    window = geometry.sliding_window
    if model_type == "cohere2" and window is not None:
        window += 1  # models/commandr.py:237-244: the layer sees sliding_window + 1 tokens
    # models/falcon.py:164-181 build Attention without cache_config: the cache stays "auto".
    honoured = model_type not in ("falcon", "RefinedWeb", "RefinedWebModel")
    return _Attention(model_type, geometry.text_config, heads, head, window, honoured)


def _attention_heads(geometry: ModelGeometry) -> tuple[int, int]:
    """(KV heads, head size) of the attention layers, where the model code does not take the config's."""
    if geometry.model_type == "minicpm3" and geometry.mla is not None:
        # models/minicpm3.py:126-133: Attention(num_local_heads, qk_nope + qk_rope, num_kv_heads=num_local_heads).
        return geometry.num_attention_heads, geometry.mla.qk_nope_head_dim + geometry.mla.qk_rope_head_dim
    if geometry.model_type == "zamba2":
        # models/zamba2.py:146-199: Attention(num_attention_heads, attention_head_dim), no KV-head grouping.
        heads = geometry.num_attention_heads
        text = geometry.text_config
        attn_hidden = text.get("attention_hidden_size") or 2 * geometry.hidden_size  # Zamba2Config default
        return heads, int(text.get("attention_head_dim") or attn_hidden // heads)
    return geometry.num_kv_heads, geometry.head_dim


def _attention_spec(attention: _Attention, layer: int, kind: str) -> LayerSpec:
    """One cached attention layer's spec."""
    heads, head, window, honoured = attention.heads, attention.head, attention.window, attention.honoured
    if attention.model_type in ("gemma4", "gemma4_text"):
        layer_heads, layer_head = _gemma4_layer(attention.text, layer, heads, head)
        return LayerSpec(kind, layer_heads, layer_head, layer_head, window if kind == SLIDING else None, honoured)
    kind = _model_code_kind(attention, layer, kind)
    if kind == CHUNKED:
        return LayerSpec(CHUNKED, heads, head, head, _chunk(attention.text), honoured)
    if kind == SLIDING and window is not None:
        return LayerSpec(SLIDING, heads, head, head, window, honoured)
    return LayerSpec(FULL, heads, head, head, None, honoured)


def _model_code_kind(attention: _Attention, layer: int, kind: str) -> str:
    """The layer's kind where the model code overrides the one the config gives."""
    if attention.model_type == "qwen2_moe":
        # models/qwen2_moe.py:262-270 pass no per-layer window: every layer is full attention even
        # with use_sliding_window (cases qwen2_moe_sw-*: the engine prints the all-full figure).
        return FULL
    if attention.model_type == "gpt_oss":
        # models/gpt_oss.py:176: even layers slide, whatever layer_types says.
        return SLIDING if layer % 2 == 0 and attention.window else FULL
    if attention.model_type in ("llama4", "llama4_text"):  # also the text stack of Llama4ForConditionalGeneration
        return _llama4_kind(attention.text, layer)
    return kind


def _first_kv_shared_layer(text: Mapping[str, Any], model_type: str, num_layers: int) -> int:
    """Gemma 3n / Gemma 4: the last num_kv_shared_layers reuse an earlier layer's KV and cache nothing
    (models/gemma3n.py:311-399, models/gemma4.py:403-495: kv_sharing_target_layer_name)."""
    shared = text.get("num_kv_shared_layers")
    if model_type in ("gemma3n", "gemma3n_text", "gemma4", "gemma4_text") and isinstance(shared, int) \
            and not isinstance(shared, bool) and 0 < shared < num_layers:
        return num_layers - shared
    return num_layers


def _gemma4_layer(text: Mapping[str, Any], layer: int, heads: int, head: int) -> tuple[int, int]:
    """(KV heads, head size) of one Gemma 4 layer: `per_layer_config` (Gemma4TextConfig.__post_init__
    gives full-attention layers global_head_dim, default 512, and num_global_key_value_heads unless
    attention_k_eq_v is false); vLLM builds each layer from it (models/gemma4.py:576-593)."""
    per_layer = text.get("per_layer_config")
    if isinstance(per_layer, Mapping):
        entry = next((v for k, v in per_layer.items() if str(k).lstrip("0") == str(layer).lstrip("0")), None)
        if isinstance(entry, Mapping):
            return int(entry.get("num_key_value_heads") or heads), int(entry.get("head_dim") or head)
        return heads, head
    layer_types = text.get("layer_types")
    if not isinstance(layer_types, list) or layer >= len(layer_types) or layer_types[layer] != "full_attention":
        return heads, head
    global_heads = text.get("num_global_key_value_heads") if text.get("attention_k_eq_v", True) else None
    return int(global_heads or heads), int(text.get("global_head_dim") or 512)


def _chunk(text: Mapping[str, Any]) -> int | None:
    value = text.get("attention_chunk_size")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _llama4_kind(text: Mapping[str, Any], layer: int) -> str:
    """models/llama4.py:184-185, :251: chunked local attention on RoPE layers when a chunk is set."""
    no_rope = text.get("no_rope_layers")
    if isinstance(no_rope, list) and no_rope:
        nope = layer < len(no_rope) and no_rope[layer] == 0
    else:
        # Llama4TextConfig: an empty or missing list means every interval-th layer (default 4) is NoPE.
        interval = text.get("no_rope_layer_interval", 4)
        nope = isinstance(interval, int) and interval > 0 and (layer + 1) % interval == 0
    return FULL if nope or _chunk(text) is None else CHUNKED


def cpu_unservable(geometry: ModelGeometry, *, kv_dtype_bytes: int, cpu_amx: bool | None) -> tuple[str, str] | None:
    """(why, hint) when vLLM's CPU backend would size this model's cache and then fail, else None.

    Transformers-backend MoE models fail their first request on CPU (see TRANSFORMERS_MOE).
    MLA runs on the reference CPU kernel without AMX, which compiles one latent size and
    bf16 only (v1/attention/backends/mla/cpu_mla.py:58-64).
    """
    if geometry.architecture in TRANSFORMERS_MOE:
        return (f"vLLM serves {geometry.architecture} with its Transformers MoE backend, which sizes the cache on "
                "CPU and then fails the first request ('assert dp_metadata is not None')",
                "serve it on a GPU" + (" or name it PhiMoEForCausalLM in config.json (vLLM's own model)"
                                       if geometry.architecture == "PhimoeForCausalLM" else ""))
    scoring = geometry.text_config.get("scoring_func")  # read without a default: absent, the model fails to load
    if geometry.architecture == "MiniMaxM2ForCausalLM" and scoring != "softmax":
        # models/minimax_m2.py:96-111 route with scoring_func and no grouped top-k; the CPU router
        # takes only softmax there (model_executor/layers/fused_moe/router/cpu_router.py:238-239).
        return (f"vLLM's CPU MoE router supports softmax routing only; {geometry.architecture} routes with "
                f"{scoring!r} and fails the first request ('assert self.scoring_func == \"softmax\"')",
                "serve it on a GPU")
    if not uses_mla(geometry) or cpu_amx or geometry.mla is None:
        return None
    if geometry.mla.latent_dim not in CPU_MLA_HEAD_SIZES:
        return (f"vLLM's CPU MLA kernel (no AMX) supports a latent of {CPU_MLA_HEAD_SIZES[0]} only; "
                f"{geometry.architecture} has kv_lora_rank + qk_rope_head_dim = {geometry.mla.latent_dim}",
                "serve it on a GPU or a CPU with AMX")
    if kv_dtype_bytes == 1:
        return ("vLLM's CPU MLA kernel (no AMX) starts with an fp8 KV cache but fails the first request "
                "('expected scalar type BFloat16 but found Float8_e4m3fn')", "use --kv-cache-dtype auto")
    return None


def proof_summary() -> tuple[str, list[tuple[str, str]]]:
    """(how they were proven, [(architecture, its proof)]) for `safe-serve models --architectures`."""
    listed = [(row.architecture, f"engine run: {len(row.cases)} settings; switches: "
                                 f"{', '.join(row.switches) or 'none'}; {row.vllm_model}")
              for row in verified_architectures()]
    for family in STATE_FAMILIES.values():
        if family.golden:
            cpu = f"refused, {family.cpu_failure}" if family.cpu_failure else "cannot load it without torchvision"
            listed.append((family.architecture, "engine-code golden file (the model class's own state "
                           f"classmethods); CPU engine: {cpu}; {family.vllm_model}"))
    return (f"vLLM {ENGINE_VERSION}: verified on the real engine (tests/data/vllm_cpu_truth.json) or by its own "
            "code (tests/data/vllm_hybrid_golden.json)", sorted(listed))
