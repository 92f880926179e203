"""Every published startup log with a known GPU, model and flags, planned as a user would plan it.

    python bench/startup_logs.py [--verbose]

For each case in tests/data/startup-logs/ (copied from ../shared/data), this runs the planner on
`--gpu <the log's GPU> --engine-version <the log's version> -- <the log's flags>` with the
checkpoint the log names (its config.json and index under models/, or a profile for the repo),
and compares the KV cache it predicts with the one the engine printed:

- vLLM: "Available KV cache memory: X GiB" (bytes, per rank);
- SGLang: the pool in tokens ("max_total_num_tokens=N").

Prints one row per case, then per engine and version: the signed error's median, p90 of
|error| and worst, and the false refusals (the plan refuses what the engine started) and false
accepts (the plan is confident, the engine then failed on memory). A case the planner cannot
take (unknown GPU, model or version) is listed as skipped with the reason.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launcher.common.errors import SafeServeError, WontFit  # noqa: E402
from launcher.common.units import GiB  # noqa: E402
from launcher.model.catalog import find, hypothetical_gpus  # noqa: E402
from launcher.model.config import geometry_from_config  # noqa: E402
from launcher.model.resolve import ResolvedModel, model_from_profile, profile_for_repo, resolve_model  # noqa: E402
from launcher.plan.planner import make_plan  # noqa: E402
from launcher.plan.types import PlanRequest  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "startup-logs"
FILES = ("startup-logs.yaml", "startup-logs-2.yaml")

# Log flags that size memory, in the engine's spelling; others (prefix caching, LoRA) pass.
VLLM_FLAGS = {"max_model_len": "--max-model-len", "gpu_memory_utilization": "--gpu-memory-utilization",
              "tensor_parallel_size": "--tensor-parallel-size", "pipeline_parallel_size": "--pipeline-parallel-size",
              "kv_cache_dtype": "--kv-cache-dtype", "dtype": "--dtype", "max_num_seqs": "--max-num-seqs",
              "max_num_batched_tokens": "--max-num-batched-tokens", "block_size": "--block-size",
              "enforce_eager": "--enforce-eager"}
SGLANG_FLAGS = {"tp_size": "--tp-size", "tp": "--tp-size", "mem_fraction_static": "--mem-fraction-static",
                "context_length": "--context-length", "chunked_prefill_size": "--chunked-prefill-size",
                "page_size": "--page-size"}
# Values the log calls a default: the user did not type them.
_DEFAULT_NOTE = re.compile(r"default|auto", re.IGNORECASE)


@dataclass(frozen=True)
class Row:
    case: str
    engine: str
    version: str
    logged: float  # GiB (vLLM) or tokens (SGLang)
    predicted: float | None  # None: refused
    low: float | None = None
    high: float | None = None
    engine_failed: bool = False
    may_not_fit: bool = False
    note: str = ""

    @property
    def error(self) -> float | None:
        if self.predicted is None or not self.logged:
            return None
        return (self.predicted - self.logged) / self.logged


def _value(raw: Any) -> str | None:
    """A log flag's value as the user typed it, or None (null, or a default the log reports)."""
    if raw is None or isinstance(raw, bool):
        return None
    text = str(raw).strip()
    if _DEFAULT_NOTE.search(text) and "(" in text:
        return None
    first = text.split()[0]
    return None if first in ("null", "None", "not") else first


def engine_args(case: Mapping[str, Any]) -> tuple[str, ...]:
    table = VLLM_FLAGS if case["engine"] == "vllm" else SGLANG_FLAGS
    args: list[str] = []
    for key, flag in table.items():
        raw = (case.get("flags") or {}).get(key)
        if key == "enforce_eager":
            if raw is True or str(raw).lower().startswith("true"):
                args.append(flag)
            continue
        value = _value(raw)
        if value is not None:
            args += [flag, value]
    return tuple(args)


def model_for(case: Mapping[str, Any]) -> tuple[Any, str]:
    """The checkpoint: its profile, else the config under models/. Where the weights we have are
    not this checkpoint's (a quantized repo sharing the base config, or no index), the engine's own
    "Model loading took" figure stands in: this bench is about the terms the planner estimates."""
    profile = profile_for_repo(str(case.get("model") or ""))
    if profile is not None:
        return model_from_profile(profile), ""
    if not case.get("model_config"):
        raise LookupError(f"model {case.get('model')} not in profiles/ and no model_config")
    directory = DATA / "models" / case["model_config"]
    config = json.loads((directory / "config.json").read_text())
    logged = (case.get("observed") or {}).get("weights_gib")
    try:
        model = resolve_model(str(directory))
    except SafeServeError:
        model = None
    tp = int((case.get("flags") or {}).get("tensor_parallel_size") or 1)
    if model is not None and (logged is None or
                              abs(model.weight_bytes / tp / GiB - float(logged)) < 0.05 * float(logged)):
        return model, ""
    if logged is None:
        raise LookupError(f"{directory.name}: no weights for this checkpoint and none logged")
    return ResolvedModel(name=str(case.get("model")), source="local", geometry=geometry_from_config(config),
                         weight_bytes=int(float(logged) * GiB * tp), weight_bytes_source="the log's Model loading took",
                         config=config), "weights from the log"


