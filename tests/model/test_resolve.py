"""Resolving what the operator typed: bad directories, bad names and an unreachable Hub, one line each."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher.common.errors import ExitCode, ModelConfigError, ModelNotFound, SafeServeError
from launcher.model.resolve import is_repo_id, resolve_model, safetensors_tensor_bytes
from tests.model.test_config import QWEN25_7B, _write_safetensors

REPO = Path(__file__).resolve().parents[1].parent
INDEX = "model.safetensors.index.json"


def _model_dir(root: Path, config: object = QWEN25_7B, index: object = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if index is not None:
        (root / INDEX).write_text(index if isinstance(index, str) else json.dumps(index))
    return root


def _error(text: str) -> SafeServeError:
    with pytest.raises(SafeServeError) as caught:
        resolve_model(text)
    assert "\n" not in str(caught.value)
    return caught.value


class TestWeightFiles:
    """Weight files that are not regular files: one line, 65 or 66, and never a hang."""

    def test_fifo_is_refused_without_blocking(self, tmp_path: Path) -> None:
        """A FIFO named model.safetensors used to block the plan forever in open()."""
        model = _model_dir(tmp_path / "m")
        os.mkfifo(model / "model.safetensors")
        started = time.monotonic()
        error = _error(str(model))
        assert time.monotonic() - started < 2
        assert isinstance(error, ModelConfigError) and error.exit_code == ExitCode.DATA
        assert str(error) == f"{model}/model.safetensors: is a FIFO, not a regular file"

    def test_fifo_index_is_refused(self, tmp_path: Path) -> None:
        model = _model_dir(tmp_path / "m")
        os.mkfifo(model / INDEX)
        assert str(_error(str(model))) == f"{model}/{INDEX}: is a FIFO, not a regular file"

    def test_directory_named_like_a_shard(self, tmp_path: Path) -> None:
        model = _model_dir(tmp_path / "m")
        (model / "model-00001-of-00002.safetensors").mkdir()
        error = _error(str(model))
        assert error.exit_code == 65 and "model-00001-of-00002.safetensors: is a directory" in str(error)

    def test_dangling_symlink(self, tmp_path: Path) -> None:
        """A symlink into a cache that was cleaned: 66 (the input is not there), naming the target."""
        model = _model_dir(tmp_path / "m")
        (model / "model.safetensors").symlink_to(tmp_path / "gone" / "blob")
        error = _error(str(model))
        assert isinstance(error, ModelNotFound) and error.exit_code == 66
        assert "model.safetensors: a dangling symlink" in str(error) and "gone/blob" in str(error)

    def test_symlink_loop(self, tmp_path: Path) -> None:
        model = _model_dir(tmp_path / "m")
        (model / "a.safetensors").symlink_to(model / "b.safetensors")
        (model / "b.safetensors").symlink_to(model / "a.safetensors")
        error = _error(str(model))
        assert error.exit_code == 66 and "Too many levels of symbolic links" in str(error)

    def test_symlink_to_a_regular_file_is_read(self, tmp_path: Path) -> None:
        """The HF cache links snapshots to blobs: a symlink to a regular file is fine."""
        model = _model_dir(tmp_path / "m")
        expected = _write_safetensors(tmp_path / "blob", {"w": ("BF16", [16, 8])})
        (model / "model.safetensors").symlink_to(tmp_path / "blob")
        assert resolve_model(str(model)).weight_bytes == expected == 256

    def test_short_header_is_one_line(self, tmp_path: Path) -> None:
        model = _model_dir(tmp_path / "m")
        (model / "model.safetensors").write_bytes((1000).to_bytes(8, "little") + b"{}")
        assert str(_error(str(model))) == f"{model}/model.safetensors: safetensors header cut short (2 of 1000 bytes)"

    def test_a_truncated_file_is_one_line_65(self, tmp_path: Path) -> None:
        """An interrupted download: the header is whole, the tensor data stops short. Was planned as if
        complete (the engine then fails to load it after the start lock)."""
        model = _model_dir(tmp_path / "m")
        raw = json.dumps({"w": {"dtype": "BF16", "shape": [64, 32], "data_offsets": [0, 4096]}}).encode()
        (model / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * 1000)
        assert str(_error(str(model))) == (f"{model}/model.safetensors: cut short: its header places tensor data "
                                           "up to byte 4096 and the file holds 1000 (an incomplete download?)")

    def test_a_header_whose_shape_and_offsets_disagree_is_one_line_65(self, tmp_path: Path) -> None:
        """A header that lies: shape x dtype says 2 TB, the offsets 10 bytes. Was planned as 0.00 GiB of weights."""
        model = _model_dir(tmp_path / "m")
        raw = json.dumps({"w": {"dtype": "BF16", "shape": [10**6, 10**6], "data_offsets": [0, 10]}}).encode()
        (model / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * 10)
        assert str(_error(str(model))) == (f"{model}/model.safetensors: tensor 'w' of dtype BF16 and shape "
                                           "[1000000, 1000000] needs 2000000000000 bytes, its data_offsets span 10")

    def test_sub_byte_and_unknown_dtypes_are_read_by_their_offsets(self, tmp_path: Path) -> None:
        """F4 packs two values a byte (safetensors' bit sizes); a dtype we do not know is taken at its offsets."""
        model = _model_dir(tmp_path / "m")
        raw = json.dumps({"a": {"dtype": "F4", "shape": [64, 32], "data_offsets": [0, 1024]},
                          "b": {"dtype": "NEWTYPE", "shape": [3], "data_offsets": [1024, 1031]}}).encode()
        (model / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * 1031)
        assert resolve_model(str(model)).weight_bytes == 1031

    def test_header_nested_too_deeply(self, tmp_path: Path) -> None:
        raw = b"[" * 100_000 + b"]" * 100_000
        (tmp_path / "w.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw)
        with pytest.raises(ModelConfigError, match="unreadable safetensors header"):
            safetensors_tensor_bytes(tmp_path / "w.safetensors")


class TestIndexValues:
    @pytest.mark.parametrize(("index", "text"), [
        ('{"metadata": []}', "'metadata' must be an object holding total_size, not []"),
        ('{"metadata": {"total_size": NaN}}', "metadata.total_size must be a byte count from 1 to 2**50, not nan"),
        ('{"metadata": {"total_size": Infinity}}', "not inf"),
        ('{"metadata": {"total_size": 1' + "0" * 400 + "}}", "not 1000000000"),
        ('{"metadata": {"total_size": true}}', "not True"),
        ('{"metadata": {"total_size": -5}}', "not -5"),
        ('{"metadata": {"total_size": [5]}}', "not [5]"),
        ('{"metadata": {}}', "no metadata.total_size"),
        ("[1, 2]", "expected a JSON object"),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON (nested too deeply)"),
        ('{"metadata": {"total_size": 1' + "0" * 5000 + "}}", "not valid JSON (Exceeds the limit (4300 digits)"),
    ])
    def test_bad_index_value_names_the_file(self, tmp_path: Path, index: str, text: str) -> None:
        """Each bad index is a data error (65) naming the index file and what is wrong with it."""
        model = _model_dir(tmp_path / "m", index=index)
        error = _error(str(model))
        assert isinstance(error, ModelConfigError)
        assert str(error).startswith(f"{model}/{INDEX}: ") and text in str(error)

    def test_integral_float_total_size_is_accepted(self, tmp_path: Path) -> None:
        """Some writers emit 1.5e10; an integral float is a byte count."""
        model = _model_dir(tmp_path / "m", index='{"metadata": {"total_size": 1.5e10}}')
        assert resolve_model(str(model)).weight_bytes == 15_000_000_000


class TestConfigFile:
    def test_missing_config_names_the_directory(self, tmp_path: Path) -> None:
        error = _error(str(tmp_path))
        assert isinstance(error, ModelNotFound)
        assert str(error) == f"{tmp_path}: no config.json there (a model directory needs one)"

    def test_config_errors_name_the_real_file(self, tmp_path: Path) -> None:
        """geometry's 'config.json:' prefix becomes the path the operator can open."""
        model = _model_dir(tmp_path / "m", {**QWEN25_7B, "torch_dtype": "banana"},
                           index={"metadata": {"total_size": 9}})
        assert str(_error(str(model))) == (
            f"{model}/config.json: 'torch_dtype' must be a torch dtype name such as bfloat16, not 'banana'")

    def test_config_json_directory(self, tmp_path: Path) -> None:
        (tmp_path / "m" / "config.json").mkdir(parents=True)
        error = _error(str(tmp_path / "m"))
        assert error.exit_code == 65 and str(error).endswith("config.json: is a directory, not a regular file")

    def test_unreadable_config_is_66(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A config.json the reader may not open (EACCES) is 66 with the OS's reason. The refusal
        comes from os.open itself, as for a mode-0 file, so the test also holds as root (which
        opens a mode-0 file anyway)."""
        model = _model_dir(tmp_path / "m")
        real_open = os.open

        def refusing_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if os.fspath(path).endswith(os.sep + "config.json"):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", refusing_open)
        error = _error(str(model))
        assert error.exit_code == 66 and "Permission denied" in str(error)

    def test_oversized_config_is_refused(self, tmp_path: Path) -> None:
        model = _model_dir(tmp_path / "m", '{"a": "' + "x" * (65 << 20) + '"}')
        assert "larger than 64 MiB" in str(_error(str(model)))


class TestModelArguments:
    @pytest.mark.parametrize(("text", "code", "fragment"), [
        ("a" * 256, 66, "the name is too long for the file system"),
        ("~nosuchuser", 66, "no such user's home directory"),
        ("~nosuchuser/models/x", 66, "no such user's home directory"),
        ("org/ünï", 66, "is not a directory, a known alias or a Hugging Face repo id"),
        ("a/b/c", 66, "is not a directory, a known alias or a Hugging Face repo id"),
        ("org/" + "n" * 97, 66, "is not a directory"),
        ("org/na--me", 66, "is not a directory"),
        ("../../etc/passwd", 66, "is not a directory"),
        ("", 66, "not a usable name or path"),
        ("x" * 5000, 66, "not a usable name or path (5000 characters)"),
        ("a\0b", 66, "not a usable name or path"),
    ])
    def test_names_the_system_rejects(self, text: str, code: int, fragment: str) -> None:
        """Names the file system or the Hub client would reject: one short line, 66, no traceback."""
        error = _error(text)
        assert error.exit_code == code and fragment in str(error) and len(str(error).split(" (")[0]) < 200

    @pytest.mark.parametrize(("text", "ok"), [
        ("Qwen/Qwen2.5-7B-Instruct", True), ("meta-llama/Llama-3.1-8B", True), ("org/ünï", False),
        ("org/a..b", False), ("org/x.git", False), ("-org/x", False), ("org/x-", False), ("a/b/c", False),
        ("o" * 96 + "/x", True), ("o" * 97 + "/x", False),
    ])
    def test_repo_id_rule_matches_huggingface_hub(self, text: str, ok: bool) -> None:
        """Our check agrees with huggingface_hub's validate_repo_id, so it never raises at us."""
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        try:
            validate_repo_id(text)
            hub_ok = True
        except HFValidationError:
            hub_ok = False
        assert is_repo_id(text) is ok is hub_ok


# --------------------------------------------------------------------------- the Hub, in a subprocess

_PLAN = [sys.executable, "-m", "launcher", "plan", "--gpu", "h100"]


@pytest.fixture
def hub_env(tmp_path: Path) -> Callable[..., dict[str, str]]:
    """An environment whose Hub is a loopback port and whose cache is empty (huggingface_hub reads both at import)."""
    def make(endpoint: str = "http://127.0.0.1:9", **extra: str) -> dict[str, str]:
        return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"),
                "HF_ENDPOINT": endpoint, "SAFE_SERVE_STATE_DIR": str(tmp_path / "state"), **extra}
    return make


def _cache_repo(hf_home: Path, repo_id: str, files: dict[str, bytes]) -> None:
    """The Hugging Face cache layout: refs/main -> a snapshot holding the files."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, data in files.items():
        (snapshot / name).write_bytes(data)


def _run(argv: list[str], env: dict[str, str], timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    return run, time.monotonic() - started


@pytest.fixture
def blackhole() -> Iterator[str]:
    """A loopback port that accepts connections (the kernel's backlog) and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()


@pytest.fixture
def fake_hub() -> Iterator[Callable[[int, str], str]]:
    """A loopback HTTP server answering every request with one status (and X-Error-Code), like the Hub's errors."""
    import http.server
    import threading

    servers: list[http.server.ThreadingHTTPServer] = []

    def start(status: int, error_code: str = "") -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.send_response(status)
                if error_code:
                    self.send_header("X-Error-Code", error_code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_HEAD = do_GET = _answer

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


class TestHub:
    @pytest.mark.parametrize(("status", "error_code", "code", "text"), [
        (503, "", 75, "the Hugging Face Hub is unavailable (2 tries, 4 s timeout each; HfHubHTTPError"),
        (429, "", 75, "the Hugging Face Hub is unavailable"),
        (404, "RepoNotFound", 66, "someorg/x: no such repository on the Hugging Face Hub (or no access)"),
        (404, "EntryNotFound", 66, "someorg/x: the repository has no config.json"),
        (401, "", 66, "someorg/x: the Hugging Face Hub refused (401)"),
    ])
    def test_hub_answers(self, hub_env: Callable[..., dict[str, str]], fake_hub: Callable[[int, str], str],
                         status: int, error_code: str, code: int, text: str) -> None:
        """Server errors and rate limits are temporary (75); a missing repo or file is 66; one line each."""
        run, took = _run([*_PLAN, "someorg/x"], hub_env(fake_hub(status, error_code)))
        assert run.returncode == code, run.stderr
        assert text in run.stderr and len(run.stderr.strip().splitlines()) == 1 and took < 10

    def test_unreachable_hub_is_temporary_and_fast(self, hub_env: Callable[..., dict[str, str]]) -> None:
        """Connection refused, nothing cached: one line and 75 (EX_TEMPFAIL) in seconds, not 23 s and 65."""
        run, took = _run([*_PLAN, "someorg/somemodel"], hub_env())
        assert run.returncode == 75, run.stderr
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in run.stderr
        assert lines[0].startswith("safe-serve: someorg/somemodel: the Hugging Face Hub is unavailable "
                                   "(2 tries, 4 s timeout each; ConnectError: [Errno 111] Connection refused)")
        assert took < 10

    def test_silent_hub_times_out_in_bounded_time(self, hub_env: Callable[..., dict[str, str]], blackhole: str) -> None:
        """A Hub that accepts and never answers: 2 tries of 4 s, then 75."""
        run, took = _run([*_PLAN, "someorg/somemodel"], hub_env(blackhole))
        assert run.returncode == 75 and "unavailable (2 tries, 4 s timeout each; ReadTimeout" in run.stderr, run.stderr
        assert took < 20

    def test_profile_repo_falls_back_to_its_profile(self, hub_env: Callable[..., dict[str, str]]) -> None:
        """A repo a profile names still plans with the Hub down (from the profile, as before)."""
        run, _ = _run([*_PLAN, "Qwen/Qwen2.5-7B-Instruct", "--json"], hub_env())
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["model"] == "Qwen/Qwen2.5-7B-Instruct"

    def test_cached_single_file_plans_offline(self, tmp_path: Path, hub_env: Callable[..., dict[str, str]]) -> None:
        """HF_HUB_OFFLINE=1 and a cached model.safetensors without an index: weights from the cached header."""
        header = tmp_path / "w.safetensors"
        weight = _write_safetensors(header, {"a": ("BF16", [1024, 512]), "b": ("F32", [100])})
        _cache_repo(tmp_path / "hf", "someorg/single", {"config.json": json.dumps(QWEN25_7B).encode(),
                                                        "model.safetensors": header.read_bytes()})
        run, _ = _run([*_PLAN, "someorg/single", "--json"], hub_env(HF_HUB_OFFLINE="1"))
        assert run.returncode == 0, run.stderr
        doc = json.loads(run.stdout)
        weights = next(item for item in doc["budget"] if item["key"] == "weights")
        rope = 32768 * 128 * 2  # the rotary table vLLM builds beside the weights (counted in that row)
        assert weights["bytes"] - rope == weight == 1024 * 512 * 2 + 100 * 4
        assert weights["detail"].startswith("someorg/single model.safetensors header (cached), + 0.01 GiB as loaded")

    def test_cached_single_file_with_hub_down(self, tmp_path: Path, hub_env: Callable[..., dict[str, str]]) -> None:
        """Online but unreachable, everything cached: the cache answers, exit 0."""
        header = tmp_path / "w.safetensors"
        _write_safetensors(header, {"a": ("BF16", [64, 64])})
        _cache_repo(tmp_path / "hf", "someorg/single", {"config.json": json.dumps(QWEN25_7B).encode(),
                                                        "model.safetensors": header.read_bytes()})
        run, _ = _run([*_PLAN, "someorg/single"], hub_env())
        assert run.returncode == 0, run.stderr

    def test_offline_without_weights_cached_is_66(self, tmp_path: Path, hub_env: Callable[..., dict[str, str]]) -> None:
        _cache_repo(tmp_path / "hf", "someorg/noweights", {"config.json": json.dumps(QWEN25_7B).encode()})
        run, _ = _run([*_PLAN, "someorg/noweights"], hub_env(HF_HUB_OFFLINE="1"))
        assert run.returncode == 66, run.stderr
        assert "HF_HUB_OFFLINE is set and neither model.safetensors.index.json nor model.safetensors" in run.stderr

    def test_offline_nothing_cached_is_66(self, hub_env: Callable[..., dict[str, str]]) -> None:
        run, _ = _run([*_PLAN, "someorg/uncached"], hub_env(HF_HUB_OFFLINE="1"))
        assert run.returncode == 66 and "config.json is not in the Hugging Face cache" in run.stderr, run.stderr

    def test_cached_bad_config_names_the_repo(self, tmp_path: Path, hub_env: Callable[..., dict[str, str]]) -> None:
        config = json.dumps({**QWEN25_7B, "num_key_value_heads": 0}).encode()
        index = b'{"metadata": {"total_size": 100}}'
        _cache_repo(tmp_path / "hf", "someorg/bad", {"config.json": config, INDEX: index})
        run, _ = _run([*_PLAN, "someorg/bad"], hub_env(HF_HUB_OFFLINE="1"))
        assert run.returncode == 65, run.stderr
        assert "someorg/bad/config.json: 'num_key_value_heads' must be positive, not 0" in run.stderr
