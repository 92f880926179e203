#!/usr/bin/env python3
"""The data-parallel attention grid SGLang's own resolution and pool code run on (tests/oracles/README.md).

    python tests/oracles/sglang_dp_attention_cases.py > /tmp/dp-cases.json
    $VENV/bin/python tests/oracles/sglang_oracle.py --input /tmp/dp-cases.json > /tmp/dp-0.5.23.json
    $VENV/bin/python tests/oracles/sglang_oracle.py --sglang-path TREE-0.5.22 --input /tmp/dp-cases.json \\
        > /tmp/dp-0.5.22.json
    python tests/oracles/sglang_dp_attention_cases.py --golden /tmp/dp-0.5.23.json /tmp/dp-0.5.22.json \\
        > tests/data/sglang_dp_attention_oracle.json

The golden file keeps, per release and case, the flags and what the plan is checked against: the fraction, the
chunk, the decode max_bs, the page size, the pool's cell, tokens and request limit for the P and W given, or
SGLang's error.

Models whose attention SGLang builds over T / D ranks (DeepSeek-V3 and Kimi K2 MLA, DeepSeek-V2-Lite MLA without a
q LoRA, Qwen3-MoE and GLM-4.5 GQA), four cards, T of 2-8 and every D > 1 dividing it (and one that does not), the
two spellings (0.5.23's --attn-dp-size, --dp-size D --enable-dp-attention) and the flags that move the reserve,
the chunk and the request limit. P is the card's total less 3 GiB; W a round figure under the pool.
"""

from __future__ import annotations

import json

MODELS = {"deepseek-v3": 60.0, "kimi-k2-instruct": 70.0, "deepseek-v2-lite": 4.0, "qwen3-30b-a3b": 10.0,
          "qwen3-235b-a22b": 40.0, "glm-4.5-air": 20.0}
CARDS = ((24564, "sm89"), (81559, "sm90"), (143771, "sm90"), (183359, "sm100"))
VARIANTS = ((), ("--disable-cuda-graph",), ("--cuda-graph-max-bs-decode", "128"), ("--cuda-graph-max-bs-decode", "400"),
            ("--max-running-requests", "64"), ("--max-running-requests", "1000"), ("--chunked-prefill-size", "4096"),
            ("--kv-cache-dtype", "fp8_e4m3"))


# Cases a review asked for: the MLA backend's pages on Blackwell and with FlashMLA pinned, a request limit below D
# (0.5.22 divides it to 0), both spellings at once (SGLang's refusal), and heads that split over T / D, not T.
EXTRA = (("deepseek-v3", 183359, "sm100", ("--tp-size", "8", "--attn-dp-size", "8", "--chunked-prefill-size", "4000")),
         ("deepseek-v3", 143771, "sm90", ("--tp-size", "8", "--attn-dp-size", "8", "--attention-backend", "flashmla")),
         ("deepseek-v3", 143771, "sm90", ("--tp-size", "8", "--attn-dp-size", "8", "--max-running-requests", "4")),
         ("deepseek-v3", 143771, "sm90", ("--tp-size", "8", "--attn-dp-size", "4", "--dp-size", "2",
                                           "--enable-dp-attention")),
         ("qwen3-30b-a3b", 81559, "sm90", ("--tp-size", "6", "--attn-dp-size", "3")))


def cases() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for model, mem, platform, flags in EXTRA:
        out.append({"id": f"{model}|{mem}|extra|{' '.join(flags)}", "config_path": f"tests/data/configs/{model}.json",
                    "gpu_mem_mib": mem, "platform": platform, "flags": list(flags),
                    "kv": {"pre_model_load_gib": round(mem / 1024 - 3, 3), "weights_gib": MODELS[model]}})
    for model, weights_gib in MODELS.items():
        for mem, platform in CARDS:
            for tp in (2, 4, 8):
                for dp in [d for d in (2, 3, 4, 8) if d <= tp]:
                    variants = VARIANTS if (tp, dp) in ((8, 8), (4, 2)) else VARIANTS[:1]
                    for variant in variants:
                        spelling = ["--dp-size", str(dp), "--enable-dp-attention"] if (tp, dp) == (4, 4) \
                            else ["--attn-dp-size", str(dp)]
                        out.append({"id": f"{model}|{mem}|tp{tp}|dp{dp}|{' '.join(variant) or 'default'}",
                                    "config_path": f"tests/data/configs/{model}.json", "gpu_mem_mib": mem,
                                    "platform": platform, "flags": ["--tp-size", str(tp), *spelling, *variant],
                                    "kv": {"pre_model_load_gib": round(mem / 1024 - 3, 3),
                                           "weights_gib": weights_gib / (tp if weights_gib > 30 else 1)}})
    return out


KEPT = ("mem_fraction_static", "chunked_prefill_size", "page_size", "context_len", "error")
KEPT_KV = ("cell_size", "max_total_num_tokens", "max_running_requests", "pre_model_load_gib", "available_gib", "error")


def golden(paths: list[str]) -> str:
    flags = {case["id"]: case["flags"] for case in cases()}
    runs = {}
    for path in paths:
        with open(path) as handle:
            raw = json.load(handle)
        records = []
        for result in raw["results"]:
            record = {"id": result["id"], "flags": flags[result["id"]],
                      **{k: result[k] for k in KEPT if k in result}}
            if isinstance(result.get("decode_graph"), dict):
                record["decode_max_bs"] = result["decode_graph"].get("max_bs")
            if isinstance(result.get("kv"), dict):
                record["kv"] = {k: result["kv"][k] for k in KEPT_KV if k in result["kv"]}
            records.append(json.dumps(record, sort_keys=True))
        runs[raw["meta"]["sglang_version"]] = records
    lines = ['{"generator": "tests/oracles/sglang_dp_attention_cases.py (module docstring)", "runs": {']
    lines.append(",\n".join(f'"{version}": [\n' + ",\n".join(records) + "\n]" for version, records in runs.items()))
    return "\n".join(lines) + "\n}}"


if __name__ == "__main__":
    import sys

    print(golden(sys.argv[2:]) if sys.argv[1:2] == ["--golden"] else json.dumps({"cases": cases()}))
