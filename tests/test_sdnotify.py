"""sd_notify datagrams and the watchdog period (launcher/supervise/sdnotify.py)."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

from launcher.supervise import sdnotify


class TestSdnotify:
    def _socket(self, name: str | None = None) -> tuple[socket.socket, str]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if name is None:
            address = os.path.join(tempfile.mkdtemp(prefix="ssn"), "notify")
            sock.bind(address)
            return sock, address
        sock.bind("\0" + name)
        return sock, "@" + name

    def test_unset_socket_is_a_no_op(self) -> None:
        """Without NOTIFY_SOCKET nothing is sent and the call reports False."""
        assert sdnotify.notify("READY=1", env={}) is False

    def test_path_socket_receives_the_datagram(self) -> None:
        """A filesystem socket gets the exact state string."""
        sock, address = self._socket()
        with sock:
            assert sdnotify.notify("READY=1\nSTATUS=serving", env={"NOTIFY_SOCKET": address}) is True
            assert b"READY=1\nSTATUS=serving" == sock.recv(4096)

    def test_abstract_socket_receives_the_datagram(self) -> None:
        """An @name socket is the abstract namespace."""
        sock, address = self._socket(f"safe-serve-test-{os.getpid()}")
        with sock:
            assert sdnotify.notify("STOPPING=1", env={"NOTIFY_SOCKET": address}) is True
            assert b"STOPPING=1" == sock.recv(4096)

    def test_unreachable_socket_returns_false(self, tmp_path: Path) -> None:
        """A socket path with no listener gives False, not an exception."""
        assert sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": str(tmp_path / "missing")}) is False
