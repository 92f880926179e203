"""Qwen2-VL / Qwen2.5-VL in vLLM's profile run: the dummy item is sized by vLLM's own processing info
(replayed from tests/data/vllm_qwen_vl_dummy_oracle.json, written by tests/oracles/vllm_qwen_vl_dummy_oracle.py
with vLLM 0.32.0's qwen2_vl.py), and the vision tower's forward over it is the profile's peak where it is
larger than the language model's phase: at Qwen2.5-VL's default 128,000 tokens one dummy video of 14 frames,
114,688 tokens, 458,752 patches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.engines import vllm as vl
from launcher.engines.vllm import budget as vb
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.resolve import ResolvedModel
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest

DATA = Path(__file__).resolve().parents[2] / "data"
ORACLE = json.loads((DATA / "vllm_qwen_vl_dummy_oracle.json").read_text())
CONFIG = {k: v for k, v in json.loads((DATA / "configs" / "qwen2.5-vl-7b.json").read_text()).items()
          if not k.startswith("_")}


def _geometry(**vision: Any) -> Any:
    return geometry_from_config({**CONFIG, "vision_config": {**CONFIG["vision_config"], **vision}})


QWEN3 = {k: v for k, v in json.loads((DATA / "configs" / "qwen3-vl-8b-instruct.json").read_text()).items()
         if not k.startswith("_")}


def test_the_oracle_is_there() -> None:
    assert ORACLE["vllm"] == "0.32.0" and len(ORACLE["records"]) == 540 and len(ORACLE["qwen3_vl"]) == 108


@pytest.mark.parametrize("record", ORACLE["qwen3_vl"],
                         ids=[f"{r['max_model_len']}-{r['image_max_pixels']}-{r['video_max_pixels']}-"
                              f"{'-'.join(f'{k}{v}' for k, v in r['limits'].items()) or 'all'}"
                              for r in ORACLE["qwen3_vl"]])
def test_qwen3_dummy_item_is_vllms(record: dict[str, Any]) -> None:
    """Qwen3-VL's video is two frames whatever the length: the largest item is the image unless the video
    processor's longest_edge / 2 exceeds the image processor's."""
    limits = {"image": 999, "video": 999, **record["limits"]}
    dummy = vb._qwen3_vl_dummy(geometry_from_config(QWEN3), limits=limits, image_pixels=record["image_max_pixels"],
                               video_pixels=record["video_max_pixels"])
    assert dummy is not None
    tokens, patches, per_patch, modality = dummy
    assert (tokens, modality) == (record["item_tokens"], record["modality"])
    assert patches == tokens * 4 and per_patch == 3 * 2 * 16 * 16


def test_qwen3_vl_tower_and_deepstack_outputs() -> None:
    """Qwen3-VL-8B (tower 1152 wide, MLP 4304, deepstack at 3 layers, out 4096): one 16,384-token dummy image,
    65,536 patches of 1,536 pixels; its encoder outputs are 4096 x 4 wide; per patch the attention phase
    (11 W) + the patch embeddings (W) + the rotary cos/sin (a head, 72) + the deepstack features (3 x 4096 / 4),
    and 16 B of int64 positions."""
    geometry = geometry_from_config(QWEN3)
    small = vb.profile_peak(geometry, rules=vl.rules_for("0.19.0")[0], batched_tokens=2048, num_seqs=256, tp=1,
                            gpu_name="NVIDIA L40S", max_model_len=32768, mm_limits=vb.mm_limits({}))
    terms = dict(small.terms)
    assert terms["encoder cache"] == 16_384 * 4096 * 4 * 2
    assert terms["dummy images"] == 65_536 * 1536 * 2
    forward = 65_536 * 1536 * 2 + 65_536 * ((11 * 1152 + 1152 + 72 + 3 * 4096 // 4) * 2 + 16)
    assert small.total_bytes == forward + vb.PROFILE_CONSTANT_BYTES  # the tower is the peak on a 48 GB card
    big = vb.profile_peak(geometry, rules=vl.rules_for("0.19.0")[0], batched_tokens=8192, num_seqs=1024, tp=1,
                          gpu_name="NVIDIA H100 80GB HBM3", max_model_len=32768, mm_limits=vb.mm_limits({}))
    assert dict(big.terms)["vision forward beyond"] == 0  # 1,024 sampler rows: the language model's phase binds


@pytest.mark.parametrize("record", ORACLE["records"],
                         ids=[f"{r['max_model_len']}-{r['max_pixels']}-t{r['temporal_patch_size']}-"
                              f"{'-'.join(f'{k}{v}' for k, v in r['limits'].items()) or 'all'}"
                              for r in ORACLE["records"]])
def test_dummy_item_is_vllms(record: dict[str, Any]) -> None:
    geometry = _geometry(temporal_patch_size=record["temporal_patch_size"])
    limits = {"image": 999, "video": 999, **record["limits"]}
    dummy = vb._qwen_vl_dummy(geometry, max_model_len=record["max_model_len"], limits=limits,
                              max_pixels=record["max_pixels"])
    assert dummy is not None
    tokens, patches, per_patch, modality = dummy
    assert (tokens, modality) == (record["item_tokens"], record["modality"])
    assert patches == tokens * 4 and per_patch == 3 * record["temporal_patch_size"] * 14 * 14


def _peak(version: str, length: int, pinned: dict[str, Any] | None = None, tp: int = 1) -> vb.ProfilePeak:
    pinned = pinned or {}
    return vb.profile_peak(_geometry(), rules=vl.rules_for(version)[0], batched_tokens=8192, num_seqs=1024, tp=tp,
                           gpu_name="NVIDIA H100 80GB HBM3", max_model_len=length,
                           mm_limits=vb.mm_limits(pinned), mm_max_pixels=vb.mm_max_pixels(pinned))


def test_the_vision_forward_is_the_peak_at_the_default_length() -> None:
    """128,000 tokens: one 114,688-token video, 458,752 patches of 1,176 pixels; per patch the MLP phase's
    4 x 1280 + 4 x 3420 bf16 values (gate_up, SiluAndMul's native silu and product beside the input, attention
    output, residual and norm: vLLM's own tower traced, tests/data/vllm_vision_forward_oracle.json), the
    window-ordered rotary tables (2 x 80) and 6 B of window indices, beside the pixels: 17.2 GiB, over the
    language model's 2.4 GiB; +/- 3 % (traced)."""
    peak = _peak("0.19.0", 128_000)
    patches = 458_752
    forward = patches * 1176 * 2 + patches * ((4 * 1280 + 4 * 3420 + 2 * 80) * 2 + 6)
    assert peak.total_bytes == forward + vb.PROFILE_CONSTANT_BYTES
    terms = dict(peak.terms)
    assert terms["dummy images"] == patches * 1176 * 2  # V1: the pixels stay through the sampler run
    assert terms["encoder cache"] == 114_688 * 3584 * 2
    language_model = sum(b for name, b in peak.terms if name != "vision forward beyond")
    assert terms["vision forward beyond"] == peak.total_bytes - language_model
    assert peak.error_bytes == int(forward * vb.VISION_FORWARD_ERROR_FRACTION) == int(forward * 0.03)
    # V2 (0.32): the pixels are freed with the encoder call; the forward still binds.
    v2 = _peak("0.32.0", 128_000)
    assert "dummy images" not in dict(v2.terms) and v2.total_bytes == peak.total_bytes


def test_images_only_or_a_shorter_length_profile_a_smaller_item() -> None:
    """--limit-mm-per-prompt '{"video": 0}': one 16,384-token image (65,536 patches) at any length; 8,192
    tokens: one frame, the same 16,384 tokens; --mm-processor-kwargs max_pixels 1,003,520: 1,280 tokens."""
    images = _peak("0.19.0", 128_000, {"--limit-mm-per-prompt": '{"video": 0}'})
    short = _peak("0.19.0", 8192)
    assert images.total_bytes == short.total_bytes
    assert dict(short.terms)["encoder cache"] == 16_384 * 3584 * 2
    small = _peak("0.19.0", 8192, {"--mm-processor-kwargs": '{"max_pixels": 1003520}'})
    # 8192 // 1280 = 6 images: the language model's phase binds again.
    assert dict(small.terms)["encoder cache"] == 6 * 1280 * 3584 * 2
    assert dict(small.terms)["vision forward beyond"] == 0
    assert small.error_bytes == vb.V1_PEAK_ERROR_BYTES


def test_tensor_parallel_splits_the_projections_not_the_residual_stream() -> None:
    """TP 2: gate_up and the activation halve, the residual stream does not; the peak moves to the down projection,
    its shard and its all-reduced output beside gate_up and the product (6 W + 3 I / 2, traced as rank 0 of 2);
    --mm-encoder-tp-mode data runs the tower whole on each rank."""
    one, two = _peak("0.19.0", 128_000), _peak("0.19.0", 128_000, tp=2)
    patches = 458_752
    assert one.total_bytes - two.total_bytes == patches * ((4 * 1280 + 4 * 3420) - (6 * 1280 + 3 * 3420 // 2)) * 2
    forward = patches * 1176 * 2 + patches * ((6 * 1280 + 3 * 3420 // 2 + 2 * 80) * 2 + 6)
    assert two.error_bytes == int(forward * 0.03)
    data = vb.profile_peak(_geometry(), rules=vl.rules_for("0.19.0")[0], batched_tokens=8192, num_seqs=1024, tp=2,
                           max_model_len=128_000, mm_limits=vb.mm_limits({}), vision_tp=1)
    assert data.total_bytes == one.total_bytes


def test_qwen2_vl_gathers_qkv_at_tensor_parallel() -> None:
    """Qwen2-VL's ungated tower (embed_dim 1280, mlp_ratio 4, 16 heads of 80): at TP 1 the MLP's 3 W + 3 I
    (fc1, QuickGELU's native sigmoid and product) binds, beside the rotary cos/sin (80); at TP 4 split_qkv's
    all-gather keeps the whole qkv beside the split attention (7 W + 8 W / 4); at TP 8 the gather itself binds
    (its output and movedim copy beside the local qkv, 8 W + 3 W / 8)."""
    qwen2 = geometry_from_config({**CONFIG, "architectures": ["Qwen2VLForConditionalGeneration"],
                                  "model_type": "qwen2_vl",
                                  "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16,
                                                    "hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
                                                    "temporal_patch_size": 2}})
    assert vb._vision_forward_bytes(qwen2, patches=10, tp=1, act_dtype_bytes=2) == 10 * (3 * 1280 + 3 * 5120 + 80) * 2
    def forward(tp: int) -> int:
        return vb._vision_forward_bytes(qwen2, patches=10, tp=tp, act_dtype_bytes=2)

    assert forward(4) == 10 * (7 * 1280 + 8 * 1280 // 4 + 80) * 2
    assert forward(8) == 10 * (8 * 1280 + 3 * 1280 // 8 + 80) * 2


@pytest.mark.parametrize("raw", ['{"max_pixels": "big"}', '{"max_pixels": -1}', '{"max_pixels": true}', "not json",
                                 '[1, 2]', '{"max_pixels": 1e400}', '{"size": {"longest_edge": 0}}'])
def test_unreadable_processor_kwargs_keep_the_repos_default(raw: str) -> None:
    assert vb.mm_max_pixels({"--mm-processor-kwargs": raw}) is None
    assert vb.mm_max_pixels({"--mm-processor-kwargs": '{"size": {"longest_edge": 1003520}}'}) == 1_003_520
    assert vb.mm_max_pixels({"--mm-processor-kwargs": '{"max_pixels": null, "size": {"longest_edge": 3136}}'}) == 3136
    # Beyond any real image: bounded, not the default (the larger item, the safe side).
    assert vb.mm_max_pixels({"--mm-processor-kwargs": '{"max_pixels": 99999999999999999999999}'}) == vb.MM_MAX_PIXELS


def test_plan_leaves_the_vision_forward_out_of_the_kv_cache() -> None:
    """Qwen2.5-VL-7B on an L40S, vLLM 0.19: the plan keeps the length where the band's low end holds, with the
    vision forward in the activation row and a note on how to shrink it."""
    model = ResolvedModel(name="Qwen/Qwen2.5-VL-7B-Instruct", source="local", geometry=geometry_from_config(CONFIG),
                          weight_bytes=16_582_751_232, weight_bytes_source="test", config=CONFIG)
    plan = make_plan(PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["l40s"]), engine_version="0.19.0"))
    activation = next(item for item in plan.budget if item.key == "activation")
    assert activation.bytes > 10 * 2**30 and "vision forward" in activation.detail
    assert any("--limit-mm-per-prompt" in note for note in plan.notes)
    eight_k = make_plan(PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["l40s"]),
                                    engine_version="0.19.0", engine_args=("--max-model-len", "8192")))
    assert eight_k.kv_cache_bytes > plan.kv_cache_bytes + 10 * 2**30
    # The flags reach the planner as vLLM reads them: a smaller max_pixels, a smaller item.
    small = make_plan(PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["l40s"]),
                                  engine_version="0.19.0", engine_args=("--max-model-len", "8192",
                                                                        "--mm-processor-kwargs",
                                                                        '{"max_pixels": 1003520}')))
    detail = next(item.detail for item in small.budget if item.key == "activation")
    # 8,192 // 1,280 = 6 frame pairs: one 7,680-token video (vLLM 0.32's own sizing, the oracle's record)
    assert "1 dummy video x 7,680 tokens" in detail and small.kv_cache_bytes > eight_k.kv_cache_bytes


