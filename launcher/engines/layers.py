"""Which layers an engine caches, as data: per model_type, the pattern of sliding-window layers
an engine's model code builds when config.json does not list `layer_types`.

`launcher.model.config` reads what the config says: `layer_types` when it lists them, otherwise
one kind for every layer (sliding when `sliding_window` is set, else full; MLA for a latent
cache). An engine's model code knows more: Gemma 2 slides every other layer, Qwen2 slides only
with `use_sliding_window`. Each engine's `architectures.py` holds those rows (`LAYER_PATTERNS`,
citing its model files) and binds a geometry with them (`cached_layers`); this module holds the
row type and the one interpreter, so a new pattern is one row in the engine's table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.model.config import FULL, MLA, SLIDING, ModelGeometry, whole_number

if TYPE_CHECKING:
    from launcher.plan.types import PlanRequest


@dataclass(frozen=True)
class LayerPattern:
    """Which layers slide for the model types listed, when config.json has no `layer_types`.

    Every `every`-th layer (1-based) is full and the others slide, `every` read from `every_key`
    when the config sets it; or, with `first_sliding_key`, the layers from that index on slide.
    `window_switch`: the window counts only when this config key is true. `strict`: the keys
    must be whole numbers (as the config class reads them), else any positive int or the default.
    Without a window no row applies: every layer is full.
    """

    model_types: tuple[str, ...]  # exact model_type names, or prefixes ending in "*"
    source: str  # the engine's model file:line that builds these layers
    every: int = 1
    every_key: str | None = None
    window_switch: str | None = None
    first_sliding_key: str | None = None
    strict: bool = True

    def matches(self, model_type: str) -> bool:
        return any(model_type.startswith(t[:-1]) if t.endswith("*") else model_type == t for t in self.model_types)

    def read(self, text: Mapping[str, Any], key: str | None) -> int | None:
        if key is None:
            return None
        if self.strict:
            return whole_number(text, key)
        value = text.get(key)  # lenient: EXAONE writes its pattern as a string ("LLLG")
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    def kinds(self, text: Mapping[str, Any], num_layers: int, window: int | None) -> tuple[list[str], int | None]:
        """The per-layer kinds and the window that remains."""
        if self.window_switch is not None and not text.get(self.window_switch, False):
            window = None
        if self.first_sliding_key is not None:
            first = self.read(text, self.first_sliding_key) or 0
            return [SLIDING if window and i >= first else FULL for i in range(num_layers)], window
        every = self.read(text, self.every_key) or self.every
        return [SLIDING if (i + 1) % every else FULL for i in range(num_layers)], window


def cached_layers(geometry: ModelGeometry, patterns: Sequence[LayerPattern]) -> ModelGeometry:
    """`geometry` with the layer kinds and the window this engine's model code builds.

    A config that lists `layer_types` is taken as it is; otherwise the first row of `patterns`
    for the model type decides. Idempotent: it reads the config, not the kinds it replaces.
    """
    text = geometry.text_config
    window = geometry.sliding_window  # without layer_types: the configured window, on every layer
    if window is None or isinstance(text.get("layer_types"), list):
        return geometry
    pattern = next((p for p in patterns if p.matches(geometry.model_type)), None)
    if pattern is None:
        return geometry
    kinds, window = pattern.kinds(text, geometry.num_layers, window)
    if geometry.mla is not None:
        kinds = [MLA if kind == FULL else kind for kind in kinds]
    return dataclasses.replace(geometry, layer_kinds=tuple(kinds), sliding_window=window if SLIDING in kinds else None)


def request_with_cached_layers(request: PlanRequest, patterns: Sequence[LayerPattern]) -> PlanRequest:
    """`request` whose model geometry has the layers this engine caches (its planner's first step)."""
    geometry = cached_layers(request.model.geometry, patterns)
    if geometry is request.model.geometry:
        return request
    return dataclasses.replace(request, model=dataclasses.replace(request.model, geometry=geometry))
