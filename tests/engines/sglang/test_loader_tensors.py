"""The tensors SGLang's loader allocates, derived (launcher/engines/sglang/parameters.py), against the
modules SGLang 0.5.23 builds itself (tests/oracles/sglang_params.py -> tests/data/sglang_params.json):
tensor by tensor where derived, and the layer-count bound where not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from launcher.common.units import MiB
from launcher.engines.sglang import budget as sb
from launcher.engines.sglang import parameters
from launcher.model import allocator
from launcher.model.config import ModelGeometry, geometry_from_config

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = json.loads((ROOT / "tests" / "data" / "sglang_params.json").read_text())
BUILT = [record for record in GOLDEN["results"] if "error" not in record]
# The same cases built by 2 and 4 ranks (one process each, rank 0 kept): the splits of every layer.
SPLIT = [record for tp in (2, 4)
         for record in json.loads((ROOT / "tests" / "data" / f"sglang_params_tp{tp}.json").read_text())["results"]
         if "error" not in record]
ELEMENT = {"bfloat16": 2, "float16": 2, "float32": 4}
# SGLang has no module of its own for Seed-OSS and runs the Transformers backend, whose rotary
# embedding computes its table in the forward pass: the bound, which counts a rope cache, is above.
TRANSFORMERS_BACKEND = {"config:seed-oss-36b-instruct"}


def _config(record: dict[str, Any]) -> dict[str, Any]:
    source = ROOT / record["source"]
    loaded = yaml.safe_load(source.read_text()) if source.suffix == ".yaml" else json.loads(source.read_text())
    return loaded["config"] if source.suffix == ".yaml" else loaded


def _sequence(record: dict[str, Any]) -> list[int]:
    """Every tensor's bytes in creation order."""
    sizes = [tensor[3] for tensor in record["before_layers"]]
    for kind in record["layers"]:
        sizes += [tensor[3] for tensor in record["layer_kinds"][kind]]
    return sizes + [tensor[3] for tensor in record["after_layers"]]


def _geometry(record: dict[str, Any]) -> ModelGeometry:
    return geometry_from_config(_config(record))


DERIVED = [record for record in BUILT
           if parameters.loader_tensors(_geometry(record), element=ELEMENT[record["dtype"]], tp=1) is not None]


def test_the_golden_file_is_sglangs_own() -> None:
    assert GOLDEN["meta"]["sglang"] == "0.5.23" and GOLDEN["meta"]["platform"] == "sm90"
    assert len(GOLDEN["results"]) == 122 and len(BUILT) == 102


def test_derived_families_cover_the_common_decoders() -> None:
    """Llama/Mistral/Qwen2/Qwen3 (plain, AWQ, FP8), Phi-3/4, Granite 3, GLM-4, Gemma 2, Qwen3-MoE, Mixtral,
    DeepSeek-V2-Lite."""
    families = {(_geometry(record).architecture, record["quant_class"]) for record in DERIVED}
    assert len(DERIVED) == 65
    assert families == {
        ("LlamaForCausalLM", None), ("MistralForCausalLM", None), ("Qwen2ForCausalLM", None),
        ("Qwen3ForCausalLM", None), ("Gemma2ForCausalLM", None), ("Qwen3MoeForCausalLM", None),
        ("MixtralForCausalLM", None), ("DeepseekV2ForCausalLM", None), ("Phi3ForCausalLM", None),
        ("GraniteForCausalLM", None), ("Glm4ForCausalLM", None),
        ("LlamaForCausalLM", "AWQMarlinConfig"), ("Qwen2ForCausalLM", "AWQMarlinConfig"),
        ("Qwen3ForCausalLM", "AWQMarlinConfig"), ("LlamaForCausalLM", "CompressedTensorsConfig"),
        ("Qwen2ForCausalLM", "CompressedTensorsConfig")}


@pytest.mark.parametrize("record", DERIVED, ids=lambda record: record["id"])
def test_tensor_by_tensor(record: dict[str, Any]) -> None:
    """The same tensors in the same order; what no checkpoint holds equals SGLang's buffers (the
    rope cache, Gemma's norm copies) and the vocab padding."""
    geometry = _geometry(record)
    element = ELEMENT[record["dtype"]]
    loader = parameters.loader_tensors(geometry, element=element, tp=1)
    assert loader is not None
    assert list(loader.tensors) == _sequence(record)
    tied = geometry.tie_word_embeddings or geometry.architecture == "Gemma2ForCausalLM"
    padding = parameters.vocab_padding_bytes(geometry, element=element, tp=1, tied=tied)
    assert loader.engine_only_bytes == record["buffer_bytes"] + padding


