"""Refusals: what the engine refuses at start is refused before launch, as data, with planned
alternatives (issue: refuse exactly what the engine refuses)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launcher.common.errors import WontFit
from launcher.common.units import GiB
from launcher.model.catalog import hypothetical_gpus
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *argv], capture_output=True, text=True, timeout=60,
                          check=False)


def request(model: str, gpu: str, *args: str, engine: str = "vllm") -> PlanRequest:
    return PlanRequest(model=resolve_model(model), engine=engine, gpus=hypothetical_gpus([gpu]),
                       engine_args=tuple(args))


@pytest.mark.parametrize(("engine", "flag"), [("vllm", "--tensor-parallel-size"), ("sglang", "--tp-size")])
def test_tp_that_does_not_divide_the_heads_is_refused_with_a_working_tp(engine: str, flag: str) -> None:
    with pytest.raises(WontFit) as info:
        make_plan(request("qwen2.5-7b", "3xrtx4090", flag, "3", engine=engine))
    assert info.value.rule == "tp-divides-heads" and "28" in info.value.message
    assert any(a.startswith(f"{flag} 2 over 2 GPUs") for a in info.value.alternatives)
    # The alternative is itself a plan that fits.
    (alternative,) = [a for a in info.value.alternatives if a.startswith(flag)]
    plan = make_plan(PlanRequest(model=resolve_model("qwen2.5-7b"), engine=engine,
                                 gpus=hypothetical_gpus(["3xrtx4090"]), engine_args=alternative.engine_args))
    assert plan.tp == 2 and plan.kv_cache_tokens == alternative.kv_cache_tokens


@pytest.mark.parametrize(("model", "gpu", "needed"), [("qwen2.5-7b-awq", "v10016gb", "75"),
                                                      ("gpt-oss-20b", "v10032gb", "80")])
def test_quantization_below_its_minimum_capability(model: str, gpu: str, needed: str) -> None:
    with pytest.raises(WontFit) as info:
        make_plan(request(model, gpu))
    assert info.value.rule == "quant-min-capability" and f"Minimum capability: {needed}" in info.value.message
    assert info.value.source and info.value.source.startswith("vllm/config/vllm.py:")


def test_fit_no_longer_recommends_awq_on_a_v100() -> None:
    result = run("fit", "qwen2.5-7b", "--concurrency", "4", "--tokens", "4096", "--gpu", "v10016gb", "--json")
    doc = json.loads(result.stdout)
    best = doc["gpus"][0]["best"]
    # One V100 + the AWQ checkpoint would be cheapest, but AWQ needs sm75: two V100s in fp16 instead.
    assert (best["checkpoint"], best["gpu_count"]) == ("qwen2.5-7b", 2)


def test_plan_json_refusal_is_a_document_on_stdout() -> None:
    result = run("plan", "llama-3.1-70b", "--gpu", "rtx4090", "--json")
    assert result.returncode == 78
    doc = json.loads(result.stdout)
    assert doc["schema"] == "safe-serve.refusal/1" and doc["rule"] == "kv-capacity"
    assert "weights alone" in doc["reason"]
    assert doc["alternatives"] and all(a["engine_args"] for a in doc["alternatives"])
    assert result.stderr.startswith("safe-serve: will not fit:")


def test_70b_on_four_4090s_offers_what_fit_finds() -> None:
    with pytest.raises(WontFit) as info:
        model = resolve_model("llama-3.1-70b")
        make_plan(PlanRequest(model=model, engine="vllm", engine_version="0.33.0",  # sized before warmup
                              gpus=hypothetical_gpus(["4xrtx4090"]),
                              variants=tuple(resolve_model(a) for a in model.quantized_variants)))
    # fit's order: 4 GPUs with the weights quantized to fp8 while vLLM loads them comes before the int4 checkpoint
    assert any("4 x NVIDIA GeForce RTX 4090 --quantization fp8_per_tensor --tensor-parallel-size 4" in a
               for a in info.value.alternatives)


@pytest.mark.parametrize(("argv", "cause"), [
    (("--max-gpu-memory", "0"), "--max-gpu-memory"),
    (("--margin", "30GiB"), "(--margin)"),
])
def test_refusals_name_the_cap_or_the_margin(argv: tuple[str, ...], cause: str) -> None:
    result = run("plan", "qwen2.5-7b", "--gpu", "rtx4090", *argv)
    assert result.returncode == 78 and cause in result.stderr


def test_concurrency_above_max_num_seqs_is_said_and_planned_for_what_runs() -> None:
    plan = make_plan(PlanRequest(model=resolve_model("qwen2.5-7b"), engine="vllm",
                                 gpus=hypothetical_gpus(["rtx4090"]), concurrency=1000))
    assert any("at most 256 requests at once" in w for w in plan.warnings)
    assert plan.max_concurrency >= 256


@pytest.mark.parametrize("argv", [
    ("plan", "qwen2.5-7b", "--gpu", "rtx4090", "--engine-version", "banana"),
    ("plan", "qwen2.5-7b", "--concurrency", "0"),
    ("plan", "qwen2.5-7b", "--gpu", "rtx4090", "--concurrency", "0"),
    ("plan", "qwen2.5-7b", "--device", "cpu", "--gpu", "rtx4090"),
])
def test_bad_cli_values_exit_2_before_any_probe(argv: tuple[str, ...]) -> None:
    result = run(*argv)
    assert result.returncode == 2 and "Traceback" not in result.stderr and result.stderr.count("\n") <= 2


class TestPinnedKvSize:
    """A pinned KV size must fit what the weights and activations leave (vLLM allocates it as given)."""

    def test_kv_bytes_beyond_the_card_are_refused(self) -> None:
        with pytest.raises(WontFit, match="--kv-cache-memory-bytes: 30.00 GiB") as info:
            make_plan(request("qwen2.5-7b", "rtx4090", "--kv-cache-memory-bytes", "30G"))
        assert info.value.rule == "pinned-kv"

    def test_kv_bytes_that_fit_are_the_plan_and_utilization_is_ignored(self) -> None:
        plan = make_plan(request("qwen2.5-7b", "rtx4090", "--kv-cache-memory-bytes", "4G"))
        assert plan.kv_cache_bytes == 4 * GiB and plan.engine_figures["gpu_memory_utilization"] is None
        assert plan.memory_knob.startswith("--kv-cache-memory-bytes 4.00 GiB")

    def test_num_gpu_blocks_override_is_the_block_count(self) -> None:
        plan = make_plan(request("qwen2.5-7b", "rtx4090", "--num-gpu-blocks-override", "100"))
        assert plan.num_blocks == 100 and plan.item("kv").source == "pinned"
        with pytest.raises(WontFit, match="--num-gpu-blocks-override"):
            make_plan(request("qwen2.5-7b", "rtx4090", "--num-gpu-blocks-override", "100000"))
