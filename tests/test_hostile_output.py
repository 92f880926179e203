"""Hostile input, part 3: what safe-serve shows and passes on.

Secrets (engine flags that carry credentials, secret-named environment words) never appear in
any output: plan, refusal, fit, --dry-run (human and JSON), the usage hint, the serve run's log
events; the engine still gets the real values. A local model directory reaches the engine as a
path, never as a flag; names print escaped; closed standard descriptors are reopened on
/dev/null before anything else can take them.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from launcher.engines import adapter
from tests.model.test_config import QWEN25_7B, _write_safetensors
from tests.test_serve_standin import SCENARIOS, STANDIN, VLLM, nvml_fixture_for, plan_json, vllm_agrees

REPO = Path(__file__).resolve().parent.parent
API_KEY, HF_TOKEN, ENV_TOKEN = "sk-SECRET-api-0001", "hf_SECRETtoken0002", "hf_SECRETenv0003"
SECRETS = (API_KEY, HF_TOKEN, ENV_TOKEN, "sk-SECRET-second")


def _run(*argv: str, env: dict[str, str] | None = None, tmp: Path | None = None) -> subprocess.CompletedProcess[str]:
    state = {"SAFE_SERVE_STATE_DIR": str(tmp / "state")} if tmp else {}
    return subprocess.run([sys.executable, "-m", "launcher", *argv], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **state, **(env or {})}, timeout=120)


def _no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"{secret} shown in:\n{text[-3000:]}"


class TestMaskingRules:
    def test_vllm_flags_as_its_argparse_reads_them(self) -> None:
        shown = adapter("vllm").shown_argv([
            "vllm", "serve", "m", "--api-key", API_KEY, "sk-SECRET-second", "--port", "1",  # nargs "+"
            f"--hf-token={HF_TOKEN}", "--hf-token", "--enforce-eager",  # "?" bare: nothing to mask
            "--api_key", API_KEY, "--api-k", API_KEY])  # underscore spelling, argparse abbreviation
        assert shown == ["vllm", "serve", "m", "--api-key", "<redacted>", "<redacted>", "--port", "1",
                         "--hf-token=<redacted>", "--hf-token", "--enforce-eager",
                         "--api_key", "<redacted>", "--api-k", "<redacted>"]

    def test_sglang_flags_and_the_path_flag_like_them(self) -> None:
        shown = adapter("sglang").shown_argv([
            "--ssl-keyfile", "/etc/key.pem", "--ssl-keyfile-password", API_KEY, "--admin-api-key", API_KEY,
            "--watermark-config", '{"key": "x"}', "--api-key", API_KEY, "--tp-size", "2"])
        assert shown == ["--ssl-keyfile", "/etc/key.pem", "--ssl-keyfile-password", "<redacted>",
                         "--admin-api-key", "<redacted>", "--watermark-config", "<redacted>",
                         "--api-key", "<redacted>", "--tp-size", "2"]

    def test_environment_words(self) -> None:
        shown = adapter("vllm").shown_argv(["env", f"HF_TOKEN={ENV_TOKEN}", "OPENAI_API_KEY=k", "AWS_SECRET=s",
                                            "DB_PASSWORD=p", "VLLM_CPU_KVCACHE_SPACE=4", "python"])
        assert shown == ["env", "HF_TOKEN=<redacted>", "OPENAI_API_KEY=<redacted>", "AWS_SECRET=<redacted>",
                         "DB_PASSWORD=<redacted>", "VLLM_CPU_KVCACHE_SPACE=4", "python"]

    def test_the_engine_gets_the_real_values(self) -> None:
        from launcher.model.catalog import hypothetical_gpus
        from launcher.model.resolve import resolve_model
        from launcher.plan.planner import make_plan
        from launcher.plan.types import PlanRequest

        args = ("--api-key", API_KEY)
        plan = make_plan(PlanRequest(model=resolve_model("qwen2.5-7b"), engine="vllm",
                                     gpus=hypothetical_gpus(["rtx4090"]), engine_args=args))
        assert [*args] == adapter("vllm").engine_argv(plan, "m", args, None)[3:5]


PASSTHROUGH = ("--api-key", API_KEY, "sk-SECRET-second", "--hf-token", HF_TOKEN)
ENGINE_CMD = f"env HF_TOKEN={ENV_TOKEN} python -m vllm.entrypoints.openai.api_server"


@pytest.mark.parametrize("argv", [
    ("serve", "qwen2.5-7b", "--gpu", "rtx4090", "--dry-run", "--engine-cmd", ENGINE_CMD, "--", *PASSTHROUGH),
    ("serve", "qwen2.5-7b", "--gpu", "rtx4090", "--dry-run", "--json", "--engine-cmd", ENGINE_CMD, "--", *PASSTHROUGH),
    ("serve", "qwen2.5-7b", "--engine", "sglang", "--gpu", "h100", "--dry-run", "--",
     "--api-key", API_KEY, "--ssl-keyfile-password", HF_TOKEN),
    ("plan", "qwen2.5-7b", "--gpu", "rtx4090", "--json", "--", *PASSTHROUGH),
    ("plan", "llama-3.1-70b", "--gpu", "rtx4090", "--", *PASSTHROUGH),  # a refusal: alternatives
    ("plan", "llama-3.1-70b", "--gpu", "rtx4090", "--json", "--", *PASSTHROUGH),
    # a pinned length above the model's: the "longest that fits" alternative repeats the flags
    ("plan", "qwen2.5-7b", "--gpu", "rtx4090", "--json", "--", *PASSTHROUGH, "--max-model-len", "999999"),
    ("fit", "qwen2.5-7b", "--concurrency", "4", "--tokens", "4096", "--gpu", "rtx4090", "--", *PASSTHROUGH),
    ("fit", "qwen2.5-7b", "--concurrency", "4", "--tokens", "4096", "--gpu", "rtx4090", "--json", "--",
     *PASSTHROUGH),
    ("plan", "qwen2.5-7b", "--gpu", "rtx4090", "--api-key", API_KEY),  # before `--`: the usage hint
    # a key starting with '-' (base64url): argparse reads it as a flag; it was named in "does not take"
    ("plan", "qwen2.5-7b", "--gpu", "rtx4090", "--json", "--", "--api-key", "-" + API_KEY),
    ("plan", "qwen2.5-7b", "--engine", "sglang", "--gpu", "h100", "--", "--admin-api-k", "-" + HF_TOKEN),
])
def test_no_output_shows_a_secret(argv: tuple[str, ...], tmp_path: Path) -> None:
    """Before: the dry-run command (human and JSON), the alternatives, fit's flags and the usage
    hint printed the --api-key and --hf-token values and HF_TOKEN from --engine-cmd."""
    result = _run(*argv, tmp=tmp_path)
    assert result.returncode in (0, 2, 78), result.stderr
    assert result.stdout or result.stderr
    _no_secret(result.stdout, result.stderr)
    if "--dry-run" in argv:
        assert "<redacted>" in result.stdout


@pytest.mark.parametrize("engine_cmd", [f"env HF_TOKEN={ENV_TOKEN} 'vllm serve", f"vllm serve --api-key {API_KEY} \"'"])
def test_an_engine_cmd_that_cannot_be_split_is_not_repeated(engine_cmd: str) -> None:
    """The usage error repeated the whole --engine-cmd, secrets and all (it cannot be split, so not masked)."""
    result = _run("qwen2.5-7b", "--gpu", "h100", "--dry-run", "--json", "--engine-cmd", engine_cmd)
    assert result.returncode == 2 and "No closing quotation" in result.stderr, result.stderr
    _no_secret(result.stdout, result.stderr)


def test_a_bare_optional_secret_flag_before_another_flag_is_fine() -> None:
    """vLLM's --hf-token takes an optional value: `--hf-token --port 8001` is two flags, not a hidden value."""
    result = _run("plan", "qwen2.5-7b", "--gpu", "rtx4090", "--", "--hf-token", "--port", "8001")
    assert result.returncode == 0, result.stderr


