"""The operator's first hour (issue 22): every input understood or corrected, logs as operators expect."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from launcher.serve.logsetup import colour_wanted, configure_logging, renderer_for, to_journald


def run(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "launcher", *argv], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--margin", "1"], "--margin size '1' has no unit"),
    (["--max-gpu-memory", "0.5"], "written 50%"),
    (["--max-gpu-memory", "120%"], "at most 100%"),
])
def test_sizes_need_a_unit(argv: list[str], fragment: str) -> None:
    code, out, err = run(["plan", "qwen2.5-7b", "--gpu", "rtx4090", *argv])
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1


def test_kubernetes_units_and_a_share_of_the_gpu() -> None:
    """24Gi is 24 GiB; 50% of an H100 is half its CUDA total."""
    plans = [json.loads(run(["plan", "qwen2.5-7b", "--gpu", "rtx4090", "--margin", m, "--json"])[1])
             for m in ("2Gi", "2GiB", "2GB")]
    assert plans[0]["budget"] == plans[1]["budget"] != plans[2]["budget"]
    code, out, _ = run(["plan", "qwen2.5-7b", "--gpu", "h100", "--max-gpu-memory", "50%", "--json"])
    doc = json.loads(out)
    assert code == 0 and abs(doc["gpu_memory_utilization"] - 0.5) < 0.01, doc["gpu_memory_utilization"]


@pytest.mark.parametrize(("model", "alias"), [("qwen2.5-7", "qwen2.5-7b"), ("llama3.1-8b", "llama-3.1-8b"),
                                              ("qwen2.5:7b", "qwen2.5-7b")])
def test_did_you_mean_for_aliases(model: str, alias: str) -> None:
    code, _, err = run(["plan", model, "--gpu", "h100"])
    assert code == 66 and f"did you mean {alias}" in err


def test_gpu_names_as_people_type_them() -> None:
    code, _, err = run(["plan", "qwen2.5-7b", "--gpu", "a100"])
    assert code == 2 and "a100-40gb" in err and "a100-80gb" in err and "a10080gb" not in err
    _, _, err = run(["plan", "qwen2.5-7b", "--gpu", "rtx4009"])
    assert "did you mean" in err and "rtx4090" in err
    _, _, err = run(["plan", "qwen2.5-7b", "--gpu", "zzz"])
    assert "known:" in err and "a100-80gb" in err and "a10080gb" not in err


def test_version_help_command_and_case_insensitive_choices() -> None:
    code, out, _ = run(["-V"])
    assert code == 0 and out.startswith("safe-serve, version ")
    code, out, _ = run(["help", "plan"])
    assert code == 0 and "Usage: safe-serve plan" in out and "SAFE_SERVE_MAX_GPU_MEMORY" in out
    code, out, _ = run(["help"])
    assert code == 0 and "Usage: safe-serve" in out
    code, out, _ = run(["plan", "qwen2.5-7b", "--gpu", "h100", "--engine", "SGLang", "--json"])
    assert code == 0 and json.loads(out)["engine"] == "sglang"


def test_every_option_has_help_and_its_variable() -> None:
    from launcher.edge.cli import cli

    for name, command in cli.commands.items():
        for param in command.params:
            if param.param_type_name != "option" or param.name == "help":
                continue
            assert param.help, (name, param.name)  # type: ignore[attr-defined]
            assert str(param.envvar).startswith("SAFE_SERVE_"), (name, param.name)


def test_the_environment_configures_like_the_unit_file() -> None:
    """SAFE_SERVE_ENGINE in example.env is read by safe-serve itself, not only by the unit."""
    code, out, _ = run(["plan", "qwen2.5-7b", "--gpu", "h100", "--json"], env={"SAFE_SERVE_ENGINE": "sglang"})
    assert code == 0 and json.loads(out)["engine"] == "sglang"
    code, out, _ = run(["plan", "qwen2.5-7b", "--gpu", "h100", "--engine", "vllm", "--json"],
                       env={"SAFE_SERVE_ENGINE": "sglang"})
    assert json.loads(out)["engine"] == "vllm"  # the command line wins


def test_config_file(tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("engine: sglang\nconcurrency: 2\nengine-args: [--context-length, '4096']\n")
    code, out, err = run(["plan", "qwen2.5-7b", "--gpu", "h100", "--config", str(config), "--json"])
    doc = json.loads(out)
    assert code == 0, err
    assert doc["engine"] == "sglang" and doc["max_model_len"] == 4096
    config.write_text("concurency: 2\n")
    code, _, err = run(["plan", "qwen2.5-7b", "--gpu", "h100", "--config", str(config)])
    assert code == 2 and "did you mean concurrency" in err
    code, _, err = run(["plan", "qwen2.5-7b", "--gpu", "h100", "--config", str(tmp_path / "none.yaml")])
    assert code == 66 and "no such file" in err
    config.write_text("engine: [unclosed\n")
    code, _, err = run(["plan", "qwen2.5-7b", "--gpu", "h100", "--config", str(config)])
    assert code == 2 and "not valid YAML" in err and "Traceback" not in err


def test_ready_file_directory_checked_at_start(tmp_path: Path) -> None:
    code, out, err = run(["qwen2.5-7b", "--ready-file", "/nonexistent/dir/ready"])
    assert code == 2 and "/nonexistent/dir does not exist" in err
    code, _, err = run(["qwen2.5-7b", "--ready-file", str(tmp_path)])
    assert code == 2 and "is a directory" in err


def test_engine_short_flag_hint_moves_the_whole_flag() -> None:
    code, _, err = run(["plan", "qwen2.5-7b", "--gpu", "rtx4090", "-tp", "2"])
    assert code == 2 and "safe-serve plan qwen2.5-7b --gpu rtx4090 -- -tp 2" in err


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _render(log_format: str | None, stream: io.StringIO, env: dict[str, str]) -> str:
    render = renderer_for(log_format, stream, env)
    out = render(None, "warning", {"event": "kv-diverged", "level": "warning", "timestamp": "t"})
    return out.decode() if isinstance(out, bytes) else out


def test_colour_only_on_a_terminal_and_never_with_no_color() -> None:
    assert "\x1b[" in _render("console", FakeTty(), {})
    assert "\x1b[" not in _render("console", FakeTty(), {"NO_COLOR": "1"})
    assert "\x1b[" not in _render("console", io.StringIO(), {})  # the shipped example.env off a terminal
    assert json.loads(_render(None, io.StringIO(), {}))["event"] == "kv-diverged"
    assert colour_wanted(FakeTty(), {"NO_COLOR": ""})  # no-color.org: an empty NO_COLOR does not count


def test_journald_lines_carry_their_priority(tmp_path: Path) -> None:
    """With stderr being $JOURNAL_STREAM, each line starts <N> (SyslogLevelPrefix=, on by default)."""
    path = tmp_path / "journal"
    old = structlog.get_config()
    with path.open("w") as stream:
        st = os.fstat(stream.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert to_journald(stream, env) and not to_journald(stream, {"JOURNAL_STREAM": "1:2"})
        try:
            configure_logging("json", env=env, stream=stream)
            structlog.get_logger("t").warning("kv-diverged", tokens=3)
            structlog.get_logger("t").info("ready")
        finally:  # later tests log through structlog: not into this closed file
            structlog.configure(**old)
    first, second = path.read_text().splitlines()
    assert first.startswith("<4>{") and json.loads(first[3:])["tokens"] == 3
    assert second.startswith("<6>{")


def test_example_env_logs_without_colour() -> None:
    text = (Path(__file__).resolve().parents[1] / "systemd" / "example.env").read_text()
    args = next(line for line in text.splitlines() if line.startswith("SAFE_SERVE_ARGS="))
    assert "--log-format json" in args


def test_config_file_alone_configures_a_serve(tmp_path: Path) -> None:
    """`safe-serve --config FILE` is a serve, the model and flags all from the file (a unit's one argument)."""
    config = tmp_path / "serve.yaml"
    config.write_text("model: qwen2.5-7b\nengine: sglang\ngpu: [h100]\ndry-run: true\n"
                      "engine-args: [--port, '31000']\n")
    code, out, err = run(["--config", str(config)])
    assert code == 0, err
    assert "sglang.launch_server --model-path Qwen/Qwen2.5-7B-Instruct --port 31000" in out.splitlines()[-1]
