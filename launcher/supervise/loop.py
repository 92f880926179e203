"""The supervision loop: one engine (and its restarts), from spawn to outcome.

The shape is gunicorn's arbiter, cut down to one child: signal handlers only enqueue, one loop
waits on the engine's pipes and a wake-up fd, dispatches queued events through explicit
tables, then runs reconcile steps every tick (reap, deadlines, systemd keep-alives).
Exit-code rules: ``outcome``; the process and its group guard: ``process``; output: ``output``.
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

from launcher.common.errors import ExitCode
from launcher.supervise import sdnotify
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
from launcher.supervise.outcome import (
    STOP_SIGNALS_CLEAN,
    Phase,
    State,
    StopBook,
    SupervisorOutcome,
    decide_outcome,
    signal_name,
)
from launcher.supervise.output import (
    MAX_LINE_BYTES,
    PARTIAL_FLUSH_AFTER_S,
    LineHook,
    QueuedWriter,
    StatusLine,
    StreamPump,
)
from launcher.supervise.process import Engine, EngineCommand, GroupGuard, grow_pipe, spawn_engine
from launcher.supervise.readiness import HealthCheck, HealthPoller, ReadyFile

log = structlog.get_logger("safe_serve.supervisor")

READ_CHUNK = 1 << 20  # bytes per os.read
DRAIN_AFTER_EXIT_S = 2.0  # how long to read pipes that outlive the engine's group
TICK_S = 1.0  # reconcile steps run at least this often
EXTEND_EVERY_S = 10.0  # while loading, tell systemd every 10 s ...
EXTEND_BY_S = 30.0  # ... to wait 30 s more (a lost datagram still leaves 20 s of slack)
MIN_WATCHDOG_EVERY_S = 0.5  # a tiny WATCHDOG_USEC must not make the loop spin


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
    output_flush_s: float = 30.0  # at exit, how long a stalled reader may keep us waiting


class OwnStream:
    """A text stream for our own log lines that queues behind the engine's stderr lines while
    the loop runs (never blocking on a stalled reader), and writes to ``fallback`` otherwise."""

    def __init__(self, fallback: Any) -> None:
        self.fallback = fallback
        self.writer: QueuedWriter | None = None

    def write(self, text: str) -> int:
        writer = self.writer
        if writer is None:
            return int(self.fallback.write(text))
        writer.write(text.encode("utf-8", errors="replace"))
        return len(text)

    def flush(self) -> None:
        if self.writer is None:
            self.fallback.flush()


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
        self._health_failures = 0
        self._stop = StopBook()
        self._pending_restart: EngineCommand | None = None
        self._drain_deadline: float | None = None
        self._drain_limit: float | None = None
        self._watch_deadlines: dict[str, float] = {}
        self._next_extend: float | None = None
        watchdog = sdnotify.watchdog_interval_s(self._opts.notify_env)
        self._watchdog_every = max(watchdog, MIN_WATCHDOG_EVERY_S) if watchdog is not None else None
        self._next_watchdog: float | None = None
        self._stopping_sent = False
        self._outcome: SupervisorOutcome | None = None
        self._writers: dict[str, QueuedWriter] = {}
        self._paused: dict[int, StreamPump] = {}  # engine pipes not read while their writer is full
        self._paused_said = False
        self.own_stream = OwnStream(sys.stderr)
        self._status_text: Callable[[], str] | None = None
        self._status_line: StatusLine | None = None
        self._signal_table: dict[int, Callable[[int], None]] = {
            signal.SIGTERM: self._on_stop_signal,
            signal.SIGHUP: self._on_stop_signal,
            signal.SIGQUIT: self._on_stop_signal,
            signal.SIGINT: self._on_sigint,
            signal.SIGCHLD: self._on_sigchld,
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

    def status(self, text: str) -> None:
        """Show ``text`` in ``systemctl status`` (STATUS=); thread-safe, never raises."""
        self._notify(f"STATUS={_one_line(text)}")

    def set_status_line(self, text: Callable[[], str] | None) -> None:
        """Show ``text()`` as a live line on stderr below the engine's output (a terminal only:
        the caller decides), or take it away with None. Call from the loop's thread or before run."""
        self._status_text = text
        if self._writers:
            self._attach_status()

    def _attach_status(self) -> None:
        if self._status_line is not None:
            for writer in self._writers.values():
                writer.status = None
            self._status_line.close()
            self._status_line = None
        if self._status_text is not None:
            self._status_line = StatusLine(self._opts.stderr_fd, self._status_text)
            for writer in self._writers.values():
                writer.status = self._status_line
            self._status_line.show()

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
        drained = lambda: self._events.post(OutputDrained())  # noqa: E731  # from the writer threads
        self._writers = {"stdout": QueuedWriter(self._opts.stdout_fd, "stdout", drained),
                         "stderr": QueuedWriter(self._opts.stderr_fd, "stderr", drained)}
        self.own_stream.writer = self._writers["stderr"]
        if self._status_text is not None:
            self._attach_status()
        try:
            with self._signals():
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
                    self._pause(key.fd, key.data)
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
            if self._stop.term_at is not None and now >= self._stop.term_at:
                self._stop.term_at = None
                self._begin_stop(signal.SIGTERM, State.STOPPING)
            if self._stop.deadline is not None and now >= self._stop.deadline:
                self._escalate(f"the engine did not stop within the {self._opts.grace_s:g} s grace period")
            self._check_watches(now)
            if self._next_extend is not None and now >= self._next_extend and self._state is not State.STOPPING:
                self._notify(f"EXTEND_TIMEOUT_USEC={int(self._opts.extend_by_s * 1e6)}")
                self._next_extend = now + self._opts.extend_every_s
            if self._next_watchdog is not None and now >= self._next_watchdog and self._watchdog_every is not None:
                if self._health_failures == 0 and engine.phase is Phase.READY and self._state is State.RUNNING:
                    self._notify("WATCHDOG=1")
                self._next_watchdog = now + self._watchdog_every
            return
        if self._drain_deadline is None:  # just reaped: clear the group, then read what is left
            if engine.kill_stragglers():
                log.warning("killed processes left in the engine's process group", pgid=engine.pgid)
            self._drain_deadline = now + DRAIN_AFTER_EXIT_S
            self._drain_limit = now + DRAIN_AFTER_EXIT_S + self._opts.output_flush_s
        if self._paused and self._drain_limit is not None:
            # a slow reader, not a process outliving the group, keeps the pipes open
            self._drain_deadline = min(max(self._drain_deadline, now + DRAIN_AFTER_EXIT_S), self._drain_limit)
        if engine.pipes and now < self._drain_deadline:
            return
        if engine.pipes:
            log.warning("engine output pipes still open after its exit; closing them", pgid=engine.pgid)
        self._finish_engine(engine)

    def _next_timeout(self, now: float) -> float:
        deadlines = [now + TICK_S, *self._watch_deadlines.values()]
        for candidate in (self._stop.deadline, self._stop.term_at, self._drain_deadline, self._next_extend,
                          self._next_watchdog):
            if candidate is not None:
                deadlines.append(candidate)
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

    # ------------------------------------------------------------------ back-pressure

    def _pause(self, fd: int, pump: StreamPump) -> None:
        if fd in self._paused:
            return
        self._selector.unregister(fd)
        self._paused[fd] = pump
        if not self._paused_said:
            self._paused_said = True
            log.warning("our output is not being read: pausing the engine's output until it is "
                        "(back-pressure; nothing is dropped)", stream=pump.name,
                        buffered_bytes=getattr(pump.out, "queued", None))

    def _resume_all(self) -> None:
        for fd, pump in list(self._paused.items()):
            del self._paused[fd]
            self._selector.register(fd, selectors.EVENT_READ, pump)

    def _on_output_drained(self, _event: OutputDrained) -> None:
        for fd, pump in list(self._paused.items()):
            if not getattr(pump.out, "full", False) or pump.out.broken:
                del self._paused[fd]
                self._selector.register(fd, selectors.EVENT_READ, pump)

    def _flush_output(self) -> None:
        deadline = time.monotonic() + self._opts.output_flush_s
        for writer in self._writers.values():
            writer.flush(max(deadline - time.monotonic(), 0.0))

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
        self._next_extend = None
        self._ready_file.write(engine.pid)
        self._notify(f"READY=1\nSTATUS={_one_line(request.status or f'engine ready (pid {engine.pid})')}")
        if self._watchdog_every is not None:
            self._next_watchdog = time.monotonic()
        log.info("engine ready", pid=engine.pid)

    def _on_mark_event(self, request: MarkEvent) -> None:
        self._watch_deadlines.pop(request.name, None)

    def _on_healthy(self, event: Healthy) -> None:
        engine = self._current()
        if event.generation != engine.generation or self._state is not State.RUNNING:
            return
        engine.phase = max(engine.phase, Phase.HEALTHY)
        if self._on_ready is not None:
            self._on_ready()
        else:
            self.mark_ready()

    def _on_health_result(self, event: HealthResult) -> None:
        engine, check = self._current(), self._opts.health
        if event.generation != engine.generation or self._state is not State.RUNNING or check is None:
            return
        if event.healthy:
            if self._health_failures:
                log.info("engine health answers again", failures=self._health_failures)
            self._health_failures = 0
            return
        self._health_failures += 1
        log.warning("engine health check failed", url=check.url, failures=self._health_failures, limit=check.failures)
        if check.failures > 0 and self._health_failures >= check.failures:
            self.request_stop(f"the engine's {check.path} failed {self._health_failures} times in a row",
                              self._opts.liveness_exit_code)

    # ------------------------------------------------------------------ stopping

    def _begin_stop(self, signum: int, state: State) -> None:
        # A paused engine blocks in its own write and could not shut down: while it stops, its
        # output is read beyond the bound (what it writes in the grace period), still not dropped.
        self._resume_all()
        if state is State.STOPPING:
            self._pending_restart = None  # stopping wins over a restart in progress
        self._state = state
        if self._stop.deadline is None:
            self._stop.deadline = time.monotonic() + self._opts.grace_s
        if signum in STOP_SIGNALS_CLEAN:
            self._stop.forwarded.add(signum)
        self._current().signal_group(signum)
        if state is State.STOPPING and not self._stopping_sent:
            self._stopping_sent = True
            extend_us = int((self._opts.grace_s + DRAIN_AFTER_EXIT_S + 5.0) * 1e6)
            self._notify(f"STOPPING=1\nSTATUS=stopping the engine\nEXTEND_TIMEOUT_USEC={extend_us}")
        elif state is State.RESTARTING:
            self.status("restarting the engine")

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
        engine = self._engine
        if engine is None or engine.returncode is not None:
            return
        engine.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + min(self._opts.grace_s, 5.0)
        while engine.returncode is None:
            late = time.monotonic() >= deadline
            if late:
                engine.signal_group(signal.SIGKILL)
            try:
                pid, status = os.waitpid(engine.pid, 0 if late else os.WNOHANG)
            except ChildProcessError:
                return  # reaped elsewhere; nothing left to wait for
            if pid:
                engine.record_exit(status)
            else:
                time.sleep(0.05)
        engine.kill_stragglers()

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
        for name, fileobj in (("stdout", popen.stdout), ("stderr", popen.stderr)):
            assert fileobj is not None
            pump = StreamPump(name, self._writers[name], self._on_line, self._opts.max_line_bytes,
                              self._opts.line_filter)
            grow_pipe(fileobj.fileno())
            engine.pipes[fileobj.fileno()] = (pump, fileobj)
            self._selector.register(fileobj.fileno(), selectors.EVENT_READ, pump)
        self._engine = engine
        now = time.monotonic()
        self._stop = StopBook()
        self._drain_deadline = self._drain_limit = None
        self._health_failures = 0
        self._next_watchdog = None
        self._watch_deadlines = {name: now + seconds for name, seconds in self._opts.watch_timeouts_s.items()}
        self._next_extend = now
        if self._opts.health is not None:
            generation = self._generation
            first = [True]

            def on_result(healthy: bool) -> None:  # the poller's thread: enqueue only
                if first[0]:
                    first[0] = False
                    self._events.post(Healthy(generation))
                else:
                    self._events.post(HealthResult(generation, healthy))

            self._health = HealthPoller(self._opts.health, on_result)
            self._health.start()
        log.info("engine started", pid=popen.pid, argv=list(command.argv), restarts=self._restarts)
        self.status(f"engine starting (pid {popen.pid})")

    def _close_pipe(self, fd: int, *, hook: bool = True) -> None:
        pump, fileobj = self._current().pipes.pop(fd)
        if self._paused.pop(fd, None) is None:
            self._selector.unregister(fd)
        fileobj.close()
        if not hook:
            pump.on_line = None
        pump.close()

    def _stop_health(self) -> None:
        if self._health is not None:
            self._health.stop()
            self._health = None

    def _notify(self, state: str) -> None:
        sdnotify.notify(state, self._opts.notify_env)

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
        if not self._stopping_sent:
            self._stopping_sent = True
            self._notify("STOPPING=1")
        self.own_stream.writer = None
        self._status_text = None
        self._attach_status()
        for writer in self._writers.values():  # after an exception: what was read still goes out
            writer.flush(min(1.0, self._opts.output_flush_s))
        dropped = {name: writer.close() for name, writer in self._writers.items()}
        if any(dropped.values()):
            log.warning("engine output dropped: our output was not read in time",
                        **{f"{name}_bytes": count for name, count in dropped.items() if count})
        self._selector.close()
        self._events.close()


def _one_line(text: str) -> str:
    return " ".join(text.split())
