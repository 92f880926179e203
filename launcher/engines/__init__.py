"""Engine adapters: one package per engine holds all of that engine's knowledge.

`adapter(engine)` is the one door: it returns the engine's `EngineAdapter` (see `base.py`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from launcher.engines.base import EngineAdapter

ENGINES = ("vllm", "sglang")
_ADAPTERS: dict[str, EngineAdapter] = {}


def adapter(engine: str) -> EngineAdapter:
    """The adapter of `engine` ("vllm" or "sglang"); ValueError for any other name."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}: use one of {', '.join(ENGINES)}")
    found = _ADAPTERS.get(engine)
    if found is None:
        module = importlib.import_module(f"launcher.engines.{engine}.adapter")
        found = _ADAPTERS[engine] = module.ADAPTER
    return found


def figure_keys() -> tuple[str, ...]:
    """Every engine's own plan figures (the JSON keys of their memory knobs), in a stable order."""
    return tuple(key for name in ENGINES for key in adapter(name).figure_keys)


def ranks(engine: str, pinned: Mapping[str, Any]) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes from the pinned flags, in the engine's spelling."""
    return adapter(engine).ranks(pinned)
