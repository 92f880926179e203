"""Engine output: copied byte for byte to our own stdout/stderr, split into lines for a hook.

Two parts:

* ``StreamPump`` reads one engine pipe's chunks, hands each line to the hook and passes
  complete lines on to a writer (an unterminated tail is held back briefly, so our own log
  lines never land inside an engine line);
* ``QueuedWriter`` owns one destination fd and writes from its own thread, so a reader that
  stalls (a stuck log pipe, a blocking container log driver) never blocks the loop: signals,
  timers and the engine's pipes are still served. Its buffer is bounded: above
  ``HIGH_WATER_BYTES`` the loop stops reading the engine pipes that feed it (back-pressure:
  the engine waits in its own ``write``, nothing is dropped) and reads again below
  ``LOW_WATER_BYTES``. Bytes are dropped only when the destination is gone (EPIPE, closed)
  or still stalled when safe-serve exits, and then counted in one log line.

``DirectWriter`` writes synchronously (benchmarks, tests of the pump alone).
"""

from __future__ import annotations

import os
import selectors
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

log = structlog.get_logger("safe_serve.supervisor")

LineHook = Callable[[str, bytes], None]
Buffer = bytes | bytearray | memoryview

MAX_LINE_BYTES = 16 << 20  # longer lines reach on_line truncated (pass-through is never cut)
PARTIAL_FLUSH_BYTES = 64 << 10  # an unterminated line this long is written through at once
PARTIAL_FLUSH_AFTER_S = 0.2  # ... or after this long (tqdm bars end in \r, not \n)
HIGH_WATER_BYTES = 8 << 20  # buffered for a slow reader before the engine is paused
LOW_WATER_BYTES = 1 << 20  # ... and resumed below this
# Our own lines wait while an engine line longer than PARTIAL_FLUSH_BYTES (or older than
# PARTIAL_FLUSH_AFTER_S) is part-written, so that they land after it, not inside it; at most this long.
OWN_HOLD_MAX_S = 2.0


class Writer(Protocol):
    broken: bool

    def write(self, *buffers: Buffer) -> None: ...


class DirectWriter:
    """Writes at once, retrying short writes; a failing destination is dropped."""

    def __init__(self, fd: int, name: str = "stdout") -> None:
        self.fd = fd
        self.name = name
        self.broken = False

    def write(self, *buffers: Buffer) -> None:
        if self.broken:
            return
        try:
            _writev_all(self.fd, list(buffers))
        except OSError as exc:
            self.broken = True
            log.warning("engine output dropped: cannot write to our own stream", stream=self.name, error=str(exc))


class StatusLine:
    """One live status line on a terminal (stderr), kept below the engine's output: hidden
    (``\r`` + erase line) before each write to the terminal, drawn again after a write that
    ended a line, and redrawn about once a second. Only ever used when stderr is a TTY."""

    ERASE = b"\r\x1b[2K"

    def __init__(self, fd: int, text: Callable[[], str]) -> None:
        self.fd = fd
        self._text = text
        self._lock = threading.Lock()
        self._shown = False
        self._off = False

    def hide(self) -> None:
        with self._lock:
            if self._shown:
                self._shown = False
                _write_quietly(self.fd, self.ERASE)

    def show(self) -> None:
        with self._lock:
            if self._off:
                return
            try:
                text = self._text()
            except Exception:  # noqa: BLE001  # a status line must never break the output
                return
            line = text.encode("utf-8", errors="replace")
            _write_quietly(self.fd, (self.ERASE if self._shown else b"\r") + line)
            self._shown = True

    def close(self) -> None:
        self.hide()
        with self._lock:
            self._off = True


def _write_quietly(fd: int, data: bytes) -> None:
    try:
        _writev_all(fd, [data])
    except OSError:
        pass


