"""Every verified architecture equals the real vLLM 0.32 CPU engine on every recorded setting.

Offline: the engine's own figures are in tests/data/vllm_cpu_truth.json (recorded by
`tests/engine_harness.py truth` on tiny random checkpoints from tests/tinymodels.py); the
table under test is launcher/engines/vllm/architectures.py. The live twin is
tests/test_engine_vllm_cpu.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.common.errors import WontFit
from launcher.common.units import GiB
from launcher.engines.vllm.architectures import (
    CHUNKED,
    ENGINE_VERSION,
    PATTERN_SWITCHES,
    VERIFIED,
    architecture_status,
    config_switches,
    verified_architectures,
    vllm_layer_specs,
)
from launcher.engines.vllm.hybrid import STATE_FAMILIES
from launcher.engines.vllm.kv import kv_layout
from launcher.model.config import FULL, MLA, SLIDING, geometry_from_config
from launcher.model.gpu import HostMemory
from launcher.model.resolve import ResolvedModel
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest

TRUTH = json.loads((Path(__file__).resolve().parents[2] / "data" / "vllm_cpu_truth.json").read_text())
BY_ID = {c["id"]: c for c in TRUTH["cases"]}
AMX = TRUTH["meta"]["versions"]["amx"]
ROW_CASES = [(row.architecture, cid) for row in VERIFIED for cid in row.cases]


def _plan(case: dict[str, Any]) -> Any:
    model = ResolvedModel(name=case["kind"], source="local", geometry=geometry_from_config(case["config"]),
                          weight_bytes=10 * 2**20, weight_bytes_source="tiny test model", config=case["config"])
    request = PlanRequest(model=model, engine="vllm", device="cpu",
                          host=HostMemory(total_bytes=24 * GiB, available_bytes=20 * GiB, cpu_amx=AMX),
                          engine_args=tuple(case["args"]), engine_env=case["env"], engine_version=ENGINE_VERSION)
    return make_plan(request)


def _served(case: dict[str, Any]) -> bool:
    return bool(case.get("ok") and case.get("completion_ok"))


@pytest.mark.parametrize(("architecture", "case_id"), ROW_CASES, ids=[cid for _, cid in ROW_CASES])
def test_every_recorded_case_equals_the_plan(architecture: str, case_id: str) -> None:
    """Tokens, concurrency and blocks equal the engine; cases it sized but could not serve are refused."""
    case = BY_ID[case_id]
    assert case["config"]["architectures"][0] == architecture
    assert case["tokens"] is not None, f"{case_id}: the engine printed no KV line"
    if not _served(case):
        with pytest.raises(WontFit):
            _plan(case)
        return
    plan = _plan(case)
    assert (plan.kv_cache_tokens, f"{plan.max_concurrency:.2f}") == (case["tokens"], case["concurrency_str"])
    if case.get("num_blocks") is not None:
        assert plan.num_blocks == case["num_blocks"]


@pytest.mark.parametrize("row", VERIFIED, ids=[row.architecture for row in VERIFIED])
def test_each_row_is_proven_by_two_served_settings(row: Any) -> None:
    """A row is verified only by >= 2 recorded engine settings, one of them answering a completion."""
    cases = [BY_ID[cid] for cid in row.cases]
    assert len({(tuple(c["args"]), tuple(sorted(c["env"].items()))) for c in cases}) >= 2
    assert any(_served(c) for c in cases)
    assert {c.get("engine_version", TRUTH["meta"]["versions"]["vllm"]) for c in cases} == {row.engine_version}
    ok, note = architecture_status(geometry_from_config(cases[0]["config"]))
    assert ok and row.architecture in note


def test_recorded_architectures_outside_the_table_are_marked_unverified() -> None:
    """Verified means a row of the table (engine runs) or a state family proven by the golden file."""
    verified = {row.architecture for row in VERIFIED}
    golden = {f.architecture for f in STATE_FAMILIES.values() if f.golden}
    for case in TRUTH["cases"]:
        geometry = geometry_from_config(case["config"])
        ok, note = architecture_status(geometry)
        assert ok == (geometry.architecture in verified | golden), case["id"]


def test_removal_is_the_minor_release_after_the_last_that_served_it() -> None:
    """registry.py keeps MPTForCausalLM in 0.28.0 and lists it as supported until 0.28.0 from 0.29.0."""
    from launcher.engines.vllm.architectures import removed_in

    assert (removed_in("MPTForCausalLM"), removed_in("KeyeForConditionalGeneration")) == ("0.29.0", "0.34.0")
    assert removed_in("Phi3SmallForCausalLM") == "0.10.0" and removed_in("LlamaForCausalLM") is None


def test_unknown_and_removed_architectures_are_not_verified() -> None:
    base = dict(BY_ID["llama-base"]["config"])
    ok, note = architecture_status(geometry_from_config({**base, "architectures": ["FooBarForCausalLM"]}))
    assert not ok and note.startswith("unverified architecture FooBarForCausalLM")
    ok, note = architecture_status(geometry_from_config({**base, "architectures": ["MPTForCausalLM"]}))
    assert not ok and "supported until 0.28.0" in note
    ok, note = architecture_status(geometry_from_config(base))
    assert ok and note.startswith("verified architecture LlamaForCausalLM")


def test_listing_is_sorted_and_complete() -> None:
    rows = verified_architectures()
    assert [r.architecture for r in rows] == sorted(r.architecture for r in VERIFIED)
    assert len(rows) == len({r.architecture for r in rows}) >= 25
    assert rows[0].as_dict()["engine_version"] == "0.32.0" and rows[0].as_dict()["engine"] == "vllm"


# --------------------------------------------------------------------------- engine quirks, one each


def _geometry(case_id: str) -> Any:
    return geometry_from_config(BY_ID[case_id]["config"])


def test_cohere2_passes_the_window_plus_one() -> None:
    specs = vllm_layer_specs(_geometry("cohere2-base"))
    assert [(s.kind, s.window) for s in specs if s] == [(SLIDING, 257)] * 3 + [(FULL, None)]


def test_minicpm3_caches_plain_kv_of_nope_plus_rope() -> None:
    geometry = _geometry("minicpm3-base")
    assert geometry.mla is not None  # the config carries kv_lora_rank, but vLLM caches K and V
    shapes = {(s.kind, s.num_kv_heads, s.head_size, s.head_size_v) for s in vllm_layer_specs(geometry) if s}
    assert shapes == {(FULL, 4, 96, 96)}


def test_deepseek_caches_one_latent() -> None:
    spec = vllm_layer_specs(_geometry("deepseek_v3-base"))[0]
    assert spec is not None and (spec.kind, spec.num_kv_heads, spec.head_size, spec.head_size_v) == (MLA, 1, 576, 0)


def test_falcon_heads_follow_multi_query_and_ignore_fp8() -> None:
    old, new = _geometry("falcon-base"), _geometry("falcon_ndarch-base")
    assert (old.num_kv_heads, new.num_kv_heads) == (1, 2)
    assert not any(s.kv_dtype_honoured for s in vllm_layer_specs(old) if s)
    bf16 = kv_layout(old, block_size=128, kv_dtype_bytes=2)
    fp8 = kv_layout(old, block_size=128, kv_dtype_bytes=1)
    assert fp8.bytes_per_block == bf16.bytes_per_block == 4 * 128 * 1 * 64 * 2


def test_llama4_rope_layers_are_chunked_nope_layers_full() -> None:
    specs = vllm_layer_specs(_geometry("llama4-base"))
    assert [(s.kind, s.window) for s in specs if s] == [(CHUNKED, 256)] * 3 + [(FULL, None)]
    layout = kv_layout(_geometry("llama4-base"), block_size=128, kv_dtype_bytes=2)
    # 3 chunked + 1 full: group size 1, four block tables.
    assert (layout.group_size, len(layout.groups)) == (1, 4)
    assert layout.blocks_per_request(4096, 2048) == 32 + 3 * 18


def test_dbrx_reads_attn_config_kv_n_heads() -> None:
    config = dict(BY_ID["dbrx-base"]["config"])
    config.pop("num_key_value_heads", None)  # real DBRX checkpoints carry only attn_config.kv_n_heads
    config["attn_config"] = {**config["attn_config"], "kv_n_heads": 2}
    assert geometry_from_config(config).num_kv_heads == 2


def test_llama4_without_a_nope_list_uses_the_interval() -> None:
    """Real Llama-4 configs write "no_rope_layers": []: every 4th layer is NoPE (Llama4TextConfig)."""
    config = {**BY_ID["llama4-base"]["config"], "no_rope_layers": [], "num_hidden_layers": 8, "layer_types": None}
    config.pop("no_rope_layer_interval", None)
    kinds = [s.kind for s in vllm_layer_specs(geometry_from_config(config)) if s]
    assert kinds == [CHUNKED, CHUNKED, CHUNKED, FULL] * 2


def test_each_row_lists_the_switches_its_runs_used() -> None:
    """A row's switches are those its recorded configs turn on, plus documented layer patterns only."""
    for row in VERIFIED:
        used: set[str] = set()
        for cid in row.cases:
            used |= config_switches(geometry_from_config(BY_ID[cid]["config"]))
        assert set(row.switches) == used | set(PATTERN_SWITCHES.get(row.architecture, ())), row.architecture


