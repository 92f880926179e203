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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from launcher.common.errors import SafeServeError
    from launcher.engines.accepted_flags import AcceptedFlags
    from launcher.engines.events import EngineEvent, LogReader
    from launcher.plan.types import Calibration, Plan, PlanRequest


class Measurements(Protocol):
    """Turns the engine's log events of one start into a `Calibration` for the next plan."""

    def feed(self, event: EngineEvent) -> Calibration | None: ...


class EngineAdapter(Protocol):
    name: str  # "vllm" or "sglang" (launcher.common.vocab.Engine)
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
    memory_knob_flag: str | None  # the memory fraction an alternative may set
    cpu_offload_flag: str | None  # weights offloaded to CPU memory, where the engine's plan models it

    # planning
    def check_engine_args(self, engine_args: Sequence[str], version: str | None) -> tuple[str, ...]: ...
    def accepted_flag_names(self) -> frozenset[str]: ...
    def pinned_flags(self, engine_args: Sequence[str]) -> dict[str, Any]: ...
    def set_flag(self, args: Sequence[str], flag: str, value: str) -> list[str]: ...
    def drop_flag(self, args: Sequence[str], flag: str) -> list[str]: ...
    def ranks(self, pinned: Mapping[str, Any]) -> tuple[int, int]: ...
    def rules_version(self, version: str | None) -> tuple[str, str | None]: ...
    def pinned_as_written(self, flag: str, value: Any) -> str: ...
    def plan(self, request: PlanRequest) -> Plan: ...
    def engine_decides(self, request: PlanRequest, refusal: SafeServeError) -> Plan: ...
    def verified_architectures(self) -> tuple[str, list[tuple[str, str]]]: ...

    # launching
    def engine_argv(self, plan: Plan, model_ref: str, passthrough: Sequence[str],
                    engine_cmd: str | None) -> list[str]: ...
    def health_address(self, passthrough: Sequence[str]) -> tuple[str, int]: ...

    # watching
    def parse_line(self, line: str) -> EngineEvent | None: ...
    def log_reader(self, env: Mapping[str, str]) -> LogReader: ...
    def retuned_args(self, plan: Plan, args: Sequence[str], event: EngineEvent, *,
                     concurrency: int) -> list[str] | None: ...
    def kv_shortfall(self, plan: Plan, event: EngineEvent, *, concurrency: int,
                     tolerance: float) -> str | None: ...
    def measurements(self, plan: Plan) -> Measurements: ...


