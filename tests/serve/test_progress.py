"""The live status line while the engine loads: what it says, and when it is shown."""

from __future__ import annotations

import io

import click

from launcher.serve.progress import Progress, wanted


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_line_names_the_phase_and_the_figures_seen() -> None:
    progress = Progress("vllm")
    progress.saw("weights", {"gib": 14.19}, "weights loaded")
    progress.saw("available_kv", {"gib": 5.29}, "memory profiled")
    progress.saw("kv", {"tokens": 99040}, "KV cache sized")
    text = click.unstyle(progress.text())
    assert text.startswith("safe-serve: vllm KV cache sized · 0:0")
    assert text.endswith("· weights 14.19 GiB · KV memory 5.29 GiB · KV 99,040 tokens")


def test_shown_only_on_a_terminal_and_not_under_systemd() -> None:
    assert not wanted(io.StringIO(), {})  # a pipe or a file
    assert not wanted(_Tty(), {"NOTIFY_SOCKET": "/run/systemd/notify"})  # STATUS= carries it there
