"""Every published startup log with a known GPU, model and flags, planned as a user would plan it,
scored leave-one-out.

    python bench/startup_logs.py [--verbose] [--in-sample]

For each case in tests/data/startup-logs/ (copied from ../shared/data), this runs the planner on
`--gpu <the log's GPU> --engine-version <the log's version> -- <the log's flags>` with the
checkpoint the log names (its config.json and index under models/, or a profile for the repo),
and compares the KV cache it predicts with the one the engine printed:

- vLLM: "Available KV cache memory: X GiB" (bytes, per rank);
- SGLang: the pool in tokens ("max_total_num_tokens=N").

Leave-one-out: every constant the planner fits on these logs (`FITS`) is refitted for each case
from the other sources' logs only, and the CUDA total of the card from the other sources'
observations in tests/data/cuda-totals.yaml; a log is never scored by a term fitted on it.
`--in-sample` scores with the shipped constants instead (what the project reported before).

Prints one row per case, then per engine, version and GPU class: the signed error's median, p90
of |error| and worst, how many logged figures fall inside the plan's band, the false refusals (the
plan refuses what the engine started), the unsafe side outside the band (the plan promises more KV
than the engine gave, beyond its band) and the false accepts (the plan is confident, the engine
then failed on memory). Then each fitted term's leave-one-out residuals and each term's residual
against the figure the log printed. A case the planner cannot take is listed as skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launcher.common.errors import SafeServeError, WontFit  # noqa: E402
from launcher.common.units import GiB  # noqa: E402
from launcher.engines import sglang as sg  # noqa: E402
from launcher.engines import vllm as vl  # noqa: E402
from launcher.engines.sglang import budget as sgb  # noqa: E402
from launcher.engines.vllm import budget as vb  # noqa: E402
from launcher.engines.vllm import rules as vr  # noqa: E402
from launcher.model import cuda_totals  # noqa: E402
from launcher.model.catalog import CatalogGpu, find, hypothetical_gpus, load_catalog  # noqa: E402
from launcher.model.config import ModelGeometry, geometry_from_config  # noqa: E402
from launcher.model.gpu import GpuDevice  # noqa: E402
from launcher.model.resolve import ResolvedModel, model_from_profile, profile_for_repo, resolve_model  # noqa: E402
from launcher.plan.planner import make_plan  # noqa: E402
from launcher.plan.types import Plan, PlanRequest  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "startup-logs"
TOTALS = Path(__file__).resolve().parent.parent / "tests" / "data" / "cuda-totals.yaml"
# -3: collected by this project (author tables of llm-d-benchmark's H100 runs), not in the shared data.
FILES = ("startup-logs.yaml", "startup-logs-2.yaml", "startup-logs-3.yaml")
# The project's real configs by repo id (tests/data/configs/README.md's table: file | class | kind | repo).
_CONFIGS = Path(__file__).resolve().parent.parent / "tests" / "data" / "configs"
REAL_CONFIGS = {m.group(2).lower(): _CONFIGS / m.group(1) for m in re.finditer(
    r"^\| `([^`]+\.json)` \| \w+ \| [^|]+ \| ([\w.-]+/[\w.-]+) \|$", (_CONFIGS / "README.md").read_text(), re.M)}

# Log flags that size memory, in the engine's spelling; others (prefix caching, LoRA) pass.
VLLM_FLAGS = {"max_model_len": "--max-model-len", "gpu_memory_utilization": "--gpu-memory-utilization",
              "tensor_parallel_size": "--tensor-parallel-size", "pipeline_parallel_size": "--pipeline-parallel-size",
              "kv_cache_dtype": "--kv-cache-dtype", "dtype": "--dtype", "max_num_seqs": "--max-num-seqs",
              "max_num_batched_tokens": "--max-num-batched-tokens", "block_size": "--block-size",
              "enforce_eager": "--enforce-eager", "quantization": "--quantization"}
SGLANG_FLAGS = {"tp_size": "--tp-size", "tp": "--tp-size", "mem_fraction_static": "--mem-fraction-static",
                "context_length": "--context-length", "chunked_prefill_size": "--chunked-prefill-size",
                "page_size": "--page-size"}
# SGLang logs that print no version, scored with the rule set their date and printed defaults fit
# (said in the row's note); a log whose date or features fit none stays skipped.
ASSUMED_VERSIONS = {
    # A source checkout of mid-2026 (report dated 2026-06-14, torch 2.9.1): after 0.5.23's rules
    # (Dec 2025-2026); --mem-fraction-static is pinned, so only the pool arithmetic is used.
    "sglang-qwen3-14b-4x4090-tp4-mf080": ("0.5.23", "version assumed: newest rules (mid-2026 checkout)"),
    # An image of early Feb 2025 (0.4.x): older than every rule set here; the defaults it printed
    # (mem_fraction_static 0.88, chunked_prefill_size 2048, cuda graph bs 8 on a 24 GiB card) are
    # 0.5.1's table (server_args.py:449-530 in 0.5.2), and the pool formula is the same.
    "sglang-jerryzsj-rtx3090-r1-distill-qwen-7b-wsl2": (
        "0.5.1", "version assumed: 0.5.1 table (a 0.4.x image printing the same defaults); WSL2 desktop"),
    # llm-d-benchmark's H100 table (startup-logs-3.yaml): image vllm/vllm-openai:latest on 2026-01-26, i.e.
    # 0.14.1 (0.13.0-0.15.1 are one rule set here: the sort, graphs not subtracted, 0.9 utilization).
    **{case_id: ("0.14.1", "version assumed: vllm/vllm-openai:latest on 2026-01-26 (0.13.0-0.15.1 alike)")
       for case_id in ("vllm-llmdbench-h100-gpt-oss-20b-u090-mml16000-bs128",
                       "vllm-llmdbench-h100-llama-3.1-8b-u090-mml16000-bs128",
                       "vllm-llmdbench-h100-qwen3-0.6b-u090-mml16000-bs128",
                       "vllm-llmdbench-h100-qwen3-32b-u090-mml16000-bs128",
                       "vllm-llmdbench-2xh100-qwen3-32b-tp2-u090-mml16000-bs128",
                       "vllm-llmdbench-2xh100-llama-3.3-70b-fp8-tp2-u090-mml16000-bs128",
                       "vllm-llmdbench-h100-llama-3.3-70b-fp8-tp1-u090-mml16000-fail")},
}
# What the vllm/vllm-openai images install beside vLLM that its rules read (PlanRequest.engine_packages):
# FlashInfer, at the release's pin (METADATA: 0.11.0 extra flashinfer-python==0.3.1, 0.14.1 Requires-Dist 0.5.3).
# A case without an image is planned as a user would without the engine here: not known.
IMAGE_PACKAGES = {"vllm/vllm-openai:v0.11.0": {"flashinfer-python": "0.3.1"},
                  "vllm/vllm-openai:latest": {"flashinfer-python": "0.5.3"}}
# Logs whose card was shared (a desktop under WSL2): planned on the host as it was, i.e. with the free
# memory the log's first reading shows (plus the planned CUDA context, which the host's NVML free still
# held) and the fraction the engine printed, since the planner's own would add a margin for the tenant.
SHARED_CARD = {"sglang-jerryzsj-rtx3090-r1-distill-qwen-7b-wsl2": "0.88"}
# Logs of a release older than every rule set here, whose default fraction the log printed: planned
# with that fraction, so that what is scored is the pool arithmetic, not a table the release did not
# have (0.4.3.post4 on 4 x L4 printed 0.85, its TP 4 step; 0.5.1's table gives 0.858 there).
PRINTED_FRACTION = {"sglang-llmsinclouds-4xl4-qwq-32b-tp4": "0.85"}
# Values the log calls a default: the user did not type them.
_DEFAULT_NOTE = re.compile(r"default|auto", re.IGNORECASE)


@dataclass(frozen=True)
class Row:
    case: str
    engine: str
    version: str
    gpu: str
    logged: float  # GiB (vLLM) or tokens (SGLang)
    predicted: float | None  # None: refused
    low: float | None = None
    high: float | None = None
    engine_failed: bool = False
    may_not_fit: bool = False
    note: str = ""

    @property
    def error(self) -> float | None:
        if self.predicted is None or self.logged <= 0:
            return None
        return (self.predicted - self.logged) / self.logged

    @property
    def in_band(self) -> bool:
        return self.low is not None and self.high is not None and self.low <= self.logged <= self.high

    @property
    def unsafe_outside(self) -> bool:
        """More KV promised than the engine gave, beyond the band's low end."""
        return self.predicted is not None and self.predicted > self.logged and \
            (self.low is None or self.low > self.logged)


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


