"""Every line the renderer prints is true: parsed back, the table says what the JSON says.

Plans are made for catalog GPUs (no probe); the text of `render_plan` / `render_fit` is read
back with regular expressions and each figure compared with `plan_to_json` / `fit_to_json`
of the same plan.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import pytest

from launcher.common.units import GiB
from launcher.edge.render import fit_to_json, plan_to_json, render_fit, render_plan
from launcher.engines import adapter
from launcher.model.catalog import hypothetical_gpus
from launcher.model.gpu import GpuDevice
from launcher.model.resolve import resolve_model
from launcher.plan.types import Plan, PlanRequest

try:  # the planner is moving out of plan.py (issue 10)
    from launcher.plan.planner import make_plan
except ImportError:  # pragma: no cover - before the move
    from launcher.plan.types import make_plan  # type: ignore[attr-defined,no-redef]


def plan_for(model: str, gpus: Sequence[str], *flags: str, engine: str = "vllm",
             concurrency: int = 1) -> tuple[Plan, tuple[GpuDevice, ...]]:
    devices = hypothetical_gpus(list(gpus))
    request = PlanRequest(model=resolve_model(model), engine=engine, gpus=devices, engine_version=None,
                          engine_args=tuple(flags), concurrency=concurrency)
    return make_plan(request), devices


ROW = re.compile(r"^  (?P<label>.{34}) +(?P<gib>-?\d+\.\d\d)  (?P<source>.{14}) (?P<why>.*)$")


def parse_plan_text(text: str) -> dict[str, Any]:
    """Read the figures back out of `render_plan`'s text."""
    lines = text.splitlines()
    head = re.match(r"safe-serve plan: (?P<model>\S+) on (?P<where>.+), (?P<engine>vllm|sglang) (?P<version>\S+)"
                    r"(?P<assumed> \(assumed: not installed\))? \(rules (?P<rules>\S+)\), "
                    r"TP (?P<tp>\d+) x PP (?P<pp>\d+)$",
                    lines[0])
    assert head, lines[0]
    rows = {}
    for line in lines[3:]:
        if not line.strip():
            break
        match = ROW.match(line)
        assert match, line
        rows[match["label"].rstrip()] = float(match["gib"])
    fields = {m[1]: m[2] for m in (re.match(r"^  (memory knob|max length|KV cache|concurrency|flags added|"
                                             r"pinned \(kept\)) +(.*)$", line) for line in lines) if m}
    return {"head": head.groupdict(), "rows": rows, "fields": fields}


def assert_text_matches_json(text: str, doc: dict[str, Any]) -> dict[str, Any]:
    parsed = parse_plan_text(text)
    head, rows, fields = parsed["head"], parsed["rows"], parsed["fields"]
    assert (doc["model"], doc["engine"], doc["engine_version"], doc["rules_version"]) == (
        head["model"], head["engine"], head["version"], head["rules"])
    assert doc["engine_version_assumed"] == bool(head["assumed"])
    assert (doc["tensor_parallel_size"], doc["pipeline_parallel_size"]) == (int(head["tp"]), int(head["pp"]))
    for item in doc["budget"]:
        assert rows[item["label"][:34].rstrip()] == round(item["bytes"] / GiB, 2), item["label"]
    knob = fields["memory knob"].split()
    value = doc["gpu_memory_utilization"] if knob[0] == "--gpu-memory-utilization" else doc["mem_fraction_static"]
    assert float(knob[1]) == value
    assert int(fields["max length"].split()[0].replace(",", "")) == doc["max_model_len"]
    kv = re.match(r"(\d+\.\d\d) GiB = ([\d,]+) tokens", fields["KV cache"])
    assert kv and (float(kv[1]), int(kv[2].replace(",", ""))) == (round(doc["kv_cache_bytes"] / GiB, 2),
                                                                    doc["kv_cache_tokens"])
    assert float(fields["concurrency"].split()[0]) == doc["max_concurrency"]
    assert fields["flags added"].split() == doc["engine_args"]
    return parsed


def where(text: str) -> str:
    return parse_plan_text(text)["head"]["where"]


def test_unused_card_is_named_with_the_reason() -> None:
    plan, given = plan_for("qwen2.5-7b", ["2xa100-80gb"])
    text, doc = render_plan(plan, given=given), plan_to_json(plan, given=given)
    assert_text_matches_json(text, doc)
    assert where(text) == "1 of 2 x NVIDIA A100-SXM4-80GB (1 unused: no --tensor-parallel-size)"
    assert (1, 1, "no --tensor-parallel-size") == (doc["gpu"]["count"], doc["gpu"]["unused"],
                                                   doc["gpu"]["unused_reason"])
    assert ["NVIDIA A100-SXM4-80GB"] * 2 == doc["gpu"]["given"]


