"""Reverse planning: the hardware and flags that carry a workload, from the same planner."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from launcher.common.units import GiB
from launcher.edge.cli import cli
from launcher.model.catalog import hypothetical_gpus
from launcher.model.resolve import resolve_model
from launcher.plan.fit import Workload, fit, largest_concurrency, longest_length
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest


def base(model: str = "qwen2.5-7b", gpu: str = "rtx4090") -> PlanRequest:
    resolved = resolve_model(model)
    variants = tuple(resolve_model(alias) for alias in resolved.quantized_variants)
    # vLLM 0.33, the last release that sizes the KV cache before warmup: the figures below are its
    # (0.34's extensible KV cache keeps T and a margin free: tests/engines/vllm/test_extensible_kv_cache.py).
    return PlanRequest(model=resolved, engine="vllm", gpus=hypothetical_gpus([gpu]), variants=variants,
                       engine_version="0.33.0")


class TestWorkedExample:
    def test_kv_for_32_x_4096(self) -> None:
        """32 x 4096 tokens x 57,344 B = 7.52 GB of KV (the example's 7.34 divides by 1024 x 10^6)."""
        kv = 32 * 4096 * resolve_model("qwen2.5-7b").geometry.kv_bytes_per_token(2)
        assert kv == 7_516_192_768 and round(kv / (1024 * 10**6), 2) == 7.34 and round(kv / GiB, 2) == 7.0

    def test_one_24gb_card_is_not_enough_in_bf16(self) -> None:
        """On a 24 GB card 32 x 4096 needs fp8 KV or a quantized checkpoint; in bf16 it is short."""
        (result,) = fit(base(), Workload(32, 4096), hypothetical_gpus(["rtx4090"]))
        assert result.best is not None and result.best.gpu_count == 1 and result.best.compromises
        assert result.closest_miss is not None and result.closest_miss.kv_dtype == "auto"
        assert "need ~7.00 GiB" in result.closest_miss.shortfall

    @pytest.mark.parametrize("gpu", ["a100-40gb", "l40s", "rtx6000ada"])
    def test_40_and_48_gb_cards_carry_it_plainly(self, gpu: str) -> None:
        """A 40 GB or 48 GB card carries 32 x 4096 on one GPU with no compromise."""
        (result,) = fit(base(), Workload(32, 4096), hypothetical_gpus([gpu]))
        assert result.best is not None and result.best.gpu_count == 1 and result.best.compromises == ()

    def test_24gb_carries_32_x_2048(self) -> None:
        """At 32 x 2048 (half the KV) a 24 GB card carries it in bf16."""
        (result,) = fit(base(), Workload(32, 2048), hypothetical_gpus(["rtx4090"]))
        assert result.best is not None and result.best.compromises == () and result.best.gpu_count == 1


class TestOnlineQuantization:
    def test_fp8_weights_come_after_fp8_kv_and_before_a_quantized_checkpoint(self) -> None:
        """70B on L40S: bf16 needs more than 2 cards; 2 carry it with the weights quantized while loading
        (and fp8 KV), before the int4 checkpoint is tried; the option says so and plans as fitted."""
        request = base("llama-3.1-70b", "l40s")
        (result,) = fit(request, Workload(4, 8192), hypothetical_gpus(["l40s"]))
        assert result.best is not None and result.best.gpu_count == 2
        assert result.best.compromises == ("fp8 KV cache", "fp8 weights (quantized while loading)")
        args = result.best.engine_args
        assert args[args.index("--quantization") + 1] == "fp8_per_tensor"
        plan = make_plan(dataclasses.replace(request, engine_args=result.best.engine_args,
                                             gpus=hypothetical_gpus(["2xl40s"]), variants=()))
        assert plan.kv_cache_tokens >= 4 * 8192

    def test_a_pinned_quantization_is_not_given_twice(self) -> None:
        request = base("llama-3.1-70b", "l40s")
        pinned = dataclasses.replace(request, engine_args=("--quantization", "fp8"))
        (result,) = fit(pinned, Workload(4, 8192), hypothetical_gpus(["l40s"]))
        assert result.best is not None and result.best.engine_args.count("--quantization") == 1
        assert "fp8 weights (quantized while loading)" not in result.best.compromises

    def test_not_tried_for_a_quantized_checkpoint_nor_before_vllm_0_16(self) -> None:
        for request in (base("llama-3.1-70b-awq", "l40s"),
                        dataclasses.replace(base("llama-3.1-70b", "l40s"), engine_version="0.15.0")):
            (result,) = fit(request, Workload(4, 8192), hypothetical_gpus(["l40s"]))
            assert result.best is None or "--quantization" not in result.best.engine_args


class TestAgreementWithPlan:
    @pytest.mark.parametrize(("model", "gpu", "n", "tokens"), [
        ("qwen2.5-7b", "t4", 32, 4096), ("llama-3.1-70b", "h100", 8, 8192), ("qwen2.5-72b", "l40s", 4, 16384),
        ("llama-3.1-8b", "a10g", 16, 8192),
    ])
    def test_fitted_configuration_planned_carries_the_workload(self, model: str, gpu: str, n: int,
                                                               tokens: int) -> None:
        """Planning the fitted flags on the fitted GPUs gives a plan with room for N x L."""
        request = base(model, gpu)
        (result,) = fit(request, Workload(n, tokens), hypothetical_gpus([gpu]))
        assert result.best is not None
        option = result.best
        checkpoint = next(v for v in (request.model, *request.variants) if (v.alias or v.name) == option.checkpoint)
        plan = make_plan(dataclasses.replace(request, model=checkpoint, engine_args=option.engine_args,
                                             gpus=hypothetical_gpus([f"{option.gpu_count}x{gpu}"]), variants=()))
        assert plan.max_model_len == tokens and plan.max_concurrency >= n
        assert plan.kv_cache_tokens >= n * tokens

    def test_inverse_answers_are_tight(self) -> None:
        """The largest concurrency at L fits and one more does not; the longest length at N likewise."""
        request = base("qwen2.5-7b", "l4")
        most = largest_concurrency(request, 4096)
        assert most > 0
        assert fit(request, Workload(most, 4096), hypothetical_gpus(["l4"]))[0].best.compromises == ()
        assert fit(request, Workload(most + 1, 4096), hypothetical_gpus(["l4"]))[0].best.compromises != ()
        length = longest_length(request, 8)
        plan = make_plan(dataclasses.replace(request, concurrency=8))
        assert plan.max_model_len == length and plan.max_concurrency >= 8


def test_cli_json_schema() -> None:
    """`safe-serve fit --json` reports each GPU with the best configuration and the inverse answers."""
    result = CliRunner().invoke(cli, ["fit", "qwen2.5-7b", "--concurrency", "32", "--tokens", "4096",
                                      "--gpu", "rtx4090", "--json", "--engine-version", "0.33.0"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["schema"] == "safe-serve.fit/1" and doc["workload"] == {"concurrency": 32, "tokens": 4096}
    (gpu,) = doc["gpus"]
    assert gpu["fits"] and gpu["best"]["kv_cache_dtype"] == "fp8"
    # In bf16 the card holds 24 of those requests, or 32 of at most 3,136 tokens: at the low end of
    # the KV band (5.37 GiB of 6.06 at the centre), since a plain yes must hold there; the CUDA graphs
    # (a first capture and 86 graphs x 28 layers) have a band of 0.21 GiB, the allocator's segments around
    # the weights (counted from 0.27) 85 +/- 28 MiB. The RTX 4090's CUDA total is the published 23.64 GiB
    # (tests/data/cuda-totals.yaml).
    assert doc["largest_concurrency_at_tokens"] == largest_concurrency(base(), 4096) == 24
    assert doc["longest_tokens_at_concurrency"] == longest_length(base(), 32) == 3136


@pytest.mark.parametrize(("engine", "pinned"), [
    ("vllm", ["--max-model-len", "100"]),  # was given twice: --max-model-len 100 --max-model-len 8192
    ("vllm", ["--tensor-parallel-size", "4"]),  # was overridden by each configuration's count
    ("vllm", ["--kv-cache-dtype=fp8"]),
    ("sglang", ["--context-length", "100"]),
    ("sglang", ["--tp", "2"]),
])
def test_a_pinned_flag_fit_chooses_is_exit_2(engine: str, pinned: list[str]) -> None:
    result = subprocess.run([sys.executable, "-m", "launcher", "fit", "qwen2.5-7b", "--concurrency", "8", "--tokens",
                             "8192", "--gpu", "h100", "--engine", engine, "--json", "--", *pinned],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == "safe-serve.error/1" and "would be overridden" in doc["reason"]
    assert "safe-serve plan" in doc["hint"]
