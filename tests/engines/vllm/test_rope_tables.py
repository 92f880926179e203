"""vLLM's rotary tables, counted with the weights (vllm/budget.py rope_tables), against the tables
vLLM 0.32 builds itself (tests/oracles/vllm_params.py -> tests/data/vllm_params.json)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from launcher.common.errors import ModelConfigError
from launcher.common.units import GiB, MiB
from launcher.engines.vllm import budget as vb
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = json.loads((ROOT / "tests" / "data" / "vllm_params.json").read_text())
BUILT = [record for record in GOLDEN["results"] if "error" not in record]


def _geometry(record: dict[str, Any]) -> Any:
    source = ROOT / record["source"]
    text = source.read_text()
    return geometry_from_config(yaml.safe_load(text)["config"] if source.suffix == ".yaml" else json.loads(text))


def _tables(record: dict[str, Any]) -> int:
    """The language model's cos/sin tables as vLLM built them (the vision towers' are under 1 MiB)."""
    return sum(size * count for key, (_, _, size, count) in record["buffers"].items()
               if "cos_sin_cache" in key and not key.startswith(("visual", "vision")))


def test_the_golden_file_is_vllms_own() -> None:
    assert GOLDEN["meta"]["vllm"].startswith("0.32.0")
    assert (len(GOLDEN["results"]), len(BUILT)) == (122, 107)


@pytest.mark.parametrize("record", BUILT, ids=lambda record: record["id"])
def test_every_table_vllm_builds(record: dict[str, Any]) -> None:
    tables = vb.rope_tables(_geometry(record), dtype=record["dtype"], version="0.32.0")
    assert tables is not None and tables.bytes == _tables(record)


@pytest.mark.parametrize(("case", "positions", "rotary", "tables"), [
    ("config:llama-4-scout-17b-16e-instruct", 10_485_760, 128, 1),  # 2.5 GiB on every rank
    ("config:mistral-nemo-instruct-2407", 1_024_000, 128, 1),
    ("config:gemma-3-12b-it", 131072 * 8 + 131072, 256, 1),  # linear x 8 for the full layers, the sliding ones' own
    ("config:qwen2.5-vl-7b", 128000 * 4, 128, 1),  # M-RoPE: 4 x the maximum
    ("config:phi-3.5-mini-instruct", 131072 + 4096, 96, 1),  # longrope: the long and the short table
])
def test_the_large_ones(case: str, positions: int, rotary: int, tables: int) -> None:
    record = next(record for record in BUILT if record["id"] == case)
    assert _tables(record) == positions * rotary * 2 * tables


def test_the_weights_term_counts_them() -> None:
    """Llama-3.1-8B: vLLM's "Model loading took" is the checkpoint and its 32 MiB table; the plan too,
    and the KV cache is that much smaller than the checkpoint alone leaves."""
    model = resolve_model("llama-3.1-8b")
    plan = make_plan(PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus(["h100"])))
    weights = plan.item("weights")
    assert weights.bytes - model.weight_bytes == 131072 * 128 * 2 == 32 * MiB
    assert "rotary tables 0.03 GiB: 131,072 positions x 128 x 2 B" in weights.detail
    assert weights.bytes < 15 * GiB


def test_transformers_backend_builds_none_from_0_32() -> None:
    """Seed-OSS runs on vLLM's Transformers backend in 0.32 (registry.py:709-730): no table at load;
    before, the plan counts one (the safe side)."""
    geometry = _geometry(next(record for record in BUILT if record["id"] == "config:seed-oss-36b-instruct"))
    assert vb.rope_tables(geometry, dtype="bfloat16", version="0.32.0").bytes == 0
    assert vb.rope_tables(geometry, dtype="bfloat16", version="0.19.0").bytes == 524288 * 128 * 2


def test_qwen3_vl_takes_factor_one_from_0_32_only() -> None:
    """0.32 passes mrope_positions_factor 1 for Qwen3-VL (qwen3_vl.py:1818-1831); 0.19 has no such argument
    and builds 4 x the maximum (mrope.py:238): counted x 4 before 0.32."""
    geometry = _geometry(next(record for record in BUILT if record["id"] == "config:qwen3-vl-8b-instruct"))
    assert vb.rope_tables(geometry, dtype="bfloat16", version="0.32.0").bytes == 262144 * 128 * 2
    assert vb.rope_tables(geometry, dtype="bfloat16", version="0.19.0").bytes == 4 * 262144 * 128 * 2



def test_rope_parameters_per_layer_type_count_a_table_each() -> None:
    """transformers 5 writes rope_parameters per layer type; Gemma 3 in that form: the same two tables."""
    record = next(record for record in BUILT if record["id"] == "config:gemma-3-12b-it")
    source = json.loads((ROOT / record["source"]).read_text())
    text = {key: value for key, value in source["text_config"].items()
            if key not in ("rope_scaling", "rope_local_base_freq", "rope_theta")}
    text["rope_parameters"] = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                               "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}
    geometry = geometry_from_config({**source, "text_config": text})
    assert vb.rope_tables(geometry, dtype="bfloat16", version="0.32.0").bytes == _tables(record) == 603_979_776


def test_a_table_no_engine_would_build_is_not_derived() -> None:
    """A zero-length table (a stranger's config.json: no rotary dims) must not be derived as a saving; the
    zero factors that would give one are refused before (config.py: a rope factor and a partial rotary factor are
    above 0), and a geometry built past that check still derives none."""
    model = resolve_model("llama-3.1-8b")
    with pytest.raises(ModelConfigError, match="'partial_rotary_factor' must be a number above 0 to 1"):
        geometry_from_config({**model.config, "partial_rotary_factor": 0.0})
    geometry = dataclasses.replace(geometry_from_config(model.config),
                                   text_config={**model.config, "partial_rotary_factor": 0.0})
    assert vb.rope_tables(geometry, dtype="bfloat16", version="0.32.0") is None
    with pytest.raises(ModelConfigError, match="'rope_scaling.factor' must be a number above 0 to 6.55e"):
        geometry_from_config({**model.config, "rope_scaling": {"rope_type": "linear", "factor": 0}})


def test_gemma_olmoe_stablelm_move_to_the_transformers_backend_in_0_34() -> None:
    """0.34.0 registry.py:782-811 maps GemmaForCausalLM (and OLMoE, StableLM, Aria) to the Transformers
    backend (models/gemma.py is gone): Gemma-7B's 8,192 x 256 bf16 table is no longer built at load."""
    from launcher.model.config import geometry_from_config

    gemma = geometry_from_config({"architectures": ["GemmaForCausalLM"], "model_type": "gemma",
                                  "hidden_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 16,
                                  "head_dim": 256, "num_hidden_layers": 28, "intermediate_size": 24576,
                                  "vocab_size": 256000, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"})
    assert vb.rope_tables(gemma, dtype="bfloat16", version="0.33.0").bytes == 8192 * 256 * 2 == 4 * MiB
    assert vb.rope_tables(gemma, dtype="bfloat16", version="0.34.0").bytes == 0
