"""MLA's decode weights (vllm/budget.py mla_decode_weights): a quantized kv_b_proj is dequantized into a
model-dtype copy that W_UK_T and W_UV keep alive (vLLM 0.32 mla_attention.py:407-422, :1220-1320), inside
"Model loading took"; an unquantized one is its own weight."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from launcher.common.units import MiB
from launcher.engines.vllm import budget as vb
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.resolve import ResolvedModel, resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest

ROOT = Path(__file__).resolve().parents[3]
PARAMS = {record["id"]: record for record in json.loads((ROOT / "tests" / "data" / "vllm_params.json").read_text())
          ["results"]}


def _config(name: str) -> dict[str, Any]:
    return dict(json.loads((ROOT / "tests" / "data" / "configs" / f"{name}.json").read_text()))


def test_deepseek_v3_fp8_at_eight_ranks() -> None:
    """61 MLA layers, 128 heads split 8 ways: 512 x 16 x (128 + 128) x 2 B = 4 MiB a layer on each rank."""
    geometry = geometry_from_config(_config("deepseek-v3"))
    added = vb.mla_decode_weights(geometry, dtype="bfloat16", tp=8, pp=1)
    assert added.bytes == 61 * 512 * 16 * 256 * 2 == 244 * MiB
    assert added.rule == "MLA W_UK_T/W_UV: kv_b_proj dequantized to bfloat16, 61 layers x 512 x 16 heads x 256"
    assert vb.mla_decode_weights(geometry, dtype="bfloat16", tp=8, pp=2).bytes == 31 * 4 * MiB  # ceil(61 / 2)


def test_an_unquantized_kv_b_proj_is_its_own_weight() -> None:
    """DeepSeek-V2-Lite in bf16: the views are of the loaded weight (get_and_maybe_dequant_weights returns
    it); vLLM's own parameters for it are the checkpoint's (tests/data/vllm_params.json)."""
    model = resolve_model("deepseek-v2-lite")
    assert vb.mla_decode_weights(model.geometry, dtype="bfloat16", tp=1, pp=1).bytes == 0
    assert PARAMS["deepseek-v2-lite"]["parameter_bytes"] == 31412968448
    # Online fp8 quantizes kv_b_proj too: the copy is back (27 layers, 16 heads, 512 x 256).
    online = vb.mla_decode_weights(model.geometry, dtype="bfloat16", tp=1, pp=1, online_quantization="fp8")
    assert online.bytes == 27 * 512 * 16 * 256 * 2


def test_a_checkpoint_that_leaves_kv_b_proj_unquantized() -> None:
    config = _config("deepseek-v3")
    quant = config["quantization_config"]
    every = geometry_from_config({**config, "quantization_config": {**quant, "ignore": ["lm_head", "re:.*kv_b_proj"]}})
    assert vb.mla_decode_weights(every, dtype="bfloat16", tp=8, pp=1).bytes == 0
    two = geometry_from_config({**config, "quantization_config": {**quant, "modules_to_not_convert": [
        "model.layers.0.self_attn.kv_b_proj", "model.layers.1.self_attn.kv_b_proj", "model.layers.2.mlp"]}})
    assert vb.mla_decode_weights(two, dtype="bfloat16", tp=8, pp=1).bytes == 59 * 4 * MiB


def test_the_plan_counts_the_copies_with_the_weights() -> None:
    """A DeepSeek-V2-Lite with an fp8 quantization_config (its weights as the profile's): the weights row is
    the checkpoint's share + the rotary table + 27 copies of 4 MiB, labelled computed."""
    model = resolve_model("deepseek-v2-lite")
    config = {**model.config, "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                                                      "weight_block_size": [128, 128]}}
    quantized = dataclasses.replace(model, geometry=geometry_from_config(config), config=config)
    assert isinstance(quantized, ResolvedModel)
    plain = make_plan(PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["h100"])))
    fp8 = make_plan(PlanRequest(model=quantized, engine="vllm", gpus=hypothetical_gpus(["h100"])))
    assert fp8.item("weights").bytes - plain.item("weights").bytes == 27 * 512 * 16 * 256 * 2 == 108 * MiB
    assert "0.11 GiB MLA W_UK_T/W_UV: kv_b_proj dequantized to bfloat16, 27 layers" in fp8.item("weights").detail
    assert fp8.item("weights").source == "computed"


def _with_quant(**changes: Any) -> Any:
    config = _config("deepseek-v3")
    return geometry_from_config({**config, "quantization_config": {**config["quantization_config"], **changes}})


def test_ignore_lists_are_matched_as_vllm_matches_them() -> None:
    """A regex naming some layers leaves the others' copies; a regex or wildcard over all attention
    leaves none; config_groups whose targets miss kv_b_proj leave it unquantized; the MTP layer (61),
    outside the decoder, changes nothing."""
    def mib(geometry: Any, pp: int = 1) -> int:
        return vb.mla_decode_weights(geometry, dtype="bfloat16", tp=8, pp=pp).bytes // MiB

    assert mib(_with_quant(ignore=[r"re:model\.layers\.[0-2]\.self_attn\.kv_b_proj"])) == 58 * 4
    assert mib(_with_quant(ignore=["re:.*self_attn.*", "lm_head"])) == 0  # as Kimi-K2-Thinking ships
    assert mib(_with_quant(exclude_modules=["model.layers.*.self_attn*"])) == 0  # ModelOpt's wildcards
    assert mib(_with_quant(exclude=["re:.*kv_b_proj$"])) == 0  # Quark
    assert mib(_with_quant(config_groups={"group_0": {"targets": [r"re:.*mlp\.experts.*"]}})) == 0
    assert mib(_with_quant(config_groups={"group_0": {"targets": ["Linear"]}})) == 61 * 4
    assert mib(_with_quant(modules_to_not_convert=["model.layers.61.self_attn.kv_b_proj"])) == 61 * 4
    # fp8's modules_to_not_convert matches exactly: "self_attn" alone names no layer there (AWQ's would).
    assert mib(_with_quant(modules_to_not_convert=["self_attn"])) == 61 * 4


def test_pipeline_stages_split_as_vllm_splits_them() -> None:
    """61 layers on 2 stages are [31, 30] (get_pp_indices): with layers 0-3 unquantized the first stage
    holds 27 copies, the second 30, and the plan takes the larger."""
    ignored = [f"model.layers.{i}.self_attn.kv_b_proj" for i in range(4)]
    added = vb.mla_decode_weights(_with_quant(ignored_layers=ignored), dtype="bfloat16", tp=8, pp=2)
    assert added.bytes == 30 * 4 * MiB


def test_a_strangers_regex_cannot_stall_the_plan() -> None:
    """Patterns that could backtrack for long are not run: the copies are counted (the safe side), at once."""
    started = time.monotonic()
    for pattern in ["re:(a+)+$", "re:(.*)*x", "re:" + ".*" * 12 + "x", "re:" + "a" * 500, "re:[unclosed"]:
        assert vb.mla_decode_weights(_with_quant(ignore=[pattern]), dtype="bfloat16", tp=8, pp=1).bytes == 244 * MiB
    assert time.monotonic() - started < 5
