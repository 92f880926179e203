"""The watch: one serve's engine lines against the plan, its retunes, readiness and failures.

The supervisor passes every engine line through untouched; the watch reads the lines its
engine's rules know (typed events from the adapter), compares the engine's KV tokens with the
plan, and on divergence or a known fatal start error retunes (new flags computed from the
engine's own numbers, never the same flags twice), aborts (78, or 75 when other processes hold
the memory) or warns. Ready means verified and healthy: the KV report was seen and accepted
(or the check waived, said in the log) AND /health answers. After ready, a known fatal error
while serving ends the engine and safe-serve with 70 once its lines have passed through; a
CUDA out-of-memory is remembered for the next plan of the same setup.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from launcher.common.devlock import DeviceLock
from launcher.common.errors import ExitCode
from launcher.common.vocab import DivergenceMode
from launcher.engines import adapter
from launcher.engines.events import MAX_RULE_BYTES, EngineEvent
from launcher.plan.types import Calibration, Plan
from launcher.serve import progress as live
from launcher.supervise import EngineCommand, HealthCheck, Supervisor, SupervisorOptions, build_child_env
from launcher.supervise.outcome import State

log = structlog.get_logger("safe_serve.watch")

RETUNE, ABORT, WARN = DivergenceMode.RETUNE, DivergenceMode.ABORT, DivergenceMode.WARN
# The engine's own progress, named after the last line of each kind we saw.
ENGINE_PHASES = {
    "pre_load": "loading weights", "weights": "weights loaded", "available_kv": "memory profiled",
    "kv_alloc": "KV cache allocated", "kv": "KV cache sized", "ready": "serving",
}


@dataclass(frozen=True)
class ServeOptions:
    engine_cmd: str | None = None
    on_divergence: str = RETUNE
    tolerance: float = 0.02
    max_retunes: int = 2
    watch_timeout_s: float = 1800.0
    grace_s: float = 30.0
    lock_timeout_s: float = 300.0
    ready_file: str | None = None
    health_failures: int = 3  # /health failures in a row after ready that end the engine; 0: no liveness check
    health_interval_s: float = 5.0  # between liveness probes after ready
    crash_linger_s: float = 5.0  # after a fatal error while serving: the engine's last lines pass, then SIGTERM


def diverges(plan: Plan, event: EngineEvent, tolerance: float) -> bool:
    tokens = event.values.get("tokens")
    if tokens is None or plan.kv_cache_tokens <= 0:
        return False
    return bool(abs(tokens - plan.kv_cache_tokens) / plan.kv_cache_tokens > tolerance)


def child_env(plan: Plan, base: Mapping[str, str] | None = None) -> dict[str, str]:
    return build_child_env(os.environ if base is None else base, dict(plan.engine_env))


class Watch:
    """One serve, as explicit state: what was tried, what was verified, what the engine did."""

    def __init__(self, plan: Plan, *, model: str, passthrough: Sequence[str], options: ServeOptions,
                 concurrency: int, lock: DeviceLock | None = None,
                 on_measured: Callable[[Calibration], None] | None = None,
                 on_runtime_oom: Callable[[], Calibration | None] | None = None,
                 on_state: Callable[[Mapping[str, object]], None] | None = None) -> None:
        self.plan, self.model, self.options, self.concurrency = plan, model, options, concurrency
        self.on_state = on_state  # the instance's status file (launcher.serve.instances)
        self.stopping = False  # `stopping` reported: no later state replaces it
        self.engine = adapter(plan.engine)
        self.on_measured, self.on_runtime_oom = on_measured, on_runtime_oom
        # Held since before the plan read free memory (request.lock_live_devices); released when
        # the engine has sized its KV cache, or fails, or at exit.
        self.lock = lock if lock is not None else DeviceLock(())
        # Several engines on this node's GPUs (vLLM's data-parallel ranks, SGLang's replicas) each size their
        # own KV cache from their own reading of free memory: the first KV line does not mean the others have
        # read theirs, so the lock is held until the server answers.
        tp, pp = self.engine.ranks(plan.pinned)
        self.release_on_kv = self.engine.gpus_on_node(plan.pinned) <= tp * pp
        # A worker node of a multi-node launch serves no HTTP: ready once its ranks have their KV cache, and
        # any KV record of theirs counts (SGLang's summary line is the first node's alone).
        self.worker = self.engine.worker_node(plan.pinned)
        # The engine's flags as one list: the operator's, then the plan's. A retune rewrites this
        # list, so a recomputed flag replaces the plan's own instead of being overridden by it.
        self.args = [*passthrough, *plan.engine_args]
        self.bare = dataclasses.replace(plan, engine_args=())
        self.tried: set[tuple[str, ...]] = set()
        self.retunes = 0
        self.measured = self.engine.measurements(plan)
        # Why the KV check may be skipped: the operator said so, or the plan predicts nothing.
        self.waiver = ("--on-divergence warn" if options.on_divergence == WARN else
                       "--trust-engine (the plan predicts no KV cache)" if plan.kv_cache_tokens <= 0 else None)
        # Per engine start (reset when the supervisor starts the next generation):
        self.generation = 0
        self.kv: dict[str, object] = {}  # the KV report's figures
        self.kv_accepted = False
        self.healthy = self.worker  # nothing to answer /health on a worker node
        self.ready = False
        self.settled = False  # restart or stop requested: later lines of this engine are not acted on
        self.failed = False  # a fatal error while serving; stop requested
        self.oom_recorded = False
        self.engine_phase = "starting"
        self.reader = self.engine.log_reader(child_env(plan))  # the engine's records, in order, per start
        self.progress = live.Progress(plan.engine) if live.wanted() else None
        host, port = self.engine.health_address(plan.pinned)
        self.supervisor = Supervisor(
            self._command_for(self.args),
            SupervisorOptions(
                grace_s=options.grace_s,
                health=HealthCheck(host=host, port=port, live_interval_s=options.health_interval_s,
                                   failures=options.health_failures) if options.health_failures > 0
                else HealthCheck(host=host, port=port),
                # lines no rule could match never reach Python decoding
                line_filter=tuple(key.encode() for key in self.engine.log_prefilter),
                ready_file=Path(options.ready_file) if options.ready_file else None,
                watch_timeouts_s={"kv": options.watch_timeout_s}),
            on_line=self.on_line, on_ready=self.on_healthy, on_watch_timeout=self.on_watch_timeout,
            on_state=self.on_supervisor_state,
        )
        if self.progress is not None:
            self.supervisor.set_status_line(self.progress.text)

    # ------------------------------------------------------------------ running

    def run(self) -> int:
        """Start the engine and supervise it; returns safe-serve's exit code."""
        old = structlog.get_config()
        # Our log lines queue behind the engine's stderr lines: a stalled reader blocks neither.
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(self.supervisor.own_stream))  # type: ignore[arg-type]
        try:
            self._report("starting")
            outcome = self.supervisor.run()
        finally:
            structlog.configure(logger_factory=old["logger_factory"])
            self.lock.release()
        say = log.info if outcome.exit_code == 0 else log.error  # the level follows the outcome
        say("exit", code=outcome.exit_code, reason=outcome.reason, phase=outcome.phase.name,
            engine_phase=self.engine_phase, restarts=outcome.restarts, engine_returncode=outcome.engine_returncode)
        return outcome.exit_code

    def _report(self, state: str) -> None:
        if self.on_state is None or self.stopping:
            return  # once `stopping`, a KV line logged while stopping does not make it `serving` again
        self.stopping = state == "stopping"
        tokens = self.kv.get("tokens")
        self.on_state({"state": state, "engine_phase": self.engine_phase, "retunes": self.retunes,
                       "engine_kv_tokens": tokens if isinstance(tokens, int) else None})

    def _argv_for(self, flags: Sequence[str]) -> tuple[str, ...]:
        return tuple(self.engine.engine_argv(self.bare, self.model, flags, self.options.engine_cmd))

    def _command_for(self, flags: Sequence[str]) -> EngineCommand:
        argv = self._argv_for(flags)
        self.tried.add(argv)
        return EngineCommand(argv=argv, env=child_env(self.plan), shown=tuple(self.engine.shown_argv(argv)))

    def _sync(self) -> None:
        """A new engine generation starts with nothing verified."""
        if self.supervisor.generation != self.generation:
            self.generation = self.supervisor.generation
            self.kv, self.kv_accepted, self.healthy, self.ready = {}, False, self.worker, False
            self.settled = self.failed = False
            self.engine_phase = "starting"
            self.reader = self.engine.log_reader(child_env(self.plan))

    # ------------------------------------------------------------------ hooks

    def on_supervisor_state(self, state: State) -> None:
        """A stop to exit has begun (a stop signal, an abort, a failure while serving): say `stopping`."""
        if state is State.STOPPING:
            self._report("stopping")

    def on_line(self, stream: str, raw: bytes) -> None:
        self._sync()
        if self.settled and not self.ready:
            return
        # The rules read a bounded start of the line (the pass-through is whole): linear in any line.
        event = self.reader.read(stream, raw[:MAX_RULE_BYTES].decode("utf-8", errors="replace"))
        if event is None:
            return
        if self.ready:
            if event.is_fatal or event.is_crash:
                self._failed_while_serving(event)
            return
        self.engine_phase = ENGINE_PHASES.get(event.kind, self.engine_phase)
        if self.progress is not None:
            self.progress.saw(event.kind, event.values, self.engine_phase)
        calibration = self.measured.feed(event)
        # Measured against the plan's own flags only: after a retune the request has changed.
        if calibration is not None and self.on_measured is not None and self.retunes == 0:
            self.on_measured(calibration)
        if event.kind == "kv":
            if self.release_on_kv or self.worker:  # a worker node has no /health to hold the lock until
                self.lock.release()
            self.kv = dict(event.values)
            self._check_kv(event)
            if not self.settled:
                self._report("serving" if self.ready else "starting")
        elif event.kind == "kv_alloc" and self.worker and not self.kv_accepted:
            # The first node's summary line is checked there, against the same plan: here, its pool is in place.
            self.lock.release()
            self.kv = dict(event.values)
            log.info("worker-node-kv", tokens=event.values.get("tokens"), planned_tokens=self.plan.kv_cache_tokens,
                     reason="the first node checks the KV summary; this node serves no HTTP")
            self._accept()
        elif event.kind == "sized_before_warmup" and self.plan.kv_sized_after_warmup:
            # The plan's cap (~free memory less the margin) was set for a cache sized after warmup; sized before,
            # what vLLM allocates after it comes from little more than the margin.
            log.warning("plan-mismatch", reason="vLLM sizes its KV cache before warmup on this machine, not after as "
                        "planned; the KV check follows; plan with --no-enable-extensible-kv-cache for this machine",
                        utilization=self.plan.engine_figures.get("gpu_memory_utilization"))
        elif event.is_fatal:
            self.lock.release()
            self._decide(event, f"engine error {event.name}: {event.line[:200]}")

    def on_healthy(self) -> None:
        self._sync()
        self.healthy = True
        self.lock.release()  # every engine on the node has sized its KV cache
        if not self.kv_accepted and not self.settled and self.waiver is not None:
            log.warning("kv-check-waived", reason=f"no KV report checked before /health answered ({self.waiver})")
            self._accept()
        self._maybe_ready()

    def on_watch_timeout(self, name: str) -> None:
        log.error("watch-timeout", missing=name, seconds=self.options.watch_timeout_s, engine_phase=self.engine_phase)
        self.supervisor.request_stop(f"no KV line within {self.options.watch_timeout_s:.0f} s", int(ExitCode.TEMPFAIL))

    # ------------------------------------------------------------------ decisions

    def _check_kv(self, event: EngineEvent) -> None:
        plan, options = self.plan, self.options
        # After a retune the plan no longer describes the flags: only fatal errors count.
        why: str | None
        if self.retunes == 0 and diverges(plan, event, options.tolerance):
            why = (f"engine KV tokens {event.values['tokens']:,} vs planned {plan.kv_cache_tokens:,} "
                   f"(tolerance {options.tolerance:.0%})")
        else:
            why = self.engine.kv_shortfall(plan, event, concurrency=self.concurrency, tolerance=options.tolerance)
        if why is None or self._decide(event, why):
            self._accept()

    def _accept(self) -> None:
        self.kv_accepted = True
        self.supervisor.mark_event("kv")
        self._maybe_ready()

    def _maybe_ready(self) -> None:
        if self.ready or self.settled or not (self.kv_accepted and self.healthy):
            return
        self.ready = True
        plan = self.plan
        log.info("ready", engine=plan.engine, kv_tokens=self.kv.get("tokens"), planned_tokens=plan.kv_cache_tokens,
                 max_model_len=self.kv.get("max_model_len") or plan.max_model_len, retunes=self.retunes)
        self.supervisor.set_status_line(None)
        self._report("serving")
        self.supervisor.mark_ready(f"serving: {self.kv.get('tokens', '?')} KV tokens (planned {plan.kv_cache_tokens})")

    def _decide(self, event: EngineEvent, why: str) -> bool:
        """Retune, abort or warn; True when the engine keeps its KV cache (warned, nothing to change)."""
        plan, options = self.plan, self.options
        if options.on_divergence == WARN and not event.is_fatal:
            log.warning("divergence", reason=why, planned_tokens=plan.kv_cache_tokens, waived_by="--on-divergence warn",
                        **event.values)
            return True
        new_args = (self.engine.retuned_args(plan, self.args, event, concurrency=self.concurrency)
                    if options.on_divergence == RETUNE else None)
        if new_args is not None and self.retunes < options.max_retunes and self._argv_for(new_args) not in self.tried:
            command = self._command_for(new_args)  # never the same flags twice
            self.retunes += 1
            self.args = new_args
            log.warning("retune", reason=why, attempt=self.retunes, engine_args=self.engine.shown_argv(new_args),
                        **event.values)
            self._report("retuning")
            self.supervisor.request_restart(command, reason=why)
            self.settled = True
            return False
        if event.is_fatal or options.on_divergence == ABORT:
            log.error("abort", reason=why, planned_tokens=plan.kv_cache_tokens, planned_len=plan.max_model_len,
                      **event.values)
            temporary = event.name in self.engine.temporary_fatal
            self.supervisor.request_stop(why, int(ExitCode.TEMPFAIL if temporary else ExitCode.CONFIG))
            self.settled = True
            return False
        log.warning("divergence", reason=why, planned_tokens=plan.kv_cache_tokens, **event.values)
        return True

    def _failed_while_serving(self, event: EngineEvent) -> None:
        """A known fatal error after ready: let its lines pass, stop the engine, exit 70."""
        if event.name == "cuda_oom" and not self.oom_recorded:
            self.oom_recorded = True
            remembered = self.on_runtime_oom() if self.on_runtime_oom is not None else None
            log.error("runtime-oom", line=event.line[:200],
                      next_extra_headroom_bytes=remembered.extra_headroom_bytes if remembered else None)
        if self.failed:
            return
        if self.supervisor.state in (State.STOPPING, State.RESTARTING):
            # Engines log errors while they shut down (vLLM: "AsyncLLM output_handler failed"
            # after SIGTERM): a stop already asked for keeps its own exit code.
            log.info("engine-error-while-stopping", kind=event.kind, line=event.line[:200])
            return
        self.failed = True
        why = f"engine failed while serving ({event.name}): {event.line[:200]}"
        log.error("engine-failure", reason=why, kind=event.kind, linger_s=self.options.crash_linger_s)
        self.supervisor.request_stop(why, int(ExitCode.SOFTWARE), after_s=self.options.crash_linger_s)


def run_serve(plan: Plan, *, model: str, passthrough: Sequence[str], options: ServeOptions, concurrency: int,
              lock: DeviceLock | None = None, on_measured: Callable[[Calibration], None] | None = None,
              on_runtime_oom: Callable[[], Calibration | None] | None = None,
              on_state: Callable[[Mapping[str, object]], None] | None = None) -> int:
    """Start the engine, watch it against the plan, supervise; returns the exit code."""
    return Watch(plan, model=model, passthrough=passthrough, options=options, concurrency=concurrency, lock=lock,
                 on_measured=on_measured, on_runtime_oom=on_runtime_oom, on_state=on_state).run()
