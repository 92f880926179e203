"""Multimodal wrappers in vLLM: read through to the text backbone's verified layout, and the
encoder's share of the profile run switched by the engine's own multimodal flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.engines import vllm as vl
from launcher.engines.vllm import budget as vb
from launcher.engines.vllm.architectures import architecture_status, vllm_layer_specs, wrapper_backbone
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.resolve import ResolvedModel
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "configs"


def _geometry(name: str):  # type: ignore[no-untyped-def]
    return geometry_from_config(json.loads((CONFIGS / f"{name}.json").read_text()))


@pytest.mark.parametrize(("name", "backbone"), [
    ("kimi-vl-a3b-instruct", "DeepseekV2ForCausalLM"),
    ("mistral-small-3.1-24b-instruct-2503", "MistralForCausalLM"),
    ("magistral-small-2509", "MistralForCausalLM"),
    ("qwen2.5-vl-7b", "Qwen2ForCausalLM"),
    ("qwen3-vl-8b-instruct", "Qwen3ForCausalLM"),
    ("llama-4-scout-17b-16e-instruct", "Llama4ForCausalLM"),
    ("gemma-3-12b-it", "Gemma3ForCausalLM"),  # config-level sliding_window: runs gemma3_swp-*
    ("qwen3.5-27b", "Qwen3_5ForCausalLM"),  # golden file (Qwen3.5 needs torchvision on CPU)
    ("qwen3.5-35b-a3b", "Qwen3_5MoeForCausalLM"),
])
def test_a_wrapper_is_verified_through_its_text_backbone(name: str, backbone: str) -> None:
    geometry = _geometry(name)
    wrapped = wrapper_backbone(geometry)
    assert wrapped is not None and wrapped[0] == backbone
    verified, note = architecture_status(geometry)
    assert verified and f"as {backbone} from text_config" in note
    # The layers planned are the backbone's: the same specs as the text config alone.
    assert vllm_layer_specs(geometry) == vllm_layer_specs(geometry_from_config(dict(geometry.text_config)))


def test_a_wrapper_keeps_its_backbones_unproven_switches() -> None:
    """Qwen2.5-VL with use_sliding_window: Qwen2ForCausalLM's runs did not use the switch."""
    raw = json.loads((CONFIGS / "qwen2.5-vl-7b.json").read_text())
    text = raw.get("text_config", raw)
    text.update(use_sliding_window=True, sliding_window=4096, max_window_layers=14)
    verified, note = architecture_status(geometry_from_config(raw))
    assert not verified and "wraps Qwen2ForCausalLM" in note and "use_sliding_window" in note


def test_an_unknown_wrapper_stays_unverified() -> None:
    verified, note = architecture_status(_geometry("gemma-3n-e4b-it"))
    assert not verified and note.startswith("unverified")


@pytest.mark.parametrize(("name", "flags", "profiled"), [
    ("mistral-small-3.1-24b-instruct-2503", (), True),
    ("mistral-small-3.1-24b-instruct-2503", ("--limit-mm-per-prompt", '{"image": 0}'), False),
    ("mistral-small-3.1-24b-instruct-2503", ("--limit-mm-per-prompt", '{"image": {"count": 0}}'), False),
    ("mistral-small-3.1-24b-instruct-2503", ("--limit-mm-per-prompt", '{"image": 2}'), True),
    ("qwen2.5-vl-7b", ("--limit-mm-per-prompt", '{"image": 0}'), True),  # video keeps its default 999
    ("qwen2.5-vl-7b", ("--limit-mm-per-prompt", '{"image": 0, "video": 0}'), False),
    ("qwen2.5-vl-7b", ("--language-model-only",), False),
    ("qwen2.5-vl-7b", ("--skip-mm-profiling",), False),
    ("qwen2.5-7b", (), False),
    # nested past Python's stack: json.loads raises RecursionError; the engine's parser decides, the term stays
    ("qwen2.5-vl-7b", ("--limit-mm-per-prompt", "[" * 5_000), True),
])
def test_the_encoder_is_profiled_as_vllm_decides(name: str, flags: tuple[str, ...], profiled: bool) -> None:
    assert vb.encoder_profiled(_geometry(name), vl.pinned_flags(flags)) is profiled


def test_switching_the_encoder_off_returns_its_outputs_to_the_kv_cache() -> None:
    """The profile run holds the dummy item's encoder outputs and, on 0.19's V1 runner, its pixels
    (gpu_model_runner.py profile_run): at 8,192 tokens, with max_pixels 6,422,528, one 8,192-token Qwen2.5-VL
    item (32,768 patches of 1,176 pixels); without them the KV cache gets exactly that back, on an idle H100 at
    T = 8192, where the language model's phase (the 1,024-row sampler) is the peak, not the vision forward (at
    the repos' default 16,384-token image the tower's own forward binds instead)."""
    geometry = _geometry("qwen2.5-vl-7b")
    model = ResolvedModel(name="qwen2.5-vl-7b", source="local", geometry=geometry, weight_bytes=16_580_000_000,
                          weight_bytes_source="test", config={})

    def kv(*flags: str) -> int:
        plan = make_plan(PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["1x h100-80gb"]),
                                     engine_version="0.19.0",
                                     engine_args=("--max-model-len", "8192", "--max-num-batched-tokens", "8192",
                                                  "--mm-processor-kwargs", '{"max_pixels": 6422528}', *flags)))
        assert plan.architecture_verified
        return plan.kv_cache_bytes

    encoder = 2 * 8192 * geometry.hidden_size + 2 * 32_768 * 1176
    assert kv("--limit-mm-per-prompt", '{"image": 0, "video": 0}') - kv() == pytest.approx(encoder, abs=2 << 20)


def test_skipping_the_encoder_profile_is_said() -> None:
    """--skip-mm-profiling leaves the encoder out of vLLM's budget: the plan follows and says so."""
    geometry = _geometry("qwen2.5-vl-7b")
    model = ResolvedModel(name="qwen2.5-vl-7b", source="local", geometry=geometry, weight_bytes=16_580_000_000,
                          weight_bytes_source="test", config={})
    plan = make_plan(PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["1x h100-80gb"]),
                                 engine_version="0.19.0", engine_args=("--skip-mm-profiling",)))
    assert ("--skip-mm-profiling: the multimodal encoder's memory at the first image (not in vLLM's budget "
            "either); the plan does not count it") in plan.warnings
