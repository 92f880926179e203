"""Real GPU startup logs (tests/data/startup-logs/, copied from ../shared/data) against our KV accounting.

Each case gives the engine's own KV bytes (rounded to 0.01 GiB in the log); the tokens we
predict from those bytes must land on the logged figure within that rounding.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from launcher.common.units import GiB
from launcher.engines import sglang as sg
from launcher.engines.vllm.kv import kv_capacity, kv_layout
from launcher.model.config import geometry_from_config
from launcher.model.resolve import resolve_model

LOGS = Path(__file__).resolve().parent / "data" / "startup-logs" / "startup-logs.yaml"  # copied from ../shared/data

QWEN3_1_7B = {"model_type": "qwen3", "hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960}
MISTRAL_7B_TEXT = {"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "vocab_size": 32064, "max_position_embeddings": 32768}
QWQ_32B = {"model_type": "qwen2", "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 40,
           "num_key_value_heads": 8, "vocab_size": 152064, "max_position_embeddings": 40960}


@pytest.fixture(scope="module")
def cases() -> dict[str, dict]:
    if not LOGS.is_file():
        pytest.skip(f"{LOGS} not present (shared data lives beside the checkout)")
    return {case["id"]: case for case in yaml.safe_load(LOGS.read_text())}


def _log_float(log: str, pattern: str) -> float:
    match = re.search(pattern, log)
    assert match, pattern
    return float(match.group(1))


def _blocks_range(gib: float, bytes_per_block: int) -> range:
    low = int((gib - 0.005) * GiB // bytes_per_block)
    high = int((gib + 0.005) * GiB // bytes_per_block)
    return range(low, high + 1)


class TestVllmLogs:
    def test_llava_mistral_exact_bytes(self, cases: dict) -> None:
        """v0.10.2 printed the KV bytes exactly: 59212694937 B -> 28234 blocks -> 451,744 tokens, 110.29x."""
        log = cases["vllm-80gb-llava-v16-mistral-7b-v0102"]["observed"]["log"]
        kv_bytes = int(_log_float(log, r"Current kv cache memory in use is (\d+) bytes"))
        layout = kv_layout(geometry_from_config(MISTRAL_7B_TEXT), block_size=16, kv_dtype_bytes=2)
        capacity = kv_capacity(layout, kv_bytes, max_model_len=4096, in_flight_tokens=0)
        assert f"{capacity.max_concurrency:.2f}" == "110.29"
        assert capacity.num_blocks * 16 == int(re.search(r"GPU KV cache size: ([\d,]+)", log).group(1).replace(",", ""))

    def test_qwen3_1_7b_tokens_within_rounding(self, cases: dict) -> None:
        """Available 18.78 GiB at 112 KiB/token, length 1024 -> the logged 175,856 tokens."""
        case = cases["vllm-33263-24gb-qwen3-1.7b-mml1024-seqs1"]
        layout = kv_layout(geometry_from_config(QWEN3_1_7B), block_size=16, kv_dtype_bytes=2)
        printed = {kv_capacity(layout, b * layout.bytes_per_block, max_model_len=1024, in_flight_tokens=0).tokens
                   for b in _blocks_range(case["observed"]["kv_cache_gib"], layout.bytes_per_block)}
        assert case["observed"]["kv_tokens"] in printed

    @pytest.mark.parametrize(("variant", "tp", "pp"), [("single", 1, 1), ("tp2", 2, 1), ("pp2", 1, 2)])
    def test_qwen3_14b_awq_l4(self, cases: dict, variant: str, tp: int, pp: int) -> None:
        """Qwen3-14B-AWQ on L4: single, TP 2 and PP 2 token counts follow from the KV GiB."""
        observed = cases["vllm-l4-qwen3-14b-awq-single-and-tp2"]["observed"]
        figures = observed if variant == "single" else observed[variant]
        geometry = resolve_model("qwen3-14b").geometry
        layout = kv_layout(geometry, block_size=16, kv_dtype_bytes=2, tp=tp, pp=pp)
        results = {}
        for blocks in _blocks_range(figures["kv_cache_gib"], layout.bytes_per_block):
            cap = kv_capacity(layout, blocks * layout.bytes_per_block, max_model_len=40960, in_flight_tokens=0)
            results[cap.tokens] = cap.concurrency_printed
        assert figures["kv_tokens"] in results
        assert results[figures["kv_tokens"]] == f"{figures['max_concurrency']:.2f}"


class TestSglangLogs:
    @pytest.mark.parametrize(("case_id", "config", "tp", "fraction"), [
        pytest.param("sglang-llmsinclouds-4xl4-qwq-32b-tp4", QWQ_32B, 4, 0.85, id="qwq-32b-tp4"),
        pytest.param("sglang-jerryzsj-rtx3090-r1-distill-qwen-7b-wsl2", None, 1, 0.88, id="r1-distill-7b"),
        pytest.param("sglang-qwen3-14b-4x4090-tp4-mf080", None, 4, 0.80, id="qwen3-14b-tp4"),
    ])
    def test_pool_tokens_from_logged_memory(self, cases: dict, case_id: str, config: dict | None, tp: int,
                                            fraction: float) -> None:
        """rest = A - P x (1 - f), // cell size: the logged max_total_num_tokens within the 0.01 GB rounding."""
        case = cases[case_id]
        log = case["observed"]["log"]
        geometry = geometry_from_config(config) if config else resolve_model(
            {"sglang-jerryzsj-rtx3090-r1-distill-qwen-7b-wsl2": "deepseek-r1-distill-qwen-7b",
             "sglang-qwen3-14b-4x4090-tp4-mf080": "qwen3-14b"}[case_id]).geometry
        after = _log_float(log, r"Load weight end\..*?avail mem=([\d.]+) GB")
        usage = re.search(r"mem usage=([\d.]+) GB", log)
        begin = re.search(r"Load weight begin\. avail mem=([\d.]+) GB", log)
        before = float(begin.group(1)) if begin else after + float(usage.group(1))
        cell = sg.cell_size_bytes(geometry, kv_bytes=2, tp=tp, pp=1)
        logged = int(re.search(r"max_total_num_tokens=(\d+)", log).group(1))
        tokens, _ = sg.pool_tokens(pre_load_bytes=int(before * GiB), after_load_bytes=int(after * GiB),
                                   fraction_value=fraction, cell_bytes=cell, page_size=1, max_total_tokens=None)
        tolerance = (0.005 + 0.005 * (1 - fraction)) * GiB / cell
        assert abs(tokens - logged) <= tolerance

    def test_k_size_from_tokens(self, cases: dict) -> None:
        """K size = (tokens + page) x heads x head_dim x layers x 2 B: QwQ-32B TP 4 prints 1.42 GB."""
        log = cases["sglang-llmsinclouds-4xl4-qwq-32b-tp4"]["observed"]["log"]
        tokens = int(re.search(r"#tokens: (\d+)", log).group(1))
        geometry = geometry_from_config(QWQ_32B)
        k_bytes = (tokens + 1) * sg.cell_size_bytes(geometry, kv_bytes=2, tp=4, pp=1) // 2
        assert f"{k_bytes / GiB:.2f}" == _log_float(log, r"K size: ([\d.]+) GB").__format__(".2f")
