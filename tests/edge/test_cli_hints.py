"""The CLI edge's hints: engine flags without `--`, the help epilog, shell completion."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from launcher.edge.cli_hints import (
    EPILOG,
    completion_instructions,
    engine_flags_moved,
    no_such_option_hint,
    usage_hint,
)
from launcher.engines import adapter

REPO = Path(__file__).resolve().parents[1].parent
# What the CLI passes: every flag the engine adapters know.
ENGINE_FLAGS = adapter("vllm").flag_names | adapter("sglang").flag_names


def test_engine_flag_without_dashdash_gets_the_corrected_command() -> None:
    argv = ["plan", "qwen2.5-7b", "--gpu", "rtx4090", "--max-model-len", "8192"]
    assert ("engine flags go after `--`: safe-serve plan qwen2.5-7b --gpu rtx4090 -- --max-model-len 8192"
            == no_such_option_hint("--max-model-len", ["--max-gpu-memory"], argv, ENGINE_FLAGS))


def test_moved_flags_join_the_existing_engine_flags() -> None:
    argv = ["qwen2.5-7b", "--enforce-eager", "--dry-run", "--", "--port", "8000"]
    assert ["qwen2.5-7b", "--dry-run", "--", "--enforce-eager", "--port", "8000"] == \
        engine_flags_moved(argv, "--enforce-eager")
    assert ["m", "--", "--max-model-len=4096"] == engine_flags_moved(["m", "--max-model-len=4096"], "--max-model-len")


def test_near_miss_of_our_own_option_keeps_clicks_suggestion() -> None:
    argv = ["plan", "m", "--concurency", "3"]
    assert no_such_option_hint("--concurency", ["--concurrency"], argv, ENGINE_FLAGS) is None
    # an unknown flag nobody resembles is most likely an engine flag
    assert no_such_option_hint("--swap-space", [], ["plan", "m", "--swap-space", "4"], ENGINE_FLAGS) == \
        "engine flags go after `--`: safe-serve plan m -- --swap-space 4"


def test_usage_hint_from_the_real_click_error() -> None:
    from launcher.edge.cli import cli

    argv = ["plan", "qwen2.5-7b", "--gpu", "rtx4090", "--max-model-len", "8192"]
    with pytest.raises(click.NoSuchOption) as caught:
        cli.main(args=argv, prog_name="safe-serve", standalone_mode=False)
    assert usage_hint(caught.value, argv, ENGINE_FLAGS) == \
        "engine flags go after `--`: safe-serve plan qwen2.5-7b --gpu rtx4090 -- --max-model-len 8192"
    assert usage_hint(click.UsageError("Missing argument 'MODEL'."), ["plan"], ENGINE_FLAGS) is None


def test_epilog_names_the_shortcut_and_completion() -> None:
    assert "`safe-serve MODEL ...` is `safe-serve serve MODEL ...`" in EPILOG
    assert 'eval "$(_SAFE_SERVE_COMPLETE=bash_source safe-serve)"' in EPILOG
    assert "safe-serve plan qwen2.5-7b --gpu rtx4090" in EPILOG


def test_completion_instructions() -> None:
    assert completion_instructions("bash") == 'eval "$(_SAFE_SERVE_COMPLETE=bash_source safe-serve)"  # in ~/.bashrc'
    assert completion_instructions("zsh").startswith('eval "$(_SAFE_SERVE_COMPLETE=zsh_source safe-serve)"')
    assert completion_instructions("fish").startswith("_SAFE_SERVE_COMPLETE=fish_source safe-serve | source")
    with pytest.raises(ValueError):
        completion_instructions("tcsh")


def test_clicks_completion_script_comes_out_of_the_entry_point() -> None:
    """The documented variable makes the real entry point print click's bash completion script."""
    done = subprocess.run([sys.executable, "-m", "launcher"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "_SAFE_SERVE_COMPLETE": "bash_source"}, check=False)
    assert 0 == done.returncode, done.stderr
    assert "_safe_serve_completion()" in done.stdout
    assert "complete -o nosort -F _safe_serve_completion safe-serve" in done.stdout
