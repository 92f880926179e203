"""SGLang's KV layouts per release against SGLang's own code (tests/data/sglang_layouts_versions.json).

The file holds what the ModelConfig, pool code and ServerArgs of older SGLang releases computed
without a GPU (tests/oracles/sglang_layouts.py --sglang-path, drivers in
tests/oracles/sglang_legacy_layouts.py), over the configs and variants of tests/data/sglang_layouts.json,
as changes to that file's 0.5.23 records. Every record of every release is rebuilt and replayed
through the planner's layout code with that release's rules (`rules_for`): the cell per token, the
budget, the tokens, the SWA split, the state pool, the running requests, and the configs SGLang
refuses, which the plan refuses too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.common.errors import UnsupportedModel
from launcher.common.units import GiB
from launcher.engines import sglang as sg
from launcher.engines.checks_common import CheckInput
from launcher.engines.sglang import architectures as arch
from launcher.engines.sglang.checks import start_checks
from launcher.model.config import ModelGeometry, geometry_from_config

TESTS = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(TESTS / "oracles"))
from sglang_layouts import apply_patch  # noqa: E402

VERSIONS_FILE = json.loads((TESTS / "data" / "sglang_layouts_versions.json").read_text())
BASE = json.loads((TESTS / "data" / "sglang_layouts.json").read_text())
SCENARIO = BASE["meta"]["kv_scenario"]
VERSIONS = list(VERSIONS_FILE["runs"])


def _release(version: str) -> list[dict[str, Any]]:
    """The release's records: the base's, less the absent, with the differing ones rebuilt."""
    run = VERSIONS_FILE["runs"][version]
    base = {r["id"]: r for r in BASE["results"]}
    changed = {e["id"]: apply_patch(base.get(e["id"], {}), e) for e in run["differing"]}
    kept = [r for r in BASE["results"] if r["id"] not in changed and r["id"] not in run["absent"]]
    assert len(kept) == run["identical"], version
    return kept + list(changed.values())


CASES = [(version, case) for version in VERSIONS for case in _release(version)]


def _id(item: tuple[str, dict[str, Any]]) -> str:
    return f"{item[0]}|{item[1]['id']}"


def _geometry(case: dict[str, Any]) -> ModelGeometry:
    return geometry_from_config(json.loads((TESTS / case["config"]).read_text()))


def _error(case: dict[str, Any]) -> dict[str, str] | None:
    return case.get("error") or case.get("kv", {}).get("error")


def _rules(version: str) -> sg.SglangRules:
    return sg.rules_for(version)[0]


# Records SGLang's code in that release refuses or could not size here, that the plan does not refuse,
# with why: kept in view, so that a change shows.
NOT_REFUSED = {
    ("0.5.2", "qwen3-next-80b-a3b"): "0.5.2 sizes 512 state slots and runs out of memory at this scenario: "
                                     "the plan's pool is empty too (checked below)",
    ("0.5.2", "qwen3-next-80b-a3b-instruct"): "as qwen3-next-80b-a3b",
}
# The oracle cannot run this step without the model's modules (tests/oracles/sglang_legacy_layouts.py).
ORACLE_UNSUPPORTED = "OracleUnsupported"


def _ours(version: str, case: dict[str, Any]) -> tuple[float, dict[str, Any], arch.SglangLayout]:
    rules = _rules(version)
    pinned = sg.pinned_flags(case["flags"])
    tp, pp = sg.ranks(pinned)
    lay = arch.layout(_geometry(case), rules)
    kv_bytes = case["kv"]["kv_dtype_bytes"]
    cell = arch.cell_size_bytes(lay, kv_bytes=kv_bytes, kv_fp8=kv_bytes == 1, tp=tp, pp=pp, pinned=pinned,
                                rules=rules)
    return cell, pinned, lay


def _pool(version: str, case: dict[str, Any]) -> dict[str, int]:
    """The pool as the planner sizes it for the release, from the record's fraction and P/A."""
    rules = _rules(version)
    cell, pinned, lay = _ours(version, case)
    tp, pp = sg.ranks(pinned)
    geometry = _geometry(case)
    kv_bytes = case["kv"]["kv_dtype_bytes"]
    after_load = int(SCENARIO["available_gib"] * GiB)
    if arch.multimodal(geometry, pinned) and rules.mm_kv_reserve:
        after_load -= sg.MULTIMODAL_RESERVE_BYTES
    slot = None if lay.state is None else arch.state_slot_bytes(
        lay.state, tp=tp, ssm_dtype=pinned.get("--mamba-ssm-dtype"), pp=pp, num_layers=lay.num_layers, rules=rules)
    sizing = arch.pool(pre_load_bytes=int(SCENARIO["pre_model_load_gib"] * GiB), after_load_bytes=after_load,
                       fraction_value=case["mem_fraction_static"], cell_bytes=cell, page_size=case["page_size"],
                       max_total_tokens=None, state_slot=slot,
                       state_ratio=float(pinned.get("--mamba-full-memory-ratio", arch.DEFAULT_MAMBA_FULL_MEMORY_RATIO)),
                       context_len=case["context_len"],
                       **arch.pool_rules(lay, rules=rules, pinned=pinned, kv_bytes=kv_bytes, tp=tp, pp=pp))
    out = {"budget_bytes": sizing.budget_bytes, "max_total_num_tokens": sizing.tokens}
    if sizing.swa_tokens is not None and sizing.swa_tokens != sizing.tokens:
        out["swa_max_total_num_tokens"] = sizing.swa_tokens
    request_tokens = sizing.tokens
    if rules.requests_before_pp_min:  # stage 0's own profile, before the PP minimum and the split
        stage0 = arch.stage_cells(lay, kv_bytes=kv_bytes, kv_fp8=kv_bytes == 1, tp=tp, pp=pp, pinned=pinned,
                                  rules=rules)[0]
        request_tokens = int(sizing.budget_bytes // stage0.total) if stage0.total > 0 else sizing.tokens
    requests = arch.running_requests(request_tokens, case["context_len"], pinned.get("--max-running-requests"),
                                     rules)
    if sizing.state_slots is not None:
        out["max_mamba_cache_size"] = sizing.state_slots
        requests = min(requests, sizing.state_slots // arch.state_slots_per_request(
            geometry.architecture, pinned, pp=pp, rules=rules))
    out["max_running_requests"] = requests
    return out