def _tp(case: Mapping[str, Any]) -> int:
    flags = case.get("flags") or {}
    return int(_value(flags.get("tensor_parallel_size")) or _value(flags.get("tp_size")) or
               _value(flags.get("tp")) or 1)


def _pp(case: Mapping[str, Any]) -> int:
    return int(_value((case.get("flags") or {}).get("pipeline_parallel_size")) or 1)


def model_for(case: Mapping[str, Any], gpu: CatalogGpu | None = None) -> tuple[Any, str]:
    """The checkpoint: its profile, else the config under models/. Where the weights we have are
    not this checkpoint's (a quantized repo sharing the base config, or no index), the engine's own
    "Model loading took" figure stands in: this bench is about the terms the planner estimates.
    That figure is the weights as loaded: the planner's own repacking rule is taken off it so that
    the plan does not count it twice."""
    profile = profile_for_repo(str(case.get("model") or ""))
    if profile is not None:
        return model_from_profile(profile), ""
    logged = (case.get("observed") or {}).get("weights_gib")
    tp = _tp(case)
    if not case.get("model_config"):
        return _real_config_model(case, logged, tp, gpu)
    directory = DATA / "models" / case["model_config"]
    config = json.loads((directory / "config.json").read_text())
    try:
        model = resolve_model(str(directory))
    except SafeServeError:
        model = None
    if model is not None and (logged is None or
                              abs(model.weight_bytes / tp / GiB - float(logged)) < 0.05 * float(logged)):
        return model, ""
    if logged is None:
        raise LookupError(f"{directory.name}: no weights for this checkpoint and none logged")
    geometry = geometry_from_config(config)
    return ResolvedModel(name=str(case.get("model")), source="local", geometry=geometry,
                         weight_bytes=_checkpoint_from_logged(case, geometry, float(logged) * GiB, gpu),
                         weight_bytes_source="the log's Model loading took", config=config), "weights from the log"


