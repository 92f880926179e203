"""Calibration records: what the engine measured replaces our estimate on the same key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from launcher.common.units import GiB
from launcher.engines import adapter
from launcher.model.catalog import hypothetical_gpus
from launcher.model.resolve import resolve_model
from launcher.plan.calibration import calibration_key, load, record
from launcher.plan.planner import make_plan
from launcher.plan.types import CALIBRATED, Calibration, PlanRequest


def test_round_trip_and_merge(tmp_path: Path) -> None:
    """A record is read back under its key; a later record merges into it."""
    key = calibration_key(gpu_name="NVIDIA L4", model="m", engine="vllm", engine_version="0.32.0",
                          pinned={"--enforce-eager": True, "--max-model-len": 4096},
                          key_flags=adapter("vllm").calibration_key_flags)
    assert "--enforce-eager=True" in key and "max-model-len" not in key  # length does not change non-KV memory
    record(tmp_path, key, Calibration(non_kv_bytes=5 * GiB))
    record(tmp_path, key, Calibration(load_overhead_bytes=4 * GiB))
    loaded = load(tmp_path, key)
    assert loaded == Calibration(non_kv_bytes=5 * GiB, load_overhead_bytes=4 * GiB, key=key)
    assert load(tmp_path, "other key") is None


def test_corrupt_file_is_ignored(tmp_path: Path) -> None:
    """A damaged calibration file means no calibration, not a crash."""
    (tmp_path / "calibration.json").write_text("{not json")
    assert load(tmp_path, "k") is None
    record(tmp_path, "k", Calibration(non_kv_bytes=1))
    assert load(tmp_path, "k").non_kv_bytes == 1


def test_plan_uses_the_measured_non_kv_memory() -> None:
    """With a calibration, KV = requested - measured non-KV, and the item says so (vLLM 0.33: sized before
    warmup; 0.34's extensible KV cache uses no such figure)."""
    base = PlanRequest(model=resolve_model("qwen2.5-7b"), engine="vllm", gpus=hypothetical_gpus(["l40s"]),
                       engine_version="0.33.0")
    plain = make_plan(base)
    measured = dataclasses.replace(base, calibration=Calibration(non_kv_bytes=16 * GiB, key="k"))
    plan = make_plan(measured)
    assert plan.kv_cache_bytes == plan.item("requested").bytes - 16 * GiB
    assert plan.item("kv").source == CALIBRATED and plan.kv_cache_bytes != plain.kv_cache_bytes
    assert any("earlier start" in note for note in plan.notes)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_start_quantized_while_loading_is_another_calibration_setup(engine: str) -> None:
    """Online fp8 holds about half the weights: its measurement must not size a 16-bit start, nor the reverse."""
    spec = adapter(engine)

    def key(argv: list[str]) -> str:
        return calibration_key(gpu_name="L40S", model="m", engine=engine, engine_version="1",
                               key_flags=spec.calibration_key_flags, pinned=spec.pin(argv).values)

    assert key([]) != key(["--quantization", "fp8"])