def _plan_warnings(config: dict[str, Any], *flags: str) -> tuple[str, ...]:
    model = ResolvedModel(name="vlm", source="local", geometry=geometry_from_config(config),
                          weight_bytes=16_582_751_232, weight_bytes_source="test", config=config)
    return make_plan(PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["h100"]), engine_version="0.19.0",
                                 engine_args=("--max-model-len", "8192", *flags))).warnings


def test_a_tower_whose_forward_is_not_derived_is_said() -> None:
    said = "that forward is not derived here"
    kimi = _config("kimi-vl-a3b-instruct")
    assert any(said in warning for warning in _plan_warnings(kimi))
    assert not any(said in warning for warning in _plan_warnings(kimi, "--language-model-only"))
    for derived in (CONFIG, QWEN3, _config("gemma-3-12b-it"), _config("mistral-small-3.1-24b-instruct-2503")):
        assert not any(said in warning for warning in _plan_warnings(derived))


def test_qwen3_5_takes_the_same_item_without_deepstack() -> None:
    """Qwen3.5-27B: Qwen3VLProcessingInfo and Qwen3_VisionTransformer (qwen3_5.py), no deepstack levels."""
    config = {k: v for k, v in json.loads((DATA / "configs" / "qwen3.5-27b.json").read_text()).items()
              if not k.startswith("_")}
    held = vb.encoder_profile(geometry_from_config(config), batched_tokens=2048, num_seqs=256, max_model_len=32768,
                              act_dtype_bytes=2, inputs_alive=True, limits=vb.mm_limits({}))
    assert held.outputs_bytes == 16_384 * 5120 * 2 and held.inputs_bytes == 65_536 * 1536 * 2
    assert held.forward_bytes == 65_536 * 1536 * 2 + 65_536 * ((11 * 1152 + 1152 + 72) * 2 + 16)


