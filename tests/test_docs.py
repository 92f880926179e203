"""Every documented `safe-serve` command runs as written and does what the text says.

Commands are extracted from README.md and docs/*.md: fenced `sh`/`bash`/`console`/`shell`
blocks, lines starting with `safe-serve` or `$ safe-serve` (continuation lines joined,
`a && safe-serve ...` keeps its `safe-serve` part, `# comments` dropped). Each one runs as
`python -m launcher ...` in a fresh process, against

- the GPU catalog, for commands with `--gpu`;
- the stand-in libnvidia-ml (tests/nvml_stub, fixture two_gpus.txt: an H100 with a tenant
  and an idle L40S), for commands that probe the live GPUs;
- a small local model directory `./my-model` (config.json + safetensors index) in the
  working directory.

A serve command that would start an engine runs with `--dry-run` added: what is checked is
the plan and the exact engine command line it would start (starting needs the engine and
a GPU; tests/test_serve_standin.py starts stand-in engines). `EXPECT` holds the exit code
and a line that must appear for every command; a command the docs show that is not in
`EXPECT` fails the test, and so does an entry no doc shows any more. A block that cannot run
here is marked in the Markdown with `<!-- not-run: REASON -->` on the line before it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.probe.test_probe import StubLibs, _fixture, dead_pid, sleeper, stub_libs  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parent.parent
DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
SHELL_FENCES = {"sh", "bash", "console", "shell"}
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(?P<reason>[^>]*?)\s*-->")
OUR_COMMANDS = {"plan", "fit", "gpus", "models", "serve", "ps", "status", "help"}
TIMEOUT_S = 180


@dataclass(frozen=True)
class DocCommand:
    where: str  # file:line
    text: str  # as written, continuation lines joined
    argv: tuple[str, ...]  # after `safe-serve`
    not_run: str | None  # the marker's reason


@dataclass(frozen=True)
class Expect:
    code: int
    line: str  # a regular expression one output line (stdout or stderr) must match
    nvml: bool = False  # probes the live GPUs: run against the NVML stand-in
    wiring: str | None = None  # what cli.py must wire for this to pass (see the report to the lead)


def extract(path: Path) -> list[DocCommand]:
    found: list[DocCommand] = []
    lines = path.read_text().splitlines()
    fence: str | None = None
    reason: str | None = None
    pending_reason: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if fence is None:
            marker = NOT_RUN.search(stripped)
            if marker:
                pending_reason = marker["reason"]
            elif stripped.startswith("```"):
                fence = stripped[3:].strip().lower()
                reason, pending_reason = pending_reason, None
            elif stripped:
                pending_reason = None
            i += 1
            continue
        if stripped.startswith("```"):
            fence = None
            i += 1
            continue
        start = i
        while line.rstrip().endswith("\\") and i + 1 < len(lines):  # continuation lines
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i].strip()
        i += 1
        if fence not in SHELL_FENCES:
            continue
        text = line.strip()
        text = text[2:] if text.startswith("$ ") else text
        for part in text.split("&&"):
            words = shlex.split(part, comments=True)
            if words[:1] == ["safe-serve"]:
                found.append(DocCommand(f"{path.name}:{start + 1}", part.strip(), tuple(words[1:]), reason))
    return found


def documented() -> list[DocCommand]:
    return [c for path in DOCS for c in extract(path)]


def key(argv: tuple[str, ...]) -> str:
    return shlex.join(argv)


WILL_START = "starting an engine needs the engine and a GPU: checked with --dry-run"
PRESET = "cli.py: --preset NAME option, presets.apply(...) into the request, notes into Plan.notes"

EXPECT: dict[str, Expect] = {
    # README.md
    "plan qwen2.5-7b --gpu rtx4090": Expect(
        0, r"^safe-serve plan: Qwen/Qwen2\.5-7B-Instruct on 1 x NVIDIA GeForce RTX 4090, vllm \S+ "),
    "qwen2.5-7b": Expect(
        0, r"^vllm serve Qwen/Qwen2\.5-7B-Instruct --gpu-memory-utilization 0\.\d+ --max-model-len \d+$", nvml=True),
    "qwen2.5-7b --engine sglang --dry-run": Expect(
        0, r"-m sglang\.launch_server --model-path Qwen/Qwen2\.5-7B-Instruct --mem-fraction-static 0\.\d+ "
           r"--context-length \d+$", nvml=True),
    "plan qwen2.5-7b --gpu a100-80gb -- --max-model-len 8192": Expect(0, r"^  pinned \(kept\)  --max-model-len 8192$"),
    "plan qwen2.5-7b --gpu a100-80gb --preset online-long": Expect(
        0, r"^  note: preset online-long: keeps 1\.5 GiB free for prefill peaks", wiring=PRESET),
    "./my-model --device cpu --engine-cmd 'python -m vllm.entrypoints.openai.api_server' -- --enforce-eager": Expect(
        0, r"^VLLM_CPU_KVCACHE_SPACE=\d+ python -m vllm\.entrypoints\.openai\.api_server --model \S*my-model "
           r"(?=.*--enforce-eager)(?=.*--max-model-len \d+)"),
    "fit qwen2.5-7b --concurrency 32 --tokens 4096": Expect(
        0, r"^  NVIDIA A100-SXM4-80GB +1 GPU +[\d,]+ +\+\d+%  --max-model-len 4096$"),
    # docs/operators.md
    "gpus": Expect(0, r"^0 +NVIDIA H100 80GB HBM3 ", nvml=True),
    "plan qwen2.5-7b --engine vllm": Expect(
        0, r"^safe-serve plan: Qwen/Qwen2\.5-7B-Instruct on 1 x NVIDIA H100 80GB HBM3", nvml=True),
    "qwen2.5-7b --engine vllm --concurrency 4 -- --port 8000": Expect(
        0, r"^vllm serve Qwen/Qwen2\.5-7B-Instruct (?=.*--port 8000)(?=.*--gpu-memory-utilization 0\.\d+ )"
           r"(?=.*--max-model-len \d+)",
        nvml=True),
    "qwen2.5-7b --engine vllm --dry-run": Expect(0, r"^vllm serve Qwen/Qwen2\.5-7B-Instruct ", nvml=True),
}


def with_dry_run(argv: tuple[str, ...]) -> tuple[str, ...]:
    """A serve command (explicit, or the `safe-serve MODEL` shortcut) without --dry-run gets it."""
    is_serve = argv[:1] == ("serve",) or (argv[:1] and argv[0] not in OUR_COMMANDS and not argv[0].startswith("-"))
    if not is_serve:
        return argv
    head = argv[:argv.index("--")] if "--" in argv else argv
    if "--dry-run" in head:
        return argv
    return (*head, "--dry-run", *argv[len(head):])


def write_small_model(where: Path) -> None:
    """A Qwen2-shaped model small enough to plan on any host's RAM (index only: no tensors read)."""
    config = json.loads((REPO / "tests" / "data" / "configs" / "qwen2.5-7b.json").read_text())
    config.pop("_source", None)
    config.update(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=1024, max_position_embeddings=4096)
    where.mkdir()
    (where / "config.json").write_text(json.dumps(config))
    (where / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 8_000_000},
                                                                    "weight_map": {}}))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("docs")
    write_small_model(cwd / "my-model")
    return cwd


