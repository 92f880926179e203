"""The supervision loop: one engine (and its restarts), from spawn to outcome.

The shape is gunicorn's arbiter, cut down to one child: signal handlers only enqueue, one loop
waits on the engine's pipes and a wake-up fd, dispatches queued events through explicit
tables, then runs reconcile steps every tick (reap, deadlines, systemd keep-alives). This
module holds the states (``State``: NEW, RUNNING, RESTARTING, STOPPING, FINISHED), the
dispatch tables and their targets; how each step is done lives beside it: the tunables in
``options``, the inbox and signal handlers in ``events``, spawning and reaping in ``process``,
SIGTERM/grace/SIGKILL and the drain after exit in ``stopping``, exit-code rules in
``outcome``, output in ``output`` and ``streams``, systemd in ``keepalive``, health, liveness
and watches in ``readiness``.
"""

from __future__ import annotations

import os
import selectors
import signal
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import structlog

from launcher.common import stopsignals
from launcher.supervise.events import (
    Controls,
    HealthResult,
    Healthy,
    MarkEvent,
    MarkReady,
    OutputDrained,
    RestartRequest,
    StopRequest,
)
from launcher.supervise.keepalive import KeepAlive
from launcher.supervise.options import SupervisorOptions
from launcher.supervise.outcome import Phase, State, SupervisorOutcome, decide_outcome, signal_name
from launcher.supervise.output import LineHook
from launcher.supervise.process import Engine, EngineCommand, reap, start_engine
from launcher.supervise.readiness import Health, ReadyFile, Watches
from launcher.supervise.stopping import Stopper
from launcher.supervise.streams import OwnStream, Streams

log = structlog.get_logger("safe_serve.supervisor")

TICK_S = 1.0  # reconcile steps run at least this often