def _no_class(version: str, architecture: str) -> bool:
    """A hybrid state architecture the release's model registry has no class for."""
    classes = VERSIONS_FILE["runs"][version]["meta"]["model_classes"]
    state = {a for a, _, _ in sg.STATE_MODEL_CLASSES}
    return architecture in state and classes.get(architecture) is None


def test_state_model_classes_are_the_releases() -> None:
    """`STATE_MODEL_CLASSES` against each checked release's model registry (its models/*.py EntryClass)."""
    from launcher.engines.versions import version_key

    for version in VERSIONS:
        classes = VERSIONS_FILE["runs"][version]["meta"]["model_classes"]
        for architecture, first, _ in sg.STATE_MODEL_CLASSES:
            if architecture in classes:
                assert (classes[architecture] is not None) == (version_key(version) >= version_key(first)), \
                    (version, architecture)


def _golden(case: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    kv = case["kv"]
    merged = {**kv, **(kv.get("mamba") or {})}
    return {k: merged[k] for k in keys if k in merged}


SIZED = [(v, c) for v, c in CASES if _error(c) is None]
REFUSED = [(v, c) for v, c in CASES if _error(c) is not None]


@pytest.mark.parametrize("item", SIZED, ids=[_id(i) for i in SIZED])
def test_cell_and_pool_equal_the_release(item: tuple[str, dict[str, Any]]) -> None:
    """Cell per token (fullest stage), budget, tokens, SWA tokens, state slots and requests of each record."""
    version, case = item
    geometry = _geometry(case)
    if geometry.architecture in arch.NO_SGLANG_CLASS or _no_class(version, geometry.architecture):
        # SGLang's ModelConfig sizes it, but the release has no model class to load it with (the run's
        # `model_classes`): the plan refuses it for that release.
        with pytest.raises(UnsupportedModel):
            arch.layout(geometry, _rules(version))
        return
    cell, _, _ = _ours(version, case)
    stages = [st.get("cell_size") for st in case["kv"]["stages"]]
    if None not in stages:  # 0.5.1-0.5.2 compute the cell inside profile_max_num_token: tokens prove it
        assert cell == pytest.approx(float(max(stages)), rel=1e-12)
    ours = _pool(version, case)
    golden = _golden(case, list(ours))
    assert {k: ours[k] for k in golden} == golden


STATE = [(v, c) for v, c in SIZED if "mamba" in c["kv"] and _geometry(c).architecture not in arch.NO_SGLANG_CLASS]


@pytest.mark.parametrize("item", STATE, ids=[_id(i) for i in STATE])
def test_state_per_request_equals_the_release(item: tuple[str, dict[str, Any]]) -> None:
    version, case = item
    rules = _rules(version)
    pinned = sg.pinned_flags(case["flags"])
    tp, pp = sg.ranks(pinned)
    lay = arch.layout(_geometry(case), rules)
    assert lay.state is not None
    mamba = case["kv"]["mamba"]
    assert (len(lay.state.layers), len(lay.full_layers)) == (mamba["state_layers"], mamba["full_attention_layers"])
    assert arch.state_slot_bytes(lay.state, tp=tp, ssm_dtype=pinned.get("--mamba-ssm-dtype")) == mamba["cache_per_req"]
    assert arch.state_slots_per_request(_geometry(case).architecture, pinned, pp=pp, rules=rules) \
        == mamba["slots_per_request"]


def _plan_refuses(version: str, case: dict[str, Any]) -> str | None:
    """Why the plan refuses this record in that release (its layout, a start check, no pool), or None."""
    rules = _rules(version)
    geometry = _geometry(case)
    pinned = sg.pinned_flags(case["flags"])
    tp, pp = sg.ranks(pinned)
    try:
        arch.layout(geometry, rules)
    except UnsupportedModel as exc:
        return str(exc)
    refusals = start_checks(CheckInput(
        geometry=geometry, device="cuda", compute_capability=(9, 0), gpu_count=tp * pp, tp=tp, pp=pp,
        dtype="bfloat16", kv_cache_dtype=pinned.get("--kv-cache-dtype"), block_size=None, max_model_len=None,
        model_max_len=sg.derived_context_length(geometry)[0], engine_version=version,
        attention_backend=pinned.get("--attention-backend")))
    if refusals:
        return refusals[0].message
    return None


@pytest.mark.parametrize("item", REFUSED, ids=[_id(i) for i in REFUSED])
def test_what_the_release_refuses_the_plan_refuses(item: tuple[str, dict[str, Any]]) -> None:
    version, case = item
    error = _error(case)
    assert error is not None
    if error["type"] == ORACLE_UNSUPPORTED:
        pytest.skip(error["message"])
    if (version, case["model"]) in NOT_REFUSED:
        if "kv_dtype_bytes" in case.get("kv", {}):  # out of memory: the plan's pool is empty too
            assert _pool(version, case)["max_total_num_tokens"] <= 0
        return
    reason = _plan_refuses(version, case)
    assert reason is not None, f"SGLang {version}: {error['type']}: {error['message'][:200]}"


def test_every_release_is_rebuilt_whole() -> None:
    """Each release's records: as many as its run made, every id once."""
    for version in VERSIONS:
        records = _release(version)
        meta = VERSIONS_FILE["runs"][version]["meta"]
        assert meta["sglang_version"] == version
        assert len({r["id"] for r in records}) == len(records)
    assert {"0.5.2", "0.5.9", "0.5.13", "0.5.18", "0.5.21"} <= set(VERSIONS)


def test_the_newest_rules_are_the_base_files() -> None:
    """The layout fields' defaults are 0.5.21-0.5.23's: the base file's planner run is unchanged."""
    import dataclasses

    newest = sg.RULES[-1]
    defaults = {f.name: f.default for f in dataclasses.fields(sg.SglangRules)
                if f.name in ("mm_kv_reserve", "swa_pool", "swa_stage_extra_layer", "dsa_fp8_scaled_cell",
                              "mamba_pool", "mamba_extra_buffer", "kimi_linear_radix", "requests_before_pp_min")}
    assert {k: getattr(newest, k) for k in defaults} == defaults


# --------------------------------------------------------------------------- through the planner


def _plan_request(config: str, version: str | None, *engine_args: str) -> Any:
    from launcher.model.catalog import hypothetical_gpus
    from launcher.model.resolve import ResolvedModel
    from launcher.plan.types import PlanRequest

    raw = json.loads((TESTS / "data" / config).read_text())
    model = ResolvedModel(name=Path(config).stem, source="local", geometry=geometry_from_config(raw),
                          weight_bytes=16 * GiB, weight_bytes_source="test", config=raw)
    return PlanRequest(model=model, engine="sglang", gpus=hypothetical_gpus(["h100"]), engine_version=version,
                       engine_args=engine_args)


def test_exaone4_needs_a_pinned_attention_backend_in_its_releases() -> None:
    """0.5.9-0.5.21 check EXAONE 4's attention backend before picking one: refused (exit 78) unless pinned."""
    from launcher.common.errors import WontFit
    from launcher.plan.planner import make_plan

    config = "sglang_layouts/configs/exaone-4.0-32b.json"
    with pytest.raises(WontFit, match=r"required for Exaone4ForCausalLM, but got None"):
        make_plan(_plan_request(config, "0.5.13"))
    assert make_plan(_plan_request(config, "0.5.13", "--attention-backend", "fa3")).kv_cache_tokens > 0
    assert make_plan(_plan_request(config, "0.5.23")).kv_cache_tokens > 0


def test_a_state_model_before_its_class_is_refused() -> None:
    """Falcon-H1 has a model class from 0.5.3: SGLang 0.5.2 cannot serve its state."""
    from launcher.plan.planner import make_plan

    with pytest.raises(UnsupportedModel, match=r"SGLang 0\.5\.2 has no model class for FalconH1ForCausalLM"):
        make_plan(_plan_request("sglang_layouts/configs/falcon-h1-7b.json", "0.5.2"))
    assert make_plan(_plan_request("sglang_layouts/configs/falcon-h1-7b.json", "0.5.9")).kv_cache_tokens > 0


def test_the_multimodal_reserve_comes_out_of_the_pool_from_0518() -> None:
    """Qwen2.5-VL at one pinned fraction: 0.5.13 keeps the 100 MiB in the pool, 0.5.18 reserves it."""
    from launcher.plan.planner import make_plan

    pinned = ("--mem-fraction-static", "0.8")
    before = make_plan(_plan_request("configs/qwen2.5-vl-7b.json", "0.5.13", *pinned))
    after = make_plan(_plan_request("configs/qwen2.5-vl-7b.json", "0.5.18", *pinned))
    cell = before.kv_cache_bytes / before.kv_cache_tokens
    assert before.kv_cache_tokens - after.kv_cache_tokens == pytest.approx(sg.MULTIMODAL_RESERVE_BYTES / cell, abs=1)


def test_hybrid_pools_of_releases_not_run_are_planned_unverified() -> None:
    """0.5.3-0.5.8 split hybrid SWA and state pools in ways not run here: the plan says so and widens its band."""
    from launcher.plan.planner import make_plan

    plan = make_plan(_plan_request("configs/gpt-oss-20b.json", "0.5.6"))
    assert not plan.architecture_verified
    assert any("unverified layout: SGLang 0.5.6's hybrid SWA pool" in w for w in plan.warnings)
    assert make_plan(_plan_request("configs/gpt-oss-20b.json", "0.5.9")).architecture_verified
    assert make_plan(_plan_request("configs/llama-3.1-8b.json", "0.5.6")).architecture_verified


def _plan_config(raw: dict[str, Any], version: str, *engine_args: str) -> Any:
    from launcher.model.catalog import hypothetical_gpus
    from launcher.model.resolve import ResolvedModel
    from launcher.plan.planner import make_plan
    from launcher.plan.types import PlanRequest

    model = ResolvedModel(name="test", source="local", geometry=geometry_from_config(raw), weight_bytes=16 * GiB,
                          weight_bytes_source="test", config=raw)
    return make_plan(PlanRequest(model=model, engine="sglang", gpus=hypothetical_gpus(["8xh200"]),
                                 engine_version=version, engine_args=("--tp-size", "8", *engine_args)))


def test_exaone4_with_a_null_window_pattern_needs_no_backend() -> None:
    """SGLang checks the backend only when `hf_config.sliding_window_pattern is not None` (0.5.18
    server_args.py:5694): an explicit null skips it; absent, Exaone4Config's default 4 applies."""
    from launcher.common.errors import WontFit

    raw = json.loads((TESTS / "data" / "sglang_layouts/configs/exaone-4.0-32b.json").read_text())
    with pytest.raises(WontFit, match=r"required for Exaone4ForCausalLM"):
        _plan_config({k: v for k, v in raw.items() if k != "sliding_window_pattern"}, "0.5.18")
    assert _plan_config({**raw, "sliding_window_pattern": None}, "0.5.18").kv_cache_tokens > 0


def test_llama4_needs_a_backend_through_0_5_5() -> None:
    """0.5.3-0.5.5 assert Llama 4's backend before picking a default (0.5.5 server_args.py:999-1003); 0.5.6
    auto-selects one."""
    from launcher.common.errors import WontFit

    raw = json.loads((TESTS / "data" / "sglang_layouts/configs/llama-4-scout.json").read_text())
    with pytest.raises(WontFit, match=r"fa3, aiter, or triton is required for Llama4 model"):
        _plan_config(raw, "0.5.5")
    assert _plan_config(raw, "0.5.5", "--attention-backend", "fa3").kv_cache_tokens > 0
    assert _plan_config(raw, "0.5.6").kv_cache_tokens > 0


def test_dbrx_is_refused_only_with_an_integer_jitter_eps() -> None:
    """transformers 5.12.1's DbrxConfig refuses `moe_jitter_eps: 0` (strict validation) and reads 0.0 or null."""
    raw = json.loads((TESTS / "data" / "sglang_layouts/configs/dbrx-instruct.json").read_text())
    with_int = {**raw, "ffn_config": {**raw["ffn_config"], "moe_jitter_eps": 0}}
    with pytest.raises(UnsupportedModel, match=r"cannot read this config.json"):
        _plan_config(with_int, "0.5.18")
    for value in (0.0, None):
        assert _plan_config({**raw, "ffn_config": {**raw["ffn_config"], "moe_jitter_eps": value}},
                            "0.5.18").kv_cache_tokens > 0


def test_the_next_stages_first_layer_from_0_5_7() -> None:
    """0.5.7-0.5.20 run a stage's layer ids to end_layer + 1 (0.5.7 model_runner.py:472-478)."""
    assert not sg.rules_for("0.5.6")[0].swa_stage_extra_layer
    assert sg.rules_for("0.5.7")[0].swa_stage_extra_layer and sg.rules_for("0.5.20")[0].swa_stage_extra_layer
    assert not sg.rules_for("0.5.21")[0].swa_stage_extra_layer
    assert sg.rules_for("0.5.9")[0].requests_before_pp_min and not sg.rules_for("0.5.10")[0].requests_before_pp_min
