"""Launch and watch: start the engine with the plan's flags, check its numbers, retune or abort.

The supervisor passes every engine line through untouched; `run_serve`'s line hook reads
them through the engine's log rules, compares the engine's KV tokens with the plan, and on divergence or a
known fatal error retunes (new flags computed from the engine's own numbers, never the same
flags twice), aborts (exit 78) or warns.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from launcher.devlock import DeviceLock
from launcher.engines import engine_logs, engine_module
from launcher.engines.events import EngineEvent
from launcher.engines.flags import set_flag
from launcher.errors import ExitCode
from launcher.plan import Calibration, Plan
from launcher.units import GiB

RETUNE, ABORT, WARN = "retune", "abort", "warn"


@dataclass(frozen=True)
class ServeOptions:
    engine_cmd: str | None = None
    on_divergence: str = RETUNE
    tolerance: float = 0.02
    max_retunes: int = 2
    watch_timeout: float = 1800.0
    grace: float = 30.0
    lock_timeout: float = 300.0
    ready_file: str | None = None


def engine_argv(plan: Plan, model: str, passthrough: Sequence[str], engine_cmd: str | None) -> list[str]:
    """The engine's command line: its executable part, the model, the operator's flags, ours."""
    if plan.engine == "sglang":
        base = shlex.split(engine_cmd) if engine_cmd else [sys.executable, "-m", "sglang.launch_server"]
        return [*base, "--model-path", model, *passthrough, *plan.engine_args]
    base = shlex.split(engine_cmd) if engine_cmd else ["vllm", "serve"]
    # `vllm serve` takes the model positionally; the OpenAI api_server module wants --model.
    model_args = ["--model", model] if any("api_server" in part for part in base) else [model]
    return [*base, *model_args, *passthrough, *plan.engine_args]


class Measurements:
    """Turns what the engine logged into a `Calibration` for the next plan of the same key."""

    def __init__(self, plan: Plan) -> None:
        self._plan = plan
        self._pre_load_gib: float | None = None

    def feed(self, event: EngineEvent) -> Calibration | None:
        requested = self._plan.item("requested")
        weights = self._plan.item("weights")
        if event.kind == "available_kv" and requested is not None:
            # vLLM: everything it subtracted from the request besides the KV cache.
            return Calibration(non_kv_bytes=requested.bytes - int(event.values["gib"] * GiB))
        if event.kind == "pre_load":
            self._pre_load_gib = event.values["gib"]
        if event.kind == "weights" and self._plan.engine == "sglang" and self._pre_load_gib is not None \
                and weights is not None:
            used = int((self._pre_load_gib - event.values["avail_gib"]) * GiB)
            return Calibration(load_overhead_bytes=max(used - weights.bytes, 0))
        return None


def health_port(plan: Plan, passthrough: Sequence[str]) -> tuple[str, int]:
    engine = engine_module(plan.engine)
    pinned = engine.pinned_flags(passthrough)
    return str(pinned.get("--host") or "127.0.0.1"), int(pinned.get("--port") or engine.DEFAULT_PORT)


def retuned_args(plan: Plan, args: Sequence[str], event: EngineEvent, *, concurrency: int = 1,
                 margin_gib: float = 0.25) -> list[str] | None:
    """Engine flags recomputed from what the engine reported, or None when its numbers don't say."""
    v = event.values
    block = plan.block_size or 16
    if event.kind in ("fatal:kv_too_small", "fatal:kv_too_small_v0") and v.get("estimated_max_model_len"):
        length = v["estimated_max_model_len"] // concurrency
        length = length // block * block if length >= block else length
        flag = engine_module(plan.engine).LENGTH_FLAG
        return set_flag(args, flag, str(length)) if length > 0 else None
    if event.kind == "fatal:startup_free":
        utilization = math.floor((v["free_gib"] - margin_gib) / v["total_gib"] * 10_000) / 10_000
        return set_flag(args, "--gpu-memory-utilization", f"{utilization:g}") if utilization > 0 else None
    if event.kind == "kv" and v.get("tokens") is not None and plan.engine == "sglang":
        # SGLang caps request length at the pool silently: make the cap explicit.
        length = v["tokens"] // concurrency
        if length < (v.get("max_model_len") or plan.max_model_len):
            return set_flag(args, "--context-length", str(length))
    if event.kind == "kv" and v.get("concurrency") is not None and v["concurrency"] < concurrency:
        length = int(v["tokens"] / concurrency) // block * block
        return set_flag(args, "--max-model-len", str(length)) if length > 0 else None
    if event.kind == "fatal:weights_leave_nothing":
        return set_flag(args, "--mem-fraction-static", f"{min(v['minimum'] + 0.02, 0.99):.3f}")
    return None


