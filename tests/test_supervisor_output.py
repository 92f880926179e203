"""Pass-through and line splitting, and the writer a slow reader cannot block (launcher/supervise/output.py)."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.supervise import output
from launcher.supervise.output import QueuedWriter, StreamPump


class TestStreamPump:
    def _pump(self, tmp_path: Path, **kw: Any) -> tuple[StreamPump, list[bytes], Path, int]:
        path = tmp_path / "out.bin"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        seen: list[bytes] = []
        return StreamPump("stdout", fd, lambda _s, line: seen.append(line), **kw), seen, path, fd

    def test_lines_split_across_chunks_arrive_whole(self, tmp_path: Path) -> None:
        """A line cut by chunk boundaries reaches the hook once, whole, without its newline."""
        pump, seen, path, fd = self._pump(tmp_path)
        for chunk in (b"ab", b"c\nde", b"f\r\n\n", b"tail"):
            pump.feed(chunk)
        pump.close()
        os.close(fd)
        assert [b"abc", b"def\r", b"", b"tail"] == seen
        assert b"abc\ndef\r\n\ntail" == path.read_bytes()

    def test_unterminated_tail_is_held_then_flushed(self, tmp_path: Path) -> None:
        """Bytes after the last newline wait until flush_partial(), then go out unchanged."""
        pump, _seen, path, fd = self._pump(tmp_path)
        pump.feed(b"one\ntw")
        assert b"one\n" == path.read_bytes()
        assert pump.pending_since is not None
        pump.flush_partial()
        assert b"one\ntw" == path.read_bytes()
        os.close(fd)

    def test_overlong_line_is_truncated_for_the_hook_only(self, tmp_path: Path) -> None:
        """The hook sees at most max_line_bytes of a line; the output keeps every byte."""
        pump, seen, path, fd = self._pump(tmp_path, max_line_bytes=10)
        pump.feed(b"x" * 25)
        pump.feed(b"y" * 5 + b"\nz" * 2)
        pump.close()
        os.close(fd)
        assert [b"x" * 10, b"z", b"z"] == seen
        assert b"x" * 25 + b"y" * 5 + b"\nz\nz" == path.read_bytes()

    @settings(max_examples=300, deadline=None)
    @given(
        pieces=st.lists(st.sampled_from([b"KV cache", b"K", b"V cache", b"\n", b"\r\n", b"x" * 7, b"\xff\xfe", b""]),
                        max_size=40),
        cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
        needles=st.sampled_from([None, (b"KV cache",), (b"KV cache", b"\xff")]),
    )
    def test_any_chunking_gives_the_same_lines(self, pieces: list[bytes], cuts: list[int],
                                               needles: tuple[bytes, ...] | None) -> None:
        """However the pipe cuts the data, the output is identical and the hook sees the same (filtered) lines."""
        data = b"".join(pieces)
        bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
        read_fd, write_fd = os.pipe()
        seen: list[bytes] = []
        pump = StreamPump("stdout", write_fd, lambda _s, line: seen.append(line), needles=needles)
        for start, end in itertools.pairwise(bounds):
            pump.feed(data[start:end])
        pump.close()
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as reader:
            assert data == reader.read()
        lines = data.split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        expected = [line for line in lines if needles is None or any(n in line for n in needles)]
        assert expected == seen

    def test_broken_destination_keeps_the_hook_fed(self, tmp_path: Path) -> None:
        """When our stdout is gone the pipe is still drained and parsed."""
        read_fd, write_fd = os.pipe()
        os.close(read_fd)
        seen: list[bytes] = []
        pump = StreamPump("stdout", write_fd, lambda _s, line: seen.append(line))
        pump.feed(b"a\nb\n")
        os.close(write_fd)
        assert pump.out_broken is True
        assert [b"a", b"b"] == seen


class TestOwnLinesBetweenEngineLines:
    """Our own log lines queue behind the engine's stderr, never inside a line it has part-written
    (a 17 MiB line flushed in pieces, a progress bar ended by \\r counts as a line end)."""

    def _writer(self, tmp_path: Path) -> tuple[QueuedWriter, Path, int]:
        path = tmp_path / "err.bin"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        return QueuedWriter(fd, "stderr"), path, fd

    def test_held_while_the_engine_line_is_open(self, tmp_path: Path) -> None:
        writer, path, fd = self._writer(tmp_path)
        writer.write(b"x" * 100_000)  # a partial flush: the line is open
        writer.write_own(b'{"event": "ours"}\n')
        writer.write(b"yyy\n")
        writer.write_own(b'{"event": "next"}\n')  # at a line start: written at once
        writer.write(b"zz\r")
        writer.write_own(b'{"event": "after a bar"}\n')
        assert writer.flush(5)
        writer.close()
        os.close(fd)
        assert path.read_bytes() == (b"x" * 100_000 + b'yyy\n{"event": "ours"}\n{"event": "next"}\nzz\r'
                                     b'{"event": "after a bar"}\n')

    def test_released_after_the_hold_limit_when_the_line_never_ends(self, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(output, "OWN_HOLD_MAX_S", 0.1)
        writer, path, fd = self._writer(tmp_path)
        writer.write(b"no end")
        writer.write_own(b"ours\n")
        deadline = time.monotonic() + 5
        while path.read_bytes() != b"no endours\n" and time.monotonic() < deadline:
            time.sleep(0.02)
        writer.close()
        os.close(fd)
        assert path.read_bytes() == b"no endours\n"
