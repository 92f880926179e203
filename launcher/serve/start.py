"""One `serve`, from the operator's typed options to the engine's exit code: lock, plan, argv,
dry run or launch with calibration recorded. The CLI parses and prints; this module orchestrates.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from launcher.common.devlock import DeviceLock
from launcher.common.errors import UnsupportedModel, WontFit
from launcher.plan.request import PlanOptions, build_request, calibration_key_for, lock_live_devices
from launcher.plan.types import Calibration, Plan, PlanRequest
from launcher.serve.watch import ServeOptions, run_serve

__all__ = ["Prepared", "dry_run_output", "launch", "prepare"]


@dataclass(frozen=True)
class Prepared:
    """A serve planned and ready to start: the request, its plan and the engine's argv."""

    request: PlanRequest
    plan: Plan
    argv: tuple[str, ...]
    shown: tuple[str, ...]  # argv as logs, tables and --dry-run show it: secrets masked
    model_ref: str  # a local directory, else the repo id


def prepare(options: PlanOptions, env: Mapping[str, str], *, engine_cmd: str | None) -> Prepared:
    """Plan `options` (the engine decides with --trust-engine) and build the engine's argv."""
    from launcher.engines import adapter
    from launcher.plan.planner import engine_decides, make_plan

    request = build_request(options, env)
    if engine_cmd:
        # The engine runs in another environment (a venv, a container): what is installed here is not beside it.
        request = dataclasses.replace(request, engine_packages=None)
    try:
        plan = make_plan(request, choices=True)
    except (WontFit, UnsupportedModel) as refusal:
        if not request.trust_engine:
            raise
        plan = engine_decides(request, refusal)
    model_ref = request.model.path or request.model.name
    argv = adapter(plan.engine).engine_argv(plan, model_ref, request.engine_args, engine_cmd)
    return Prepared(request, plan, tuple(argv), tuple(adapter(plan.engine).shown_argv(argv)), model_ref)


def take_start_lock(options: PlanOptions, timeout_s: float) -> DeviceLock | None:
    """The start lock, held from before the plan reads free memory (see `lock_live_devices`)."""
    return lock_live_devices(options, timeout_s)


def dry_run_output(prepared: Prepared, *, as_json: bool) -> str:
    """What `--dry-run` prints: the plan and the exact command line (with the engine's env)."""
    from launcher.common.shown import shown_env
    from launcher.edge.render import plan_to_json, render_plan

    plan, gpus = prepared.plan, prepared.request.gpus
    if as_json:
        return json.dumps(plan_to_json(plan, list(prepared.shown), given=gpus), indent=2)
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in shown_env(plan.engine_env).items())
    return render_plan(plan, given=gpus) + ("\n" + env + " " if env else "\n") + shlex.join(prepared.shown)


def launch(prepared: Prepared, options: ServeOptions, lock: DeviceLock | None, env: Mapping[str, str],
           *, warn: Callable[[str], None], name: str | None = None) -> int:
    """Start and watch the engine; what it measured is recorded for the next plan of this setup."""
    from launcher.common.paths import state_dir
    from launcher.plan.calibration import record, record_runtime_oom

    request, plan = prepared.request, prepared.plan
    key = calibration_key_for(plan.engine, request.engine_version, request.gpus, request.model.name,
                              request.pinned)

    def on_measured(measured: Calibration) -> None:
        try:
            record(state_dir(env), key, measured)
        except OSError as exc:  # a read-only state dir must not stop the engine
            warn(f"safe-serve: calibration not saved: {exc}")

    def on_runtime_oom() -> Calibration | None:  # a CUDA OOM while serving: more headroom next start
        try:
            return record_runtime_oom(state_dir(env), key)
        except OSError as exc:
            warn(f"safe-serve: calibration not saved: {exc}")
            return None

    status = StatusFile(state_dir(env), base_status(prepared, name), warn)
    try:
        return run_serve(plan, model=prepared.model_ref, passthrough=request.engine_args, options=options,
                         concurrency=request.concurrency, lock=lock, on_measured=on_measured,
                         on_runtime_oom=on_runtime_oom, on_state=status.update)
    finally:
        status.remove()


def base_status(prepared: Prepared, name: str | None) -> dict[str, object]:
    """What `safe-serve ps` shows of this instance that does not change while it runs."""
    import os

    from launcher.engines import adapter
    from launcher.serve.instances import STATUS_SCHEMA, instance_name, now, process_started

    request, plan = prepared.request, prepared.plan
    host, port = adapter(plan.engine).health_address(request.pinned.values)
    pid = os.getpid()
    return {"schema": STATUS_SCHEMA, "name": name or instance_name(request.model.name, port),
            "model": request.model.name, "engine": plan.engine, "engine_version": plan.engine_version,
            "gpus": [g.uuid or g.name for g in request.gpus[: plan.tp * plan.pp]] or ["cpu"], "host": host,
            "port": port, "pid": pid, "pid_started": process_started(pid) or 0.0,
            "planned_kv_tokens": plan.kv_cache_tokens, "engine_kv_tokens": None, "memory_knob": plan.memory_knob,
            "retunes": 0, "state": "starting", "engine_phase": "starting", "since": now(), "started": now()}


class StatusFile:
    """This instance's status file: updated on each state change, removed at exit; a state
    directory it cannot write costs one warning, never the engine."""

    def __init__(self, state: Path, base: dict[str, object], warn: Callable[[str], None]) -> None:
        self.state, self.doc, self.warn, self.broken = state, base, warn, False

    def update(self, change: Mapping[str, object]) -> None:
        from launcher.serve.instances import now, write_status

        if change.get("state") != self.doc.get("state"):
            self.doc["since"] = now()
        self.doc.update(change)
        if self.broken:
            return
        try:
            write_status(self.state, self.doc)
        except OSError as exc:
            self.broken = True
            self.warn(f"safe-serve: status file not written (safe-serve ps will not list this instance): {exc}")

    def remove(self) -> None:
        from launcher.serve.instances import remove_status

        remove_status(self.state, str(self.doc["name"]))
