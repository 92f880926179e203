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

Older releases (`--sglang-path DIR`, a `pip install --no-deps --target` of the release and its pinned
transformers) run through the drivers of tests/oracles/sglang_legacy_layouts.py, chosen by feature
detection; `--merge-versions RUN...` writes tests/data/sglang_layouts_versions.json from their outputs
(each release as changes to this file's records). Commands and timings: tests/oracles/README.md.
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
    from sglang_legacy_layouts import LayoutOracle

    oracle = LayoutOracle(quiet=True)
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
    from sglang_legacy_layouts import model_classes

    classes = model_classes()
    archs = sorted({arch for name, path in paths.items() if not names or name in names
                    for arch in (json.load(open(path)).get("architectures") or [])[:1]})
    meta = {
        # Which of the configs' architectures this release's model registry has a class for
        # (models/*.py EntryClass): the others run on the Transformers fallback or not at all.
        "model_classes": {arch: classes.get(arch) for arch in archs},
        "generator": "tests/oracles/sglang_layouts.py (drives tests/oracles/sglang_oracle.py's Oracle)",
        "sglang_version": oracle.version,
        "platform": PLATFORM, "gpu_mem_mib": GPU_MIB, "kv_scenario": KV_SCENARIO,
        "variants": {**VARIANTS, **SWA_VARIANTS, **MAMBA_VARIANTS},
        "stubbed": sorted(set(__import__("sglang_oracle").STUBBED)),
        "kv_driver": oracle.kv_driver,
        "transformers_version": __import__("transformers").__version__,
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


def _flat(value, prefix: str = "") -> dict:
    """{dotted path: leaf}; lists of records by index (kv.stages.0.cell_size), other lists whole."""
    if isinstance(value, dict) and value:
        out: dict = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        out = {}
        for i, v in enumerate(value):
            out.update(_flat(v, f"{prefix}{i}."))
        return out
    return {prefix[:-1]: value}


def _patch(base: dict, record: dict) -> dict:
    """The record as changes to the base record: {dotted path: value}; `null` in `drop` removes a path."""
    old, new = _flat(base), _flat(record)
    drop = sorted(k for k in old if k not in new)
    entry = {"id": record["id"], "patch": {k: v for k, v in new.items() if old.get(k, _ABSENT) != v},
             **({"drop": drop} if drop else {})}
    if apply_patch(base, entry) != record or len(json.dumps(entry)) > len(json.dumps(record)):
        return {"id": record["id"], "record": record}
    return entry


_ABSENT = object()


def apply_patch(base: dict, entry: dict) -> dict:
    """The release's record from the base record and its `_patch` entry (the test's reader): the paths
    in `drop` go, with any container left without a field; the `patch` paths are set."""
    if "record" in entry:
        return entry["record"]
    flat = {k: v for k, v in _flat(base).items() if k not in set(entry.get("drop", []))}
    flat.update(entry["patch"])
    return _unflat(flat)


def _unflat(flat: dict) -> dict:
    root: dict = {}
    for path, value in flat.items():
        *parents, leaf = path.split(".")
        node = root
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value

    def lists(node):  # {"0": ..., "1": ...} back to lists
        if not isinstance(node, dict):
            return node
        node = {k: lists(v) for k, v in node.items()}
        if node and all(k.isdigit() for k in node):
            return [node[str(i)] for i in range(len(node))]
        return node
    return lists(root)


def merge_versions(base_path: str, run_paths: list[str]) -> str:
    """tests/data/sglang_layouts_versions.json: each release's run against the base golden file (0.5.23):
    the records that differ, in full; the ids the release has not (a base config it refuses skips its
    variants) and the count of the identical ones, so that the test rebuilds every record."""
    with open(base_path) as f:
        base = {r["id"]: r for r in json.load(f)["results"]}
    runs = {}
    for path in run_paths:
        with open(path) as f:
            run = json.load(f)
        records = run["results"]
        ids = {r["id"] for r in records}
        differing = [_patch(base[r["id"]], r) if r["id"] in base else {"id": r["id"], "record": r}
                     for r in records if base.get(r["id"]) != r]
        runs[run["meta"]["sglang_version"]] = {
            "meta": run["meta"], "identical": len(records) - len(differing),
            "absent": sorted(set(base) - ids), "differing": differing}
    lines = ['{"meta":' + json.dumps({
        "generator": "tests/oracles/sglang_layouts.py --merge-versions (tests/oracles/README.md)",
        "base": os.path.relpath(base_path, os.path.dirname(DATA)),
        "format": "runs[version]: the release's records are the base file's, less `absent`, each changed by its "
                  "`differing` entry ({id, patch: {dotted path: new value}, drop: [dotted paths]}, or {id, record}: "
                  "the whole record where that is shorter); `identical` counts the base records kept as they are"},
        sort_keys=True) + ',"runs":{']
    for i, (version, run) in enumerate(sorted(runs.items(), key=lambda kv: [int(x) for x in kv[0].split(".")])):
        lines.append(json.dumps(version) + ':{"meta":' + json.dumps(run["meta"], sort_keys=True)
                     + ',"identical":' + str(run["identical"]) + ',"absent":' + json.dumps(run["absent"])
                     + ',"differing":[')
        res = run["differing"]
        lines += [json.dumps(r, separators=(",", ":"), sort_keys=True) + ("," if j < len(res) - 1 else "")
                  for j, r in enumerate(res)]
        lines.append("]}" + ("," if i < len(runs) - 1 else ""))
    lines.append("}}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--output", help="write the golden file here (default stdout)")
    ap.add_argument("--models", help="comma-separated config names (default: all)")
    ap.add_argument("--compare", metavar="GOLDEN", help="compare with this golden file; exit 1 on a difference")
    ap.add_argument("--sglang-path",
                    help="directory to put first on sys.path (a --target install of another sglang release)")
    ap.add_argument("--merge-versions", nargs="+", metavar="RUN",
                    help="write the per-release file from these runs against --base (no sglang needed)")
    ap.add_argument("--base", default=os.path.join(DATA, "sglang_layouts.json"))
    args = ap.parse_args(argv)
    from sglang_oracle import write_or_print

    if args.merge_versions:
        write_or_print(merge_versions(args.base, args.merge_versions), args.output)
        return 0
    if args.sglang_path:
        sys.path.insert(0, os.path.abspath(args.sglang_path))
    payload = run(args.models.split(",") if args.models else None)
    if args.compare:
        with open(args.compare) as f:
            golden = {r["id"]: r for r in json.load(f)["results"]}
        diffs = [r["id"] for r in payload["results"] if golden.get(r["id"]) != r]
        print(json.dumps({"compared": len(payload["results"]), "differences": diffs}, indent=1))
        return 1 if diffs else 0
    write_or_print(dump(payload), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
