"""The plan's data: what a plan is asked (`PlanRequest`) and what it answers (`Plan`).

Data only: the planners live in each engine's package (`launcher/engines/<engine>/planner.py`)
and `launcher/plan/planner.py` dispatches to them. Every number in a `Plan` carries the budget item
it came from (`BudgetItem.source` and `.detail`), so the table and the JSON can explain it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.common.units import MiB
from launcher.common.vocab import Source
from launcher.model.gpu import GpuDevice, HostMemory
from launcher.model.resolve import ResolvedModel

DEFAULT_MARGIN_BYTES = 256 * MiB  # headroom for other tenants' drift between plan and start

# Sources a budget item can come from (launcher.common.vocab.Source; names kept for readers of old code).
MEASURED = Source.MEASURED
COMPUTED = Source.COMPUTED
FORMULA = Source.FORMULA
ENGINE_DEFAULT = Source.ENGINE_DEFAULT
PINNED = Source.PINNED
CATALOG = Source.CATALOG
CALIBRATED = Source.CALIBRATED


@dataclass(frozen=True)
class Calibration:
    """What an earlier start of the same setup measured (bytes), from `launcher.plan.calibration`.

    A setup is engine, version, GPUs, model and the memory-relevant pinned flags
    (`calibration.calibration_key`); a figure measured for one setup is never used for another.
    """

    non_kv_bytes: int | None = None  # vLLM: requested - available KV (weights + act + graphs + other)
    load_overhead_bytes: int | None = None  # SGLang: P - A beyond the weights
    context_bytes: int | None = None  # SGLang: free at the plan - P (the CUDA context, + NCCL with ranks)
    extra_headroom_bytes: int = 0  # added after a runtime CUDA OOM on this setup (bounded)
    key: str = ""


# A pinned flag's value as the engine's own parser gives it: a count, a size, a fraction, a name, a switch.
PinnedValue = bool | int | float | str


@dataclass(frozen=True)
class PinnedFlags:
    """The engine flags the operator pinned, parsed once at the edge by the engine's adapter (`pin`).

    `values` are keyed by the engine's own spelling of each flag (an alias such as `-tp` is
    stored under `--tensor-parallel-size`); `argv` is the command line as written, passed
    through to the engine untouched.
    """

    argv: tuple[str, ...] = ()
    # Each value as the flag's parser returns it (a PinnedValue); read by name, so typed Any here.
    values: Mapping[str, Any] = field(default_factory=dict)

    def __contains__(self, flag: object) -> bool:
        return flag in self.values

    def get(self, flag: str, default: PinnedValue | None = None) -> Any:
        return self.values.get(flag, default)


@dataclass(frozen=True)
class PlanRequest:
    """Everything a plan depends on, gathered at the edge (`launcher.plan.request`): no planner reads
    the machine, the environment or a file."""

    model: ResolvedModel
    engine: str  # "vllm" or "sglang"
    device: str = "cuda"  # "cuda" or "cpu"
    gpus: tuple[GpuDevice, ...] = ()  # the devices the ranks will use, CUDA order
    host: HostMemory | None = None
    engine_version: str | None = None  # installed or --engine-version; None: the newest rules
    engine_version_assumed: bool = False  # no engine installed and none named: the version is our default
    engine_args: tuple[str, ...] = ()  # after `--`, as written (the argv the engine gets)
    # `engine_args` parsed by the engine's adapter: given by the edge (`build_request`), parsed here
    # only when a request is built without it or with other arguments (tests, alternatives).
    pinned: PinnedFlags = field(default_factory=PinnedFlags, compare=False)
    engine_env: Mapping[str, str] = field(default_factory=dict)  # VLLM_CPU_KVCACHE_SPACE, ...
    # The adapter's `probed_distributions` installed beside the engine, by version; None: not known (no
    # engine installed here, or a plan for another --engine-version than the installed one).
    engine_packages: Mapping[str, str] | None = None
    concurrency: int = 1
    max_gpu_memory_bytes: int | None = None
    margin_bytes: int = DEFAULT_MARGIN_BYTES
    calibration: Calibration | None = None
    trust_engine: bool = False
    allow_long_max_model_len: bool = False  # VLLM_ALLOW_LONG_MAX_MODEL_LEN / SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN
    # The planner may bound a pool whose estimate is too uncertain to promise (SGLang's --max-total-tokens).
    # False plans the engine's own pool, as a run without that bound had it (bench/startup_logs.py).
    cap_uncertain_pool: bool = True
    # Why the CUDA driver cannot map memory virtually (WSL2), or None: vLLM 0.34's extensible KV cache is
    # then off (vllm/utils/vmm_driver.py:513-547).
    vmm_unavailable: str | None = None
    # Smaller checkpoints of the same model (resolved by the caller) to offer when nothing fits.
    variants: tuple[ResolvedModel, ...] = ()
    notes: tuple[str, ...] = ()  # from the edge (preset, WSL2): shown first in the plan's notes
    warnings: tuple[str, ...] = ()  # from the edge (a calibration file ignored): shown first in the plan's warnings

    def __post_init__(self) -> None:
        if self.pinned.argv != self.engine_args:
            from launcher.engines import ENGINES, adapter

            if self.engine in ENGINES:  # an unknown engine is the planner's UsageError
                object.__setattr__(self, "pinned", adapter(self.engine).pin(self.engine_args))


@dataclass(frozen=True)
class BudgetItem:
    """One row of the budget: bytes, where the figure comes from (`Source`) and why."""

    key: str  # total, other, context, weights, non_torch, activation, cudagraph, slack, kv, free
    label: str
    bytes: int
    source: str
    detail: str
    bar: str | None = None  # which budget-bar segment: weights/activations/graphs/other/kv/free
    error_bytes: int = 0  # expected error of a formula figure (+/-), from the data behind it; 0: exact


@dataclass(frozen=True)
class MemoryKnob:
    """The setting that sizes the engine's memory, as the engine takes it (the table's "memory knob")."""

    flag: str  # the engine flag or environment variable, in the engine's spelling
    value: float | int | None  # as the engine takes it: a fraction, bytes or whole GiB (`unit`)
    unit: str  # "fraction", "bytes", "GiB" or "" (left to the engine)
    text: str  # as the table shows it: "--gpu-memory-utilization 0.9"
    why: str = ""  # where the value comes from (pinned, the engine's default, free memory)


LEFT_TO_ENGINE = MemoryKnob("", None, "", "left to the engine (--trust-engine)", "--trust-engine")


@dataclass(frozen=True)
class Plan:
    """A start that fits: the engine flags to add, the KV cache they give, and the budget behind it.

    `engine_args` are only the flags safe-serve adds; the operator's own (`pinned`) pass
    through untouched and are never overridden.
    """

    engine: str
    engine_version: str
    rules_version: str
    device: str
    model: str
    max_model_len: int
    max_model_len_source: str
    kv_cache_bytes: int
    kv_cache_tokens: int
    max_concurrency: float
    budget: tuple[BudgetItem, ...]
    engine_args: tuple[str, ...]  # flags the launch adds (never ones the operator pinned)
    engine_env: Mapping[str, str]
    pinned: Mapping[str, Any]
    tp: int = 1
    pp: int = 1
    block_size: int | None = None
    num_blocks: int | None = None
    gpu_name: str | None = None
    gpu_count: int = 0
    notes: tuple[str, ...] = ()
    engine_version_assumed: bool = False
    # The KV cache at the unfavourable and favourable ends of the estimates' error bands
    # (equal to kv_cache_bytes when every figure is exact, pinned or calibrated).
    kv_cache_bytes_low: int | None = None
    kv_cache_bytes_high: int | None = None
    # Set when the configuration fits only inside the error band: the plan is kept (exit 0),
    # the engine's own numbers decide at start and the watch retunes.
    may_not_fit: str | None = None
    # The figures whose promise rests on more than the low end of the band, by their JSON names
    # (max_model_len, max_concurrency, gpu_memory_utilization, ...): what may_not_fit is about.
    at_risk: tuple[str, ...] = ()
    # The longest length that carries the planned concurrency at the low end of the KV band and
    # at the central estimate (0: none); None where the engine's planner does not assess it.
    max_model_len_low_end: int | None = None
    max_model_len_central: int | None = None
    # What the engine's own defaults would choose on this GPU, for comparison.
    engine_defaults: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    # Whether this engine's KV layout for the model's architecture is proven against the engine
    # (launcher/engines/vllm/architectures.py); None: not assessed (e.g. --trust-engine).
    architecture_verified: bool | None = None
    # The engine sizes its KV cache from the memory free after warmup (vLLM 0.34's extensible KV cache):
    # what it prints before warmup is not the cache, and the next start measures again.
    kv_sized_after_warmup: bool = False
    # The setting that sizes the engine's memory, as the engine takes it (the table's "memory knob").
    knob: MemoryKnob = LEFT_TO_ENGINE
    # The engine's own figures for the JSON, under its own names (the adapter's `figure_keys`):
    # vLLM's gpu_memory_utilization and cpu_kvcache_space_gib, SGLang's mem_fraction_static.
    engine_figures: Mapping[str, Any] = field(default_factory=dict)
    # Planned configurations offered beside this one: without the risk when it may not fit, or
    # over all the GPUs given when it uses fewer (launcher.plan.choices; errors.Alternative).
    alternatives: tuple[Any, ...] = ()

    @property
    def memory_knob(self) -> str:
        return self.knob.text

    def item(self, key: str) -> BudgetItem | None:
        return next((i for i in self.budget if i.key == key), None)