def _checkpoint_from_logged(case: Mapping[str, Any], geometry: ModelGeometry, per_rank: float,
                            gpu: CatalogGpu | None) -> int:
    """The whole checkpoint's bytes behind one rank's logged weights: the planner's own as-loaded rule (gpt-oss's
    MXFP4 layouts) taken off, so that the plan does not count it twice, times the ranks (tp x pp)."""
    tp, pp = _tp(case), _pp(case)
    version = str(case.get("engine_version") or "").lstrip("v") or None
    cc = gpu.compute_capability if gpu else None
    if case["engine"] == "sglang":
        rules = sg.rules_for(version)[0]
        loaded = sgb.mxfp4_as_loaded(geometry, version=rules.version, tp=tp, pp=pp, compute_capability=cc)
        extra = loaded.extra_bytes if loaded is not None else 0
    else:
        rules_version = vl.rules_for(version)[0].version
        extra = vb.mxfp4_as_loaded(geometry, version=rules_version, tp=tp, pp=pp, compute_capability=cc).extra
        # vLLM's figure includes the rotary tables and MLA's dequantized kv_b_proj, which the plan adds to the
        # checkpoint's share.
        extra += vb.counted_rope_tables(geometry, dtype=_vllm_dtype(geometry), version=version or rules_version).bytes
        extra += vb.mla_decode_weights(geometry, dtype=_vllm_dtype(geometry), tp=tp, pp=pp).bytes
    return int((per_rank - extra) * tp * pp)


def _vllm_dtype(geometry: ModelGeometry) -> str:
    """The dtype vLLM builds the tables in: the config's 16-bit dtype (float32 checkpoints run in it too)."""
    return geometry.config_dtype if geometry.config_dtype in ("bfloat16", "float16") else "bfloat16"


def _real_config_model(case: Mapping[str, Any], logged: Any, tp: int, gpu: CatalogGpu | None) -> tuple[Any, str]:
    """A log without a copied config: the repo's config among tests/data/configs (listed by repo in
    its README), with the weights the log printed ("Model loading took", vLLM) or loaded (SGLang's
    "mem usage" at "Load weight end" less the leftovers the planner adds on top of the weights).
    Only the KV fields of these configs are the published ones, so the weights must come from the log."""
    repo = _config_repo(case)
    path = REAL_CONFIGS.get(repo.lower())
    config = _config_of(case)
    if path is None or config is None:
        raise LookupError(f"model {repo} not in profiles/, no model_config and no real config")
    geometry = geometry_from_config(config)
    if logged is not None:
        weights = _checkpoint_from_logged(case, geometry, float(logged) * GiB, gpu)
        source = "weights from the log"
    else:
        observed = case.get("observed") or {}
        if case["engine"] != "sglang" or observed.get("weights_gb") is None:
            raise LookupError(f"{path.name}: a reconstructed config and no weights in the log")
        leftovers = sgb.load_overhead(geometry, dtype=str(config.get("torch_dtype") or "bfloat16"), tp=tp, pp=_pp(case))
        weights = _checkpoint_from_logged(case, geometry, float(observed["weights_gb"]) * GiB - leftovers.bytes, gpu)
        source = "weights from the log (SGLang's mem usage less the planned leftovers)"
    return ResolvedModel(name=repo, source="local", geometry=geometry, weight_bytes=weights,
                         weight_bytes_source=source, config=config), f"{source}; config {path.name}"


def logged_figure(case: Mapping[str, Any]) -> float | None:
    observed = case.get("observed") or {}
    log = str(observed.get("log") or "")
    if case["engine"] == "vllm":
        match = re.search(r"Available KV cache memory: (-?[\d.]+) GiB", log)
        if match:
            return float(match.group(1))
        # An author's table of the same log line ("Available KV cache memory"), where no line is quoted.
        figure = observed.get("kv_cache_gib")
        return float(figure) if case.get("evidence") == "author_table" and isinstance(figure, (int, float)) else None
    match = re.search(r"max_total_num_tokens=(\d+)", log)
    return float(match.group(1)) if match else None


def gpu_for(case: Mapping[str, Any], catalog: Sequence[CatalogGpu]) -> CatalogGpu | None:
    """The catalog card the log ran on: by name, else by the name without its parenthesis
    ("NVIDIA H100 (variant not stated)"), else the one card whose CUDA total (from other sources)
    equals the total the log printed."""
    name = str(case.get("gpu") or "")
    gpu = find(name, catalog) or find(re.sub(r"\(.*?\)", "", name).strip(), catalog) if name else None
    if gpu is not None:
        return gpu
    source = str(case.get("gpu_total_memory_source") or "")
    printed = case.get("gpu_total_memory_gib")
    if printed is None or "from log" not in source:
        return None
    matches = [g for g in catalog if g.cuda_total_bytes and abs(g.cuda_total_bytes / GiB - float(printed)) < 0.006]
    return matches[0] if len(matches) == 1 else None


# --------------------------------------------------------------------------- leave-one-out


@dataclass(frozen=True)
class Fit:
    """A constant the planner fits on these logs: the median, over the logs it applies to, of the
    logged figure less the rest of the planner's term (`rest`)."""

    name: str
    module: ModuleType
    attribute: str
    observed: str  # field under observed: (GiB)
    applies: Callable[[Mapping[str, Any]], bool]
    term: str  # the budget row holding it
    reference: str  # where the planner states it
    band: str = ""  # the planner's +/- on the term (an attribute of the same module)
    # A constant per unit (CUDA graphs: bytes per graph and layer): the units this log's term counts.
    per_unit: Callable[[Mapping[str, Any], Plan, ModelGeometry], int] | None = None
    # The constant read straight off a log (bytes), where the log prints it apart from any plan; such
    # a fit keeps the median of a source's logs and applies where the reading exists.
    reading: Callable[[Mapping[str, Any]], float | None] | None = None
    fallback: float | None = None  # the value where no other source has a reading (None: the shipped one)
    # A per-unit constant beside a fixed part (CUDA graphs: the first capture): taken off the log's figure first.
    offset: Callable[[], int] | None = None

    unit_name: str = "GiB"

    @property
    def unit(self) -> tuple[str, int]:
        return (self.unit_name, 2**20) if self.per_unit else ("GiB", GiB)

    def residual(self, case: Mapping[str, Any], plan: Plan, geometry: ModelGeometry) -> float:
        """What the constant must be for this log: logged - (row - constant), or logged / units."""
        logged = float(case["observed"][self.observed]) * GiB
        if self.per_unit is not None:
            fixed = self.offset() if self.offset is not None else 0
            return (logged - fixed) / max(self.per_unit(case, plan, geometry), 1)
        row = next(i.bytes for i in plan.budget if i.key == self.term)
        return logged - (row - int(getattr(self.module, self.attribute)))


