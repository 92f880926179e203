#!/usr/bin/env python3
"""SGLang's KV layouts from SGLang's own code, over real configs: the golden file
tests/data/sglang_layouts.json.

Runs in the SGLang oracle venv (tests/oracles/README.md) and drives `sglang_oracle.Oracle`
(the same patches: no GPU, capacity mocked) over every config.json in

  tests/data/configs/*.json, tests/data/startup-logs/models/*/config.json,
  tests/data/sglang_layouts/configs/*.json

with a few variants per config, on an H100 (platform preset sm90, 81920 MiB):

  base        no flags (tp 1)
  tp4         --tp-size 4
  kv-fp8      --kv-cache-dtype fp8_e4m3
  pp2         --pp-size 2
  swa-ratio   --swa-full-tokens-ratio 0.5           (hybrid SWA models only)
  swa-off     --disable-hybrid-swa-memory           (hybrid SWA models only)
  mamba-ratio --mamba-full-memory-ratio 0.5         (hybrid state models only)
  mamba-bf16  --mamba-ssm-dtype bfloat16            (hybrid state models only)
  mamba-norad --disable-radix-cache                 (hybrid state models only)

Each case sizes the pool from P = 79.5 GiB free before loading and A = 40 GiB after
(inputs that exercise the arithmetic, not measurements). A record keeps what SGLang's
`ModelConfig` derived (attention arch, heads, head dims), what its pool configurator
computed (cell size per token, full/SWA layer split, configurator class) and what
`KVCacheConfigurator._resolve_memory_pool_config` returned (tokens, SWA tokens, requests),
plus, for hybrid state models, the per-request state (`mamba2_cache_params`) and the
state slots `_handle_max_mamba_cache` allocated. Configs SGLang refuses keep its error.

    .venv-sglang/bin/python tests/oracles/sglang_layouts.py --output tests/data/sglang_layouts.json
"""

# ruff: noqa: BLE001
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.normpath(os.path.join(HERE, "..", "data"))
sys.path.insert(0, HERE)

GPU_MIB = 81920
PLATFORM = "sm90"
KV_SCENARIO = {"pre_model_load_gib": 79.5, "available_gib": 40.0}
VARIANTS = {
    "base": [],
    "tp4": ["--tp-size", "4"],
    "kv-fp8": ["--kv-cache-dtype", "fp8_e4m3"],
    "pp2": ["--pp-size", "2"],
}
SWA_VARIANTS = {
    "swa-ratio": ["--swa-full-tokens-ratio", "0.5"],
    "swa-off": ["--disable-hybrid-swa-memory"],
}
MAMBA_VARIANTS = {
    "mamba-ratio": ["--mamba-full-memory-ratio", "0.5"],
    "mamba-bf16": ["--mamba-ssm-dtype", "bfloat16"],
    "mamba-norad": ["--disable-radix-cache"],
}
KEPT = ("mem_fraction_static", "page_size", "kv_cache_dtype", "dtype", "context_len", "attention_arch",
        "is_multimodal", "is_hybrid_swa", "disable_hybrid_swa_memory", "max_running_requests")


def config_paths() -> dict[str, str]:
    """name -> path; the startup-log models keep their directory name."""
    found: dict[str, str] = {}
    for path in sorted(glob.glob(os.path.join(DATA, "configs", "*.json"))):
        found[os.path.splitext(os.path.basename(path))[0]] = path
    for path in sorted(glob.glob(os.path.join(DATA, "startup-logs", "models", "*", "config.json"))):
        found.setdefault(os.path.basename(os.path.dirname(path)), path)
    for path in sorted(glob.glob(os.path.join(DATA, "sglang_layouts", "configs", "*.json"))):
        found.setdefault(os.path.splitext(os.path.basename(path))[0], path)
    return found


def _case(name: str, path: str, variant: str, flags: list[str]) -> dict:
    return {"id": f"{name}|{variant}", "config_path": path, "gpu_mem_mib": GPU_MIB, "platform": PLATFORM,
            "flags": flags, "kv": dict(KV_SCENARIO)}


def compact(result: dict, name: str, path: str, variant: str, flags: list[str]) -> dict:
    out = {"id": result.get("id"), "model": name, "config": os.path.relpath(path, os.path.dirname(DATA)),
           "variant": variant, "flags": flags}
    for key in ("error", "summary_error"):
        if key in result:
            out["error"] = result[key]
            return out
    out.update({k: result[k] for k in KEPT if k in result})
    kv = dict(result.get("kv") or {})
    for key in ("pre_model_load_gib", "available_gib", "page_size", "log_k_size_gb", "log_v_size_gb",
                "log_kv_size_gb", "log_full_k_size_gb", "log_swa_k_size_gb"):
        kv.pop(key, None)
    out["kv"] = kv
    return out


def _isolated(oracle, case: dict) -> dict:
    """One case with the process environment restored afterwards: some flags publish
    themselves as SGLANG_* variables (--mamba-ssm-dtype sets SGLANG_MAMBA_SSM_DTYPE,
    which mamba2_state_dtype reads) and would leak into every later case."""
    saved = dict(os.environ)
    try:
        return oracle.run_case(case)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run(names: list[str] | None) -> dict:
    from sglang_oracle import Oracle

    oracle = Oracle(quiet=True)
    paths = config_paths()
    results = []
    t0 = time.time()
    for name, path in paths.items():
        if names and name not in names:
            continue
        base = _isolated(oracle, _case(name, path, "base", []))
        results.append(compact(base, name, path, "base", []))
        if "error" in base or "summary_error" in base:
            continue
        variants = dict(VARIANTS)
        variants.pop("base")
        if base.get("is_hybrid_swa"):
            variants.update(SWA_VARIANTS)
        if "mamba" in (base.get("kv") or {}):
            variants.update(MAMBA_VARIANTS)
        for variant, flags in variants.items():
            results.append(compact(_isolated(oracle, _case(name, path, variant, flags)), name, path, variant, flags))
    meta = {
        "generator": "tests/oracles/sglang_layouts.py (drives tests/oracles/sglang_oracle.py's Oracle)",
        "sglang_version": oracle.version,
        "platform": PLATFORM, "gpu_mem_mib": GPU_MIB, "kv_scenario": KV_SCENARIO,
        "variants": {**VARIANTS, **SWA_VARIANTS, **MAMBA_VARIANTS},
        "stubbed": sorted(set(__import__("sglang_oracle").STUBBED)),
        "seconds": round(time.time() - t0, 1),
    }
    return {"meta": meta, "results": results}


def dump(payload: dict) -> str:
    """One record per line: diff-friendly and valid JSON."""
    lines = ['{"meta":' + json.dumps(payload["meta"], sort_keys=True) + ',"results":[']
    res = payload["results"]
    lines += [json.dumps(r, separators=(",", ":"), sort_keys=True) + ("," if i < len(res) - 1 else "")
              for i, r in enumerate(res)]
    lines.append("]}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--output", help="write the golden file here (default stdout)")
    ap.add_argument("--models", help="comma-separated config names (default: all)")
    ap.add_argument("--compare", metavar="GOLDEN", help="compare with this golden file; exit 1 on a difference")
    args = ap.parse_args(argv)
    payload = run(args.models.split(",") if args.models else None)
    if args.compare:
        with open(args.compare) as f:
            golden = {r["id"]: r for r in json.load(f)["results"]}
        diffs = [r["id"] for r in payload["results"] if golden.get(r["id"]) != r]
        print(json.dumps({"compared": len(payload["results"]), "differences": diffs}, indent=1))
        return 1 if diffs else 0
    text = dump(payload)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