def _post_load(record: dict[str, Any]) -> list[int]:
    """The tensors post_load_weights added after loading, in order ([] for a model without one)."""
    added = record.get("post_load", [])
    assert isinstance(added, list), added  # an error on the meta device would be a dict
    return [tensor[3] for tensor in added]


def test_post_load_copies_are_sglangs() -> None:
    """Only the MLA models add tensors after loading: w_kc and w_vc a layer, 2 MiB each for DeepSeek-V2-Lite
    and Kimi-VL's language model (16 heads x 128 x 512 in bf16), 16 MiB for DeepSeek-V3 (128 heads, its
    block FP8 dequantized), 4 MiB for Kimi-Linear's 7 MLA layers (32 heads) among its KDA ones."""
    added = {record["id"]: _post_load(record) for record in BUILT if _post_load(record)}
    assert set(added) == {"deepseek-v2-lite", "config:deepseek-v2-lite", "config:deepseek-v3", "config:deepseek-v3.1",
                          "config:deepseek-r1-0528", "config:kimi-k2-instruct", "config:kimi-linear-48b-a3b-instruct",
                          "config:kimi-vl-a3b-instruct"}
    assert added["deepseek-v2-lite"] == added["config:kimi-vl-a3b-instruct"] == [2 * MiB] * 2 * 27
    assert added["config:deepseek-v3"] == [16 * MiB] * 2 * 61
    assert added["config:kimi-linear-48b-a3b-instruct"] == [4 * MiB] * 2 * 7


@pytest.mark.parametrize("record", [record for record in BUILT + SPLIT if _post_load(record)],
                         ids=lambda record: f"{record['id']}-tp{record.get('tp', 1)}")
def test_every_mla_copy_is_counted(record: dict[str, Any]) -> None:
    """Derived or bounded, the leftovers count the copies SGLang makes, per rank."""
    geometry = _geometry(record)
    tp = record.get("tp", 1)
    copies, rule = parameters.mla_decode_copies(geometry, element=ELEMENT[record["dtype"]], tp=tp)
    assert copies == _post_load(record)
    overhead = sb.load_overhead(geometry, dtype=record["dtype"], tp=tp, pp=1)
    assert rule in overhead.detail and overhead.bytes >= sum(copies)


def test_the_copies_of_the_fullest_pipeline_stage() -> None:
    """Kimi-Linear's MLA layers (3, 7, ..., 26) on 2 stages of 13 + 14 layers: 3 and 4 of them."""
    record = next(record for record in BUILT if record["id"] == "config:kimi-linear-48b-a3b-instruct")
    geometry = _geometry(record)
    kinds = geometry.layer_kinds
    stages = [sum(1 for i in range(start, stop) if kinds[i] == "mla") for start, stop in ((0, 13), (13, 27))]
    copies, _ = parameters.mla_decode_copies(geometry, element=2, tp=1, pp=2)
    assert len(copies) == 2 * max(stages) and stages == [3, 4]


POST_LOAD_DERIVED = [record for record in DERIVED + SPLIT if _post_load(record) and parameters.loader_tensors(
    _geometry(record), element=ELEMENT[record["dtype"]], tp=record.get("tp", 1)) is not None]


@pytest.mark.parametrize("record", POST_LOAD_DERIVED,
                         ids=lambda record: f"{record['id']}-tp{record.get('tp', 1)}")
def test_post_load_tensor_by_tensor(record: dict[str, Any]) -> None:
    """The derived copies are SGLang's, per rank, and the leftovers count them."""
    geometry = _geometry(record)
    loader = parameters.loader_tensors(geometry, element=ELEMENT[record["dtype"]], tp=record.get("tp", 1))
    copies, _ = parameters.mla_decode_copies(geometry, element=ELEMENT[record["dtype"]], tp=record.get("tp", 1))
    assert loader is not None and copies == _post_load(record)
    overhead = sb.load_overhead(geometry, dtype=record["dtype"], tp=record.get("tp", 1), pp=1)
    assert overhead.bytes >= loader.engine_only_bytes + sum(copies)
    assert overhead.detail.startswith("derived: ")
    assert f"MLA w_kc/w_vc copies of kv_b_proj {sum(copies) // MiB} MiB" in overhead.detail


