"""vLLM 0.32 KV accounting: blocks, groups, printed tokens and concurrency."""

from __future__ import annotations

import pytest

from launcher.common.units import GiB, MiB
from launcher.engines.vllm.kv import kv_capacity, kv_layout, pp_partitions
from launcher.model.config import geometry_from_config
from tests.model.test_config import LLAMA_8B


def _geometry(**overrides: object):
    base = {"model_type": "qwen2", "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1000, "max_position_embeddings": 32768}
    return geometry_from_config({**base, **overrides})


class TestLayout:
    def test_llama_block_is_2_mib(self) -> None:
        """Llama-3.1-8B bf16, block 16: 32 layers x 64 KiB page = 2 MiB per block."""
        layout = kv_layout(geometry_from_config(LLAMA_8B), block_size=16, kv_dtype_bytes=2)
        assert (layout.page_bytes, layout.bytes_per_block) == (64 * 1024, 2 * MiB)

    def test_tp_splits_heads_and_replicates_below_one(self) -> None:
        """TP 4 leaves 2 of 8 KV heads per rank; TP 16 replicates one head per rank."""
        geometry = geometry_from_config(LLAMA_8B)
        assert kv_layout(geometry, block_size=16, kv_dtype_bytes=2, tp=4).page_bytes == 16 * 2 * 256 * 2
        assert kv_layout(geometry, block_size=16, kv_dtype_bytes=2, tp=16).page_bytes == 16 * 1 * 256 * 2

    def test_gemma_style_groups(self) -> None:
        """5:1 sliding:full splits into 1 full group + 5 sliding groups of the full-layer count."""
        geometry = geometry_from_config({
            "model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 12, "num_attention_heads": 4,
            "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 10, "sliding_window": 512})
        layout = kv_layout(geometry, block_size=16, kv_dtype_bytes=2)
        assert layout.group_size == 2 and len(layout.groups) == 6
        assert sorted(g.kind for g in layout.groups).count("sliding") == 5

    def test_close_counts_pad_to_the_larger(self) -> None:
        """12 sliding + 13 full layers pad to groups of 13 (max < 1.5 x min)."""
        kinds = ["sliding_attention"] * 12 + ["full_attention"] * 13
        geometry = _geometry(num_hidden_layers=25, sliding_window=128, layer_types=kinds)
        layout = kv_layout(geometry, block_size=16, kv_dtype_bytes=2)
        assert layout.group_size == 13 and len(layout.groups) == 2 and layout.padding_layers == 1

    def test_pp_partition_gives_remainder_before_last(self) -> None:
        """vLLM's get_pp_indices: 10 layers over 4 stages -> 2, 3, 3, 2."""
        assert [len(r) for r in pp_partitions(10, 4)] == [2, 3, 3, 2]


class TestCapacity:
    def test_qwen2_tiny_cpu_reference(self) -> None:
        """4 layers, 2 KV heads, head 32, block 128, 1 GiB, length 4096 -> 1,048,576 tokens, 256x."""
        layout = kv_layout(_geometry(), block_size=128, kv_dtype_bytes=2)
        capacity = kv_capacity(layout, 1 * GiB, max_model_len=4096, in_flight_tokens=4096)
        assert (capacity.num_blocks, capacity.tokens, capacity.concurrency_printed) == (8192, 1048576, "256.00")

    def test_sliding_window_prints_more_than_slots(self) -> None:
        """A window model's printed tokens are concurrency x length, beyond its physical slots."""
        layout = kv_layout(_geometry(model_type="mistral", sliding_window=256), block_size=16, kv_dtype_bytes=2)
        capacity = kv_capacity(layout, 64 * MiB, max_model_len=4096, in_flight_tokens=2 * 2048)
        # window 256 - 1 + 4096 in flight, capped at 4096 -> 256 blocks + 1 per request
        assert capacity.blocks_per_request == 257
        assert capacity.tokens == int(capacity.num_blocks / 257 * 4096)

    def test_too_long_reports_vllm_estimate(self) -> None:
        """When one request does not fit, the estimate is (blocks - 1) x block size."""
        layout = kv_layout(geometry_from_config(LLAMA_8B), block_size=16, kv_dtype_bytes=2)
        capacity = kv_capacity(layout, 100 * 2 * MiB, max_model_len=131072, in_flight_tokens=4096)
        assert not capacity.fits_one_request
        assert capacity.estimated_max_model_len == 99 * 16

    @pytest.mark.parametrize(("length", "blocks", "tokens"), [
        pytest.param(1024, 10991, 175856, id="qwen3-1.7b-log"),
        pytest.param(40960, 3727, 59632, id="qwen3-14b-awq-l4"),
    ])
    def test_printed_tokens_formula(self, length: int, blocks: int, tokens: int) -> None:
        """int(num_blocks / cdiv(len, 16) x len) reproduces logged token counts."""
        layout = kv_layout(_geometry(), block_size=16, kv_dtype_bytes=2)
        capacity = kv_capacity(layout, blocks * layout.bytes_per_block, max_model_len=length, in_flight_tokens=0)
        assert capacity.tokens == tokens


def test_in_flight_batches_with_pipeline_parallel() -> None:
    """`max_concurrent_batches` under async scheduling (the GPU default): PP + 1 on the V2 model runner (every
    model from 0.29), 2 at PP 1 and PP batches beyond on V1 (config/vllm.py:582-586 in 0.32.0), PP on CPU."""
    from launcher.engines.vllm.kv import in_flight_tokens

    assert in_flight_tokens(batched_tokens=8192, device="cuda", pp=2, v2_runner=True) == 3 * 8192
    assert in_flight_tokens(batched_tokens=8192, device="cuda", pp=1, v2_runner=True) == 2 * 8192
    assert in_flight_tokens(batched_tokens=8192, device="cuda", pp=2, v2_runner=False) == 2 * 8192
    assert in_flight_tokens(batched_tokens=2048, device="cuda", pp=1, v2_runner=False) == 2 * 2048
    assert in_flight_tokens(batched_tokens=2048, device="cpu", pp=1, v2_runner=True) == 2048