def pool_short(event: EngineEvent, concurrency: int, tolerance: float) -> bool:
    """SGLang's pool holds fewer than `concurrency` requests of its context, beyond the tolerance."""
    tokens, context = event.values.get("tokens"), event.values.get("max_model_len")
    return tokens is not None and bool(context) and tokens < context * concurrency * (1 - tolerance)


def diverges(plan: Plan, event: EngineEvent, tolerance: float) -> bool:
    tokens = event.values.get("tokens")
    if tokens is None or plan.kv_cache_tokens <= 0:
        return False
    return abs(tokens - plan.kv_cache_tokens) / plan.kv_cache_tokens > tolerance


def child_env(plan: Plan, base: Mapping[str, str] | None = None) -> dict[str, str]:
    from launcher.supervisor import build_child_env

    return build_child_env(os.environ if base is None else base, dict(plan.engine_env))


EXIT_WONT_FIT = int(ExitCode.CONFIG)
# The engine's own progress, named after the last line of each kind we saw.
ENGINE_PHASES = {
    "pre_load": "loading weights", "weights": "weights loaded", "available_kv": "memory profiled",
    "kv_alloc": "KV cache allocated", "kv": "KV cache sized", "ready": "serving",
}
# Other processes hold the memory: the same command may work later (exit 75, not 78).
TEMPORARY_KINDS = ("fatal:unbalanced", "fatal:startup_free", "fatal:cpu_node_memory")