class PackageAdapter:
    """An `EngineAdapter` assembled from an engine package's modules.

    Each engine package keeps its knowledge in four modules: `__init__` (flags, rules by
    version), `planner` (the plan), `runtime` (command line, retunes, measurements) and
    `logs` (its log lines as events). A subclass names them and the engine's flag spellings.
    """

    name: str
    newest: str
    oldest: str
    length_flag: str
    tp_flag: str
    pp_flag: str
    fp8_kv_dtype: str
    default_port: int
    log_prefilter: tuple[str, ...]
    temporary_fatal: frozenset[str]
    kv_dtype_flag = "--kv-cache-dtype"
    memory_knob_flag: str | None = None
    cpu_offload_flag: str | None = None
    _rules: Any  # the package: pinned_flags(), rules_for(), FLAGS, CALIBRATION_KEY_FLAGS, MEMORY_FLAGS
    _logs: Any  # parse(line)
    _runtime: Any  # engine_argv, retuned_args, kv_shortfall, measurements_for
    _planner_module: str  # imported on first plan (keeps `safe-serve gpus` light)
    _accepted_module: str  # the engine's argparse by release (`accepted.ACCEPTED`), imported when checked

    def _accepted(self) -> AcceptedFlags:
        import importlib

        table: AcceptedFlags = importlib.import_module(self._accepted_module).ACCEPTED
        return table

    def check_engine_args(self, engine_args: Sequence[str], version: str | None) -> tuple[str, ...]:
        """UsageError (exit 2) for a flag the engine's argparse does not take or a second model;
        warnings where our table cannot vouch for `version` (launcher/engines/accepted_flags.py)."""
        from launcher.engines.accepted_flags import check_engine_args

        return check_engine_args(self._accepted(), version, engine_args)

    def accepted_flag_names(self) -> frozenset[str]:
        """Every option string any release we read takes (for the CLI's `--` hint)."""
        return frozenset().union(*self._accepted().versions.values())

    def pinned_flags(self, engine_args: Sequence[str]) -> dict[str, Any]:
        return dict(self._rules.pinned_flags(engine_args))

    def set_flag(self, args: Sequence[str], flag: str, value: str) -> list[str]:
        """`args` with `flag` set, every spelling and alias of it replaced (`-tp 3` included)."""
        from launcher.engines.flags import set_flag

        return set_flag(args, flag, value, self._rules.FLAGS)

    def drop_flag(self, args: Sequence[str], flag: str) -> list[str]:
        from launcher.engines.flags import drop_flag

        return drop_flag(args, flag, self._rules.FLAGS)

    @property
    def memory_flags(self) -> frozenset[str]:
        return frozenset(self._rules.MEMORY_FLAGS)

    @property
    def env_keys(self) -> tuple[str, ...]:
        return tuple(self._rules.ENV_KEYS)

    @property
    def allow_long_env(self) -> str:
        return str(self._rules.ALLOW_LONG_ENV)

    @property
    def calibration_key_flags(self) -> tuple[str, ...]:
        return tuple(self._rules.CALIBRATION_KEY_FLAGS)

    @property
    def flag_names(self) -> frozenset[str]:
        names = {name for spec in self._rules.FLAGS for name in (spec.name, *spec.aliases)}
        return frozenset(names | set(self._rules.OTHER_FLAGS))

    def pinned_as_written(self, flag: str, value: Any) -> str:
        """A pinned flag as the operator wrote it: `--max-model-len auto`, not the engine's -1."""
        if value is True:
            return flag
        try:
            written = self._rules.AS_WRITTEN.get((flag, value))
        except TypeError:  # an unhashable value has no sentinel
            written = None
        return f"{flag} {written if written is not None else value}"

    def ranks(self, pinned: Mapping[str, Any]) -> tuple[int, int]:
        tp, pp = self._rules.ranks(pinned)
        return int(tp), int(pp)

    def rules_version(self, version: str | None) -> tuple[str, str | None]:
        chosen, note = self._rules.rules_for(version)
        return str(chosen.version), note

    def _planner(self) -> Any:
        import importlib

        return importlib.import_module(self._planner_module)

    def plan(self, request: PlanRequest) -> Plan:
        return self._planner().plan(request)  # type: ignore[no-any-return]

    def engine_decides(self, request: PlanRequest, refusal: SafeServeError) -> Plan:
        return self._planner().engine_decides(request, refusal)  # type: ignore[no-any-return]

    def verified_architectures(self) -> tuple[str, list[tuple[str, str]]]:
        """(how they were proven, [(architecture, its proof)]) for `safe-serve models --architectures`."""
        proof, rows = self._rules.verified_architectures()
        return str(proof), [(str(name), str(detail)) for name, detail in rows]

    def engine_argv(self, plan: Plan, model_ref: str, passthrough: Sequence[str],
                    engine_cmd: str | None) -> list[str]:
        return list(self._runtime.engine_argv(plan, model_ref, passthrough, engine_cmd))

    def health_address(self, passthrough: Sequence[str]) -> tuple[str, int]:
        pinned = self.pinned_flags(passthrough)
        return str(pinned.get("--host") or "127.0.0.1"), int(pinned.get("--port") or self.default_port)

    def parse_line(self, line: str) -> EngineEvent | None:
        return self._logs.parse(line)  # type: ignore[no-any-return]

    def log_reader(self, env: Mapping[str, str]) -> LogReader:
        """A reader of one engine start's lines in order (traceback state per stream)."""
        return self._logs.reader(env)  # type: ignore[no-any-return]

    def retuned_args(self, plan: Plan, args: Sequence[str], event: EngineEvent, *,
                     concurrency: int) -> list[str] | None:
        return self._runtime.retuned_args(plan, args, event, concurrency=concurrency)  # type: ignore[no-any-return]

    def kv_shortfall(self, plan: Plan, event: EngineEvent, *, concurrency: int, tolerance: float) -> str | None:
        return self._runtime.kv_shortfall(plan, event, concurrency=concurrency,  # type: ignore[no-any-return]
                                          tolerance=tolerance)

    def measurements(self, plan: Plan) -> Measurements:
        return self._runtime.measurements_for(plan)  # type: ignore[no-any-return]
