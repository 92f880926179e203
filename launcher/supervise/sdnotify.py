"""Tell systemd how the service is doing (the sd_notify datagram protocol), never raising.

Shape from gunicorn's ``systemd.py``: a no-op without ``NOTIFY_SOCKET``, ``@`` means the
abstract namespace, one datagram per call, failures are reported by the return value only.
Several assignments go in one call separated by newlines, e.g. ``"READY=1\\nSTATUS=serving"``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

__all__ = ["notify", "socket_address", "watchdog_interval_s"]


def socket_address(env: Mapping[str, str] | None = None) -> str | None:
    """Return the ``AF_UNIX`` address named by ``NOTIFY_SOCKET``, or None when unset or unusable.

    A leading ``@`` becomes a NUL byte (Linux abstract namespace). Other schemes systemd
    knows (``vsock:``) are not supported and give None.
    """
    value = (os.environ if env is None else env).get("NOTIFY_SOCKET", "")
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None


def notify(state: str, env: Mapping[str, str] | None = None) -> bool:
    """Send one notification such as ``READY=1``; True if a datagram was sent.

    Args:
        state: newline-separated ``KEY=VALUE`` assignments.
        env: where to look up ``NOTIFY_SOCKET`` (default: ``os.environ``).

    Returns:
        False when ``NOTIFY_SOCKET`` is unset or anything fails (a full receiver queue too: the
        datagram is dropped rather than block); never raises.
    """
    address = socket_address(env)
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.setblocking(False)  # a receiver whose queue is full must never block the loop: dropped
            sock.connect(address)
            sock.sendall(state.encode("utf-8", errors="replace"))
    except OSError:
        return False
    return True


def watchdog_interval_s(env: Mapping[str, str] | None = None) -> float | None:
    """How often to send ``WATCHDOG=1``: half of ``WATCHDOG_USEC`` (as sd_watchdog_enabled
    advises), or None when systemd runs no watchdog for us (unset, or meant for another pid)."""
    values = os.environ if env is None else env
    try:
        usec = int(values.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    pid = values.get("WATCHDOG_PID")
    if usec <= 0 or (pid and pid != str(os.getpid())):
        return None
    return usec / 2e6