def run_serve(plan: Plan, *, model: str, passthrough: Sequence[str], options: ServeOptions, concurrency: int,
              lock: DeviceLock | None = None, on_measured: Callable[[Calibration], None] | None = None) -> int:
    """Start the engine, watch its first lines against the plan, supervise; returns the exit code."""
    import structlog

    from launcher.supervisor import EngineCommand, HealthCheck, Supervisor, SupervisorOptions

    log = structlog.get_logger("safe_serve.watch")
    logs = engine_logs(plan.engine)
    parse = logs.parse
    # The engine's flags as one list: the operator's, then the plan's. A retune rewrites this
    # list, so a recomputed flag replaces the plan's own instead of being overridden by it.
    args = [*passthrough, *plan.engine_args]
    bare = dataclasses.replace(plan, engine_args=())
    tried: set[tuple[str, ...]] = set()
    retunes = 0
    verified: dict[str, object] = {}
    # The supervisor generation whose fate is decided (restart or stop requested): lines
    # still coming from that engine pass through but are not acted on again (vLLM reports
    # a fatal error twice, on stdout and stderr).
    settled = {"generation": -1}
    progress = {"engine_phase": "starting"}  # how far the engine's own log got, for the exit line

    def argv_for(flags: Sequence[str]) -> tuple[str, ...]:
        return tuple(engine_argv(bare, model, flags, options.engine_cmd))

    def command_for(flags: Sequence[str]) -> EngineCommand:
        argv = argv_for(flags)
        tried.add(argv)
        progress["engine_phase"] = "starting"
        return EngineCommand(argv=argv, env=child_env(plan))

    # Held since before the plan read free memory (cli._lock_live_devices); released when
    # the engine has sized its KV cache, or fails, or at exit.
    lock = lock if lock is not None else DeviceLock(())
    host, port = health_port(plan, passthrough)
    supervisor: Supervisor

    def decide(event: EngineEvent, why: str) -> None:
        nonlocal args, retunes
        if options.on_divergence == WARN and not event.is_fatal:
            log.warning("divergence", reason=why, planned_tokens=plan.kv_cache_tokens, **event.values)
            return
        new_args = retuned_args(plan, args, event, concurrency=concurrency) if options.on_divergence == RETUNE else None
        if new_args is not None and retunes < options.max_retunes:
            if argv_for(new_args) not in tried:  # never the same flags twice
                command = command_for(new_args)
                retunes += 1
                args = new_args
                log.warning("retune", reason=why, attempt=retunes, engine_args=new_args, **event.values)
                supervisor.request_restart(command, reason=why)
                settled["generation"] = supervisor.generation
                return
        if event.is_fatal or options.on_divergence == ABORT:
            log.error("abort", reason=why, planned_tokens=plan.kv_cache_tokens, planned_len=plan.max_model_len,
                      **event.values)
            code = int(ExitCode.TEMPFAIL) if event.kind in TEMPORARY_KINDS else EXIT_WONT_FIT
            supervisor.request_stop(why, code)
            settled["generation"] = supervisor.generation
        else:
            log.warning("divergence", reason=why, planned_tokens=plan.kv_cache_tokens, **event.values)

    measured = Measurements(plan)

    def on_line(stream: str, raw: bytes) -> None:
        if settled["generation"] == supervisor.generation:
            return
        event = parse(raw.decode("utf-8", errors="replace"))
        if event is None:
            return
        progress["engine_phase"] = ENGINE_PHASES.get(event.kind, progress["engine_phase"])
        calibration = measured.feed(event)
        # Measured against the plan's own flags only: after a retune the request has changed.
        if calibration is not None and on_measured is not None and retunes == 0:
            on_measured(calibration)
        if event.kind == "kv":
            supervisor.mark_event("kv")
            lock.release()
            verified.update(event.values)
            # After a retune the plan no longer describes the flags: only fatal errors count.
            if retunes == 0 and diverges(plan, event, options.tolerance):
                decide(event, f"engine KV tokens {event.values['tokens']:,} vs planned {plan.kv_cache_tokens:,} "
                              f"(tolerance {options.tolerance:.0%})")
            elif plan.engine == "sglang" and pool_short(event, concurrency, options.tolerance):
                decide(event, "SGLang pool smaller than the context length")
        elif event.is_fatal:
            lock.release()
            decide(event, f"engine error {event.kind[6:]}: {event.line[:200]}")

    def on_ready() -> None:
        log.info("ready", engine=plan.engine, kv_tokens=verified.get("tokens"), planned_tokens=plan.kv_cache_tokens,
                 max_model_len=verified.get("max_model_len") or plan.max_model_len, retunes=retunes)
        supervisor.mark_ready(f"serving: {verified.get('tokens', '?')} KV tokens (planned {plan.kv_cache_tokens})")

    def on_watch_timeout(name: str) -> None:
        log.error("watch-timeout", missing=name, seconds=options.watch_timeout, engine_phase=progress["engine_phase"])
        supervisor.request_stop(f"no KV line within {options.watch_timeout:.0f} s", int(ExitCode.TEMPFAIL))

    supervisor = Supervisor(
        command_for(args),
        SupervisorOptions(grace_seconds=options.grace, health=HealthCheck(host=host, port=port),
                          # lines no rule could match never reach Python decoding
                          line_filter=tuple(key.encode() for key in logs.PREFILTER),
                          ready_file=Path(options.ready_file) if options.ready_file else None,
                          watches={"kv": options.watch_timeout}),
        on_line=on_line, on_ready=on_ready, on_watch_timeout=on_watch_timeout,
    )
    try:
        outcome = supervisor.run()
    finally:
        lock.release()
    log.info("exit", code=outcome.exit_code, reason=outcome.reason, phase=outcome.phase.name,
             engine_phase=progress["engine_phase"], restarts=outcome.restarts)
    return outcome.exit_code