VISION = json.loads((DATA / "vllm_vision_forward_oracle.json").read_text())
QWEN_TOWERS = [(r["model"], g) for r in VISION["results"] for g in r["grids"] if "grid" in g]
assert len(QWEN_TOWERS) > 50
IMAGE_TOWERS = [(r["model"], g) for r in VISION["results"] for g in r["grids"] if "images" in g]


def _config(model: str) -> dict[str, Any]:
    return {k: v for k, v in json.loads((DATA / "configs" / f"{model}.json").read_text()).items()
            if not k.startswith("_")}


@pytest.mark.parametrize("record", QWEN_TOWERS,
                         ids=[f"{m}-tp{g['tp']}-{'x'.join(map(str, g['grid']))}" for m, g in QWEN_TOWERS])
def test_vision_forward_is_vllms_own_tower(record: tuple[str, dict[str, Any]]) -> None:
    """Every Qwen-VL record of the traced towers (0.34.0's modules, rank 0 of TP 1, 2, 4, 8): the planner's
    per-patch terms within 0.1 % (the int64 indices depend on the grid's shape, the planner takes their largest; a
    few hundred bytes of sequence offsets per forward are left out)."""
    model, grid = record
    ours = vb._vision_forward_bytes(geometry_from_config(_config(model)), patches=grid["patches"], tp=grid["tp"],
                                    act_dtype_bytes=2, frames=grid["grid"][0])
    assert abs(ours - grid["peak_bytes"]) <= grid["peak_bytes"] * 0.001