# --------------------------------------------------------------------------- the serve run


@pytest.fixture(scope="module", name="nvml_stub")
def _nvml_stub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The NVML stand-in library (as tests/test_serve_standin.py builds it)."""
    lib_dir = tmp_path_factory.mktemp("nvml")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-fvisibility=hidden", "-Wl,-soname,libnvidia-ml.so.1",
                    "-o", str(lib_dir / "libnvidia-ml.so.1"), str(REPO / "tests" / "nvml_stub" / "nvml_stub.c")],
                   check=True)
    return lib_dir

def _serve(tmp: Path, nvml_lib: Path, *, options: tuple[str, ...] = (), engine_args: tuple[str, ...] = (),
           close_fds: tuple[int, ...] = ()) -> tuple[subprocess.Popen[bytes], dict[str, Path]]:
    """`safe-serve qwen2.5-7b` on a stand-in RTX 4090 with the stand-in vLLM (as tests/test_serve_standin.py)."""
    tmp.mkdir(parents=True, exist_ok=True)
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090", engine_args)
    files = {name: tmp / name for name in ("ready", "record", "argv.jsonl", "state", "stdout", "stderr", "locks")}
    standin = [sys.executable, str(STANDIN), "--scenario", str(SCENARIOS / VLLM),
               "--record", str(files["record"]), "--argv-log", str(files["argv.jsonl"])]
    for key, value in vllm_agrees(plan).items():
        standin += ["--standin-set", f"{key}={value}"]
    port = _free_port()
    argv = [sys.executable, "-m", "launcher", "qwen2.5-7b", "--engine-cmd", shlex.join(["env", f"HF_TOKEN={ENV_TOKEN}",
                                                                                        *standin]),
            "--log-format", "json", "--ready-file", str(files["ready"]), "--grace", "5", *options,
            "--", "--port", str(port), *engine_args]
    env = {**os.environ, "SAFE_SERVE_STATE_DIR": str(files["state"]), "SAFE_SERVE_LOCK_DIR": str(files["locks"]),
           "NO_COLOR": "1", "LD_LIBRARY_PATH": str(nvml_lib),
           "SAFE_SERVE_NVML_STUB_FIXTURE": str(nvml_fixture_for("rtx4090", tmp / "nvml.txt"))}

    def close() -> None:
        for fd in close_fds:
            os.close(fd)

    with files["stdout"].open("wb") as out, files["stderr"].open("wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=REPO, env=env, preexec_fn=close)  # noqa: PLW1509
    return proc, files


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(predicate: Any, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if predicate():
            return
        time.sleep(0.05)
    assert predicate(), f"not reached (exit {proc.poll()})"


def _stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_serve_run_logs_no_secret_and_the_engine_gets_them(tmp_path: Path, nvml_stub: Path) -> None:
    """Before: the `engine started` event (journal, pod logs) carried --api-key, --hf-token and HF_TOKEN."""
    proc, files = _serve(tmp_path, nvml_stub, engine_args=PASSTHROUGH)
    try:
        _wait(files["ready"].exists, proc)
    finally:
        code = _stop(proc)
    err = files["stderr"].read_text()
    assert 0 == code, err[-3000:]
    started = [json.loads(line) for line in err.splitlines() if '"engine started"' in line]
    assert started and "<redacted>" in started[0]["argv"]
    _no_secret(err, files["stdout"].read_text())
    real = json.loads(files["argv.jsonl"].read_text().splitlines()[0])["argv"]
    assert API_KEY in real and HF_TOKEN in real


# --------------------------------------------------------------------------- descriptors


@pytest.mark.parametrize("closed", [(1,), (2,), (0, 1, 2)])
def test_closed_descriptors_are_reopened_on_dev_null(tmp_path: Path, nvml_stub: Path, closed: tuple[int, ...]) -> None:
    """Before: with stdout closed the start lock took fd 1 and got the engine's output; with
    stderr closed every clean stop exited 1."""
    proc, files = _serve(tmp_path, nvml_stub, close_fds=closed)
    try:
        _wait(files["ready"].exists, proc)
        held = {fd: os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in closed}
    finally:
        code = _stop(proc)
    assert {fd: "/dev/null" for fd in closed} == held
    assert 0 == code
    for lock in (files["locks"]).iterdir():
        assert b"" == lock.read_bytes(), lock  # released: empty, never the engine's output
    assert files["record"].joinpath("stdout.bin").exists()


@pytest.mark.parametrize("argv", [["plan", "qwen2.5-7b", "--gpu", "rtx4090"],
                                  ["plan", "qwen2.5-7b", "--gpu", "rtx4090", "--json"], ["models"]])
def test_a_result_with_stdout_closed_is_one_line_and_74(argv: list[str]) -> None:
    """`safe-serve plan --json >&-`: the result has nowhere to go; it exited 0 having written nothing
    (as `> /dev/full` is 74, so is this). A supervisor keeps running (above)."""
    result = subprocess.run([sys.executable, "-m", "launcher", *argv], cwd=REPO,
                            stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1), timeout=60)  # noqa: PLW1509
    said = b"safe-serve: cannot write the output: standard output is closed\n"
    assert (result.returncode, result.stderr) == (74, said)


# --------------------------------------------------------------------------- model paths and names


def _local_model(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(QWEN25_7B))
    _write_safetensors(root / "model.safetensors", {"w": ("BF16", [64, 32])})
    return root


def test_a_directory_named_like_a_flag_reaches_the_engine_as_a_path(tmp_path: Path) -> None:
    """Before: `./--served-model-name` reached vLLM as the bare flag `--served-model-name`."""
    _local_model(tmp_path / "--served-model-name")
    result = subprocess.run([sys.executable, "-m", "launcher", "serve", "./--served-model-name", "--gpu", "rtx4090",
                             "--dry-run", "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(REPO), "SAFE_SERVE_STATE_DIR": str(tmp_path / "s")})
    assert 0 == result.returncode, result.stderr
    command = json.loads(result.stdout)["command"]
    assert "--served-model-name" not in command
    assert command[2] == "./--served-model-name"


def test_a_name_with_a_newline_cannot_forge_a_plan_line(tmp_path: Path) -> None:
    name = "m\nsafe-serve plan: forged on 8 x H100"
    _local_model(tmp_path / name)
    result = _run("plan", str(tmp_path / name), "--gpu", "rtx4090", tmp=tmp_path)
    assert 0 == result.returncode, result.stderr
    assert not any(line.startswith("safe-serve plan: forged") for line in result.stdout.splitlines())
    assert "m\\nsafe-serve plan: forged" in result.stdout.splitlines()[0]