def test_a_switch_the_row_was_not_proven_with_is_unverified() -> None:
    """Qwen2 (dense) with use_sliding_window: true: its rows were proven without the switch."""
    config = {**BY_ID["qwen2-base"]["config"], "use_sliding_window": True, "sliding_window": 256,
              "max_window_layers": 2}
    ok, note = architecture_status(geometry_from_config(config))
    assert not ok and "use_sliding_window" in note
    ok, _ = architecture_status(geometry_from_config(BY_ID["qwen2-base"]["config"]))
    assert ok


def test_qwen2_moe_ignores_use_sliding_window_as_the_engine_does() -> None:
    """Planned +11.6 % / +61.2 % over the engine before (layers from max_window_layers slid)."""
    for cid in ("qwen2_moe_sw-base", "qwen2_moe_sw-mml1024"):
        geometry = geometry_from_config(BY_ID[cid]["config"])
        assert geometry.text_config["use_sliding_window"] is True
        assert all(spec is not None and spec.kind == FULL for spec in vllm_layer_specs(geometry))
        assert architecture_status(geometry)[0]


def test_gemma4_full_layers_take_the_global_head() -> None:
    """+24 % / +48 % tokens over the engine before (one head size for every layer)."""
    geometry = geometry_from_config(BY_ID["gemma4_text-base"]["config"])
    specs = vllm_layer_specs(geometry)
    assert [(s.kind, s.head_size) for s in specs if s is not None] == [(SLIDING, 32)] * 3 + [(FULL, 64)]
    shared = {**BY_ID["gemma4_text-base"]["config"], "num_kv_shared_layers": 1}
    assert vllm_layer_specs(geometry_from_config(shared))[-1] is None
    assert not architecture_status(geometry_from_config(shared))[0]  # KV sharing: not proven on the engine


def test_models_architectures_lists_what_is_verified_per_engine() -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "launcher", "models", "--architectures"], capture_output=True,
                            text=True, timeout=60, check=True)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("vLLM 0.32.0: verified on the real engine") and lines[0].endswith("65 architectures")
    assert any(line.split()[0] == "Cohere2ForCausalLM" for line in lines if line.startswith("  "))
    vllm_rows = {line.split()[0]: line for line in lines[:next(i for i, line in enumerate(lines)
                                                              if line.startswith("SGLang "))] if line.startswith("  ")}
    assert "golden file" in vllm_rows["KimiLinearForCausalLM"] and "cannot build" in vllm_rows["KimiLinearForCausalLM"]
    assert "golden file" in vllm_rows["Qwen3_5MoeForConditionalGeneration"]
    assert any(line.startswith("SGLang ") and line.endswith("62 architectures") for line in lines)
    sglang_rows = lines[next(i for i, line in enumerate(lines) if line.startswith("SGLang ")):]
    assert any(line.split()[0] == "Qwen3NextForCausalLM" for line in sglang_rows if line.startswith("  "))
