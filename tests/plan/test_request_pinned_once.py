"""The operator's engine flags are parsed once per command, at the edge (PlanOptions.pinned); the
lock, the plan, the calibration key, the health address and the argv read that one parse."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from click.testing import CliRunner

from launcher.edge.cli import cli
from launcher.engines.sglang import rules as sglang_rules
from launcher.engines.vllm import rules as vllm_rules


@pytest.fixture()
def parses(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """Every call of the engines' flag parser, with the argv it parsed."""
    seen: list[tuple[str, ...]] = []
    for module in (vllm_rules, sglang_rules):
        real: Callable[..., dict[str, Any]] = module.parse_pinned

        def counted(argv: Sequence[str], specs: Any, real: Callable[..., dict[str, Any]] = real) -> dict[str, Any]:
            seen.append(tuple(argv))
            return real(argv, specs)

        monkeypatch.setattr(module, "parse_pinned", counted)
    return seen


@pytest.mark.parametrize("command", [
    ["plan", "qwen2.5-7b", "--gpu", "h100", "--", "--max-model-len", "7936", "-tp", "1"],
    ["plan", "qwen2.5-7b", "--gpu", "h100", "--json", "--preset", "online", "--", "--enforce-eager"],
    ["serve", "qwen2.5-7b", "--gpu", "h100", "--dry-run", "--", "--max-model-len", "7936", "--port", "8100"],
    ["serve", "qwen2.5-7b", "--gpu", "2xh100", "--dry-run", "--json", "--", "--tensor-parallel-size", "2"],
    ["plan", "qwen2.5-7b", "--engine", "sglang", "--gpu", "h100", "--", "--context-length", "7936"],
    ["serve", "qwen2.5-7b", "--engine", "sglang", "--gpu", "h100", "--dry-run", "--", "--tp-size", "1"],
])
def test_engine_flags_are_parsed_once_per_command(command: list[str], parses: list[tuple[str, ...]],
                                                  tmp_path: Any) -> None:
    result = CliRunner().invoke(cli, command, env={"SAFE_SERVE_STATE_DIR": str(tmp_path)})
    assert result.exit_code == 0, result.output
    assert len(parses) == 1, parses
    assert parses[0] == tuple(command[command.index("--") + 1:])


def test_the_pinned_value_reaches_the_argv_as_written(parses: list[tuple[str, ...]], tmp_path: Any) -> None:
    result = CliRunner().invoke(cli, ["serve", "qwen2.5-7b", "--gpu", "h100", "--dry-run", "--",
                                      "--max-model-len", "7936"], env={"SAFE_SERVE_STATE_DIR": str(tmp_path)})
    assert result.exit_code == 0, result.output
    command_line = result.output.strip().splitlines()[-1]
    assert command_line.count("--max-model-len") == 1 and "--max-model-len 7936" in command_line
    assert len(parses) == 1
