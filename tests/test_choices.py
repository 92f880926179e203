"""Alternatives wherever the answer is not a plain yes; each offered one, planned again, fits."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest


def plan(*argv: str) -> tuple[int, dict[str, Any], str]:
    words = list(argv)
    words.insert(words.index("--") if "--" in words else len(words), "--json")
    proc = subprocess.run([sys.executable, "-m", "launcher", "plan", *words], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def replanned(model: str, engine: str, gpu: str, alternative: dict[str, Any], base_args: tuple[str, ...] = (),
              concurrency: str = "1") -> dict[str, Any]:
    """The alternative planned as the operator would type it: its flags replace the operator's."""
    gpu_spec = f"{alternative['gpu_count']}x{gpu}" if alternative.get("gpu_count") else gpu
    code, doc, err = plan(alternative.get("model") or model, "--engine", engine, "--gpu", gpu_spec,
                          "--concurrency", concurrency, "--", *alternative["engine_args"])
    assert code == 0, err
    return doc


def find(alternatives: list[dict[str, Any]], flag: str) -> dict[str, Any]:
    found = [a for a in alternatives if flag in a["engine_args"]]
    assert found, [a["description"] for a in alternatives]
    return found[0]


def test_may_not_fit_lists_what_fits_without_the_risk() -> None:
    args = ("--max-model-len", "4096")
    code, doc, _ = plan("qwen2.5-7b", "--gpu", "rtx4090", "--concurrency", "28", "--", *args)
    assert code == 0 and doc["risk"] == "may-not-fit" and len(doc["alternatives"]) >= 3
    fp8 = find(doc["alternatives"], "--kv-cache-dtype")
    again = replanned("qwen2.5-7b", "vllm", "rtx4090", fp8, concurrency="28")
    assert again["fits"] and again["kv_cache_tokens"] == fp8["kv_cache_tokens"]


def test_sglang_fraction_is_planned_not_just_named() -> None:
    code, doc, err = plan("gemma-2-9b", "--gpu", "rtx4090", "--engine", "sglang")
    assert code == 78 and "raise --mem-fraction-static" in err
    knob = find(doc["alternatives"], "--mem-fraction-static")
    value = float(knob["engine_args"][knob["engine_args"].index("--mem-fraction-static") + 1])
    assert 0.75 < value < 0.99 and knob["max_model_len"] >= 4096
    again = replanned("gemma-2-9b", "sglang", "rtx4090", knob)
    assert again["fits"] and again["mem_fraction_static"] == value
    lower = dict(knob, engine_args=["--mem-fraction-static", f"{value - 0.01:.2f}"])
    code, low, _ = plan("gemma-2-9b", "--engine", "sglang", "--gpu", "rtx4090", "--", *lower["engine_args"])
    assert code == 78 or low["max_model_len"] < 4096  # the smallest value that serves 4096 tokens


def test_several_gpus_without_a_tp_flag_offer_the_tp_plan() -> None:
    code, doc, _ = plan("qwen2.5-7b", "--gpu", "2xrtx3090")
    assert code == 0 and doc["tensor_parallel_size"] == 1 and doc["gpu"]["unused"] == 1
    tp = find(doc["alternatives"], "--tensor-parallel-size")
    code, wide, _ = plan("qwen2.5-7b", "--gpu", "2xrtx3090", "--", *tp["engine_args"])
    assert code == 0 and wide["tensor_parallel_size"] == 2
    assert wide["kv_cache_tokens"] == tp["kv_cache_tokens"] > doc["kv_cache_tokens"]


def test_cpu_offload_where_it_would_fit() -> None:
    code, doc, _ = plan("llama-3.1-70b", "--gpu", "rtx4090")
    assert code == 78
    offload = find(doc["alternatives"], "--cpu-offload-gb")
    again = replanned("llama-3.1-70b", "vllm", "rtx4090", offload)
    assert again["fits"] and again["max_model_len"] >= 4096


@pytest.mark.parametrize("argv", [("qwen2.5-7b", "--gpu", "h100"), ("qwen2.5-7b", "--gpu", "h100", "--engine",
                                                                     "sglang")])
def test_a_plain_yes_has_no_alternatives(argv: tuple[str, ...]) -> None:
    code, doc, _ = plan(*argv)
    assert code == 0 and doc["fits"] is True and doc["alternatives"] == []


def test_fit_prints_an_identical_reason_once() -> None:
    proc = subprocess.run([sys.executable, "-m", "launcher", "fit", "qwen2.5-7b", "--concurrency", "1", "--tokens",
                           "99999999"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 78
    assert proc.stdout.count("User-specified max_model_len (99999999)") == 1
    assert re.search(r"reason 1 \(2\d GPU types\): vLLM refuses this at start", proc.stdout)
    assert len(proc.stdout) < 6000  # was ~20 KB: the same paragraph for every GPU type