def _version(case: Mapping[str, Any]) -> tuple[int, ...]:
    text = str(case.get("engine_version") or "").lstrip("v")
    parts = re.findall(r"\d+", text)[:3]
    return tuple(int(p) for p in parts) if parts else (0,)


def _observed(case: Mapping[str, Any], key: str) -> bool:
    return case["engine"] == "vllm" and (case.get("observed") or {}).get(key) is not None


def graphs_for(case: Mapping[str, Any], plan: Plan, geometry: ModelGeometry) -> vb.CudaGraphs:
    """The graphs the planner counts for the log's engine, GPU and flags (batch limits as planned)."""
    gpu = find(plan.gpu_name or "")
    pinned = plan.pinned
    return vb.cuda_graphs(geometry, rules=vr.rules_for(plan.engine_version)[0], version=plan.engine_version,
                          layers=-(-geometry.kv_layers // max(_pp(case), 1)),
                          max_num_seqs=int(pinned.get("--max-num-seqs", plan.engine_defaults["max_num_seqs"])),
                          max_num_batched_tokens=int(pinned.get("--max-num-batched-tokens",
                                                                plan.engine_defaults["max_num_batched_tokens"])),
                          compute_capability=gpu.compute_capability if gpu else None)


def _graph_layers(case: Mapping[str, Any], plan: Plan, geometry: ModelGeometry) -> int:
    graphs = graphs_for(case, plan, geometry)
    return graphs.count * graphs.layers


def _graphs(case: Mapping[str, Any], plan: Plan, geometry: ModelGeometry) -> int:
    return graphs_for(case, plan, geometry).count


def _captured(case: Mapping[str, Any], moe: bool) -> bool:
    """A capture with its model's config, FULL_AND_PIECEWISE's default (0.11+), dense or MoE. Not an author's
    table: llm-d-benchmark's "CUDAGraph memory" is the free memory's change over capture, negative where the
    allocator gave back cached blocks (-0.88 to +1.03 GiB), not what the graphs hold; an author's table whose
    capture figure is the run's own "Graph capturing finished ... took" line (llm-d-planner's) counts."""
    config = _config_of(case)
    quoted = (case.get("observed") or {}).get("cudagraph_source")  # the capture line of the run's own log
    if not _observed(case, "cudagraph_gib") or _version(case) < (0, 11) or config is None \
            or (case.get("evidence") == "author_table" and not quoted):
        return False
    return bool(geometry_from_config(config).num_experts) == moe


def _config_repo(case: Mapping[str, Any]) -> str:
    """The repo whose real config stands for the case's: its own, or `config_repo` where the checkpoint is another
    repo's quantization or fine-tune of the same architecture (the weights then come from the log)."""
    return str(case.get("config_repo") or case.get("model") or "")


def _config_of(case: Mapping[str, Any]) -> dict[str, Any] | None:
    """The config.json copied beside the logs, else the repo's among the real configs, else None."""
    if case.get("model_config"):
        return dict(json.loads((DATA / "models" / case["model_config"] / "config.json").read_text()))
    path = REAL_CONFIGS.get(_config_repo(case).lower())
    return None if path is None else {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}


FITS = (
    Fit("profile-run constant (V1)", vb, "PROFILE_CONSTANT_BYTES", "peak_torch_memory_gib",
        lambda c: _observed(c, "peak_torch_memory_gib") and (0, 17) <= _version(c) < (0, 29), "activation",
        "launcher/engines/vllm/budget.py PROFILE_CONSTANT_BYTES", "V1_PEAK_ERROR_BYTES"),
    Fit("non-torch, one rank, graphs profiled inside (0.18-0.26)", vb, "NON_TORCH_BYTES_TP1_V019",
        "non_torch_memory_gib",
        lambda c: _observed(c, "non_torch_memory_gib") and (0, 18) <= _version(c) < (0, 27) and _tp(c) * _pp(c) == 1,
        "non_torch", "launcher/engines/vllm/budget.py NON_TORCH_BYTES_TP1_V019", "NON_TORCH_ERROR_BYTES"),
    Fit("non-torch, one rank, no graph profile inside (before 0.18)", vb, "NON_TORCH_BYTES_TP1",
        "non_torch_memory_gib",
        lambda c: _observed(c, "non_torch_memory_gib") and _version(c) < (0, 18) and _tp(c) * _pp(c) == 1,
        "non_torch", "launcher/engines/vllm/budget.py NON_TORCH_BYTES_TP1", "NON_TORCH_ERROR_BYTES"),
    Fit("non-torch, tensor-parallel ranks (0.19+, sm90/100)", vb, "NON_TORCH_BYTES_TP_V019", "non_torch_memory_gib",
        lambda c: _observed(c, "non_torch_memory_gib") and _version(c) >= (0, 19) and _tp(c) > 1,
        "non_torch", "launcher/engines/vllm/budget.py NON_TORCH_BYTES_TP_V019", "NON_TORCH_TP_ERROR_BYTES"),
    Fit("CUDA graphs per graph and layer, dense (0.11+)", vb, "CUDAGRAPH_DENSE_BYTES_PER_GRAPH_LAYER", "cudagraph_gib",
        lambda c: _captured(c, moe=False), "cudagraph",
        "launcher/engines/vllm/budget.py CUDAGRAPH_DENSE_BYTES_PER_GRAPH_LAYER",
        "CUDAGRAPH_DENSE_ERROR_PER_GRAPH_LAYER",
        per_unit=_graph_layers, unit_name="MiB per graph and layer beside the 0.32 GiB first capture",
        offset=lambda: vb.CUDAGRAPH_FIRST_CAPTURE_BYTES),
    Fit("CUDA graphs per graph, MoE (0.11+)", vb, "CUDAGRAPH_MOE_BYTES_PER_GRAPH", "cudagraph_gib",
        lambda c: _captured(c, moe=True), "cudagraph",
        "launcher/engines/vllm/budget.py CUDAGRAPH_MOE_BYTES_PER_GRAPH", "CUDAGRAPH_MOE_ERROR_PER_GRAPH",
        per_unit=_graphs, unit_name="MiB per graph"),
    Fit("CUDA context before the baseline, one rank", sgb, "CUDA_CONTEXT_BYTES", "", lambda c: True, "context",
        "launcher/engines/sglang/budget.py CUDA_CONTEXT_BYTES", "CONTEXT_ERROR_BYTES",
        reading=lambda c: context_reading(c)),
    Fit("NCCL at the baseline, ranks without NVLS", sgb, "NCCL_BYTES", "", lambda c: True, "context",
        "launcher/engines/sglang/budget.py NCCL_BYTES", "NCCL_ERROR_BYTES",
        reading=lambda c: parallel_reading(c, nvls=False), fallback=0.0),
    Fit("NCCL at the baseline, NVSwitch Hopper/Blackwell (NVLS)", sgb, "NVLS_NCCL_BYTES", "", lambda c: True,
        "context", "launcher/engines/sglang/budget.py NVLS_NCCL_BYTES", "NVLS_NCCL_ERROR_BYTES",
        reading=lambda c: parallel_reading(c, nvls=True)),
)

_STARTUP_FREE = re.compile(r"Free memory on device \(?([\d.]+)/([\d.]+) GiB\)? on startup")
_DISTRIBUTED = re.compile(r"Init torch distributed ends\. mem usage=([\d.]+) GB")


def _first_reading(case: Mapping[str, Any]) -> tuple[float, float | None] | None:
    """(GiB held below the CUDA total at the engine's first free-memory reading, GiB of it that the
    log gives to distributed init, if it says) from a start that did not fail (one failed because
    another process held the card) on a card not shared with a desktop; None where the log has none.
    vLLM prints its reading with the total ("Free memory on device (x/y GiB) on startup", after its
    distributed init); SGLang prints free memory before load, the total comes from the catalog."""
    observed = case.get("observed") or {}
    if observed.get("startup_failed") or case["id"] in SHARED_CARD:
        return None
    text = f"{observed.get('log') or ''} {case.get('gpu_total_memory_source') or ''}"
    if case["engine"] == "vllm":
        match = _STARTUP_FREE.search(text)
        return (float(match.group(2)) - float(match.group(1)), None) if match else None
    before = observed.get("avail_mem_before_load_gb")
    if before is None and observed.get("weights_gb") is not None and observed.get("avail_mem_after_load_gb"):
        before = float(observed["weights_gb"]) + float(observed["avail_mem_after_load_gb"])
    gpu = gpu_for(case, load_catalog())
    if before is None or gpu is None or gpu.cuda_total_bytes is None:
        return None
    distributed = _DISTRIBUTED.search(text)
    return gpu.cuda_total_bytes / GiB - float(before), float(distributed.group(1)) if distributed else None


def context_reading(case: Mapping[str, Any]) -> float | None:
    """Bytes of CUDA context: a one-rank reading, or a parallel one less what distributed init took."""
    reading = _first_reading(case)
    if reading is None:
        return None
    held, distributed = reading
    if distributed is not None:
        return (held - distributed) * GiB
    return held * GiB if _tp(case) * _pp(case) == 1 else None


def parallel_reading(case: Mapping[str, Any], nvls: bool) -> float | None:
    """Bytes held beyond the CUDA context with more than one rank, on boards with NVLS or without."""
    reading, gpu = _first_reading(case), gpu_for(case, load_catalog())
    if reading is None or gpu is None or _tp(case) * _pp(case) == 1 or \
            sgb.nvls_board(gpu.name, gpu.compute_capability) != nvls:
        return None
    held, distributed = reading
    return distributed * GiB if distributed is not None else held * GiB - sgb.CUDA_CONTEXT_BYTES


@contextlib.contextmanager
def constants(values: Mapping[Fit, float]) -> Iterator[None]:
    saved = {fit: getattr(fit.module, fit.attribute) for fit in values}
    try:
        for fit, value in values.items():
            setattr(fit.module, fit.attribute, int(value))
        yield
    finally:
        for fit, value in saved.items():
            setattr(fit.module, fit.attribute, value)


@dataclass
class Scoring:
    """Everything a leave-one-out run needs: the cases, each fit's per-log residuals and the
    CUDA-total observations."""

    cases: list[Mapping[str, Any]]
    residuals: dict[Fit, dict[str, float]]  # fit -> source -> residual bytes
    totals: list[cuda_totals.Observation]
    in_sample: bool = False

    def refit(self, case: Mapping[str, Any]) -> dict[Fit, float]:
        if self.in_sample:
            return {}
        values = {}
        for fit, by_source in self.residuals.items():
            source = _publisher(case) if fit.reading else _source(case)
            others = [r for s, r in by_source.items() if s != source]
            if others:
                values[fit] = statistics.median(others)
            elif source in by_source and fit.fallback is not None:
                values[fit] = fit.fallback
        return values

    def catalog(self, source: str) -> tuple[CatalogGpu, ...]:
        """The catalog with each card's CUDA total from the other sources only."""
        if self.in_sample:
            return load_catalog()
        return cuda_totals.catalog_without(load_catalog(), self.totals, source)


def _source(case: Mapping[str, Any]) -> str:
    return str(case.get("source") or case["id"])


def _publisher(case: Mapping[str, Any]) -> str:
    """The repository a log was published in (one sweep's logs are one source), else the log."""
    match = re.match(r"https://github\.com/([^/]+/[^/]+)", str(case.get("source") or ""))
    return match.group(1) if match else _source(case)


def prepare(cases: list[Mapping[str, Any]], in_sample: bool) -> Scoring:
    residuals: dict[Fit, dict[str, float]] = {fit: {} for fit in FITS}
    readings: dict[Fit, dict[str, list[float]]] = {fit: defaultdict(list) for fit in FITS if fit.reading}
    for case in cases:
        for fit, by_source in readings.items():
            value = fit.reading(case) if fit.reading else None
            if value is not None:
                by_source[_publisher(case)].append(value)
        planned = plan_case(case, load_catalog())
        if not isinstance(planned, tuple):
            continue
        for fit in FITS:
            if fit.reading is None and fit.applies(case):
                residuals[fit][_source(case)] = fit.residual(case, planned[1], planned[2])
    for fit, by_source in readings.items():
        residuals[fit] = {source: statistics.median(values) for source, values in by_source.items()}
    return Scoring(cases, residuals, cuda_totals.load(TOTALS), in_sample)


# --------------------------------------------------------------------------- planning one case


def plan_case(case: Mapping[str, Any],
              catalog: Sequence[CatalogGpu]) -> tuple[Row, Plan, ModelGeometry] | Row | str:
    """The row and plan for a case, the row alone for a refusal, or why it was skipped."""
    version = str(case.get("engine_version") or "").lstrip("v") or None
    assumed, assumed_note = ASSUMED_VERSIONS.get(case["id"], (None, ""))
    version = version or assumed
    if version is None:
        return "engine version not stated"
    logged = logged_figure(case)
    if logged is None:
        return "no KV figure in the log"
    gpu = gpu_for(case, catalog)
    if gpu is None:
        return f"GPU {case.get('gpu')!r} not in the catalog"
    try:
        model, weights_note = model_for(case, gpu)
    except (LookupError, SafeServeError) as exc:
        return str(exc)
    count = int(case.get("gpu_count") or 1) if str(case.get("gpu_count") or "1").isdigit() else 1
    gpus, args = hypothetical_gpus([f"{count}x{gpu.name}"], catalog), engine_args(case)
    if case["id"] in SHARED_CARD:
        gpus, args = _as_shared(case, gpus), (*args, "--mem-fraction-static", SHARED_CARD[case["id"]])
        weights_note = f"{weights_note}; free memory and fraction from the log (shared card)".strip("; ")
    if case["id"] in PRINTED_FRACTION:
        args = (*args, "--mem-fraction-static", PRINTED_FRACTION[case["id"]])
        weights_note = f"{weights_note}; the fraction the log printed (a release older than the rules)".strip("; ")
    # The run as logged: without the --max-total-tokens safe-serve adds to an SGLang pool it cannot promise.
    request = PlanRequest(model=model, engine=case["engine"], gpus=gpus, engine_version=version, engine_args=args,
                          cap_uncertain_pool=False, engine_packages=IMAGE_PACKAGES.get(str(case.get("image"))))
    failed = bool((case.get("observed") or {}).get("startup_failed"))
    weights_note = f"{weights_note}; {assumed_note}".strip("; ") if assumed else weights_note
    base = Row(case["id"], case["engine"], version, gpu.name, logged, None, engine_failed=failed, note=weights_note)
    try:
        plan = make_plan(request)
    except WontFit as refusal:
        return dataclasses.replace(base, note=f"{weights_note} {refusal.message[:80]}".strip())
    except SafeServeError as exc:
        return f"not planned: {exc.message[:100]}"
    return _planned(base, plan), plan, model.geometry


def _as_shared(case: Mapping[str, Any], gpus: Sequence[GpuDevice]) -> tuple[GpuDevice, ...]:
    """The cards with the free memory NVML showed: the log's first reading plus the planned context."""
    before = int(float(case["observed"]["avail_mem_before_load_gb"]) * GiB)
    context = sg.CUDA_CONTEXT_BYTES + sgb.parallel_bytes(gpus[0].name, gpus[0].compute_capability, len(gpus))[0]
    return tuple(dataclasses.replace(g, free_bytes=before + context) for g in gpus)


def _planned(base: Row, plan: Plan) -> Row:
    if base.engine == "vllm":
        predicted, low, high = (plan.kv_cache_bytes / GiB, (plan.kv_cache_bytes_low or 0) / GiB,
                                (plan.kv_cache_bytes_high or 0) / GiB)
    else:
        per_token = plan.kv_cache_bytes / max(plan.kv_cache_tokens, 1)
        predicted = float(plan.kv_cache_tokens)
        low, high = (plan.kv_cache_bytes_low or 0) / per_token, (plan.kv_cache_bytes_high or 0) / per_token
    return dataclasses.replace(base, predicted=predicted, low=low, high=high,
                               may_not_fit=plan.may_not_fit is not None)


def load_cases() -> list[Mapping[str, Any]]:
    return [row for name in FILES for case in yaml.safe_load((DATA / name).read_text()) for row in _with_variants(case)]


# An author's table row beside the case's own: the same start but for its parallel layout.
_VARIANT_LAYOUT = ("tensor_parallel_size", "pipeline_parallel_size")


def _with_variants(case: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The case, then one case per row of its author's table that changes only the parallel layout (the L4
    write-up's `tp2` and `pp2`: same checkpoint, engine and flags on two cards), under `<id>/<row>` and the same
    source (scored leave-one-source-out with it). Rows that change anything else (the write-up's `replica_each`,
    two servers started one after the other) stay data, not cases."""
    observed = case.get("observed") or {}
    found = [case]
    for name, row in observed.items():
        if not isinstance(row, Mapping) or not any(k in row for k in _VARIANT_LAYOUT) \
                or row.get("kv_cache_gib") is None:
            continue
        layout = {k: int(row.get(k) or 1) for k in _VARIANT_LAYOUT}
        flags = {**(case.get("flags") or {}), **layout}
        figures = {k: v for k, v in row.items() if k not in _VARIANT_LAYOUT}
        found.append({**case, "id": f"{case['id']}/{name}", "source": _source(case), "flags": flags,
                      "tensor_parallel_size": layout["tensor_parallel_size"],
                      "gpu_count": layout["tensor_parallel_size"] * layout["pipeline_parallel_size"],
                      "observed": figures})
    return found


def rows(in_sample: bool = False) -> tuple[list[Row], list[tuple[str, str]], Scoring]:
    """Every case scored leave-one-out (or with the shipped constants), and the skipped ones."""
    scoring = prepare(load_cases(), in_sample)
    found: list[Row] = []
    skipped: list[tuple[str, str]] = []
    for case in scoring.cases:
        source = _source(case)
        with constants(scoring.refit(case)):
            outcome = plan_case(case, scoring.catalog(source))
        if isinstance(outcome, str):
            skipped.append((case["id"], outcome))
        else:
            found.append(outcome[0] if isinstance(outcome, tuple) else outcome)
    return found, skipped, scoring


# --------------------------------------------------------------------------- printing


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def print_cases(found: list[Row]) -> None:
    print(f"{'case':62} {'version':8} {'logged':>10} {'planned':>10} {'error':>7}  band / outcome")
    for row in found:
        unit = "GiB" if row.engine == "vllm" else "tok"
        planned = "refused" if row.predicted is None else f"{row.predicted:10.2f}" if unit == "GiB" else \
            f"{row.predicted:10.0f}"
        error = "" if row.error is None else f"{row.error:+7.1%}"
        inside = "" if row.predicted is None or row.low is None else ("in band" if row.in_band else "OUT of band")
        band = "" if row.predicted is None or row.low is None or row.high is None else \
            f" [{row.low:.2f}, {row.high:.2f}]"
        outcome = ("engine failed" if row.engine_failed else "") + (" may-not-fit" if row.may_not_fit else "")
        print(f"{row.case[:62]:62} {row.version:8} {row.logged:10.2f} {planned:>10} {error:>7}  "
              f"{inside}{band} {outcome} {row.note}")


def summary_line(label: str, group: list[Row]) -> str:
    started = [r for r in group if not r.engine_failed]
    errors = [r.error for r in started if r.error is not None]
    if errors:
        median, p90 = statistics.median(errors), percentile([abs(e) for e in errors], 0.9)
        worst = max(errors, key=abs)
        figures = f"{len(errors):5} {median:+8.1%} {p90:8.1%} {worst:+8.1%}"
    else:
        figures = f"{0:5} {'-':>8} {'-':>8} {'-':>8}"
    inside = sum(1 for r in started if r.in_band)
    false_refusals = sum(1 for r in started if r.predicted is None)
    unsafe = sum(1 for r in started if r.unsafe_outside)
    false_accepts = sum(1 for r in group if r.predicted is not None and r.engine_failed and not r.may_not_fit)
    return (f"{label:44} {figures} {inside:>4}/{len(started):<3} {false_refusals:8} {unsafe:8} "
            f"{false_accepts:8}")


def print_summary(found: list[Row]) -> None:
    groups: dict[tuple[str, str, str], list[Row]] = defaultdict(list)
    for row in found:
        groups[(row.engine, row.version, row.gpu)].append(row)
    print(f"{'engine  version  GPU class':44} {'cases':>5} {'median':>8} {'p90 |e|':>8} {'worst':>8} "
          f"{'in band':>8} {'false':>8} {'unsafe':>8} {'false':>8}")
    print(f"{'':44} {'':5} {'':8} {'':8} {'':8} {'':8} {'refusal':>8} {'outside':>8} {'accept':>8}")
    for (engine, version, gpu), group in sorted(groups.items()):
        print(summary_line(f"{engine:7} {version:8} {gpu}", group))
    print(summary_line("all", found))
    print("(cases: starts with a KV figure; failed starts count only as false accepts when the plan "
          "was confident)")


def print_fits(scoring: Scoring) -> None:
    """Each fitted constant: its value on all logs and each log's residual when it is left out."""
    print("\nfitted constants, leave-one-out (residual = the log's figure - the prediction refitted without it)")
    for fit, by_source in scoring.residuals.items():
        if not by_source:
            continue
        every = statistics.median(by_source.values())
        shipped = getattr(fit.module, fit.attribute)
        if fit.reading is not None:
            _print_reading_fit(fit, by_source)
            continue
        loo = []
        for source, value in by_source.items():
            others = [r for s, r in by_source.items() if s != source]
            loo.append(value - statistics.median(others) if others else float("nan"))
        worst = max((abs(x) for x in loo), default=float("nan"))
        band = int(getattr(fit.module, fit.band)) if fit.band else 0
        covers = "covers them" if band >= worst else "does NOT cover them"
        name, scale = fit.unit
        print(f"  {fit.name}: shipped {shipped / scale:.3f} {name}, median of {len(by_source)} logs "
              f"{every / scale:.3f}; held-out residuals " + ", ".join(f"{x / scale:+.3f}" for x in loo)
              + f"; largest {worst / scale:.3f}; the plan's band +/- {band / scale:.3f} {covers} "
              f"({fit.reference})")


def _print_reading_fit(fit: Fit, by_source: Mapping[str, float]) -> None:
    """A constant read off the logs (MiB): each source's reading and what the others' median misses it by."""
    shipped, band = getattr(fit.module, fit.attribute), int(getattr(fit.module, fit.band)) if fit.band else 0
    parts, loo = [], []
    for source, value in by_source.items():
        others = [r for s, r in by_source.items() if s != source]
        if others:
            loo.append(value - statistics.median(others))
        parts.append(f"{source} {value / 2**20:.0f}" + (f" ({loo[-1] / 2**20:+.0f})" if others else ""))
    if not loo:
        verdict = (f"one source: no held-out residual (left out, the plan uses {fit.fallback / 2**20:.0f} MiB)"
                   if fit.fallback is not None else "one source: no held-out residual")
    else:
        worst = max(abs(x) for x in loo)
        verdict = f"largest held-out residual {worst / 2**20:.0f} MiB; the plan's band +/- {band / 2**20:.0f} MiB " + (
            "covers it" if band >= worst else "does NOT cover it")
    median = statistics.median(by_source.values())
    print(f"  {fit.name}: shipped {shipped / 2**20:.0f} MiB, median {median / 2**20:.0f} MiB over "
          f"{len(by_source)} source(s): " + ", ".join(parts) + f" MiB; {verdict} ({fit.reference})")


def print_terms(scoring: Scoring) -> None:
    """Each budget term against the figure the log printed, leave-one-out."""
    keys = (("weights", "weights_gib"), ("non_torch", "non_torch_memory_gib"),
            ("activation", "peak_torch_memory_gib"), ("cudagraph", "cudagraph_gib"))
    print("\nterms against the log (planned - logged, GiB, leave-one-out; cudagraph: the graphs as counted x the "
          "fitted cost vs what capture took, also where the version does not subtract it)")
    print(f"  {'case':62} " + " ".join(f"{k:>11}" for k, _ in keys))
    for case in scoring.cases:
        source = _source(case)
        with constants(scoring.refit(case)):
            outcome = plan_case(case, scoring.catalog(source))
            if not isinstance(outcome, tuple) or case["engine"] != "vllm":
                continue
            # Not subtracted by this version: the graphs as counted, at the constants refitted without it.
            graphs = graphs_for(case, outcome[1], outcome[2]).estimate_bytes
        plan, observed = outcome[1], case.get("observed") or {}
        cells = []
        for key, field in keys:
            row = next((i.bytes for i in plan.budget if i.key == key), None)
            logged = observed.get(field)
            if key == "cudagraph" and not row:
                row = graphs
            cells.append(f"{'':>11}" if row is None or logged is None else f"{row / GiB - float(logged):+11.2f}")
        print(f"  {case['id'][:62]:62} " + " ".join(cells))


def print_graph_estimates(scoring: Scoring) -> list[tuple[str, float, float]]:
    """vLLM's own CUDA-graph estimate ("Estimated CUDA graph memory: X GiB total", printed by 0.19 and what 0.21+
    subtract from the KV budget) against the graphs as the plan counts them, leave-one-out; returns (case,
    planned - logged, the plan's graph band) in GiB."""
    found = []
    for case in scoring.cases:
        logged = (case.get("observed") or {}).get("cudagraph_estimate_gib")
        if logged is None:
            continue
        with constants(scoring.refit(case)):
            outcome = plan_case(case, scoring.catalog(_source(case)))
            if not isinstance(outcome, tuple):
                continue
            graphs = graphs_for(case, outcome[1], outcome[2])
            found.append((case["id"], graphs.estimate_bytes / GiB - float(logged), graphs.error_bytes / GiB))
    if not found:
        return found
    diffs = [d for _, d, _ in found]
    outside = [(case, d) for case, d, band in found if abs(d) > band]
    print(f"\nvLLM's own CUDA-graph estimate (what 0.21+ subtract; 0.19 prints it): {len(found)} starts, planned - "
          f"logged median {statistics.median(diffs):+.2f} GiB, p90 |d| {percentile([abs(d) for d in diffs], 0.9):.2f}, "
          f"{len(found) - len(outside)}/{len(found)} in the plan's graph band; outside: "
          + (", ".join(f"{case} {d:+.2f}" for case, d in outside) or "none"))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--verbose", action="store_true", help="also list the skipped cases")
    parser.add_argument("--in-sample", action="store_true", help="score with the shipped constants (not held out)")
    args = parser.parse_args()
    found, skipped, scoring = rows(in_sample=args.in_sample)
    print_cases(found)
    print()
    print_summary(found)
    print_fits(scoring)
    print_graph_estimates(scoring)
    print_terms(scoring)
    print(f"\n{len(found)} cases planned, {len(skipped)} skipped"
          + (" (in-sample: shipped constants)" if args.in_sample else " (leave-one-out)"))
    if args.verbose:
        for case_id, reason in skipped:
            print(f"  skipped {case_id}: {reason}")


if __name__ == "__main__":
    main()
