"""The supervision loop: one engine (and its restarts), from spawn to outcome.

The shape is gunicorn's arbiter, cut down to one child: signal handlers only enqueue, one loop
waits on the engine's pipes and a wake-up fd, dispatches queued events through explicit
tables, then runs reconcile steps every tick (reap, deadlines, systemd keep-alives).
Exit-code rules: ``outcome``; the process and its group guard: ``process``; output: ``output``
and ``streams`` (writers, back-pressure, status line); systemd: ``keepalive``; health and
liveness: ``readiness``.
"""

from __future__ import annotations

import os
import selectors
import signal
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import structlog

from launcher.common import stopsignals
from launcher.common.errors import ExitCode
from launcher.supervise.events import (
    EventQueue,
    HealthResult,
    Healthy,
    MarkEvent,
    MarkReady,
    OutputDrained,
    RestartRequest,
    StopRequest,
    installed_signal_handlers,
)
from launcher.supervise.keepalive import EXTEND_BY_S, EXTEND_EVERY_S, KeepAlive
from launcher.supervise.outcome import (
    STOP_SIGNALS_CLEAN,
    Phase,
    State,
    StopBook,
    SupervisorOutcome,
    decide_outcome,
    signal_name,
)
from launcher.supervise.output import MAX_LINE_BYTES, PARTIAL_FLUSH_AFTER_S, LineHook
from launcher.supervise.process import Engine, EngineCommand, GroupGuard, spawn_engine
from launcher.supervise.readiness import HealthCheck, HealthPoller, Liveness, ReadyFile
from launcher.supervise.streams import OwnStream, Streams

log = structlog.get_logger("safe_serve.supervisor")

READ_CHUNK = 1 << 20  # bytes per os.read
DRAIN_AFTER_EXIT_S = 2.0  # how long to read pipes that outlive the engine's group
TICK_S = 1.0  # reconcile steps run at least this often
STOP_FLUSH_S = 5.0  # after a requested stop, the engine's last output gets this long beyond its exit


@dataclass(frozen=True)
class SupervisorOptions:
    """Tunables of one supervision; the defaults suit systemd and containers."""

    grace_s: float = 30.0  # SIGTERM -> SIGKILL (Kubernetes' default grace is 30 s too)
    health: HealthCheck | None = None  # poll it from each start; 200 -> on_ready
    liveness_exit_code: int = int(ExitCode.SOFTWARE)  # health.failures probes failed in a row after ready
    ready_file: Path | None = None  # written at mark_ready(), removed when not ready or at exit
    watch_timeouts_s: Mapping[str, float] = field(default_factory=dict)  # event name -> seconds from start
    notify_env: Mapping[str, str] | None = None  # where NOTIFY_SOCKET/WATCHDOG_USEC are read; None: os.environ
    stdout_fd: int = 1
    stderr_fd: int = 2
    group_guard: bool = True
    reap_orphans: bool | None = None  # waitpid(-1) for every child; None: only when we are PID 1
    handle_signals: bool = True  # needs run() on the main thread
    extend_every_s: float = EXTEND_EVERY_S
    extend_by_s: float = EXTEND_BY_S
    max_line_bytes: int = MAX_LINE_BYTES
    line_filter: tuple[bytes, ...] | None = None  # on_line gets only lines holding one of these
    output_flush_s: float = 30.0  # after the engine ended unasked, how long a stalled reader may keep us waiting
    stop_flush_s: float = STOP_FLUSH_S  # ... and after a stop we were asked for (systemd waits on us)