class Supervisor(Controls):
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
    * ``on_state(state)``: the loop changed state, each change once and in order, before the
      new state's first action (SIGTERM to the group, the next spawn).

    After the first 200, with ``HealthCheck.live_interval_s`` set, ``health.failures`` failed
    probes in a row stop the engine with ``liveness_exit_code``; while the probes pass and
    systemd set ``WATCHDOG_USEC``, ``WATCHDOG=1`` goes out every half period.

    The control methods (:meth:`request_stop`, :meth:`request_restart`, :meth:`mark_ready`,
    :meth:`mark_event`, from ``events.Controls``) only enqueue; they may be called from any
    thread or hook.
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
        on_state: Callable[[State], None] | None = None,
    ) -> None:
        super().__init__()  # the inbox the control methods post to
        self._command = command
        self._opts = options or SupervisorOptions()
        self._on_line = on_line
        self._on_ready = on_ready
        self._on_watch_timeout = on_watch_timeout
        self._on_exit = on_exit
        self._on_state = on_state
        self._state = State.NEW
        self._engine: Engine | None = None
        self._generation = 0
        self._restarts = 0
        self._reap_all = os.getpid() == 1 if self._opts.reap_orphans is None else self._opts.reap_orphans
        self._selector = selectors.DefaultSelector()
        self._ready_file = ReadyFile(self._opts.ready_file)
        self._health = Health(self._opts.health, self._events.post)
        self._stopper = Stopper(self._opts)
        self._pending_restart: EngineCommand | None = None
        self._watches = Watches(self._opts.watch_timeouts_s)
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
                self._enter(State.RUNNING)
                self._spawn(self._command)
                while self.state is not State.FINISHED:  # the property: mypy keeps self._state narrowed to NEW
                    self._pump_io(self._next_timeout(time.monotonic()))
                    self._drain_events()
                    self._reconcile(time.monotonic())
                self._streams.flush(self._stopper.flush_left_s())  # within the drain's bound, from the engine's exit
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
            elif not self._streams.read(key.fd, key.data, self._selector, may_pause=self._state is State.RUNNING):
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
        self._streams.flush_stale_partials(engine, now)
        if engine.returncode is None:
            self._reconcile_running(engine, now)
        elif self._stopper.drained(engine, now, reader_stalled=bool(self._streams.paused)):
            self._finish_engine(engine)

    def _reconcile_running(self, engine: Engine, now: float) -> None:
        if self._stopper.term_due(now):
            self._begin_stop(signal.SIGTERM, State.STOPPING)
        if self._stopper.grace_over(now):
            self._escalate(f"the engine did not stop within the {self._opts.grace_s:g} s grace period")
        if self._state is State.RUNNING:
            for name in self._watches.missed(now):
                log.warning("watched event did not happen in time", watch=name)
                if self._on_watch_timeout is not None:
                    self._on_watch_timeout(name)
        alive = self._health.liveness.passing(now) and engine.phase is Phase.READY and self._state is State.RUNNING
        self._keepalive.tick(now, loading=self._state is not State.STOPPING, alive=alive)

    def _next_timeout(self, now: float) -> float:
        deadlines = [now + TICK_S, *self._watches.deadlines(), *self._stopper.deadlines(),
                     *self._keepalive.deadlines(), *self._streams.partial_deadlines(self._current())]
        return max(0.0, min(deadlines) - now)

    def _reap(self) -> None:
        reap(self._current(), every_child=self._reap_all)

    # ------------------------------------------------------------------ dispatch targets

    def _on_stop_signal(self, signum: int) -> None:
        """SIGTERM, SIGHUP, SIGQUIT, a first SIGINT: forward to the engine's group and stop."""
        if self._state is State.FINISHED:
            return
        log.info("forwarding signal to the engine's process group", signal=signal_name(signum), pgid=self.engine_pid)
        self._stopper.stop_signal(signum)
        self._begin_stop(signum, State.STOPPING)

    def _on_sigint(self, signum: int) -> None:
        """A second SIGINT (impatient Ctrl-C) kills the engine's group at once."""
        if self._stopper.sigint() >= 2 and self._state is State.STOPPING:
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
        self._stopper.request(request.reason, request.exit_code)
        if request.after_s > 0 and not request.kill and not self._stopper.group_signalled:
            self._pending_restart = None
            self._enter(State.STOPPING)
            self._stopper.term_later(request.after_s)
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
        self._watches.mark(request.name)

    def _on_healthy(self, event: Healthy) -> None:
        engine = self._current()
        if event.generation != engine.generation or self._state is not State.RUNNING:
            return
        engine.phase = max(engine.phase, Phase.HEALTHY)
        self._health.liveness.healthy(time.monotonic())
        if self._on_ready is not None:
            self._on_ready()
        else:
            self.mark_ready()

    def _on_health_result(self, event: HealthResult) -> None:
        engine = self._current()
        if event.generation != engine.generation or self._state is not State.RUNNING:
            return
        why = self._health.liveness.result(event.healthy, time.monotonic())
        if why is not None:
            self.request_stop(why, self._opts.liveness_exit_code)

    def _on_output_drained(self, _event: OutputDrained) -> None:
        self._streams.resume_drained(self._selector)

    # ------------------------------------------------------------------ transitions

    def _enter(self, state: State) -> None:
        if state is not self._state:  # a second stop signal while stopping is no change
            self._state = state
            if self._on_state is not None:
                self._on_state(state)

    def _begin_stop(self, signum: int, state: State) -> None:
        # A paused engine blocks in its own write and could not shut down: while it stops, its
        # output is read beyond the bound (what it writes in the grace period), still not dropped.
        self._streams.resume_all(self._selector)
        if state is State.STOPPING:
            self._pending_restart = None  # stopping wins over a restart in progress
        self._enter(state)
        self._stopper.signal_group(self._current(), signum)
        if state is State.STOPPING:
            self._keepalive.stopping(self._opts.stopping_covers_s)
        elif state is State.RESTARTING:
            self._keepalive.restarting()

    def _escalate(self, reason: str) -> None:
        self._stopper.kill(self._current(), reason)

    def _finish_engine(self, engine: Engine) -> None:
        """The engine is reaped and drained: restart it or decide the outcome."""
        self._release(engine, hook=True)
        self._ready_file.remove()
        assert engine.returncode is not None
        if self._state is State.RUNNING and self._on_exit is not None:
            self._on_exit(engine.returncode)
        self._drain_events()  # requests made by the last lines or by on_exit
        if self._state is State.RESTARTING and self._pending_restart is not None:
            command, self._pending_restart = self._pending_restart, None
            self._restarts += 1
            self._enter(State.RUNNING)
            self._spawn(command)
            return
        self._outcome = decide_outcome(engine.returncode, engine.phase, self._restarts, self._stopper.book)
        self._enter(State.FINISHED)

    def _spawn(self, command: EngineCommand) -> None:
        """Start engine number ``generation + 1``; everything kept per engine starts afresh."""
        engine = start_engine(command, self._generation + 1, group_guard=self._opts.group_guard)
        self._generation = engine.generation
        self._streams.attach(engine, self._selector, self._on_line, self._opts.max_line_bytes, self._opts.line_filter)
        self._engine = engine
        now = time.monotonic()
        self._stopper.reset()
        self._watches.arm(now)
        self._health.start(engine.generation)
        log.info("engine started", pid=engine.pid, argv=list(command.shown or command.argv), restarts=self._restarts)
        self._keepalive.starting(engine.pid, now)

    def _abandon(self) -> None:
        """After an unexpected exception: stop the group without the loop, briefly."""
        if self._engine is not None:
            self._engine.stop_now(min(self._opts.grace_s, 5.0))

    # ------------------------------------------------------------------ plumbing

    def _current(self) -> Engine:
        assert self._engine is not None, "no engine started yet"
        return self._engine

    def _close_pipe(self, fd: int, *, hook: bool = True) -> None:
        self._streams.detach(self._current(), fd, self._selector, hook=hook)

    def _release(self, engine: Engine, *, hook: bool) -> None:
        """Let go of what an engine held: its pipes (with ``hook``, the line hook sees their last
        lines), its health poller, its guard."""
        for fd in list(engine.pipes):
            self._close_pipe(fd, hook=hook)
        self._health.stop()
        if engine.guard is not None:
            engine.guard.disarm()

    def _signals(self) -> AbstractContextManager[None]:
        if not self._opts.handle_signals:
            return nullcontext()
        return self._events.signals_queued(self._signal_table)

    def _close(self) -> None:
        if self._engine is not None:
            self._release(self._engine, hook=False)  # pipes left only after an exception: no more hook calls
        self._ready_file.remove()
        self._keepalive.close()
        self._streams.close(min(1.0, self._opts.output_flush_s))  # after an exception: what was read still goes out
        self._selector.close()
        self._events.close()