@pytest.mark.parametrize("record", IMAGE_TOWERS, ids=[f"{m}-tp{g['tp']}-{g['images']}" for m, g in IMAGE_TOWERS])
def test_image_towers_forward_is_vllms_own(record: tuple[str, dict[str, Any]]) -> None:
    """Gemma 3's SigLIP and projector, Mistral 3's Pixtral-HF and patch merger, over N dummy images at once
    (embed_multimodal), one rank: the planner's per-patch term times the patches of an image, to a few bytes
    (26,432 B a patch, 4,096 patches an image for Gemma 3: fc1 and GELU beside 4 W; 44,456 B, 12,100 for Mistral
    Small 3.1 at 1,540 px: gate_up, silu and product beside 5 W, the unfolded patch, rotary tables, positions)."""
    model, images = record
    geometry = geometry_from_config(_config(model))
    gemma = geometry.architecture == "Gemma3ForConditionalGeneration"
    assert vb._image_tower(geometry) == (4096 if gemma else 12_100)
    per_patch = vb._image_tower_per_patch(geometry, tp=images["tp"], act_dtype_bytes=2)
    if images["tp"] == 1:
        assert per_patch == ((4 * 1152 + 2 * 4304) * 2 if gemma else (5 * 1024 + 4 * 4096 + 588 + 128) * 2 + 16)
    assert 0 <= images["peak_bytes"] - images["patches"] * per_patch <= 64
    assert images["patches"] == images["images"] * vb._image_tower(geometry)


