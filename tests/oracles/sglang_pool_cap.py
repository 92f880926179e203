#!/usr/bin/env python3
"""`--max-total-tokens` as SGLang's own pool code applies it, per release: the golden file
tests/data/sglang_pool_cap_oracle.json, which the planner's cap (planner._pool_cap, architectures.pool) is
checked against (tests/engines/sglang/test_pool_cap_oracle.py).

Runs in the SGLang oracle venv through tests/oracles/sglang_layouts.py's drivers (`LayoutOracle`: the
release's own KVCacheConfigurator or ModelRunner, chosen by feature detection; same P = 79.5 GiB, A = 40 GiB
scenario on an H100). Per model: the pool without a cap (T tokens, the full pool of a hybrid sliding-window
model), then caps at T // 3, T // 3 + 17 (off the page), T - 1 and T + 1,000 (above the pool), with
--page-size 64, and for sliding-window models with --swa-full-tokens-ratio 0.5 too. Models: a plain GQA
pool (Qwen2.5-7B), MLA (DeepSeek-V2-Lite), hybrid sliding-window pools (gpt-oss-20b, Gemma 3 12B).

    .venv-sglang/bin/python tests/oracles/sglang_pool_cap.py --output /tmp/cap-0.5.23.json
    .venv-sglang/bin/python tests/oracles/sglang_pool_cap.py --sglang-path .venv-sglang/sglang-0.5.9 \\
        --output /tmp/cap-0.5.9.json            # the target installs of tests/oracles/README.md (7 releases)
    python3 tests/oracles/sglang_pool_cap.py --merge /tmp/cap-*.json --output tests/data/sglang_pool_cap_oracle.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

MODELS = ("qwen2.5-7b", "deepseek-v2-lite", "gpt-oss-20b", "gemma-3-12b-it")
KV_KEYS = ("max_total_num_tokens", "swa_max_total_num_tokens", "full_max_total_num_tokens", "budget_bytes",
           "cell_size", "kv_dtype_bytes")


def _record(result: dict, flags: list[str]) -> dict:
    out = {"id": result["id"], "flags": flags}
    if "error" in result:
        out["error"] = str(result["error"])[:300]
        return out
    out.update({k: result[k] for k in ("mem_fraction_static", "page_size", "context_len", "is_hybrid_swa")
                if k in result})
    kv = result.get("kv") or {}
    out["kv"] = {k: kv[k] for k in KV_KEYS if k in kv}
    return out


def run() -> dict:
    import sglang_layouts as sl
    from sglang_legacy_layouts import LayoutOracle

    oracle = LayoutOracle(quiet=True)
    paths = sl.config_paths()
    records = []
    for name in MODELS:
        path = paths[name]

        def case(variant: str, flags: list[str], name: str = name, path: str = path) -> dict:
            result = sl._isolated(oracle, sl._case(name, path, variant, flags))
            compacted = sl.compact(result, name, path, variant, flags)
            return _record(compacted, flags)

        base = case("base", [])
        records.append(base)
        if "error" in base:
            continue
        tokens = base["kv"]["max_total_num_tokens"]
        swa = bool(base.get("is_hybrid_swa"))
        caps = {"third": tokens // 3, "off-page": tokens // 3 + 17, "just-under": tokens - 1, "above": tokens + 1000}
        for label, cap in caps.items():
            records.append(case(f"cap-{label}", ["--max-total-tokens", str(cap)]))
            records.append(case(f"cap-{label}-page64", ["--max-total-tokens", str(cap), "--page-size", "64"]))
            if swa:
                records.append(case(f"cap-{label}-ratio0.5",
                                    ["--max-total-tokens", str(cap), "--swa-full-tokens-ratio", "0.5"]))
    return {"sglang_version": oracle.version, "scenario": sl.KV_SCENARIO, "gpu_mem_mib": sl.GPU_MIB,
            "platform": sl.PLATFORM, "records": records}


def merge(paths: list[str]) -> str:
    runs = {}
    for path in paths:
        with open(path) as handle:
            run_ = json.load(handle)
        runs[run_["sglang_version"]] = run_
    lines = ['{"generator": "tests/oracles/sglang_pool_cap.py (module docstring)", "runs": {']
    parts = []
    for version in sorted(runs, key=lambda v: tuple(int(x) for x in v.split("."))):
        run_ = runs[version]
        head = json.dumps({k: run_[k] for k in ("scenario", "gpu_mem_mib", "platform")}, sort_keys=True)
        body = ",\n".join(json.dumps(r, sort_keys=True) for r in run_["records"])
        parts.append(f'"{version}": {{"setup": {head}, "records": [\n{body}\n]}}')
    return "\n".join(lines) + "\n" + ",\n".join(parts) + "\n}}\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sglang-path", help="a --target install of another release, put first on sys.path")
    ap.add_argument("--output")
    ap.add_argument("--merge", nargs="+", metavar="RUN")
    args = ap.parse_args(argv)
    if args.merge:
        text = merge(args.merge)
    else:
        if args.sglang_path:
            sys.path.insert(0, os.path.abspath(args.sglang_path))
        text = json.dumps(run(), sort_keys=True)
    if args.output:
        with open(args.output, "w") as handle:
            handle.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
