"""Our SGLang knowledge against SGLang's own code (tests/data/sglang_oracle.json).

The golden file holds what each checked SGLang release's own argument resolution and pool
code computed without a GPU (tests/oracles/sglang_oracle.py, README beside it): the full
grid (2,416 cases: 15 GPU sizes, tp 1-8, 6 model kinds, 11 flag variants) for 0.5.23, the
compact grid (smoke + the no-flag baseline at tp 1/4) for 0.5.2, 0.5.9, 0.5.13, 0.5.18,
0.5.21 and 0.5.22. Every version in the file is checked against the rules `rules_for` picks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.common.units import GiB
from launcher.engines import sglang as sg
from launcher.engines.versions import version_key
from launcher.model.config import geometry_from_config

DATA = Path(__file__).resolve().parents[2] / "data"
ORACLE = json.loads((DATA / "sglang_oracle.json").read_text())
CONFIGS = {p.stem: json.loads(p.read_text()) for p in (DATA / "configs").glob("*.json")}
GEOMETRIES = {name: geometry_from_config(config) for name, config in CONFIGS.items()}
# Cases that change SGLang's environment or config in ways the plan does not model are left out.
SKIPPED = ("env", "config_overrides", "error")


VERSIONS = sorted(ORACLE["runs"])
# Releases whose oracle runs through ServerArgs.__post_init__ and a stand-in ModelRunner
# (tests/oracles/README.md, "legacy"): no platform presets, pool without the SWA split.
LEGACY = {v for v in VERSIONS if version_key(v) < version_key("0.5.19")}


def _legacy_skip(version: str, case: dict, pinned: dict) -> bool:
    """Legacy runs size pp rank 0 only and report hybrid SWA pools unsplit (README)."""
    return version in LEGACY and (pinned.get("--pp-size", 1) > 1 or bool(case.get("is_hybrid_swa"))
                                  or case["model"] == "gpt-oss-20b")


def cases(version: str) -> list[dict]:
    return [r for r in ORACLE["runs"][version]["results"] if not any(k in r for k in SKIPPED)]


def _pinned(case: dict) -> dict:
    return sg.pinned_flags(case["flags"])


def _ranks(pinned: dict) -> tuple[int, int]:
    return pinned.get("--tp-size", 1), pinned.get("--pp-size", 1)


@pytest.mark.parametrize("version", VERSIONS)
def test_default_fraction_and_chunk_equal_sglang(version: str) -> None:
    """The default --mem-fraction-static and chunked prefill size equal SGLang's on every case."""
    rules, _ = sg.rules_for(version)
    mismatches = []
    for case in cases(version):
        pinned = _pinned(case)
        tp, pp = _ranks(pinned)
        derivation = sg.default_fraction(GEOMETRIES[case["model"]], gpu_mem_mib=case["gpu_mem_mib"], tp=tp, pp=pp,
                                         pinned=pinned, rules=rules)
        fraction = pinned.get("--mem-fraction-static", derivation.fraction)
        if abs(fraction - case["mem_fraction_static"]) > 1e-12 or \
                derivation.chunked_prefill_size != case["chunked_prefill_size"]:
            mismatches.append((case["id"], fraction, case["mem_fraction_static"]))
    assert mismatches == []
    assert len(cases(version)) > (2300 if version == "0.5.23" else 250)


@pytest.mark.parametrize("version", VERSIONS)
def test_context_length_and_cell_size_equal_sglang(version: str) -> None:
    """Derived context length and the pool's bytes per token equal SGLang's (fullest PP stage)."""
    mismatches = []
    for case in cases(version):
        pinned = _pinned(case)
        tp, pp = _ranks(pinned)
        geometry = GEOMETRIES[case["model"]]
        if _legacy_skip(version, case, pinned):
            continue
        length = pinned.get("--context-length") or sg.derived_context_length(geometry)[0]
        kv = case.get("kv", {})
        expected_cell = max([s["cell_size"] for s in kv.get("stages", [])] or [kv.get("cell_size")])
        kv_bytes = sg.kv_dtype_bytes(pinned.get("--kv-cache-dtype"), "bfloat16", geometry)[0]
        cell = sg.cell_size_bytes(geometry, kv_bytes=kv_bytes, tp=tp, pp=pp, pinned=pinned)
        if length != case["context_len"] or (expected_cell is not None and abs(cell - expected_cell) > 1e-6):
            mismatches.append((case["id"], length, case["context_len"], cell, expected_cell))
    assert mismatches == []