def run(argv: tuple[str, ...], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S, check=False)


def base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "NVIDIA_", "SAFE_SERVE_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               SAFE_SERVE_STATE_DIR=str(tmp_path / "state"), SAFE_SERVE_LOCK_DIR=str(tmp_path / "locks"),
               HF_HUB_OFFLINE="1", COLUMNS="200")
    env.pop("NOTIFY_SOCKET", None)
    return env


COMMANDS = documented()


def test_docs_show_commands() -> None:
    assert len(COMMANDS) >= 10, [c.where for c in COMMANDS]


def test_every_documented_command_has_an_expectation() -> None:
    runnable = {key(c.argv) for c in COMMANDS if c.not_run is None}
    missing = sorted(f"{c.where}: safe-serve {key(c.argv)}" for c in COMMANDS
                     if c.not_run is None and key(c.argv) not in EXPECT)
    assert [] == missing, "add the command to EXPECT (exit code and a key line), or mark its block not-run"
    assert [] == sorted(set(EXPECT) - runnable), "EXPECT entries no document shows any more"


def test_not_run_markers_say_why() -> None:
    for command in COMMANDS:
        assert command.not_run is None or len(command.not_run) > 10, command.where


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.not_run is None], ids=lambda c: c.where)
def test_documented_command_runs(command: DocCommand, workdir: Path, tmp_path: Path,  # noqa: F811 (fixtures)
                                 stub_libs: StubLibs, sleeper: psutil.Process, dead_pid: int) -> None:  # noqa: F811
    expect = EXPECT.get(key(command.argv))
    if expect is None:
        pytest.fail(f"{command.where}: no expectation for: safe-serve {command.text}")
    env = base_env(tmp_path)
    if expect.nvml:
        fixture = tmp_path / "fixture.txt"
        fixture.write_text(_fixture("two_gpus.txt", sleep_pid=sleeper.pid, dead_pid=dead_pid))
        env.update(LD_LIBRARY_PATH=str(stub_libs.current), SAFE_SERVE_NVML_STUB_FIXTURE=str(fixture))
    else:
        env.update(LD_LIBRARY_PATH=str(stub_libs.missing))  # no real GPU is read, even on a GPU host
    argv = with_dry_run(command.argv)
    done = run(argv, workdir, env)
    output = done.stdout + done.stderr
    wiring = f" (needs the CLI wiring: {expect.wiring})" if expect.wiring else ""
    assert "Traceback" not in output, f"{command.where}{wiring}: {output[-3000:]}"
    assert done.returncode == expect.code, (f"{command.where}: safe-serve {shlex.join(argv)} exited "
                                            f"{done.returncode}{wiring}:\n{output[-3000:]}")
    pattern = re.compile(expect.line)
    assert any(pattern.search(line) for line in output.splitlines()), (
        f"{command.where}{wiring}: no line matches {expect.line!r}:\n{output[-3000:]}")


