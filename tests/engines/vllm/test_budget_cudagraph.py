"""The CUDA-graph term against what capture took in the published vLLM logs: its band is at
least the farthest the formula has been from a real capture."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from launcher.common.units import GiB
from launcher.engines.vllm import budget as vb
from launcher.model.config import geometry_from_config

DATA = Path(__file__).resolve().parents[2] / "data" / "startup-logs"


def _residuals() -> dict[str, float]:
    """case -> logged capture memory - formula (GiB), per rank."""
    found = {}
    for name in ("startup-logs.yaml", "startup-logs-2.yaml"):
        for case in yaml.safe_load((DATA / name).read_text()):
            logged = (case.get("observed") or {}).get("cudagraph_gib")
            if logged is None or not case.get("model_config"):
                continue
            config = json.loads((DATA / "models" / case["model_config"] / "config.json").read_text())
            layers = geometry_from_config(config).kv_layers
            found[case["id"]] = float(logged) - vb.cudagraph_estimate_bytes(layers) / GiB
    return found


def test_band_covers_every_published_capture() -> None:
    residuals = _residuals()
    assert len(residuals) >= 8
    farthest = max(abs(r) for r in residuals.values())
    assert abs(vb.CUDAGRAPH_ERROR_FLOOR_BYTES / GiB - farthest) < 0.01
    for case, residual in residuals.items():
        estimate = vb.cudagraph_estimate_bytes(32)
        assert abs(residual) * GiB <= vb.cudagraph_error_bytes(estimate) + 0.01 * GiB, case


def test_formula_is_under_on_every_019_h100_capture() -> None:
    """What remains: the formula is low on every vLLM 0.19 H100 capture (MoE most), so where a
    version subtracts it the plan's KV is high by up to the floor; the band says so."""
    residuals = {k: v for k, v in _residuals().items() if "llmdplanner" in k}
    assert len(residuals) >= 8 and all(r > 0.05 for r in residuals.values())
    assert vb.cudagraph_error_bytes(0) == 0