SPLIT_DERIVED = [record for record in SPLIT if parameters.loader_tensors(
    _geometry(record), element=ELEMENT[record["dtype"]], tp=record["tp"]) is not None]


def test_every_split_case_is_derived_where_one_rank_is() -> None:
    """65 cases at 2 ranks, 63 at 4: SGLang does not build Qwen2.5-0.5B (14 heads) or Phi-4 (10 KV heads)
    at 4."""
    assert [len([r for r in SPLIT_DERIVED if r["tp"] == tp]) for tp in (2, 4)] == [65, 63]


@pytest.mark.parametrize("record", SPLIT_DERIVED, ids=lambda record: f"{record['id']}-tp{record['tp']}")
def test_tensor_by_tensor_per_rank(record: dict[str, Any]) -> None:
    geometry = _geometry(record)
    loader = parameters.loader_tensors(geometry, element=ELEMENT[record["dtype"]], tp=record["tp"])
    assert loader is not None and list(loader.tensors) == _sequence(record)


@pytest.mark.parametrize("record", [record for record in DERIVED if record["source"].startswith("profiles/")],
                         ids=lambda record: record["id"])
def test_profiles_weights_are_the_parameters(record: dict[str, Any]) -> None:
    """The profile's weight bytes are SGLang's parameters, to the byte for unquantized and AWQ models;
    FP8 checkpoints keep their scales in bfloat16 where SGLang allocates float32 (under 3 MiB)."""
    profile = yaml.safe_load((ROOT / record["source"]).read_text())
    loader = parameters.loader_tensors(_geometry(record), element=ELEMENT[record["dtype"]], tp=1)
    assert loader is not None
    difference = sum(loader.tensors) - loader.engine_only_bytes - profile["weight_bytes"]
    if loader.quantized_with in ("fp8-channel", "fp8-tensor"):
        assert 0 <= difference < 3 * MiB
    else:
        assert difference == 0


@pytest.mark.parametrize("record", [record for record in BUILT if record not in DERIVED],
                         ids=lambda record: record["id"])
def test_the_bound_holds_where_not_derived(record: dict[str, Any]) -> None:
    """Where the tensors are not derived the plan bounds the leftovers by the layer count: SGLang's own
    tensors (their allocator rounding and buffers, and the MLA copies made after loading) fall inside, or
    below for the Transformers backend."""
    geometry = _geometry(record)
    sequence = _sequence(record) + _post_load(record)
    truth = allocator.slack_bytes(sequence) + record["buffer_bytes"] + sum(_post_load(record)) \
        + sb.LOAD_RESIDUAL_BYTES
    bound = sb.load_overhead(geometry, dtype=record["dtype"], tp=1, pp=1, compute_capability=(9, 0))
    assert truth <= bound.bytes + bound.error_bytes
    if record["id"] not in TRANSFORMERS_BACKEND:
        assert bound.bytes - bound.error_bytes <= truth


# The same cases built on other cards' platform presets, recorded compactly (tests/oracles/sglang_params.py
# --digest): per case the SHA-256 of its tensors' bytes in creation order.
PLATFORMS = {platform: json.loads((ROOT / "tests" / "data" / f"sglang_params_{platform}.json").read_text())
             for platform in ("sm80", "sm86", "sm89", "sm100")}


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_every_card_builds_the_derived_tensors(platform: str) -> None:
    """A100, A10/RTX 3090, L4/RTX 4090, B200: SGLang builds what the derivation lists, as on the H100
    (AWQ becomes awq_marlin on each, compressed-tensors FP8 keeps its tensors below sm89)."""
    import hashlib

    records = {record["id"]: record for record in PLATFORMS[platform]["results"]}
    assert PLATFORMS[platform]["meta"]["platform"] == platform
    checked = 0
    for record in DERIVED:
        built = records[record["id"]]
        loader = parameters.loader_tensors(_geometry(record), element=ELEMENT[record["dtype"]], tp=1)
        assert loader is not None
        text = json.dumps(list(loader.tensors), separators=(",", ":")).encode()
        assert (built["quant_class"], built["sha256"]) == (record["quant_class"], hashlib.sha256(text).hexdigest())
        checked += 1
    assert checked == 65