def test_sglang_unused_card_names_its_own_flag() -> None:
    plan, given = plan_for("qwen2.5-7b", ["2xh100"], engine="sglang")
    assert where(render_plan(plan, given=given)).endswith("(1 unused: no --tp-size)")


def test_mixed_cards_are_both_named() -> None:
    plan, given = plan_for("qwen2.5-7b", ["rtx4090", "a100-80gb"], "-tp", "2")
    text, doc = render_plan(plan, given=given), plan_to_json(plan, given=given)
    assert_text_matches_json(text, doc)
    assert where(text) == ("2 GPUs (1 x NVIDIA GeForce RTX 4090 + 1 x NVIDIA A100-SXM4-80GB; the tightest, "
                           "NVIDIA GeForce RTX 4090, sizes every rank)")
    assert ["NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-80GB"] == doc["gpu"]["used"]
    assert 0 == doc["gpu"]["unused"]


def test_without_given_devices_the_header_says_only_what_the_plan_knows() -> None:
    plan, _ = plan_for("qwen2.5-7b", ["rtx4090"])
    assert where(render_plan(plan)) == "1 x NVIDIA GeForce RTX 4090"
    assert None is plan_to_json(plan)["gpu"]["given"]


def test_sglang_shows_both_totals_and_the_gap() -> None:
    """SGLang's table starts from the NVML total; the CUDA total it subtracts from is shown beside it."""
    plan, given = plan_for("qwen2.5-7b", ["rtx4090"], engine="sglang")
    text, doc = render_plan(plan, given=given), plan_to_json(plan, given=given)
    rows = assert_text_matches_json(text, doc)["rows"]
    nvml, cuda = doc["gpu"]["nvml_total_bytes"], doc["gpu"]["cuda_total_bytes"]
    # CUDA total: the median of the RTX 4090 totals published in tests/data/cuda-totals.yaml.
    assert (23.99, 23.64) == (round(nvml / GiB, 2), round(cuda / GiB, 2))
    assert rows["GPU total (NVML)"] == 23.99 and rows["CUDA total (what the engine gets)"] == 23.64
    assert f"NVML total - {(nvml - cuda) / GiB:.2f} GiB the driver keeps back" in text
    assert "0.35 GiB" in text  # 24564 MiB less the published 23.640 GiB (median of five)
    # held by others + free at baseline + context add up to the CUDA total, not the NVML one
    budget = {i["key"]: i["bytes"] for i in doc["budget"]}
    assert budget["other"] + budget["context"] + budget["pre_load"] == cuda


def test_vllm_shows_the_nvml_total_under_the_cuda_one() -> None:
    plan, given = plan_for("qwen2.5-7b", ["l40s"])
    text = render_plan(plan, given=given)
    rows = assert_text_matches_json(text, plan_to_json(plan, given=given))["rows"]
    assert (44.42, 44.99) == (rows["GPU total (CUDA)"], rows["NVML total (nvidia-smi)"])


def test_same_totals_add_no_row() -> None:
    plan, given = plan_for("qwen2.5-7b", ["24GiB"])
    text = render_plan(plan, given=given)
    assert "NVML total" not in text and "CUDA total (what" not in text


def test_pinned_auto_is_shown_as_written() -> None:
    plan, given = plan_for("qwen2.5-7b", ["rtx4090"], "--max-model-len", "auto")
    text, doc = render_plan(plan, given=given), plan_to_json(plan, given=given)
    parsed = assert_text_matches_json(text, doc)
    assert parsed["fields"]["pinned (kept)"] == "--max-model-len auto"
    assert {"--max-model-len": -1} == doc["pinned"]  # the engine's own sentinel stays in the data
    assert "-1" not in parsed["fields"]["pinned (kept)"]


def test_pinned_as_written() -> None:
    vllm, sglang = adapter("vllm"), adapter("sglang")
    assert "--enforce-eager" == vllm.pinned_as_written("--enforce-eager", True)
    assert "--max-model-len 8192" == vllm.pinned_as_written("--max-model-len", 8192)
    assert "--max-model-len auto" == vllm.pinned_as_written("--max-model-len", -1)
    assert "--context-length -1" == sglang.pinned_as_written("--context-length", -1)  # only vLLM's has "auto"


@dataclasses.dataclass(frozen=True)
class _FlaggedPlan(Plan):
    """A plan carrying the planner's `engine_version_assumed` (for a Plan that has no such field yet)."""

    engine_version_assumed: bool = False


