"""Weights as vLLM loads them, not as the checkpoint stores them: gpt-oss's MXFP4 experts on
Hopper (Triton kernels) are swizzled with padding, fp32 biases and, before 0.25, a second copy of
the block scales; vLLM's KV budget subtracts what it loaded."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.common.units import GiB
from launcher.engines.vllm import budget as vb
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import COMPUTED, PlanRequest

MODELS = Path(__file__).resolve().parents[2] / "data" / "startup-logs" / "models"


def _geometry(name: str):  # type: ignore[no-untyped-def]
    return geometry_from_config(json.loads((MODELS / name / "config.json").read_text()))


def test_gpt_oss_20b_on_h100_loads_what_vllm_019_printed() -> None:
    """vLLM 0.19.0 on an H100: "Model loading took 13.64 GiB" for a 12.82 GiB checkpoint."""
    model = resolve_model(str(MODELS / "gpt-oss-20b"))
    request = PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["h100"]), engine_version="0.19.0",
                          engine_args=("--max-model-len", "8192", "--gpu-memory-utilization", "0.95"))
    weights = next(i for i in make_plan(request).budget if i.key == "weights")
    assert abs(weights.bytes / GiB - 13.64) < 0.05
    assert weights.source == COMPUTED and "Hopper" in weights.detail


def test_the_rule_by_version_and_card() -> None:
    geometry = _geometry("gpt-oss-20b")

    def extra(version: str, cc: tuple[int, int] | None = (9, 0), tp: int = 1) -> float:
        return vb.mxfp4_repack_extra_bytes(geometry, version=version, tp=tp, pp=1, compute_capability=cc)[0] / GiB

    assert round(extra("0.19.0"), 2) == 0.79  # 0.20 values padded to 64, scales kept twice
    assert round(extra("0.22.0"), 2) == 0.59  # packs of 16/32: no value padding at 2880
    assert round(extra("0.25.0"), 2) == 0.03  # loaded scales deleted ("del layer.w13_weight_scale")
    assert extra("0.19.0", cc=(8, 0)) == 0 and extra("0.19.0", cc=(10, 0)) == 0  # other backends: not this rule
    assert extra("0.19.0", tp=2) > extra("0.19.0") / 2  # 1440 per rank is rounded up to 1472


def test_dense_and_other_quantizations_load_as_stored() -> None:
    assert vb.mxfp4_repack_extra_bytes(_geometry("llama-3.1-8b-instruct"), version="0.19.0", tp=1, pp=1,
                                       compute_capability=(9, 0)) == (0, "")
