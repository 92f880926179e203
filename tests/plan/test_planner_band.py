"""Error bands and engine defaults: refuse only what fails at the favourable end; on an idle
card give at least what the engine's own defaults give."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.common.errors import WontFit
from launcher.common.units import GiB, MiB
from launcher.model.catalog import hypothetical_gpus
from launcher.model.gpu import GpuDevice
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import DEFAULT_MARGIN_BYTES, PlanRequest


def request(model: str = "qwen2.5-7b", gpu: str = "rtx4090", engine: str = "vllm", **changes: object) -> PlanRequest:
    """vLLM at 0.33, the last release that sizes the KV cache before warmup (0.34's extensible KV cache
    keeps its own band: tests/engines/vllm/test_extensible_kv_cache.py); SGLang at its newest."""
    base = PlanRequest(model=resolve_model(model), engine=engine, gpus=hypothetical_gpus([gpu]),
                       engine_version="0.33.0" if engine == "vllm" else None)
    return dataclasses.replace(base, **changes)


def _with_tenant(gpu: GpuDevice, held_bytes: int) -> GpuDevice:
    return dataclasses.replace(gpu, free_bytes=(gpu.free_bytes or 0) - held_bytes, source="nvml")


class TestSglangIdleDefault:
    def test_idle_card_gets_the_engines_default_fraction(self) -> None:
        """Qwen2.5-7B on an idle RTX 4090: SGLang's own default (0.704), not default minus our margin."""
        plan = make_plan(request(engine="sglang"))
        assert plan.engine_figures["mem_fraction_static"] == plan.engine_defaults["mem_fraction_static"] == 0.704
        assert plan.item("slack").source == "engine default"

    def test_a_tenant_adds_the_margin_to_the_default_slack(self) -> None:
        gpu = _with_tenant(hypothetical_gpus(["rtx4090"])[0], GiB // 2)
        plan = make_plan(request(engine="sglang", gpus=(gpu,)))
        idle = make_plan(request(engine="sglang"))
        # The slack in bytes stays at least the idle default's plus the margin.
        assert plan.engine_figures["mem_fraction_static"] < idle.engine_figures["mem_fraction_static"]
        assert plan.item("slack").bytes >= idle.item("slack").bytes + DEFAULT_MARGIN_BYTES - 2**20

    def test_engine_defaults_in_json(self) -> None:
        from launcher.edge.render import plan_to_json

        doc = plan_to_json(make_plan(request(engine="sglang")))
        assert doc["engine_defaults"] == {"mem_fraction_static": 0.704, "chunked_prefill_size": 4096}
        vllm = plan_to_json(make_plan(request()))
        assert vllm["engine_defaults"] == {"gpu_memory_utilization": 0.92, "max_num_batched_tokens": 2048,
                                           "max_num_seqs": 256}


class TestVllmBand:
    def test_band_brackets_the_central_figure(self) -> None:
        plan = make_plan(request())
        assert plan.kv_cache_bytes_low is not None and plan.kv_cache_bytes_high is not None
        assert plan.kv_cache_bytes_low < plan.kv_cache_bytes < plan.kv_cache_bytes_high
        errors = sum(i.error_bytes for i in plan.budget if i.key in ("non_torch", "activation", "cudagraph"))
        # The total's own error enters through ceil(total x utilization).
        assert plan.kv_cache_bytes_high - plan.kv_cache_bytes >= errors

    def test_pinned_inside_the_band_plans_with_a_warning(self) -> None:
        """A length that fails at the central estimate but fits at the favourable end is kept (exit 0)."""
        central = make_plan(request(engine_args=("--max-model-len", "8192"), concurrency=1))
        tokens_central = central.kv_cache_tokens
        high_tokens = central.kv_cache_bytes_high * tokens_central // central.kv_cache_bytes
        # Ask for just more than the central estimate carries, but less than the favourable end.
        concurrency = tokens_central // 8192 + 1
        assert concurrency * 8192 < high_tokens
        plan = make_plan(request(engine_args=("--max-model-len", "8192"), concurrency=concurrency))
        assert plan.may_not_fit and "favourable end" in plan.may_not_fit

    def test_beyond_the_band_is_refused(self) -> None:
        with pytest.raises(WontFit):
            make_plan(request(engine_args=("--max-model-len", "32768"), concurrency=40))

    def test_pinned_kv_bytes_have_no_band(self) -> None:
        plan = make_plan(request(engine_args=("--kv-cache-memory-bytes", "4G")))
        assert plan.kv_cache_bytes_low == plan.kv_cache_bytes == plan.kv_cache_bytes_high


class TestVllmSafeSide:
    """The length a plan adds holds at the KV band's low end: vLLM refuses a start whose one request of
    max_model_len needs more KV than it has (kv_cache_utils.py check_enough_kv_cache_memory)."""

    def test_the_chosen_length_is_the_low_ends(self) -> None:
        """Llama-3.1-8B on an L4 (its published 22.16 GiB CUDA total): 4.02 GiB of KV at the centre, 3.37 GiB at the
        band's low end (the allocator's segments around the weights, 0.8 +/- 0.7 MiB, take one block)."""
        plan = make_plan(request("llama-3.1-8b", "l4"))
        assert plan.may_not_fit is None and plan.at_risk == ()
        assert plan.max_model_len == plan.max_model_len_low_end == 27568
        assert plan.max_model_len_central == 32912
        # One request of that length fits in the low end's bytes (2 MiB blocks of 16 tokens, one spare).
        per_block = 2 * MiB  # 32 layers x 16 tokens x 4 KiB (8 KV heads x 128 x 2 x 2 B)
        assert plan.num_blocks == plan.kv_cache_bytes // per_block
        assert (plan.kv_cache_bytes_low // per_block - 1) * 16 >= plan.max_model_len
        assert (plan.kv_cache_bytes_low // per_block - 1) * 16 < plan.max_model_len + 16 * 2

    def test_a_tight_band_keeps_the_models_maximum(self) -> None:
        plan = make_plan(request("qwen2.5-7b", "h100"))
        assert plan.max_model_len == plan.max_model_len_low_end == plan.max_model_len_central == 32768

    def test_a_pinned_length_beyond_the_low_end_is_at_risk(self) -> None:
        plan = make_plan(request("llama-3.1-8b", "l4", engine_args=("--max-model-len", "28000")))
        assert plan.max_model_len == 28000 and plan.at_risk == ("max_model_len",)
        assert plan.may_not_fit and "low end of the KV band" in plan.may_not_fit
        assert "vLLM estimates the maximum model length at 27568 (vLLM refuses to start there)" in plan.may_not_fit
        assert plan.max_model_len_low_end == 27568 and plan.max_model_len_central == 32912

    def test_concurrency_beyond_the_low_end_is_at_risk(self) -> None:
        """Four requests of 8192 fit in the 4.02 GiB centre (32,944 tokens), not in the 3.37 GiB low end."""
        plan = make_plan(request("llama-3.1-8b", "l4", engine_args=("--max-model-len", "8192"), concurrency=4))
        assert plan.at_risk == ("max_concurrency",) and plan.may_not_fit

    def test_no_length_at_the_low_end_keeps_the_centre_and_says_so(self) -> None:
        """Gemma-2-9B on an A10G: 1.10 GiB at the centre, 0.16 GiB at the low end (no request's worth)."""
        from launcher.edge.render import plan_to_json, render_plan

        plan = make_plan(request("gemma-2-9b", "a10g"))
        assert plan.max_model_len == plan.max_model_len_central == 3392 and plan.max_model_len_low_end == 0
        assert plan.at_risk == ("max_model_len",) and "refuses to start there" in (plan.may_not_fit or "")
        doc = plan_to_json(plan)
        assert doc["fits"] is False and doc["at_risk"] == ["max_model_len"] and doc["max_model_len_low_end"] == 0
        assert "length band    0 holds at the KV band's low end (none), 3,392 at the central estimate" in \
            render_plan(plan)

    def test_a_pinned_kv_size_beyond_the_low_end_is_at_risk(self) -> None:
        """4.69 GiB pinned; 5.26 GiB left at the centre, 4.61 GiB at the low end."""
        plan = make_plan(request("llama-3.1-8b", "l4", engine_args=("--kv-cache-memory-bytes", "4800M")))
        assert plan.at_risk == ("kv_cache_memory_bytes",) and "at the low end" in (plan.may_not_fit or "")


def test_sglang_weights_beyond_any_fraction_say_so() -> None:
    with pytest.raises(WontFit) as info:
        make_plan(request(model="llama-3.1-70b", engine="sglang"))
    assert "no --mem-fraction-static can fit" in str(info.value)


class TestRuntimeOomHeadroom:
    """A CUDA OOM while serving is remembered; the next plan of that setup leaves that much more free."""

    def test_vllm_requests_less_by_the_headroom(self) -> None:
        from launcher.plan.types import Calibration

        plain = make_plan(request())
        after = make_plan(request(calibration=Calibration(extra_headroom_bytes=GiB, key="k")))
        drop = plain.item("requested").bytes - after.item("requested").bytes
        assert GiB <= drop < GiB + 3 * 2**20  # 4-decimal utilization steps of ~2.4 MB
        assert after.item("requested").source == "calibrated" and "runtime CUDA OOM" in after.item("requested").detail

    def test_a_pinned_utilization_is_kept_and_warned(self) -> None:
        from launcher.plan.types import Calibration

        plan = make_plan(request(engine_args=("--gpu-memory-utilization", "0.9"),
                                 calibration=Calibration(extra_headroom_bytes=GiB, key="k")))
        assert plan.engine_figures["gpu_memory_utilization"] == 0.9 and any("out-of-memory" in w for w in plan.warnings)

    def test_sglang_keeps_more_slack(self) -> None:
        from launcher.plan.types import Calibration

        plain = make_plan(request(engine="sglang"))
        after = make_plan(request(engine="sglang", calibration=Calibration(extra_headroom_bytes=GiB, key="k")))
        assert after.item("slack").bytes - plain.item("slack").bytes >= GiB - 32 * 2**20


@pytest.mark.parametrize("gpu", ["t4", "l4", "rtx4090", "a100-40gb", "l40s", "a100-80gb", "h100", "h200", "b200"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_idle_card_gives_at_least_the_engines_defaults(gpu: str, engine: str) -> None:
    """On an idle card with no memory flag pinned, the plan asks for exactly the engine's own default."""
    try:
        plan = make_plan(request(model="qwen2.5-7b-awq" if gpu in ("t4", "l4") else "qwen2.5-7b", gpu=gpu,
                                 engine=engine))
    except WontFit:
        pytest.skip(f"qwen2.5-7b does not fit {gpu} with {engine} at all")
    knob = "gpu_memory_utilization" if engine == "vllm" else "mem_fraction_static"
    assert plan.engine_figures[knob] == plan.knob.value == plan.engine_defaults[knob]