def _with_assumed(plan: Plan, assumed: bool) -> Plan:
    if any(f.name == "engine_version_assumed" for f in dataclasses.fields(Plan)):
        return dataclasses.replace(plan, engine_version_assumed=assumed)  # type: ignore[call-arg]
    values = {f.name: getattr(plan, f.name) for f in dataclasses.fields(Plan)}
    return _FlaggedPlan(**values, engine_version_assumed=assumed)


def test_assumed_engine_version_is_marked_in_header_and_json() -> None:
    plan, given = plan_for("qwen2.5-7b", ["rtx4090"])
    assumed, installed = _with_assumed(plan, True), _with_assumed(plan, False)
    text, doc = render_plan(assumed, given=given), plan_to_json(assumed, given=given)
    assert_text_matches_json(text, doc)
    assert f"vllm {plan.engine_version} (assumed: not installed)" in text.splitlines()[0]
    assert doc["engine_version_assumed"] is True
    assert "(assumed" not in render_plan(installed, given=given)
    assert plan_to_json(installed)["engine_version_assumed"] is False


# --------------------------------------------------------------------------- fit


FIT_ROW = re.compile(r"^  (?P<gpu>.{34}) (?P<needs>.{26}) +(?P<tokens>[\d,]+) +(?P<headroom>[+-]\d+%)  (?P<flags>.*)$")


def _fit(model: str, gpus: Sequence[str], concurrency: int, tokens: int) -> tuple[Any, ...]:
    from launcher.plan.fit import Workload, fit, largest_concurrency, longest_length

    base = PlanRequest(model=resolve_model(model), engine="vllm", gpus=hypothetical_gpus([gpus[0]]),
                       variants=tuple(resolve_model(v) for v in resolve_model(model).quantized_variants))
    workload = Workload(concurrency, tokens)
    results = fit(base, workload, [hypothetical_gpus([g])[0] for g in gpus])
    inverse = None
    if len(gpus) == 1:
        inverse = (largest_concurrency(base, tokens), longest_length(base, concurrency))
    return base, workload, results, inverse


def test_fit_rows_match_json_and_name_the_real_dtype() -> None:
    base, workload, results, _ = _fit("qwen2.5-7b", ["t4", "v100-sxm2-16gb", "rtx4090", "a100-80gb"], 32, 4096)
    text = render_fit(results, workload, base.model.name, "vllm", None, geometry=base.model.geometry)
    doc = fit_to_json(results, workload, base.model.name, "vllm", None)
    rows = [m for m in (FIT_ROW.match(line) for line in text.splitlines()) if m]
    assert len(rows) == len(doc["gpus"]) == 4
    for row, entry in zip(rows, doc["gpus"], strict=True):
        best = entry["best"]
        assert row["gpu"].rstrip() == entry["gpu"][:34]
        assert int(row["tokens"].replace(",", "")) == best["kv_cache_tokens"]
        assert row["headroom"] == f"{best['max_concurrency'] / 32 - 1:+.0%}"
    misses = [line for line in text.splitlines() if "short:" in line]
    labels = [line.split("short:")[0].split() for line in misses]
    assert ["1", "GPU,", "fp16,", "as", "is"] in labels  # T4, V100: no bf16 (compute capability < 8.0)
    assert ["1", "GPU,", "bf16,", "as", "is"] in labels  # RTX 4090
    assert "bf16" not in " ".join(misses[:2])  # T4 and V100 come first
    assert "headroom: how many more requests of 4,096 tokens the KV cache holds, as a share of the 32" in text


def test_fit_inverse_never_says_zero_tokens() -> None:
    base, workload, results, inverse = _fit("qwen2.5-72b", ["a100-80gb"], 4, 8192)
    assert (0, 0) == inverse
    text = render_fit(results, workload, base.model.name, "vllm", inverse, geometry=base.model.geometry)
    assert "of at most 0 tokens" not in text and "1 requests" not in text
    assert text.endswith("not one request of 8,192 tokens fits; 4 requests at once fit at no length")
    doc = fit_to_json(results, workload, base.model.name, "vllm", inverse)
    assert (0, 0) == (doc["largest_concurrency_at_tokens"], doc["longest_tokens_at_concurrency"])


@pytest.mark.parametrize(("inverse", "tail"), [
    ((1, 16384), "at most 1 request of 8,192 tokens at once; 1 request of at most 16,384 tokens each"),
    ((3, 9000), "at most 3 requests of 8,192 tokens at once; 1 request of at most 9,000 tokens each"),
])
def test_fit_inverse_counts_agree_in_number(inverse: tuple[int, int], tail: str) -> None:
    from launcher.edge.render import inverse_text
    from launcher.plan.fit import Workload

    assert inverse_text("NVIDIA L4", Workload(1, 8192), inverse).endswith(tail)