# --------------------------------------------------------------------------- paths the docs name

PATH = re.compile(r"`((?:launcher|tests|systemd|deploy|bench|profiles|docs)/[^`\s<>]*)`")


def test_paths_the_docs_name_exist() -> None:
    missing = []
    for doc in DOCS:
        for match in PATH.finditer(doc.read_text()):
            path = match.group(1)
            if not list(REPO.glob(path.rstrip("/"))):
                missing.append(f"{doc.name}: {path}")
    assert [] == missing


def test_extraction_rules(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("```sh\n$ safe-serve plan m \\\n    --gpu l4   # a comment\npip install . && safe-serve gpus\n"
                   "echo safe-serve no\n```\n\n<!-- not-run: needs a real GPU and systemd -->\n```bash\n"
                   "safe-serve m\n```\n```text\nsafe-serve plan MODEL [--json]\n```\n")
    found = extract(doc)
    assert [(("plan", "m", "--gpu", "l4"), None), (("gpus",), None), (("m",), "needs a real GPU and systemd")] == \
        [(c.argv, c.not_run) for c in found]
    assert ("m", "--dry-run") == with_dry_run(("m",))
    assert ("serve", "m", "--dry-run", "--", "--port", "1") == with_dry_run(("serve", "m", "--", "--port", "1"))
    assert ("plan", "m") == with_dry_run(("plan", "m"))
