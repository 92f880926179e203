"""The configs of the models people deploy (tests/data/configs/) are each planned by vLLM's rules.

Each one is either planned with a verified layout, or planned and marked unverified (with the
reason), or refused with the engine's own reason (an architecture the release removed, a layout it
sizes and cannot serve). None ends in a config error (exit 65): the engine loads these configs.
Provenance of every file: tests/data/configs/README.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.common.errors import ModelConfigError, UnsupportedModel, WontFit
from launcher.engines.vllm.architectures import architecture_status
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.resolve import ResolvedModel
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
FILES = sorted(p for p in CONFIGS.glob("*.json"))
_EIGHT_H200 = ("8x h200",)


def _config(path: Path) -> dict[str, Any]:
    raw = json.loads(path.read_text())
    return {k: v for k, v in raw.items() if not k.startswith("_")}


def _request(path: Path, config: dict[str, Any], args: tuple[str, ...]) -> PlanRequest:
    geometry = geometry_from_config(config)
    model = ResolvedModel(name=path.stem, source="local", geometry=geometry, weight_bytes=8 * 2**30,
                          weight_bytes_source="placeholder: the KV layout is under test", config=config)
    return PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(_EIGHT_H200), engine_args=args)


def _tp(heads: int, kv_heads: int) -> int:
    """The widest of 8/4/2/1 ranks vLLM accepts for these heads (heads % tp == 0)."""
    return next(tp for tp in (8, 4, 2, 1) if heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0))


def test_there_are_sixty_real_configs() -> None:
    assert len(FILES) >= 60
    readme = (CONFIGS / "README.md").read_text()
    missing = [p.name for p in FILES if p.name not in readme]
    assert not missing, f"configs without provenance in README.md: {missing}"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_each_config_is_planned_or_refused_with_the_engines_reason(path: Path) -> None:
    config = _config(path)
    try:
        geometry = geometry_from_config(config)
    except ModelConfigError as exc:  # exit 65: a false refusal of a config the engine loads
        pytest.fail(f"{path.name}: {exc}")
    verified, note = architecture_status(geometry)
    assert note
    try:
        tp = str(_tp(geometry.num_attention_heads, geometry.num_kv_heads))
        # 4096 tokens, or the model's own positions where it has fewer (phi-2: 2048)
        positions = geometry.text_config.get("max_position_embeddings")
        length = str(min(4096, positions if isinstance(positions, int) and positions > 0 else 4096))
        plan = make_plan(_request(path, config, ("--max-model-len", length, "--tensor-parallel-size", tp)))
    except UnsupportedModel as exc:
        assert not verified, f"{path.name}: a verified architecture refused: {exc}"
        return
    except WontFit as exc:
        assert "removed" in str(exc) or "cannot" in str(exc) or not verified, f"{path.name}: {exc}"
        return
    assert plan.kv_cache_tokens > 0, path.name
    assert plan.architecture_verified is verified, path.name