class Supervisor:
    """Starts an engine, passes its output through, stops it on signals, requests or deadlines.

    Hooks run on the thread that called :meth:`run` (the main thread when signals are
    handled), one at a time, so they need no locks:

    * ``on_line(stream, line)``: every line of ``"stdout"``/``"stderr"``, as bytes without
      the ``\\n``. Hot path: keep a cheap substring prefilter before any regex or decode, or
      set ``SupervisorOptions.line_filter`` to the substrings the parser needs, so that
      only lines holding one reach the hook (floods then cost no Python call per line).
    * ``on_ready()``: the health endpoint answered 200. Without this hook that alone marks
      the engine ready; with it, the hook decides and calls :meth:`mark_ready`.
    * ``on_watch_timeout(name)``: a watch from ``SupervisorOptions.watch_timeouts_s`` was not marked
      in time (:meth:`mark_event`).
    * ``on_exit(returncode)``: the engine exited on its own (not stopped by us), after its
      last line was read; may call :meth:`request_restart`.

    After the first 200, with ``HealthCheck.live_interval_s`` set, ``health.failures`` failed
    probes in a row stop the engine with ``liveness_exit_code``; while the probes pass and
    systemd set ``WATCHDOG_USEC``, ``WATCHDOG=1`` goes out every half period.

    The control methods (:meth:`request_stop`, :meth:`request_restart`, :meth:`mark_ready`,
    :meth:`mark_event`) only enqueue; they may be called from any thread or hook.
    An exception escaping a hook is a bug: the engine is stopped and the exception re-raised.
    """

    def __init__(
        self,
        command: EngineCommand,
        options: SupervisorOptions | None = None,
        *,
        on_line: LineHook | None = None,
        on_ready: Callable[[], None] | None = None,
        on_watch_timeout: Callable[[str], None] | None = None,
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        self._command = command
        self._opts = options or SupervisorOptions()
        self._on_line = on_line
        self._on_ready = on_ready
        self._on_watch_timeout = on_watch_timeout
        self._on_exit = on_exit
        self._state = State.NEW
        self._engine: Engine | None = None
        self._generation = 0
        self._restarts = 0
        self._reap_all = os.getpid() == 1 if self._opts.reap_orphans is None else self._opts.reap_orphans
        self._events = EventQueue()
        self._selector = selectors.DefaultSelector()
        self._ready_file = ReadyFile(self._opts.ready_file)
        self._health: HealthPoller | None = None
        self._liveness = Liveness(self._opts.health)
        self._stop = StopBook()
        self._pending_restart: EngineCommand | None = None
        self._drain_deadline: float | None = None
        self._drain_limit: float | None = None
        self._watch_deadlines: dict[str, float] = {}
        self._keepalive = KeepAlive(self._opts.notify_env, extend_every_s=self._opts.extend_every_s,
                                    extend_by_s=self._opts.extend_by_s)
        self._outcome: SupervisorOutcome | None = None
        self._streams = Streams(self._opts.stdout_fd, self._opts.stderr_fd, sys.stderr)
        self._signal_table: dict[int, Callable[[int], None]] = {
            signal.SIGTERM: self._on_stop_signal,
            signal.SIGHUP: self._on_stop_signal,
            signal.SIGQUIT: self._on_stop_signal,
            signal.SIGINT: self._on_sigint,
            signal.SIGCHLD: self._on_sigchld,
            **{signum: self._on_not_a_stop for signum in stopsignals.NOT_STOPS},
        }
        self._request_table: dict[type, Callable[[Any], None]] = {
            StopRequest: self._on_stop_request,
            RestartRequest: self._on_restart_request,
            MarkReady: self._on_mark_ready,
            MarkEvent: self._on_mark_event,
            Healthy: self._on_healthy,
            HealthResult: self._on_health_result,
            OutputDrained: self._on_output_drained,
        }

    # ------------------------------------------------------------------ public API

    @property
    def generation(self) -> int:
        """How many engines this supervisor has started (the current one's number)."""
        return self._generation

    @property
    def state(self) -> State:
        return self._state

    @property
    def phase(self) -> Phase:
        return self._engine.phase if self._engine else Phase.NOT_STARTED

    @property
    def engine_pid(self) -> int | None:
        return self._engine.pid if self._engine else None

    def request_stop(self, reason: str, exit_code: int, *, kill: bool = False, after_s: float = 0.0) -> None:
        """Stop the engine's group (SIGTERM, SIGKILL after the grace; at once if ``kill``) and
        make :meth:`run` return ``exit_code`` whatever the engine does. With ``after_s`` the
        SIGTERM waits that long (the engine's last lines pass, it may exit by itself)."""
        self._events.post(StopRequest(reason, int(exit_code), kill, after_s))

    def request_restart(self, command: EngineCommand, reason: str = "retune") -> None:
        """Stop the engine gracefully, then start ``command`` (ignored once stopping)."""
        self._events.post(RestartRequest(command, reason))

    def mark_ready(self, status: str | None = None) -> None:
        """Declare the engine serving: READY=1 (+ STATUS) to systemd, write the ready file."""
        self._events.post(MarkReady(status))

    def mark_event(self, name: str) -> None:
        """Record that a watched event happened, disarming its watch timeout."""
        self._events.post(MarkEvent(name))

    @property
    def own_stream(self) -> OwnStream:
        """Where our own log lines go: behind the engine's stderr lines while the loop runs."""
        return self._streams.own_stream

    def status(self, text: str) -> None:
        """Show ``text`` in ``systemctl status`` (STATUS=); thread-safe, never raises."""
        self._keepalive.status(text)

    def set_status_line(self, text: Callable[[], str] | None) -> None:
        """Show ``text()`` as a live line on stderr below the engine's output (a terminal only:
        the caller decides), or take it away with None. Call from the loop's thread or before run."""
        self._streams.set_status_line(text)

    def run(self) -> SupervisorOutcome:
        """Start the engine and supervise it (and its restarts) until it is gone.

        Raises:
            EngineSpawnError: the engine could not be started.
        """
        if self._state is not State.NEW:
            raise RuntimeError("Supervisor.run() may be called only once")
        self._ready_file.remove()  # a stale file from a crashed run must not pass a probe
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()  # our own buffered text goes out before the engine's bytes
        self._events.open()
        self._selector.register(self._events.read_fd, selectors.EVENT_READ, None)
        self._streams.open(lambda: self._events.post(OutputDrained()))  # called from the writer threads
        try:
            with self._signals():
                stopsignals.supervised()  # a stop signal from now on is ours to handle
                for name in stopsignals.take_noted():
                    log.warning("signal ignored: it does not stop safe-serve", signal=name)
                self._state = State.RUNNING
                self._spawn(self._command)
                while self._state is not State.FINISHED:
                    self._pump_io(self._next_timeout(time.monotonic()))
                    self._drain_events()
                    self._reconcile(time.monotonic())
                self._flush_output()
        except BaseException:
            self._abandon()
            raise
        finally:
            self._close()
        assert self._outcome is not None
        return self._outcome

    # ------------------------------------------------------------------ loop steps

    def _pump_io(self, timeout: float) -> None:
        for key, _mask in self._selector.select(timeout):
            if key.data is None:
                self._events.drain_pipe()
                continue
            try:
                chunk = os.read(key.fd, READ_CHUNK)
            except OSError:
                chunk = b""
            if chunk:
                key.data.feed(chunk)
                if self._state is State.RUNNING and getattr(key.data.out, "full", False):
                    self._streams.pause(key.fd, key.data, self._selector)
            else:
                self._close_pipe(key.fd)

    def _drain_events(self) -> None:
        while (event := self._events.pop()) is not None:
            if isinstance(event, int):
                self._signal_table[event](event)
            else:
                self._request_table[type(event)](event)

    def _reconcile(self, now: float) -> None:
        """Every tick: reap, flush stale partial lines, deadlines, keep-alives, end of engine."""
        self._reap()
        engine = self._current()
        for pump, _file in engine.pipes.values():
            if pump.pending_since is not None and now - pump.pending_since >= PARTIAL_FLUSH_AFTER_S:
                pump.flush_partial()
        if engine.returncode is None:
            self._reconcile_running(engine, now)
        else:
            self._reconcile_exited(engine, now)

    def _reconcile_running(self, engine: Engine, now: float) -> None:
        if self._stop.term_at is not None and now >= self._stop.term_at:
            self._stop.term_at = None
            self._begin_stop(signal.SIGTERM, State.STOPPING)
        if self._stop.deadline is not None and now >= self._stop.deadline:
            self._escalate(f"the engine did not stop within the {self._opts.grace_s:g} s grace period")
        self._check_watches(now)
        alive = self._liveness.passing(now) and engine.phase is Phase.READY and self._state is State.RUNNING
        self._keepalive.tick(now, loading=self._state is not State.STOPPING, alive=alive)

    def _reconcile_exited(self, engine: Engine, now: float) -> None:
        """The engine is reaped: clear its group, read what is left in its pipes, then finish."""
        if self._drain_deadline is None:
            if engine.kill_stragglers():
                log.warning("killed processes left in the engine's process group", pgid=engine.pgid)
            self._drain_deadline = now + DRAIN_AFTER_EXIT_S
            self._drain_limit = now + DRAIN_AFTER_EXIT_S + self._flush_budget_s()
        if self._streams.paused and self._drain_limit is not None:
            # a slow reader, not a process outliving the group, keeps the pipes open
            self._drain_deadline = min(max(self._drain_deadline, now + DRAIN_AFTER_EXIT_S), self._drain_limit)
        if engine.pipes and now < self._drain_deadline:
            return
        if engine.pipes:
            log.warning("engine output pipes still open after its exit; closing them", pgid=engine.pgid)
        self._finish_engine(engine)

    def _next_timeout(self, now: float) -> float:
        deadlines = [now + TICK_S, *self._watch_deadlines.values()]
        for candidate in (self._stop.deadline, self._stop.term_at, self._drain_deadline):
            if candidate is not None:
                deadlines.append(candidate)
        deadlines.extend(self._keepalive.deadlines())
        for pump, _file in self._current().pipes.values():
            if pump.pending_since is not None:
                deadlines.append(pump.pending_since + PARTIAL_FLUSH_AFTER_S)
        return max(0.0, min(deadlines) - now)

    def _reap(self) -> None:
        """Collect exit statuses: the engine's, and every orphan's when we are PID 1."""
        engine = self._current()
        while self._reap_all or engine.returncode is None:
            try:
                pid, status = os.waitpid(-1 if self._reap_all else engine.pid, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == engine.pid:
                engine.record_exit(status)
                log.info("engine exited", pid=pid, returncode=engine.returncode)
            else:
                log.debug("reaped an orphaned process", pid=pid)

    def _check_watches(self, now: float) -> None:
        if self._state is not State.RUNNING:
            return
        for name, deadline in list(self._watch_deadlines.items()):
            if now >= deadline:
                del self._watch_deadlines[name]
                log.warning("watched event did not happen in time", watch=name)
                if self._on_watch_timeout is not None:
                    self._on_watch_timeout(name)

    def _on_output_drained(self, _event: OutputDrained) -> None:
        self._streams.resume_drained(self._selector)

    def _flush_budget_s(self) -> float:
        asked = self._stop.signal is not None or self._stop.request is not None
        return self._opts.stop_flush_s if asked else self._opts.output_flush_s

    def _flush_output(self) -> None:
        """What is queued goes out, within the same bound as the drain (from the engine's exit)."""
        limit = self._drain_limit if self._drain_limit is not None else time.monotonic() + self._flush_budget_s()
        self._streams.flush(max(limit - time.monotonic(), 0.0))

    # ------------------------------------------------------------------ dispatch targets

    def _on_stop_signal(self, signum: int) -> None:
        """SIGTERM, SIGHUP, SIGQUIT, a first SIGINT: forward to the engine's group and stop."""
        if self._state is State.FINISHED:
            return
        log.info("forwarding signal to the engine's process group", signal=signal_name(signum), pgid=self.engine_pid)
        if self._stop.signal is None:
            self._stop.signal = signum
        self._stop.term_at = None
        self._begin_stop(signum, State.STOPPING)

    def _on_sigint(self, signum: int) -> None:
        """A second SIGINT (impatient Ctrl-C) kills the engine's group at once."""
        self._stop.sigints += 1
        if self._stop.sigints >= 2 and self._state is State.STOPPING:
            self._escalate("second SIGINT")
        else:
            self._on_stop_signal(signum)

    def _on_not_a_stop(self, signum: int) -> None:
        """SIGUSR1, SIGUSR2, SIGALRM: their default action would end us silently; said and ignored."""
        log.warning("signal ignored: it does not stop safe-serve", signal=signal_name(signum))

    def _on_sigchld(self, signum: int) -> None:
        self._reap()

    def _on_stop_request(self, request: StopRequest) -> None:
        if self._state is State.FINISHED:
            return
        log.warning("stopping the engine", reason=request.reason, exit_code=request.exit_code)
        if self._stop.request is None:
            self._stop.request = (request.reason, request.exit_code)
        if request.after_s > 0 and not request.kill and self._stop.deadline is None:
            self._pending_restart = None
            self._state = State.STOPPING
            if self._stop.term_at is None:
                self._stop.term_at = time.monotonic() + request.after_s
            return
        self._begin_stop(signal.SIGTERM, State.STOPPING)
        if request.kill:
            self._escalate(request.reason)

    def _on_restart_request(self, request: RestartRequest) -> None:
        if self._state not in (State.RUNNING, State.RESTARTING):
            log.info("restart ignored: already stopping", reason=request.reason)
            return
        self._pending_restart = request.command
        if self._state is State.RUNNING:
            log.info("restarting the engine", reason=request.reason)
            self._ready_file.remove()
            self._begin_stop(signal.SIGTERM, State.RESTARTING)

    def _on_mark_ready(self, request: MarkReady) -> None:
        engine = self._current()
        if self._state is not State.RUNNING or engine.returncode is not None or engine.phase is Phase.READY:
            return
        engine.phase = Phase.READY
        self._ready_file.write(engine.pid)
        self._keepalive.ready(request.status or f"engine ready (pid {engine.pid})", time.monotonic())
        log.info("engine ready", pid=engine.pid)

    def _on_mark_event(self, request: MarkEvent) -> None:
        self._watch_deadlines.pop(request.name, None)

    def _on_healthy(self, event: Healthy) -> None:
        engine = self._current()
        if event.generation != engine.generation or self._state is not State.RUNNING:
            return
        engine.phase = max(engine.phase, Phase.HEALTHY)
        self._liveness.healthy(time.monotonic())
        if self._on_ready is not None:
            self._on_ready()
        else:
            self.mark_ready()

    def _on_health_result(self, event: HealthResult) -> None:
        engine = self._current()
        if event.generation != engine.generation or self._state is not State.RUNNING:
            return
        why = self._liveness.result(event.healthy, time.monotonic())
        if why is not None:
            self.request_stop(why, self._opts.liveness_exit_code)

    # ------------------------------------------------------------------ stopping

    def _begin_stop(self, signum: int, state: State) -> None:
        # A paused engine blocks in its own write and could not shut down: while it stops, its
        # output is read beyond the bound (what it writes in the grace period), still not dropped.
        self._streams.resume_all(self._selector)
        if state is State.STOPPING:
            self._pending_restart = None  # stopping wins over a restart in progress
        self._state = state
        if self._stop.deadline is None:
            self._stop.deadline = time.monotonic() + self._opts.grace_s
        if signum in STOP_SIGNALS_CLEAN:
            self._stop.forwarded.add(signum)
        self._current().signal_group(signum)
        if state is State.STOPPING:
            self._keepalive.stopping(self._opts.grace_s + DRAIN_AFTER_EXIT_S + self._opts.stop_flush_s + 5.0)
        elif state is State.RESTARTING:
            self._keepalive.restarting()

    def _escalate(self, reason: str) -> None:
        engine = self._current()
        if self._stop.escalation is None and engine.returncode is None:
            self._stop.escalation = reason
            log.error("killing the engine's process group", reason=reason, pgid=engine.pgid)
            engine.signal_group(signal.SIGKILL)

    def _finish_engine(self, engine: Engine) -> None:
        """The engine is reaped and drained: restart it or decide the outcome."""
        for fd in list(engine.pipes):
            self._close_pipe(fd)
        self._stop_health()
        if engine.guard is not None:
            engine.guard.disarm()
        self._ready_file.remove()
        assert engine.returncode is not None
        if self._state is State.RUNNING and self._on_exit is not None:
            self._on_exit(engine.returncode)
        self._drain_events()  # requests made by the last lines or by on_exit
        if self._state is State.RESTARTING and self._pending_restart is not None:
            command, self._pending_restart = self._pending_restart, None
            self._restarts += 1
            self._state = State.RUNNING
            self._spawn(command)
            return
        self._outcome = decide_outcome(engine.returncode, engine.phase, self._restarts, self._stop)
        self._state = State.FINISHED

    def _abandon(self) -> None:
        """After an unexpected exception: stop the group without the loop, briefly."""
        if self._engine is not None:
            self._engine.stop_now(min(self._opts.grace_s, 5.0))

    # ------------------------------------------------------------------ plumbing

    def _current(self) -> Engine:
        assert self._engine is not None, "no engine started yet"
        return self._engine

    def _spawn(self, command: EngineCommand) -> None:
        popen = spawn_engine(command)
        self._generation += 1
        guard = None
        if self._opts.group_guard:
            try:
                guard = GroupGuard(popen.pid)
            except OSError as exc:
                log.warning("no group guard: engine children may outlive a SIGKILLed safe-serve", error=str(exc))
        engine = Engine(command, popen, guard, self._generation)
        self._streams.attach(engine, self._selector, self._on_line, self._opts.max_line_bytes, self._opts.line_filter)
        self._engine = engine
        now = time.monotonic()
        self._stop = StopBook()
        self._drain_deadline = self._drain_limit = None
        self._liveness.reset()
        self._watch_deadlines = {name: now + seconds for name, seconds in self._opts.watch_timeouts_s.items()}
        if self._opts.health is not None:  # the poller's thread only enqueues
            generation = self._generation
            self._health = HealthPoller(self._opts.health, lambda: self._events.post(Healthy(generation)),
                                        lambda healthy: self._events.post(HealthResult(generation, healthy)))
            self._health.start()
        log.info("engine started", pid=popen.pid, argv=list(command.shown or command.argv), restarts=self._restarts)
        self._keepalive.starting(popen.pid, now)

    def _close_pipe(self, fd: int, *, hook: bool = True) -> None:
        self._streams.detach(self._current(), fd, self._selector, hook=hook)

    def _stop_health(self) -> None:
        if self._health is not None:
            self._health.stop()
            self._health = None

    def _signals(self) -> AbstractContextManager[None]:
        if not self._opts.handle_signals:
            return nullcontext()
        return installed_signal_handlers(self._signal_table, self._handle_signal, self._events.write_fd)

    def _handle_signal(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: enqueue only (NO LOGGING); the C-level handler already woke us."""
        self._events.put_signal(signum)

    def _close(self) -> None:
        self._stop_health()
        if self._engine is not None:
            for fd in list(self._engine.pipes):  # only after an exception: no more hook calls
                self._close_pipe(fd, hook=False)
            if self._engine.guard is not None:
                self._engine.guard.disarm()
        self._ready_file.remove()
        self._keepalive.close()
        self._streams.close(min(1.0, self._opts.output_flush_s))  # after an exception: what was read still goes out
        self._selector.close()
        self._events.close()

