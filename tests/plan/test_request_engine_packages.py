"""What is installed beside the engine reaches the plan only when it describes the engine planned: the
installed vLLM, not another --engine-version (launcher/plan/request.py, PlanRequest.engine_packages)."""

from __future__ import annotations

from importlib import metadata

import pytest

from launcher.engines import versions
from launcher.plan.planner import make_plan
from launcher.plan.request import PlanOptions, build_request


def _installed(dists: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    def version(name: str) -> str:
        if name in dists:
            return dists[name]
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(versions.metadata, "version", version)


def _request(monkeypatch: pytest.MonkeyPatch, dists: dict[str, str], engine_version: str | None = None,
             env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    _installed(dists, monkeypatch)
    options = PlanOptions(model="qwen2.5-7b", gpu_specs=("h100",), engine_version=engine_version,
                          use_calibration=False)
    return build_request(options, env or {})


def test_the_installed_engine_carries_what_is_beside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    request = _request(monkeypatch, {"vllm": "0.11.0", "flashinfer-python": "0.3.1", "torch": "2.8.0"})
    assert request.engine_version == "0.11.0"
    assert request.engine_packages == {"flashinfer-python": "0.3.1"}  # only the distributions the rules read


def test_nothing_beside_it_is_known_to_be_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _request(monkeypatch, {"vllm": "0.11.0"}).engine_packages == {}


def test_another_version_or_no_engine_is_not_known(monkeypatch: pytest.MonkeyPatch) -> None:
    other = _request(monkeypatch, {"vllm": "0.11.0", "flashinfer-python": "0.3.1"}, engine_version="0.10.2")
    assert other.engine_packages is None
    assert _request(monkeypatch, {"flashinfer-python": "0.3.1"}).engine_packages is None


def test_the_plan_follows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.11.0 with FlashInfer installed profiles FlashInfer's sampler: more KV than without it;
    VLLM_USE_FLASHINFER_SAMPLER=0 in the engine's environment turns it back to the sort."""
    with_it = make_plan(_request(monkeypatch, {"vllm": "0.11.0", "flashinfer-python": "0.3.1"}))
    without = make_plan(_request(monkeypatch, {"vllm": "0.11.0"}))
    switched_off = make_plan(_request(monkeypatch, {"vllm": "0.11.0", "flashinfer-python": "0.3.1"},
                                      env={"VLLM_USE_FLASHINFER_SAMPLER": "0"}))
    assert with_it.kv_cache_bytes > without.kv_cache_bytes == switched_off.kv_cache_bytes
    assert "FlashInfer top-k/top-p" in with_it.item("activation").detail
    assert "sampler (sort)" in without.item("activation").detail


def test_an_engine_command_runs_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """--engine-cmd starts the engine in another environment (a venv, a container): nothing installed here is
    beside it, so FlashInfer's presence is not known and the plan says what it would change."""
    from launcher.serve.start import prepare

    _installed({"vllm": "0.11.0", "flashinfer-python": "0.3.1"}, monkeypatch)
    options = PlanOptions(model="qwen2.5-7b", gpu_specs=("h100",), use_calibration=False)
    here = prepare(options, {}, engine_cmd=None)
    elsewhere = prepare(options, {}, engine_cmd="docker run --gpus all vllm/vllm-openai:v0.11.0")
    assert here.request.engine_packages == {"flashinfer-python": "0.3.1"}
    assert elsewhere.request.engine_packages is None
    assert any("FlashInfer's top-k/top-p" in n for n in elsewhere.plan.notes)
    assert elsewhere.plan.kv_cache_bytes < here.plan.kv_cache_bytes
