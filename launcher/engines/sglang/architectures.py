"""Which layers SGLang caches for an architecture, and which layouts are proven against its code."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from launcher.engines.layers import LayerPattern
from launcher.engines.layers import cached_layers as _bind
from launcher.engines.sglang.rules import NEWEST
from launcher.model.config import ModelGeometry

# Which layers slide when config.json lists no `layer_types`: SGLang reads the config through the
# same transformers config classes (srt/configs/model_config.py). Only hybrid SWA architectures
# (below) size their sliding layers apart; the others pool every layer as full attention.
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

# `is_hybrid_swa_model` (configs/model_config.py): these get a separate, smaller sliding-window
# pool. Gemma 2/3 are not on it (SGLang sizes all their layers as full attention).
HYBRID_SWA_ARCHITECTURES = frozenset({
    "GptOssForCausalLM", "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM", "IQuestQ1ForCausalLM",
    "BeamForCausalLM", "Llama4ForConditionalGeneration", "DeepseekV4ForCausalLM", "MiMoV2ForCausalLM",
    "MiMoV2FlashForCausalLM", "Step3p5ForCausalLM", "Step3p7ForConditionalGeneration", "Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration", "LagunaForCausalLM", "MellumForCausalLM",
})
DEFAULT_SWA_FULL_TOKENS_RATIO = 0.8  # --swa-full-tokens-ratio


def is_hybrid_swa(geometry: ModelGeometry, pinned: Mapping[str, Any]) -> bool:
    geometry = cached_layers(geometry)
    return (geometry.architecture in HYBRID_SWA_ARCHITECTURES and geometry.sliding_window is not None
            and not pinned.get("--disable-hybrid-swa-memory", False))


# Architectures whose KV cell size and pool SGLang's own code computed for us (the model ids in
# tests/data/sglang_oracle.json, every supported version): gemma-2-9b, llama-3.1-8b, qwen2.5-7b,
# qwen2.5-vl-7b, gpt-oss-20b, deepseek-v2-lite.
VERIFIED_ARCHITECTURES = frozenset({
    "Gemma2ForCausalLM", "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen2_5_VLForConditionalGeneration",
    "GptOssForCausalLM", "DeepseekV2ForCausalLM",
})


UNVERIFIED_KV_ERROR_FRACTION = 0.33  # as for vLLM: a layout not proven may be off as a whole


def architecture_status(geometry: ModelGeometry) -> tuple[bool, str]:
    """(verified, note) for SGLang's KV layout of this architecture."""
    arch = geometry.architecture
    if arch in VERIFIED_ARCHITECTURES:
        return True, f"verified architecture {arch}: SGLang's own pool code agrees (tests/data/sglang_oracle.json)"
    return False, (f"unverified architecture {arch}: its KV cell size in SGLang was not checked against "
                   "SGLang's code; the pool figure may be wrong")


def breakable_graph_multimodal_ok(geometry: ModelGeometry) -> bool:
    """Multimodal architectures whose breakable prefill graph SGLang keeps on."""
    return geometry.architecture in {"Qwen3_5ForConditionalGeneration", "KimiK25ForConditionalGeneration"}


def proof_summary() -> tuple[str, list[tuple[str, str]]]:
    """(how they were proven, [(architecture, its proof)]) for `safe-serve models --architectures`."""
    return (f"SGLang {NEWEST}: verified against its own pool code (tests/data/sglang_oracle.json)",
            [(name, "cell size and pool from SGLang's code") for name in sorted(VERIFIED_ARCHITECTURES)])
