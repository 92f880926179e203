"""Before 0.19 vLLM's profile run samples with a sort over the vocabulary, or with FlashInfer's top-k/top-p
where that release uses it (0.9.0-0.11.0 wherever FlashInfer is installed; 0.11.1-0.18 only with
VLLM_USE_FLASHINFER_SAMPLER=1). Checked against the torch peaks of llm-d-benchmark's H100 runs
(tests/data/startup-logs/startup-logs-3.yaml): five on the 0.13-0.14 image with the sort, Mistral-Small-3.2
on the 0.11.0 image, which carries FlashInfer."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from launcher.common.units import GiB
from launcher.engines import vllm as vl
from launcher.engines.vllm import budget as vb
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest

DATA = Path(__file__).resolve().parents[2] / "data"
CONFIGS = {"meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b-instruct.json", "Qwen/Qwen3-0.6B": "qwen3-0.6b.json",
           "Qwen/Qwen3-32B": "qwen3-32b.json", "openai/gpt-oss-20b": "gpt-oss-20b.json",
           "mistralai/Mistral-Small-3.2-24B-Instruct-2506": "mistral-small-3.2-24b-instruct-2506.json"}
H100 = "NVIDIA H100 80GB HBM3"


def _llmdbench_cases() -> list[dict[str, Any]]:
    cases = []
    for name in ("startup-logs-2.yaml", "startup-logs-3.yaml"):
        for case in yaml.safe_load((DATA / "startup-logs" / name).read_text()):
            if case["id"].startswith("vllm-llmdbench-") and not case["observed"].get("startup_failed") \
                    and case["model"] in CONFIGS:
                cases.append(case)
    return cases


CASES = _llmdbench_cases()
SORTED = [c for c in CASES if c.get("engine_version") is None]  # the `latest` image of 2026-01-26: 0.13-0.14


def _peak(case: dict[str, Any], version: str, flashinfer: bool | None) -> vb.ProfilePeak:
    geometry = geometry_from_config(json.loads((DATA / "configs" / CONFIGS[case["model"]]).read_text()))
    rules, _ = vl.rules_for(version)
    # `vllm serve` on an H100: 8192 batched tokens, 1024 sequences (get_batch_defaults).
    return vb.profile_peak(geometry, rules=rules, batched_tokens=8192, num_seqs=1024,
                           tp=int(case["flags"].get("tensor_parallel_size") or 1), gpu_name=H100,
                           flashinfer_sampler=flashinfer)


def test_the_cases_are_there() -> None:
    assert len(SORTED) == 5 and {c["model"] for c in SORTED} == {
        "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-32B", "openai/gpt-oss-20b"}


@pytest.mark.parametrize("case", SORTED, ids=[c["id"] for c in SORTED])
def test_the_sort_to_the_print_resolution(case: dict[str, Any]) -> None:
    """38 B per logit (9.5 fp32 copies) + the hidden states + the constant: each peak within 0.015 GiB."""
    peak = _peak(case, "0.14.1", False)
    logged = float(case["observed"]["peak_torch_memory_gib"])
    assert abs(peak.total_bytes / GiB - logged) <= 0.015, (peak.total_bytes / GiB, logged)
    assert peak.terms[0][0] == "sampler (sort)"


def test_llama_8b_term_by_term() -> None:
    """Llama-3.1-8B: 38 x 1024 x 128,256 + 2 x 8192 x 4096 + 0.052 GiB = 4.76 GiB (logged 4.76)."""
    case = next(c for c in SORTED if c["model"] == "meta-llama/Llama-3.1-8B-Instruct")
    expected = 38 * 1024 * 128256 + 2 * 8192 * 4096 + vb.PROFILE_CONSTANT_BYTES
    assert _peak(case, "0.14.1", False).total_bytes == expected
    assert round(expected / GiB, 2) == 4.76


def test_flashinfer_on_the_0_11_image() -> None:
    """Mistral-Small-3.2 on vllm/vllm-openai:v0.11.0 (FlashInfer installed): 14 B per logit. Its 2.12 GiB is
    FlashInfer's: the sort would hold 5.0 GiB."""
    case = next(c for c in CASES if c["model"] == "mistralai/Mistral-Small-3.2-24B-Instruct-2506")
    logged = float(case["observed"]["peak_torch_memory_gib"]) * GiB
    flashinfer, sort = _peak(case, "0.11.0", True), _peak(case, "0.11.0", False)
    assert abs(flashinfer.total_bytes - logged) <= flashinfer.error_bytes
    assert abs(flashinfer.total_bytes - logged) < 0.2 * GiB
    assert sort.total_bytes - logged > 2.5 * GiB
    assert flashinfer.terms[0][0] == "sampler (FlashInfer top-k/top-p)"