class QueuedWriter:
    """A bounded buffer in front of one fd, drained by a writer thread (see the module docstring)."""

    def __init__(self, fd: int, name: str, on_drained: Callable[[], None] | None = None,
                 high_water: int = HIGH_WATER_BYTES, low_water: int = LOW_WATER_BYTES) -> None:
        self.fd = fd
        self.name = name
        self.broken = False
        self.dropped_bytes = 0
        self.high_water = high_water
        self.low_water = low_water
        self._on_drained = on_drained  # called from the writer thread when it falls below low water
        self._chunks: deque[bytes] = deque()
        self._queued = 0  # bytes in _chunks plus the batch being written
        self._cond = threading.Condition()
        self._closing = False
        self._over = False
        self._mid_line = False  # the engine's last bytes ended inside a line (no \n or \r yet)
        self._held: list[bytes] = []  # our own lines, waiting for that line's end
        self._held_since = 0.0
        self.status: StatusLine | None = None  # a terminal's live status line, kept below our output
        self._thread = threading.Thread(target=self._run, name=f"safe-serve-{name}", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def full(self) -> bool:
        return self._queued >= self.high_water

    def write(self, *buffers: Buffer) -> None:
        """Queue the engine's bytes (copied); never blocks on the destination."""
        data = b"".join(buffers)  # copies: the caller may reuse its buffers
        if not data:
            return
        with self._cond:
            self._mid_line = not data.endswith((b"\n", b"\r"))
            self._queue(data)
            if not self._mid_line:
                self._release_held()

    def write_own(self, data: bytes) -> None:
        """Queue one of our own lines: after the engine's part-written line ends, or OWN_HOLD_MAX_S."""
        if not data:
            return
        with self._cond:
            if self._mid_line and not self.broken and not self._closing:
                if not self._held:
                    self._held_since = time.monotonic()
                self._held.append(data)
                self._cond.notify()  # the writer thread releases them when they are due
                return
            self._queue(data)

    def _queue(self, data: bytes) -> None:
        """Under the lock: append to the queue (or count as dropped once the destination is gone)."""
        if self.broken:
            self.dropped_bytes += len(data)
            return
        self._chunks.append(data)
        self._queued += len(data)
        if self._queued >= self.high_water:
            self._over = True  # the loop pauses reading; tell it when we are below low water
        self._cond.notify()

    def _release_held(self) -> None:
        """Under the lock: our held lines go into the queue now."""
        held, self._held = self._held, []
        for data in held:
            self._queue(data)

    def _held_due(self) -> float | None:
        """Under the lock: seconds until the held lines are released anyway (None: none held)."""
        return max(self._held_since + OWN_HOLD_MAX_S - time.monotonic(), 0.0) if self._held else None

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for everything queued to be written; True when it was."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._release_held()  # flushing: nothing more of the engine's line is coming first
            while self._queued and not self.broken:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        return True

    def close(self) -> int:
        """Stop the thread (after what it is writing now); returns the bytes never written."""
        with self._cond:
            self._closing = True
            lost = self._queued if not self.broken else 0
            self.dropped_bytes += lost
            self._chunks.clear()
            self._cond.notify_all()
        return self.dropped_bytes

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._chunks and not self._closing:
                    due = self._held_due()
                    if due == 0.0:
                        self._release_held()  # the engine's line did not end in time: ours go anyway
                    elif self.status is None:
                        self._cond.wait(due)
                    elif not self._cond.wait(1.0 if due is None else min(due, 1.0)) and self.status is not None:
                        self.status.show()  # idle: keep the elapsed time moving
                if self._closing:
                    return
                batch = list(self._chunks)
                self._chunks.clear()
            status = self.status
            if status is not None:
                status.hide()
            try:
                _writev_all(self.fd, batch)
                if status is not None and batch[-1].endswith(b"\n"):
                    status.show()
            except OSError as exc:
                with self._cond:
                    self.broken = True
                    self.dropped_bytes += self._queued
                    self._queued = 0
                    self._chunks.clear()
                    self._cond.notify_all()
                log.warning("engine output dropped: cannot write to our own stream", stream=self.name,
                            error=str(exc))
                if self._on_drained is not None:
                    self._on_drained()
                return
            with self._cond:
                self._queued -= sum(len(b) for b in batch)
                resume = self._over and self._queued < self.low_water
                if resume:
                    self._over = False
                self._cond.notify_all()
            if resume and self._on_drained is not None:
                self._on_drained()


class StreamPump:
    """Copies one pipe to one fd byte for byte and hands every line to a hook.

    Complete lines are written through as soon as they are read; an unterminated tail is held
    back (so our own messages do not land inside an engine line) until its newline comes, it
    grows past ``PARTIAL_FLUSH_BYTES``, it is ``PARTIAL_FLUSH_AFTER_S`` old, or EOF.
    The hook gets each line without its ``\\n`` (a ``\\r`` stays); a last line without newline
    is handed over at EOF; lines over ``max_line_bytes`` reach the hook truncated.
    With ``needles`` the hook gets only the lines containing one of them, and chunks without
    any are never split into lines (C-speed ``bytes.find`` instead of a Python call per line).
    A failing destination (closed stdout) is dropped and the pipe is still drained.
    """

    __slots__ = (
        "carry",
        "max_line_bytes",
        "name",
        "needles",
        "on_line",
        "out",
        "pending",
        "pending_since",
    )

    def __init__(
        self,
        name: str,
        out: int | Writer,
        on_line: LineHook | None,
        max_line_bytes: int = MAX_LINE_BYTES,
        needles: tuple[bytes, ...] | None = None,
    ) -> None:
        self.name = name
        self.out: Writer = DirectWriter(out, name) if isinstance(out, int) else out
        self.on_line = on_line
        self.max_line_bytes = max_line_bytes
        self.needles = needles
        self.pending = bytearray()  # read, not yet written through
        self.pending_since: float | None = None
        self.carry = bytearray()  # start of the current line, for the hook

    def feed(self, chunk: bytes) -> None:
        """Forward one chunk read from the pipe and call the hook for each completed line."""
        end = chunk.rfind(b"\n") + 1
        if end:
            if self.pending:
                self._write(self.pending, memoryview(chunk)[:end])
                self.pending.clear()
            else:
                self._write(memoryview(chunk)[:end])
            self.pending += memoryview(chunk)[end:]
        else:
            self.pending += chunk
        if len(self.pending) >= PARTIAL_FLUSH_BYTES:
            self.flush_partial()
        elif self.pending:
            if self.pending_since is None:
                self.pending_since = time.monotonic()
        else:
            self.pending_since = None
        if self.on_line is None:
            return
        if self.needles is None:
            self._split(chunk)
        else:
            self._split_filtered(chunk, self.on_line, self.needles)

    def flush_partial(self) -> None:
        """Write the held-back unterminated tail through now."""
        if self.pending:
            self._write(self.pending)
            self.pending.clear()
        self.pending_since = None

    def close(self) -> None:
        """At EOF: write everything through and hand an unterminated last line to the hook."""
        self.flush_partial()
        if self.carry and self.on_line is not None:
            line = bytes(self.carry)
            self.carry.clear()
            if self.needles is None or _has_needle(line, self.needles):
                self.on_line(self.name, line)

    def _split(self, chunk: bytes) -> None:
        parts = chunk.split(b"\n")
        tail = parts.pop()
        if parts:
            if self.carry:
                self._extend_carry(parts[0])
                parts[0] = bytes(self.carry)
                self.carry.clear()
            on_line, name, cap = self.on_line, self.name, self.max_line_bytes
            assert on_line is not None
            if len(chunk) > cap:  # rare: a line in this chunk may need truncating
                parts = [line[:cap] for line in parts]
            for line in parts:  # the hot loop: keep it bare
                on_line(name, line)
        self._extend_carry(tail)

    def _split_filtered(self, chunk: bytes, on_line: LineHook, needles: tuple[bytes, ...]) -> None:
        first_nl = chunk.find(b"\n")
        if first_nl < 0:
            self._extend_carry(chunk)
            return
        self._extend_carry(chunk[:first_nl])  # the first line may straddle the previous chunk
        first = bytes(self.carry)
        self.carry.clear()
        if _has_needle(first, needles):
            on_line(self.name, first)
        last_nl = chunk.rfind(b"\n")
        if last_nl > first_nl and any(chunk.find(n, first_nl + 1, last_nl) >= 0 for n in needles):
            cap = self.max_line_bytes
            for line in chunk[first_nl + 1 : last_nl].split(b"\n"):
                if _has_needle(line, needles):
                    on_line(self.name, line[:cap])
        self._extend_carry(chunk[last_nl + 1 :])

    def _extend_carry(self, piece: bytes) -> None:
        room = self.max_line_bytes - len(self.carry)
        if room > 0:
            self.carry += piece[:room]

    @property
    def out_broken(self) -> bool:
        return self.out.broken

    def _write(self, *buffers: Buffer) -> None:
        self.out.write(*buffers)


def _has_needle(line: bytes, needles: tuple[bytes, ...]) -> bool:
    return any(needle in line for needle in needles)


def _writev_all(fd: int, buffers: Sequence[Buffer]) -> None:
    """Write all buffers in order, retrying short writes and waiting out a non-blocking fd."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        try:
            written = os.writev(fd, views)
        except BlockingIOError:  # our stdout was left non-blocking by whoever opened it
            _wait_writable(fd)
            continue
        while written and views:
            if written >= len(views[0]):
                written -= len(views.pop(0))
            else:
                views[0] = views[0][written:]
                written = 0


def _wait_writable(fd: int) -> None:
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_WRITE)
        sel.select(1.0)


