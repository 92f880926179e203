"""The checkpoint's multi-token-prediction modules: tensors the engines' main model never loads.

DeepSeek-V3/R1, GLM-4.5+, Qwen3-Next, Qwen3.5, MiMo, ERNIE 4.5, LongCat-Flash, Nemotron-H and
others ship their MTP (next-n) layers in the same checkpoint as the model. Both engines' main
model skips them while loading; only a speculative-decoding draft loads them, in its own worker:

- vLLM 0.34.0: `model_executor/models/utils.py:642-668` (`get_spec_layer_idx_from_weight_name`:
  `model.layers.{L+i}.`, `layers.{L+i}.`, `model.language_model.layers.{L+i}.` for the
  `num_nextn_predict_layers` layers after the last), used by `deepseek_v2.py:1650`,
  `glm4_moe.py:495`, `glm4_moe_lite.py:378`, `step3p5.py:686`; the `mtp` prefixes dropped by
  `qwen3_next.py:848`, `qwen3_5.py:326,476`, `mimo.py:93` (`model.mtp_layers.`), `mimo_v2.py:907`,
  `ernie45_moe.py:410`, `longcat_flash.py:477`, `nemotron_h.py:735`; MiniMax-M2's
  `num_mtp_modules` layers after the last (`minimax_m2.py:376-379`).
- SGLang 0.5.23: `models/glm4_moe.py:1147-1156` and `deepseek_common/deepseek_weight_loader.py:344`
  (a layer index >= num_hidden_layers is skipped unless loading the next-n draft),
  `models/qwen3_next.py:1186` (`"mtp" in name` skipped).

This module only recognises those tensors by name and sums what the headers say they hold; whether
they are subtracted is each engine's planner's call (not under speculative decoding).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# The wrappers' prefixes before the decoder's own names (text models, VL wrappers, old VL layouts).
_PREFIXES = ("model.language_model.", "language_model.model.", "model.", "")
# Config keys that count the MTP layers numbered after the last decoder layer.
_COUNT_KEYS = ("num_nextn_predict_layers", "num_mtp_modules")
_MAX_COUNT = 64  # a larger count is no MTP stack; the layer rule is then not applied


@dataclass(frozen=True)
class DraftModules:
    """The MTP tensors a checkpoint holds: how many, their bytes (None where their headers were not
    read: shards not downloaded), and which names they are."""

    tensors: int
    bytes: int | None
    names: str  # "layer 61" / "mtp.*" / "layers 92-93 and mtp.*"

    def describe(self) -> str:
        return f"the MTP tensors ({self.names}: {self.tensors:,})"


def mtp_layer_range(text_config: Mapping[str, Any], num_layers: int) -> range:
    """The layer indices past the decoder's last that the config says are MTP layers."""
    for key in _COUNT_KEYS:
        count = text_config.get(key)
        if type(count) is int and 0 < count <= _MAX_COUNT:
            return range(num_layers, num_layers + count)
    return range(0)


def draft_kind(name: str, layers: range) -> str | None:
    """'layer N' or 'mtp' for an MTP tensor's name, else None. Linear in the name's length."""
    for prefix in _PREFIXES:
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix):]
        head, _, tail = rest.partition(".")
        if head.startswith("mtp") and tail:
            return "mtp"
        if head == "layers" and layers:
            index, dot, _ = tail.partition(".")
            # The engines match `layers.{N}.` as written: "061" is not layer 61.
            if dot and index.isascii() and index.isdigit() and len(index) <= 6 and str(int(index)) == index \
                    and int(index) in layers:
                return f"layer {index}"
    return None


def draft_names(names: Iterable[str], layers: range) -> dict[str, str]:
    """{tensor name: its kind} for the MTP tensors among `names`."""
    found: dict[str, str] = {}
    for name in names:
        kind = draft_kind(name, layers) if isinstance(name, str) else None
        if kind is not None:
            found[name] = kind
    return found


def summarize(kinds: Mapping[str, str], sizes: Mapping[str, int] | None) -> DraftModules | None:
    """The MTP tensors found, with their bytes when every one of them is in `sizes`."""
    if not kinds:
        return None
    total: int | None = None
    if sizes is not None and all(name in sizes for name in kinds):
        total = sum(sizes[name] for name in kinds)
    layer_numbers = sorted({int(kind.split()[1]) for kind in kinds.values() if kind.startswith("layer ")})
    parts = []
    if layer_numbers:
        parts.append(f"layer {layer_numbers[0]}" if len(layer_numbers) == 1
                     else f"layers {layer_numbers[0]}-{layer_numbers[-1]}")
    if "mtp" in kinds.values():
        parts.append("mtp*")
    return DraftModules(tensors=len(kinds), bytes=total, names=", ".join(parts))