def test_not_knowing_takes_the_sort_and_says_what_flashinfer_saves() -> None:
    """No engine here to look beside: the sort (the larger) with its own band, not widened below it; the
    difference FlashInfer's sampler would make is carried for the plan's note."""
    case = next(c for c in CASES if c["model"] == "mistralai/Mistral-Small-3.2-24B-Instruct-2506")
    unknown, sort, flashinfer = (_peak(case, "0.11.0", known) for known in (None, False, True))
    assert (unknown.total_bytes, unknown.error_bytes) == (sort.total_bytes, sort.error_bytes)
    assert unknown.flashinfer_saves_bytes == sort.total_bytes - flashinfer.total_bytes > 2.9 * GiB
    assert sort.flashinfer_saves_bytes == flashinfer.flashinfer_saves_bytes == 0
    assert "FlashInfer's if installed" in unknown.terms[0][0]


@pytest.mark.parametrize(("version", "packages", "env", "expected"), [
    ("0.8.5", {"flashinfer-python": "0.2.5"}, {}, False),  # >= 0.2.3 turned off in 0.8.5
    ("0.8.5", {"flashinfer": "0.2.2"}, {}, True),
    ("0.8.5", {"flashinfer-python": "0.2.10"}, {}, True),  # "0.2.10" >= "0.2.3" is False as strings
    ("0.10.0", {"flashinfer-python": "0.2.10"}, {}, False),  # "0.2.10" < "0.2.3" as strings: the sort
    ("0.10.1", {"flashinfer-python": "0.2.10"}, {}, True),  # version.parse from 0.10.1
    ("0.11.0", {"flashinfer-python": "0.3.1"}, {"VLLM_USE_FLASHINFER_SAMPLER": "00"}, False),  # int("00") == 0
    ("0.11.0", {"flashinfer-python": "0.3.1"}, {"VLLM_USE_FLASHINFER_SAMPLER": "false"}, None),  # vLLM raises
    ("0.9.0", {"flashinfer-python": "0.2.5"}, {}, True),
    ("0.11.0", {"flashinfer-python": "0.3.1"}, {}, True),
    ("0.11.0", {"flashinfer-python": "0.3.1"}, {"VLLM_USE_FLASHINFER_SAMPLER": "0"}, False),
    ("0.11.0", {}, {}, False),  # pip install vllm without the extra
    ("0.11.0", None, {}, None),  # not known here
    ("0.11.0", None, {"VLLM_USE_FLASHINFER_SAMPLER": "0"}, False),
    ("0.11.1", {"flashinfer-python": "0.5.2"}, {}, False),  # opt-in from 0.11.1
    ("0.14.1", None, {"VLLM_USE_FLASHINFER_SAMPLER": "1"}, True),
    ("0.19.0", {"flashinfer-python": "0.6.6"}, {"VLLM_USE_FLASHINFER_SAMPLER": "1"}, False),  # no sort to replace
])
def test_which_sampler(version: str, packages: dict[str, str] | None, env: dict[str, str],
                       expected: bool | None) -> None:
    assert vb.uses_flashinfer_sampler(vl.rules_for(version)[0], packages, env) is expected


def test_processed_logprobs_keep_the_sort() -> None:
    """FlashInfer cannot return processed logits or logprobs: --logprobs-mode processed_* keeps the sort."""
    rules = vl.rules_for("0.11.0")[0]
    installed = {"flashinfer-python": "0.3.1"}
    assert vb.uses_flashinfer_sampler(rules, installed, {}, "raw_logprobs") is True
    assert vb.uses_flashinfer_sampler(rules, installed, {}, "processed_logprobs") is False
    assert vb.uses_flashinfer_sampler(rules, None, {}, "processed_logits") is False


def test_the_plan_reads_what_is_installed() -> None:
    """The same 0.11.0 plan: FlashInfer installed beside the engine gives more KV than the sort; not known, the
    sort, and a note with the difference; the activation row says which."""
    request = PlanRequest(model=resolve_model("qwen2.5-7b"), engine="vllm", gpus=hypothetical_gpus(["h100"]),
                          engine_version="0.11.0")
    unknown = make_plan(request)
    installed = make_plan(dataclasses.replace(request, engine_packages={"flashinfer-python": "0.3.1"}))
    absent = make_plan(dataclasses.replace(request, engine_packages={}))
    assert absent.kv_cache_bytes == unknown.kv_cache_bytes < installed.kv_cache_bytes
    assert installed.kv_cache_bytes - absent.kv_cache_bytes > 3 * GiB  # 1024 rows x 152,064 x 24 B
    assert (unknown.kv_cache_bytes_low, unknown.kv_cache_bytes_high) == (absent.kv_cache_bytes_low,
                                                                         absent.kv_cache_bytes_high)
    assert "FlashInfer top-k/top-p" in installed.item("activation").detail
    assert "FlashInfer's if installed" in unknown.item("activation").detail
    [note] = [n for n in unknown.notes if "FlashInfer's top-k/top-p" in n]
    more = (installed.kv_cache_bytes - unknown.kv_cache_bytes) / GiB
    assert f"the KV cache is {more:.2f} GiB more" in note
    assert not any("FlashInfer's top-k/top-p" in n for n in (*installed.notes, *absent.notes))
