"""`--max-total-tokens` against SGLang's own pool code, per release (tests/data/sglang_pool_cap_oracle.json,
made by tests/oracles/sglang_pool_cap.py: 0.5.2, 0.5.9, 0.5.10, 0.5.11, 0.5.13, 0.5.21, 0.5.23). The plan's cap
(planner._pool_cap) gives a flag and plans the pool SGLang makes of it through `architectures.pool`: here that
arithmetic equals SGLang's for a plain GQA pool, MLA, Gemma 3, and gpt-oss's hybrid sliding-window pool, whose
full pool the cap bounds from 0.5.11 and whose profiled total it bounds before the split on 0.5.9."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.common.units import GiB
from launcher.engines import sglang as sg
from launcher.engines.sglang import architectures as arch
from launcher.model.config import geometry_from_config

DATA = Path(__file__).resolve().parents[2] / "data"
ORACLE = json.loads((DATA / "sglang_pool_cap_oracle.json").read_text())
VERSIONS = list(ORACLE["runs"])


def _geometry(model: str) -> Any:
    raw = json.loads((DATA / "configs" / f"{model}.json").read_text())
    return geometry_from_config({k: v for k, v in raw.items() if not k.startswith("_")})


def _records(version: str) -> list[dict[str, Any]]:
    return ORACLE["runs"][version]["records"]


def _ours(version: str, record: dict[str, Any]) -> dict[str, int]:
    rules = sg.rules_for(version)[0]
    scenario = ORACLE["runs"][version]["setup"]["scenario"]
    pinned = sg.pinned_flags(record["flags"])
    geometry = _geometry(record["id"].split("|")[0])
    lay = arch.layout(geometry, rules)
    kv_bytes = record["kv"]["kv_dtype_bytes"]
    cell = arch.cell_size_bytes(lay, kv_bytes=kv_bytes, kv_fp8=kv_bytes == 1, tp=1, pp=1, pinned=pinned, rules=rules)
    after = int(scenario["available_gib"] * GiB)
    if arch.multimodal(geometry, pinned) and rules.mm_kv_reserve:
        after -= sg.MULTIMODAL_RESERVE_BYTES
    sizing = arch.pool(pre_load_bytes=int(scenario["pre_model_load_gib"] * GiB), after_load_bytes=after,
                       fraction_value=record["mem_fraction_static"], cell_bytes=cell, page_size=record["page_size"],
                       max_total_tokens=pinned.get("--max-total-tokens"), context_len=record["context_len"],
                       **arch.pool_rules(lay, rules=rules, pinned=pinned, kv_bytes=kv_bytes, tp=1, pp=1))
    out = {"max_total_num_tokens": sizing.tokens}
    if "swa_max_total_num_tokens" in record["kv"]:
        out["swa_max_total_num_tokens"] = sizing.swa_tokens or 0
    return out


def test_every_release_and_pool_kind_is_there() -> None:
    assert VERSIONS == ["0.5.2", "0.5.9", "0.5.10", "0.5.11", "0.5.13", "0.5.21", "0.5.23"]
    for version in VERSIONS:
        records = _records(version)
        assert not [r["id"] for r in records if "error" in r]
        assert sum("--max-total-tokens" in r["flags"] for r in records) >= 32
    # gpt-oss's sliding-window pool is split from 0.5.9 on (0.5.2 turns hybrid SWA memory off).
    assert any("swa_max_total_num_tokens" in r["kv"] for r in _records("0.5.9"))
    assert not any("swa_max_total_num_tokens" in r["kv"] for r in _records("0.5.2"))


@pytest.mark.parametrize("version", VERSIONS)
def test_the_capped_pool_equals_sglangs(version: str) -> None:
    mismatches = []
    for record in _records(version):
        expected = {k: record["kv"][k] for k in ("max_total_num_tokens", "swa_max_total_num_tokens")
                    if k in record["kv"]}
        ours = _ours(version, record)
        if ours != expected:
            mismatches.append((record["id"], ours, expected))
    assert mismatches == []


def test_the_split_release_caps_before_splitting() -> None:
    """0.5.9, gpt-oss-20b: a flag of a third of the full pool gives a full pool 2 / 1.8 times the flag (12 full and
    12 sliding layers of one cell, ratio 0.8), as the planner scales its flag back; from 0.5.11 it is the flag."""
    split = next(r for r in _records("0.5.9") if r["id"] == "gpt-oss-20b|cap-third")
    flag = int(split["flags"][1])
    assert split["kv"]["max_total_num_tokens"] == int(flag * 2 / 1.8)
    last_split = next(r for r in _records("0.5.10") if r["id"] == "gpt-oss-20b|cap-third")
    assert last_split["kv"]["max_total_num_tokens"] == int(int(last_split["flags"][1]) * 2 / 1.8)
    first_ratio = next(r for r in _records("0.5.11") if r["id"] == "gpt-oss-20b|cap-third")
    assert first_ratio["kv"]["max_total_num_tokens"] == int(first_ratio["flags"][1])
    ratio = next(r for r in _records("0.5.23") if r["id"] == "gpt-oss-20b|cap-third")
    assert ratio["kv"]["max_total_num_tokens"] == int(ratio["flags"][1])
    assert ratio["kv"]["swa_max_total_num_tokens"] == int(int(ratio["flags"][1]) * 0.8)