def pool_cases(version: str) -> list[dict]:
    """Cases whose oracle ran SGLang's pool code (legacy runs give budget bytes only: README)."""
    found = []
    for case in cases(version):
        kv = case.get("kv", {})
        if "max_total_num_tokens" not in kv:
            continue
        if _legacy_skip(version, case, _pinned(case)) or kv["max_total_num_tokens"] <= 0:
            continue  # <= 0: legacy runners return the negative count and fail later
        found.append(case)
    return found


def platform_cases(version: str) -> list[dict]:
    """Cases run under a platform preset (runtime_context.override_platform; legacy runs have none)."""
    return [r for r in ORACLE["runs"][version]["results"] if "platform" in r and "error" not in r]


POOL_VERSIONS = [v for v in VERSIONS if pool_cases(v)]
PLATFORM_VERSIONS = [v for v in VERSIONS if platform_cases(v)]


def test_every_current_release_has_pool_and_platform_cases() -> None:
    """Only legacy releases lack pool and platform cases, so no current release goes unchecked."""
    current = [v for v in VERSIONS if v not in LEGACY]
    assert current and set(current) <= set(POOL_VERSIONS) and PLATFORM_VERSIONS == current


@pytest.mark.parametrize("version", POOL_VERSIONS)
def test_pool_tokens_equal_sglang(version: str) -> None:
    """max_total_num_tokens from pre-load memory P, weights W and the fraction equals SGLang's."""
    checked, mismatches = 0, []
    for case in pool_cases(version):
        kv = case["kv"]
        pinned = _pinned(case)
        tp, pp = _ranks(pinned)
        geometry = GEOMETRIES[case["model"]]
        pre = case["kv_input"]["pre_model_load_gib"]
        after = kv.get("available_gib", pre - case["kv_input"].get("weights_gib", 0.0))
        if case.get("is_multimodal") and version not in LEGACY:
            after -= 100 / 1024  # SGLANG_VLM_CACHE_SIZE_MB
        kv_bytes = sg.kv_dtype_bytes(pinned.get("--kv-cache-dtype"), "bfloat16", geometry)[0]
        cell = sg.cell_size_bytes(geometry, kv_bytes=kv_bytes, tp=tp, pp=pp, pinned=pinned)
        tokens, _ = sg.pool_tokens(pre_load_bytes=pre * GiB, after_load_bytes=after * GiB,
                                   fraction_value=case["mem_fraction_static"], cell_bytes=cell,
                                   page_size=case["page_size"], max_total_tokens=pinned.get("--max-total-tokens"))
        checked += 1
        if tokens != kv["max_total_num_tokens"]:
            mismatches.append((case["id"], tokens, kv["max_total_num_tokens"]))
    assert mismatches == []
    assert checked > (1000 if version == "0.5.23" else 200)


@pytest.mark.parametrize("version", PLATFORM_VERSIONS)
def test_page_size_on_each_platform(version: str) -> None:
    """The default page size per GPU generation equals SGLang's backend choice."""
    presets = ORACLE["header"]["grid"]["platform_presets"]
    checked = 0
    for case in platform_cases(version):
        capability = tuple(presets[case["platform"]]["device_capability"])
        page, _ = sg.default_page_size(GEOMETRIES[case["model"]], capability)
        assert page == case["page_size"], case["id"]
        checked += 1
    assert checked >= 40