def logged_figure(case: Mapping[str, Any]) -> float | None:
    observed = case.get("observed") or {}
    log = str(observed.get("log") or "")
    if case["engine"] == "vllm":
        match = re.search(r"Available KV cache memory: (-?[\d.]+) GiB", log)
        return float(match.group(1)) if match else None
    match = re.search(r"max_total_num_tokens=(\d+)", log)
    return float(match.group(1)) if match else None


def plan_case(case: Mapping[str, Any]) -> Row | str:
    version = str(case.get("engine_version") or "").lstrip("v") or None
    if version is None:
        return "engine version not stated"
    logged = logged_figure(case)
    if logged is None:
        return "no KV figure in the log"
    gpu = find(str(case.get("gpu") or ""))
    if gpu is None:
        return f"GPU {case.get('gpu')!r} not in the catalog"
    try:
        model, weights_note = model_for(case)
    except (LookupError, SafeServeError) as exc:
        return str(exc)
    count = int(case.get("gpu_count") or 1) if str(case.get("gpu_count") or "1").isdigit() else 1
    request = PlanRequest(model=model, engine=case["engine"], gpus=hypothetical_gpus([f"{count}x{gpu.name}"]),
                          engine_version=version, engine_args=engine_args(case))
    failed = bool((case.get("observed") or {}).get("startup_failed"))
    try:
        plan = make_plan(request)
    except WontFit as refusal:
        return _refused(case, version, logged, failed, weights_note, refusal)
    except SafeServeError as exc:
        return f"not planned: {exc.message[:100]}"
    return _planned(case, version, logged, failed, weights_note, plan)


def _refused(case: Mapping[str, Any], version: str, logged: float, failed: bool, weights_note: str,
             refusal: WontFit) -> Row:
    return Row(case["id"], case["engine"], version, logged, None, engine_failed=failed,
                   note=f"{weights_note} {refusal.message[:80]}".strip())


def _planned(case: Mapping[str, Any], version: str, logged: float, failed: bool, weights_note: str,
             plan: Any) -> Row:
    scale = GiB if case["engine"] == "vllm" else 1
    if case["engine"] == "vllm":
        predicted, low, high = (plan.kv_cache_bytes / scale, (plan.kv_cache_bytes_low or 0) / scale,
                                (plan.kv_cache_bytes_high or 0) / scale)
    else:
        per_token = plan.kv_cache_bytes / max(plan.kv_cache_tokens, 1)
        predicted = float(plan.kv_cache_tokens)
        low, high = (plan.kv_cache_bytes_low or 0) / per_token, (plan.kv_cache_bytes_high or 0) / per_token
    return Row(case["id"], case["engine"], version, logged, predicted, low, high, engine_failed=failed,
               may_not_fit=plan.may_not_fit is not None, note=weights_note)


def rows() -> tuple[list[Row], list[tuple[str, str]]]:
    found: list[Row] = []
    skipped: list[tuple[str, str]] = []
    for name in FILES:
        for case in yaml.safe_load((DATA / name).read_text()):
            outcome = plan_case(case)
            if isinstance(outcome, str):
                skipped.append((case["id"], outcome))
            else:
                found.append(outcome)
    return found, skipped


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--verbose", action="store_true", help="also list the skipped cases")
    args = parser.parse_args()
    found, skipped = rows()
    print(f"{'case':62} {'version':8} {'logged':>10} {'planned':>10} {'error':>7}  band / outcome")
    for row in found:
        unit = "GiB" if row.engine == "vllm" else "tok"
        planned = "refused" if row.predicted is None else f"{row.predicted:10.2f}" if unit == "GiB" else \
            f"{row.predicted:10.0f}"
        error = "" if row.error is None else f"{row.error:+7.1%}"
        inside = "" if row.predicted is None or row.low is None or row.high is None else (
            "in band" if row.low <= row.logged <= row.high else "OUT of band")
        outcome = ("engine failed" if row.engine_failed else "") + (" may-not-fit" if row.may_not_fit else "")
        print(f"{row.case[:62]:62} {row.version:8} {row.logged:10.2f} {planned:>10} {error:>7}  "
              f"{inside} {outcome} {row.note}")
    print()
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in found:
        groups[(row.engine, row.version)].append(row)
    print(f"{'engine':7} {'version':10} {'cases':>5} {'median':>8} {'p90 |e|':>8} {'worst':>8} {'in band':>8} "
          f"{'false refusals':>15} {'false accepts':>14}")
    for (engine, version), group in sorted(groups.items()):
        errors = [r.error for r in group if r.error is not None and not r.engine_failed]
        if errors:
            median, p90 = statistics.median(errors), percentile([abs(e) for e in errors], 0.9)
            worst = max(errors, key=abs)
        else:
            median = p90 = worst = float("nan")
        inside = sum(1 for r in group if r.low is not None and r.high is not None and r.low <= r.logged <= r.high)
        false_refusals = sum(1 for r in group if r.predicted is None and not r.engine_failed)
        false_accepts = sum(1 for r in group if r.predicted is not None and r.engine_failed and not r.may_not_fit)
        print(f"{engine:7} {version:10} {len(group):5} {median:+8.1%} {p90:8.1%} {worst:+8.1%} "
              f"{inside:>4}/{len(group):<3} {false_refusals:15} {false_accepts:14}")
    print(f"\n{len(found)} cases planned, {len(skipped)} skipped")
    if args.verbose:
        for case_id, reason in skipped:
            print(f"  skipped {case_id}: {reason}")


if __name__ == "__main__":
    main()