def test_gemma3_plan_counts_its_tower_where_it_binds() -> None:
    """Gemma 3 12B on an H100 (0.34, the V2 runner): at 8,192 tokens 32 dummy images go through SigLIP at once,
    32 x 4,096 patches x 26,432 B beside their pixels (32 x 3 x 896^2 x 2 B), above the language model's phase
    (the V2 sampler holds only the logits) by 1.6 GiB; the band +/- 3 % of it. On 0.19's V1 runner the 1,024-row sampler
    (14 B a logit) is larger and binds, as the published 0.19 H100 log shows."""
    geometry = geometry_from_config(_config("gemma-3-12b-it"))
    forward = 32 * 3 * 896 * 896 * 2 + 32 * 4096 * 26_432

    def peak(version: str) -> vb.ProfilePeak:
        return vb.profile_peak(geometry, rules=vl.rules_for(version)[0], batched_tokens=8192, num_seqs=1024, tp=1,
                               gpu_name="NVIDIA H100 80GB HBM3", max_model_len=8192, mm_limits=vb.mm_limits({}))

    v2 = peak("0.34.0")
    assert v2.total_bytes == forward + vb.PROFILE_CONSTANT_BYTES
    assert 1.6 * 2**30 < dict(v2.terms)["vision forward beyond"] < 1.7 * 2**30
    v1 = peak("0.19.0")
    assert dict(v1.terms)["vision forward beyond"] == 0 and v1.total_bytes > forward + vb.PROFILE_CONSTANT_BYTES
    # at TP 2 fc1 splits and the down projection's all-reduced output binds (6 W + I / 2, traced)
    split = vb.encoder_profile(geometry, batched_tokens=8192, num_seqs=1024, max_model_len=8192, act_dtype_bytes=2,
                               inputs_alive=False, tp=2, limits=vb.mm_limits({}))
    assert split.forward_bytes == 32 * 3 * 896 * 896 * 2 + 32 * 4096 * (6 * 1152 + 4304 // 2) * 2
    assert split.forward_error_bytes == int(split.forward_bytes * 0.03)


def test_gemma3_plan_says_how_to_profile_fewer_images() -> None:
    """A fixed-size image tower shrinks with the encoder budget (max_num_batched_tokens), not with max_pixels."""
    config = _config("gemma-3-12b-it")
    model = ResolvedModel(name="gemma-3-12b", source="local", geometry=geometry_from_config(config),
                          weight_bytes=24_600_000_000, weight_bytes_source="test", config=config)
    plan = make_plan(PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["h100"]), engine_version="0.34.0"))
    note = next(n for n in plan.notes if "encodes its largest dummy item" in n)
    assert "32 dummy images x 256 embeds" in note and "a smaller --max-num-batched-tokens profiles fewer images" in note
    assert "max_pixels" not in note
    fewer = make_plan(PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["h100"]), engine_version="0.34.0",
                                  engine_args=("--max-num-batched-tokens", "2048")))
    assert fewer.kv_cache_bytes > plan.kv_cache_bytes
    assert "8 dummy images x 256 embeds" in next(item.detail for item in fewer.budget if item.key == "activation")


