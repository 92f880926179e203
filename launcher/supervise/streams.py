"""The supervisor's two output streams: writers, back-pressure, the status line, our own log lines.

``Streams`` reads the engine's pipes into their pumps, owns the two ``QueuedWriter``s (stdout,
stderr), the engine pipes paused while a
writer is over its high-water mark (unregistered from the loop's selector, registered again
when the writer drains), the terminal's live status line, and ``own_stream``: where our own
log lines go so that they queue behind the engine's stderr lines instead of blocking.
"""

from __future__ import annotations

import os
import selectors
import time
from collections.abc import Callable
from typing import Any

import structlog

from launcher.supervise.output import PARTIAL_FLUSH_AFTER_S, LineHook, QueuedWriter, StatusLine, StreamPump
from launcher.supervise.process import Engine, grow_pipe

log = structlog.get_logger("safe_serve.supervisor")

READ_CHUNK = 1 << 20  # bytes per os.read


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
        writer.write_own(text.encode("utf-8", errors="replace"))
        return len(text)

    def flush(self) -> None:
        if self.writer is None:
            self.fallback.flush()


class Streams:
    """Writers for stdout/stderr, the pipes paused by back-pressure, the status line."""

    def __init__(self, stdout_fd: int, stderr_fd: int, own_fallback: Any) -> None:
        self._fds = {"stdout": stdout_fd, "stderr": stderr_fd}
        self.writers: dict[str, QueuedWriter] = {}
        self.paused: dict[int, StreamPump] = {}  # engine pipes not read while their writer is full
        self._paused_said = False
        self.own_stream = OwnStream(own_fallback)
        self._status_text: Callable[[], str] | None = None
        self._status_line: StatusLine | None = None

    def open(self, on_drained: Callable[[], None]) -> None:
        """Start the writer threads; ``on_drained`` is called from them when one falls below low water."""
        self.writers = {name: QueuedWriter(fd, name, on_drained) for name, fd in self._fds.items()}
        self.own_stream.writer = self.writers["stderr"]
        if self._status_text is not None:
            self._attach_status()

    def set_status_line(self, text: Callable[[], str] | None) -> None:
        self._status_text = text
        if self.writers:
            self._attach_status()

    def _attach_status(self) -> None:
        if self._status_line is not None:
            for writer in self.writers.values():
                writer.status = None
            self._status_line.close()
            self._status_line = None
        if self._status_text is not None:
            self._status_line = StatusLine(self._fds["stderr"], self._status_text)
            for writer in self.writers.values():
                writer.status = self._status_line
            self._status_line.show()

    # ------------------------------------------------------------------ back-pressure

    def pause(self, fd: int, pump: StreamPump, selector: selectors.BaseSelector) -> None:
        if fd in self.paused:
            return
        selector.unregister(fd)
        self.paused[fd] = pump
        if not self._paused_said:
            self._paused_said = True
            log.warning("our output is not being read: pausing the engine's output until it is "
                        "(back-pressure; nothing is dropped)", stream=pump.name,
                        buffered_bytes=getattr(pump.out, "queued", None))

    def resume_all(self, selector: selectors.BaseSelector) -> None:
        for fd, pump in list(self.paused.items()):
            del self.paused[fd]
            selector.register(fd, selectors.EVENT_READ, pump)

    def resume_drained(self, selector: selectors.BaseSelector) -> None:
        """Read again the pipes whose writer fell below low water (or broke: then nothing waits)."""
        for fd, pump in list(self.paused.items()):
            if not getattr(pump.out, "full", False) or pump.out.broken:
                del self.paused[fd]
                selector.register(fd, selectors.EVENT_READ, pump)

    # ------------------------------------------------------------------ the engine's pipes

    def attach(self, engine: Engine, selector: selectors.BaseSelector, on_line: LineHook | None,
               max_line_bytes: int, line_filter: tuple[bytes, ...] | None) -> None:
        """A pump for each of the engine's pipes, into our writer of the same name, read by the loop."""
        for name, fileobj in (("stdout", engine.popen.stdout), ("stderr", engine.popen.stderr)):
            assert fileobj is not None
            pump = StreamPump(name, self.writers[name], on_line, max_line_bytes, line_filter)
            grow_pipe(fileobj.fileno())
            engine.pipes[fileobj.fileno()] = (pump, fileobj)
            selector.register(fileobj.fileno(), selectors.EVENT_READ, pump)

    def read(self, fd: int, pump: StreamPump, selector: selectors.BaseSelector, *, may_pause: bool) -> bool:
        """Feed what the pipe holds to its pump; False at its end (EOF or a read error). With
        ``may_pause``, a pipe whose writer went over its high-water mark is paused."""
        try:
            chunk = os.read(fd, READ_CHUNK)
        except OSError:
            chunk = b""
        if not chunk:
            return False
        pump.feed(chunk)
        if may_pause and getattr(pump.out, "full", False):
            self.pause(fd, pump, selector)
        return True

    @staticmethod
    def flush_stale_partials(engine: Engine, now: float) -> None:
        """A line without its newline for ``PARTIAL_FLUSH_AFTER_S`` goes out as it is (a prompt, a bar)."""
        for pump, _file in engine.pipes.values():
            if pump.pending_since is not None and now - pump.pending_since >= PARTIAL_FLUSH_AFTER_S:
                pump.flush_partial()

    @staticmethod
    def partial_deadlines(engine: Engine) -> list[float]:
        return [pump.pending_since + PARTIAL_FLUSH_AFTER_S for pump, _file in engine.pipes.values()
                if pump.pending_since is not None]

    def detach(self, engine: Engine, fd: int, selector: selectors.BaseSelector, *, hook: bool = True) -> None:
        """Close one engine pipe: what was read goes out; the hook sees the last line unless ``hook`` is off."""
        pump, fileobj = engine.pipes.pop(fd)
        if self.paused.pop(fd, None) is None:  # a paused pipe is not registered
            selector.unregister(fd)
        fileobj.close()
        if not hook:
            pump.on_line = None
        pump.close()

    # ------------------------------------------------------------------ the end

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` in all for both writers; True when everything was written."""
        deadline = time.monotonic() + timeout_s
        done = True
        for writer in self.writers.values():
            done = writer.flush(max(deadline - time.monotonic(), 0.0)) and done
        return done

    def close(self, flush_s: float) -> dict[str, int]:
        """Give our log lines back to the fallback, take the status line away, flush for at most
        ``flush_s`` and stop the writers; returns (and logs) the bytes that could not be written."""
        self.own_stream.writer = None
        self._status_text = None
        self._attach_status()
        self.flush(flush_s)
        dropped = {name: writer.close() for name, writer in self.writers.items()}
        if any(dropped.values()):
            log.warning("engine output dropped: our output was not read in time (bytes that could not be written)",
                        **{f"{name}_bytes": count for name, count in dropped.items() if count})
        return dropped