def test_the_dummy_items_kind_says_what_shrinks_it() -> None:
    """Qwen2.5-VL at 128k profiles a video (frames), Qwen3-VL a max_pixels image, Gemma 3 fixed-size images;
    a tower not derived has no kind. The profile peak carries it to the plan's note."""
    def item(config: dict[str, Any], length: int) -> str:
        return vb.encoder_profile(geometry_from_config(config), batched_tokens=8192, num_seqs=1024,
                                  max_model_len=length, act_dtype_bytes=2, inputs_alive=False,
                                  limits=vb.mm_limits({})).item

    assert [item(CONFIG, 128_000), item(QWEN3, 32_768), item(_config("gemma-3-12b-it"), 8192),
            item(_config("kimi-vl-a3b-instruct"), 8192)] == ["video", "image", "fixed image", ""]
    assert _peak("0.34.0", 128_000).encoder_item == "video"


def test_the_traced_towers_cover_each_family() -> None:
    """The oracle traced every tower kind the planner derives, on 0.34.0, at TP 1, 2 and 4 (8 where the model takes
    it: Qwen2-VL and Qwen2.5-VL 7B's 28 heads do not), without error."""
    assert VISION["header"]["vllm"] == "0.34.0" and VISION["header"]["tp"] == [1, 2, 4, 8]
    for result in VISION["results"]:
        sizes = {g["tp"] for g in result["grids"]}
        assert {1, 2, 4} <= sizes and (8 in sizes) != ("8" in result["refused"]), result["model"]
    kinds = {r["architecture"] for r in VISION["results"] if "error" not in r and r["grids"]}
    assert kinds == {"Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
                     "Qwen3VLForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                     "Qwen3_5MoeForConditionalGeneration", "Gemma3ForConditionalGeneration",
                     "Mistral3ForConditionalGeneration"}
