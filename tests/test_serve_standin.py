"""`safe-serve` end to end against stand-in engines that replay vLLM's and SGLang's real log lines.

What cannot run here (vLLM on a GPU, SGLang) is played by tests/standin_engine.py with the
scenarios in tests/scenarios/: the engines' own line formats and streams, KV numbers computed
from the flags safe-serve passes (as the engine computes them), the engines' fatal errors
with their exit behaviour, and /health after the ready line. Each test runs safe-serve as a
real process on stand-in GPUs (the NVML stand-in, tests/nvml_stub, with the catalog's figures), output to files,
and reads its JSON events from stderr. Memory figures of the stand-in come from `safe-serve plan --json` for the
same command, so the engine agrees with the plan exactly unless a test makes it disagree.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests import processes
from tests.jsonlog import json_events

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "standin_engine.py"
SCENARIOS = REPO / "tests" / "scenarios"
GiB = 1 << 30
QWEN_BYTES_PER_TOKEN = 57344  # tests/scenarios/vllm-qwen2.5-7b-rtx4090.yaml: 28 layers x 2 x 4 x 128 x 2
LLAMA_CELL_BYTES = 131072  # tests/scenarios/sglang-llama-3.1-8b-h100.yaml: 32 layers x 2 x 8 x 128 x 2
TIMEOUT = 30.0

VLLM = "vllm-qwen2.5-7b-rtx4090.yaml"
SGLANG = "sglang-llama-3.1-8b-h100.yaml"

# --------------------------------------------------------------------------- helpers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@functools.cache
def plan_json(model: str, engine: str, gpu: str, flags: tuple[str, ...] = (), concurrency: int = 1,
              version: str | None = None) -> dict[str, Any]:
    """`safe-serve plan --json` for the command a test serves (no calibration: an empty state dir), for the
    release the stand-in's arithmetic is unless `version`."""
    release = ("--engine-version", version) if version else standin_version(engine)
    with tempfile.TemporaryDirectory() as state:
        done = subprocess.run(
            [sys.executable, "-m", "launcher", "plan", model, "--engine", engine, "--gpu", gpu, "--json",
             "--concurrency", str(concurrency), *release, "--", *flags],
            cwd=REPO, env={**os.environ, "SAFE_SERVE_STATE_DIR": state}, capture_output=True, check=True)
    return json.loads(done.stdout)


def standin_version(engine: str) -> tuple[str, ...]:
    """The release the stand-in's arithmetic is (tests/standin_engine.py: vLLM 0.32), planned as such."""
    return ("--engine-version", "0.32.0") if engine == "vllm" else ()


def budget(plan: dict[str, Any]) -> dict[str, int]:
    return {item["key"]: int(item["bytes"]) for item in plan["budget"]}


def vllm_agrees(plan: dict[str, Any]) -> dict[str, Any]:
    """Stand-in figures under which vLLM computes exactly the plan's KV cache."""
    b = budget(plan)
    return {"vllm.total_bytes": b["total"], "vllm.free_bytes": b["total"] - b["other"],
            "vllm.non_kv_bytes": b["requested"] - plan["kv_cache_bytes"]}


def sglang_agrees(plan: dict[str, Any]) -> dict[str, Any]:
    """Stand-in figures under which SGLang sizes the plan's pool (P and what the load takes)."""
    b = budget(plan)
    return {"sglang.pre_load_gib": b["pre_load"] / GiB,
            "sglang.weights_gib": (b["weights"] + b.get("load_overhead", 0)) / GiB}


def vllm_kv(kv_bytes: int, max_model_len: int, bytes_per_token: int = QWEN_BYTES_PER_TOKEN,
            block: int = 16) -> tuple[int, float, int]:
    """vLLM 0.32's (tokens, concurrency, estimated max model len) for a KV budget (vllm-memory.md 3.4, 4.3)."""
    blocks = kv_bytes // (bytes_per_token * block)
    concurrency = blocks / math.ceil(max_model_len / block)
    return int(concurrency * max_model_len), concurrency, min((blocks - 1) * block, max_model_len)


def gib_text(value: int) -> float:
    """A byte count as vLLM prints it (format_gib), read back as the watcher reads it."""
    return float(f"{round(value / GiB, 2)}")


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value the engine's argparse ends up with: the last spelling wins."""
    value = None
    for index, token in enumerate(argv):
        if token == flag and index + 1 < len(argv):
            value = argv[index + 1]
        elif token.startswith(flag + "="):
            value = token.partition("=")[2]
    return value


L40S_UUID = "GPU-8f2b9d4a-0c1e-4f2a-9b3c-4d5e6f708192"
L40S_TOTAL, L40S_RESERVED = 48305799168, 452984832


@pytest.fixture(scope="module")
def nvml_stub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/nvml_stub/nvml_stub.c built as a libnvidia-ml.so.1 that reads its GPUs from a fixture file."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed: cannot build the stand-in libnvidia-ml.so.1")
    lib_dir = tmp_path_factory.mktemp("nvml")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-fvisibility=hidden", "-Wl,-soname,libnvidia-ml.so.1",
                    "-o", str(lib_dir / "libnvidia-ml.so.1"), str(REPO / "tests" / "nvml_stub" / "nvml_stub.c")],
                   check=True)
    return lib_dir


def nvml_fixture_for(gpu: str, path: Path) -> Path:
    """An NVML stand-in fixture of idle catalog GPUs (`rtx4090`, `2xh100`): serve plans from a real
    probe (serve refuses a hypothetical --gpu), with the catalog's totals and compute capability."""
    from launcher.model.catalog import hypothetical_gpus

    lines = ["system driver=550.54.15 nvml=12.550.54.15 cuda=12040"]
    for index, device in enumerate(hypothetical_gpus([gpu])):
        reserved = device.total_bytes - device.usable_total_bytes
        cc = device.compute_capability or (8, 0)
        lines.append(f'gpu name="{device.name}" uuid=GPU-0000000{index}-aaaa-bbbb-cccc-{index:012d} '
                     f"total={device.total_bytes} reserved={reserved} used=0 free={device.usable_total_bytes} "
                     f"cc={cc[0]}.{cc[1]} mig=unsupported")
    path.write_text("\n".join(lines) + "\n")
    return path


class Served:
    """One safe-serve process on stand-in GPUs (NVML stand-in) with a stand-in engine; output in files."""

    def __init__(self, tmp: Path, scenario: str, *, model: str = "qwen2.5-7b", engine: str = "vllm",
                 gpu: str | None = "rtx4090", sets: dict[str, Any] | None = None, options: Sequence[str] = (),
                 engine_args: Sequence[str] = (), env: dict[str, str] | None = None,
                 nvml_lib: Path | None = None) -> None:
        self.dir = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.ready_file = tmp / "ready"
        self.record = tmp / "record"
        self.argv_log = tmp / "argv.jsonl"
        self.state = tmp / "state"
        self.out, self.err = tmp / "stdout", tmp / "stderr"
        standin = [sys.executable, str(STANDIN), "--scenario", str(SCENARIOS / scenario), "--record",
                   str(self.record), "--argv-log", str(self.argv_log)]
        for key, value in (sets or {}).items():
            standin += ["--standin-set", f"{key}={value}"]
        probe_env: dict[str, str] = {}
        if gpu is not None:
            assert nvml_lib is not None, "a GPU needs the NVML stand-in"
            probe_env = {"LD_LIBRARY_PATH": str(nvml_lib),
                         "SAFE_SERVE_NVML_STUB_FIXTURE": str(nvml_fixture_for(gpu, tmp / "nvml.txt"))}
        argv = [sys.executable, "-m", "launcher", model, "--engine", engine,
                "--engine-cmd", shlex.join(standin), "--log-format", "json", "--ready-file", str(self.ready_file),
                "--grace", "5", *standin_version(engine), *options, "--", "--port", str(self.port), *engine_args]
        self.env = {**os.environ, "SAFE_SERVE_STATE_DIR": str(self.state),
                    "SAFE_SERVE_LOCK_DIR": str(tmp / "locks"), "NO_COLOR": "1", **probe_env, **(env or {})}
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=REPO, env=self.env)

    # ---- what came out

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        return json_events(self.err, name)

    def event(self, name: str) -> dict[str, Any]:
        found = self.events(name)
        assert found, f"no {name!r} event in:\n{self.tail()}"
        return found[-1]

    def starts(self) -> list[dict[str, Any]]:
        """Every start of the stand-in: its pid and argv (after the script path)."""
        if not self.argv_log.exists():
            return []
        return [json.loads(line) for line in self.argv_log.read_text().splitlines()]

    def recorded(self, stream: str) -> bytes:
        path = self.record / f"{stream}.bin"
        return path.read_bytes() if path.exists() else b""

    def tail(self) -> str:
        return self.err.read_bytes()[-6000:].decode(errors="replace")

    # ---- driving it

    def wait_for(self, predicate: Callable[[], bool], timeout: float = TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.proc.poll() is not None:
                if predicate():
                    return
                break
            time.sleep(0.05)
        raise AssertionError(f"timed out or exited ({self.proc.poll()}):\n{self.tail()}")

    def wait_ready(self) -> dict[str, Any]:
        # The ready file is written at once; the event line queues behind the engine's output.
        self.wait_for(lambda: self.ready_file.exists() and bool(self.events("ready")))
        return self.event("ready")

    def wait(self, timeout: float = TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"safe-serve still running after {timeout} s:\n{self.tail()}") from None

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.wait()

    def survivors(self) -> list[psutil.Process]:
        """Stand-in processes still running: started from this test's scenario arguments."""
        return processes.survivors(str(self.argv_log), self.proc.pid)

    def close(self) -> None:
        processes.close(self.proc, str(self.argv_log))


@pytest.fixture
def serve(tmp_path: Path, nvml_stub: Path) -> Iterator[Callable[..., Served]]:
    made: list[Served] = []

    def start(scenario: str, **kwargs: Any) -> Served:
        served = Served(tmp_path / f"run{len(made)}", scenario, nvml_lib=nvml_stub, **kwargs)
        made.append(served)
        return served

    yield start
    for served in made:
        served.close()


def health(port: int) -> int:
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def assert_clean_exit(served: Served, code: int) -> dict[str, Any]:
    """safe-serve exited `code`, said so in its `exit` event, left no stand-in and no ready file."""
    assert served.wait() == code, served.tail()
    final = served.event("exit")
    assert final["code"] == code
    assert not served.survivors()
    assert not served.ready_file.exists()
    return final


def assert_distinct_starts(served: Served) -> None:
    argvs = [tuple(start["argv"]) for start in served.starts()]
    assert len(argvs) == len(set(argvs)), argvs


# --------------------------------------------------------------------------- agreement


def test_vllm_034_sizing_before_warmup_is_said_and_not_calibrated(serve: Callable[..., Served]) -> None:
    """A 0.34 plan assumes the KV cache sized after warmup; a driver without virtual memory management makes vLLM
    size it before (its warning): the watch says the plan does not match, and keeps no non-KV figure (what a
    start sized after warmup prints as available memory is not its cache)."""
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090", version="0.34.0")
    assert plan["kv_sized_after_warmup"] and plan["block_size"] == 64
    served = serve("vllm-0.34-sized-before-warmup.yaml", options=("--engine-version", "0.34.0"),
                   sets={**vllm_agrees(plan), "vllm.kv_bytes": plan["kv_cache_bytes"]})
    ready = served.wait_ready()
    assert ready["kv_tokens"] == plan["kv_cache_tokens"]
    [mismatch] = served.events("plan-mismatch")
    assert "before warmup" in mismatch["reason"] and mismatch["utilization"] == plan["gpu_memory_utilization"]
    assert not (served.state / "calibration.json").exists()
    assert served.stop() == 0, served.tail()
    assert_clean_exit(served, 0)


def test_vllm_agreeing_with_the_plan_is_ready_and_stops_cleanly(serve: Callable[..., Served]) -> None:
    """vLLM reports exactly the planned KV tokens: ready event, ready file, /health, calibration, SIGTERM exits 0."""
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090")
    served = serve(VLLM, sets=vllm_agrees(plan))
    ready = served.wait_ready()
    assert ready["kv_tokens"] == ready["planned_tokens"] == plan["kv_cache_tokens"]
    assert ready["kv_tokens"] == vllm_kv(plan["kv_cache_bytes"], plan["max_model_len"])[0]
    assert ready["max_model_len"] == plan["max_model_len"] and ready["retunes"] == 0 and ready["engine"] == "vllm"
    [start] = served.starts()
    assert start["argv"][-len(plan["engine_args"]):] == plan["engine_args"]
    assert served.ready_file.read_text() == f"{start['pid']}\n"
    assert health(served.port) == 200
    assert not served.events("divergence") and not served.events("retune")
    calibration = json.loads((served.state / "calibration.json").read_text())
    [entry] = calibration["entries"].values()
    kv_gib = gib_text(plan["kv_cache_bytes"])
    assert entry["non_kv_bytes"] == budget(plan)["requested"] - int(kv_gib * GiB)
    assert served.stop() == 0, served.tail()
    final = assert_clean_exit(served, 0)
    assert final["phase"] == "READY" and final["restarts"] == 0
    assert b"INFO:     Application shutdown complete." in served.err.read_bytes()
    assert served.out.read_bytes() == served.recorded("stdout")


def test_sglang_agreeing_with_the_plan_is_ready_only_after_warmup(serve: Callable[..., Served],
                                                                   tmp_path: Path) -> None:
    """SGLang's pool equals the plan; while /health answers 503 (warmup) nothing is ready; after 200 it is;
    SIGTERM exits 0."""
    plan = plan_json("llama-3.1-8b", "sglang", "h100")
    go = tmp_path / "go"
    served = serve("sglang-slow-warmup.yaml", model="llama-3.1-8b", engine="sglang", gpu="h100",
                   sets={**sglang_agrees(plan), "vars.go": str(go)})
    served.wait_for(lambda: b"Uvicorn running on" in served.err.read_bytes())
    time.sleep(1.5)  # more than one health poll
    assert health(served.port) == 503
    assert not served.ready_file.exists() and not served.events("ready") and served.proc.poll() is None
    go.touch()
    ready = served.wait_ready()
    assert ready["kv_tokens"] == ready["planned_tokens"] == plan["kv_cache_tokens"]
    assert ready["max_model_len"] == plan["max_model_len"] == 131072
    [start] = served.starts()
    assert start["argv"][-len(plan["engine_args"]):] == plan["engine_args"]
    assert "--model-path" in start["argv"]
    assert health(served.port) == 200
    assert served.stop() == 0
    final = assert_clean_exit(served, 0)
    assert final["engine_phase"] == "serving"
    assert b"The server is fired up and ready to roll!" in served.err.read_bytes()
    assert served.out.read_bytes() == b""  # SGLang logs to stderr only


def test_sglang_worker_node_is_ready_without_http(serve: Callable[..., Served]) -> None:
    """`--node-rank 1`: the node's ranks allocate their pool, and no summary line or HTTP server ever comes
    (both are node 0's). Ready once the pool is in place, and no watch timeout stops the node."""
    plan = plan_json("llama-3.1-8b", "sglang", "h100")
    served = serve("sglang-worker-node.yaml", model="llama-3.1-8b", engine="sglang", gpu="h100",
                   sets=sglang_agrees(plan), options=("--watch-timeout", "20"),
                   engine_args=("--tp-size", "2", "--nnodes", "2", "--node-rank", "1"))
    ready = served.wait_ready()
    assert served.events("worker-node-kv") and not served.events("watch-timeout")
    assert ready["kv_tokens"] == served.event("worker-node-kv")["tokens"]
    assert served.stop() == 0


# --------------------------------------------------------------------------- divergence


def _twenty_percent_fewer(plan: dict[str, Any]) -> dict[str, Any]:
    return {**vllm_agrees(plan), "vllm.kv_bytes": int(plan["kv_cache_bytes"] * 0.8)}


def test_divergence_warn_keeps_serving(serve: Callable[..., Served]) -> None:
    """--on-divergence warn: 20 % fewer tokens than planned gives a divergence event and the engine serves on."""
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090")
    served = serve(VLLM, sets=_twenty_percent_fewer(plan), options=("--on-divergence", "warn"))
    ready = served.wait_ready()
    tokens, concurrency, _ = vllm_kv(int(plan["kv_cache_bytes"] * 0.8), plan["max_model_len"])
    divergence = served.event("divergence")
    assert divergence["planned_tokens"] == plan["kv_cache_tokens"] and divergence["tokens"] == tokens
    assert tokens < 0.81 * plan["kv_cache_tokens"]
    assert divergence["concurrency"] == round(concurrency, 2)
    assert ready["kv_tokens"] == tokens and ready["planned_tokens"] == plan["kv_cache_tokens"]
    assert len(served.starts()) == 1 and health(served.port) == 200
    assert served.stop() == 0
    assert_clean_exit(served, 0)


def test_divergence_abort_exits_78(serve: Callable[..., Served]) -> None:
    """--on-divergence abort: the engine is stopped at its KV line and safe-serve exits 78 with planned vs actual."""
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090")
    served = serve(VLLM, sets=_twenty_percent_fewer(plan), options=("--on-divergence", "abort"))
    final = assert_clean_exit(served, 78)
    abort = served.event("abort")
    tokens = vllm_kv(int(plan["kv_cache_bytes"] * 0.8), plan["max_model_len"])[0]
    assert abort["planned_tokens"] == plan["kv_cache_tokens"] and abort["tokens"] == tokens
    assert abort["planned_len"] == plan["max_model_len"] == abort["max_model_len"]
    assert not served.events("ready") and len(served.starts()) == 1
    assert final["phase"] == "STARTING" and final["engine_phase"] == "KV cache sized"


def test_divergence_retune_without_restart_when_one_request_still_fits(serve: Callable[..., Served]) -> None:
    """--on-divergence retune: when the engine's concurrency still carries the requests, it warns and keeps the
    engine."""
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090")
    served = serve(VLLM, sets=_twenty_percent_fewer(plan))
    ready = served.wait_ready()
    divergence = served.event("divergence")
    assert divergence["concurrency"] >= 1 and divergence["tokens"] == ready["kv_tokens"]
    assert not served.events("retune") and len(served.starts()) == 1 and ready["retunes"] == 0
    assert served.stop() == 0
    assert_clean_exit(served, 0)


def _retune_for_concurrency(serve: Callable[..., Served], engine_args: tuple[str, ...]) -> tuple[Served, int, int]:
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090", engine_args, concurrency=4)
    assert plan["max_concurrency"] >= 4
    served = serve(VLLM, sets=_twenty_percent_fewer(plan), options=("--concurrency", "4"), engine_args=engine_args)
    tokens, concurrency, _ = vllm_kv(int(plan["kv_cache_bytes"] * 0.8), plan["max_model_len"])
    assert concurrency < 4
    return served, tokens, int(tokens / 4) // 16 * 16


def test_divergence_retune_restarts_with_a_shorter_length_pinned(serve: Callable[..., Served]) -> None:
    """--concurrency 4 no longer fits: restart once with --max-model-len = tokens/4 (the operator pinned the length)."""
    served, tokens, length = _retune_for_concurrency(serve, ("--max-model-len", "24576"))
    ready = served.wait_ready()
    retune = served.event("retune")
    assert retune["tokens"] == tokens and retune["attempt"] == 1
    assert retune["engine_args"][-2:] == ["--max-model-len", str(length)]
    first, second = served.starts()
    assert flag_value(first["argv"], "--max-model-len") == "24576"
    assert flag_value(second["argv"], "--max-model-len") == str(length)
    assert ready["retunes"] == 1 and ready["max_model_len"] == length
    assert ready["kv_tokens"] == vllm_kv(int(plan_json("qwen2.5-7b", "vllm", "rtx4090", ("--max-model-len", "24576"),
                                                       concurrency=4)["kv_cache_bytes"] * 0.8), length)[0]
    # After a retune the original plan no longer describes the flags: no second divergence.
    assert served.events("divergence") == []
    assert served.stop() == 0
    assert_clean_exit(served, 0)


def test_divergence_retune_restarts_with_a_shorter_length_planned(serve: Callable[..., Served]) -> None:
    """--concurrency 4 no longer fits: the restarted engine must get the shorter --max-model-len the plan had chosen."""
    served, _tokens, length = _retune_for_concurrency(serve, ())
    ready = served.wait_ready()
    assert served.event("retune")["engine_args"][-2:] == ["--max-model-len", str(length)]
    _first, second = served.starts()
    assert flag_value(second["argv"], "--max-model-len") == str(length)
    assert ready["max_model_len"] == length


# --------------------------------------------------------------------------- vLLM's fatal errors


def _kv_too_small(serve: Callable[..., Served], *, log_failure: bool) -> tuple[Served, int]:
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090", ("--max-model-len", "32768"))
    kv_bytes = int(1.5 * GiB)
    sets = {**vllm_agrees(plan), "vllm.kv_bytes": kv_bytes, "log_failure": str(log_failure).lower()}
    served = serve(VLLM, sets=sets, engine_args=("--max-model-len", "32768"))
    estimate = vllm_kv(kv_bytes, 32768)[2]
    assert estimate < 32768 and estimate % 16 == 0
    return served, estimate


def _assert_retuned_to_estimate(served: Served, estimate: int) -> None:
    ready = served.wait_ready()
    retune = served.event("retune")
    assert retune["estimated_max_model_len"] == estimate and retune["max_model_len"] == 32768
    assert retune["engine_args"][-2:] == ["--max-model-len", str(estimate)]
    _first, second = served.starts()
    assert flag_value(second["argv"], "--max-model-len") == str(estimate)
    assert ready["retunes"] == 1 and ready["max_model_len"] == estimate
    assert ready["kv_tokens"] == vllm_kv(int(1.5 * GiB), estimate)[0]
    assert served.stop() == 0
    assert_clean_exit(served, 0)


def test_kv_too_small_retunes_to_the_engines_estimate(serve: Callable[..., Served]) -> None:
    """vLLM's "estimated maximum model length is E" restarts it with --max-model-len E, then it serves (error
    reported once)."""
    served, estimate = _kv_too_small(serve, log_failure=False)
    _assert_retuned_to_estimate(served, estimate)


def test_kv_too_small_retunes_as_vllm_reports_it(serve: Callable[..., Served]) -> None:
    """vLLM's own double report (stdout log + stderr traceback) of "estimated maximum model length" still retunes
    once."""
    served, estimate = _kv_too_small(serve, log_failure=True)
    _assert_retuned_to_estimate(served, estimate)


def _startup_free(serve: Callable[..., Served], *, pinned: bool, log_failure: bool) -> tuple[Served, str]:
    engine_args = ("--gpu-memory-utilization", "0.92") if pinned else ()
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090", engine_args)
    b = budget(plan)
    free = int(20.0 * GiB)
    assert free < b["requested"]
    sets = {**vllm_agrees(plan), "vllm.free_bytes": free, "log_failure": str(log_failure).lower()}
    served = serve(VLLM, sets=sets, engine_args=engine_args)
    utilization = math.floor((gib_text(free) - 0.25) / gib_text(b["total"]) * 10_000) / 10_000
    return served, f"{utilization:g}"


def _assert_retuned_utilization(served: Served, utilization: str) -> None:
    ready = served.wait_ready()
    retune = served.event("retune")
    assert retune["free_gib"] == 20.0 and retune["utilization"] == 0.92
    assert retune["engine_args"][-2:] == ["--gpu-memory-utilization", utilization]
    _first, second = served.starts()
    assert flag_value(second["argv"], "--gpu-memory-utilization") == utilization
    assert ready["retunes"] == 1
    assert served.stop() == 0
    assert_clean_exit(served, 0)


def test_startup_free_retunes_the_utilization(serve: Callable[..., Served]) -> None:
    """vLLM's free-memory refusal restarts it with --gpu-memory-utilization (F - 0.25 GiB)/T, then it serves
    (pinned, reported once)."""
    served, utilization = _startup_free(serve, pinned=True, log_failure=False)
    _assert_retuned_utilization(served, utilization)


def test_startup_free_retunes_as_vllm_reports_it(serve: Callable[..., Served]) -> None:
    """The same refusal with the plan's own utilization and vLLM's double report must still retune and serve."""
    served, utilization = _startup_free(serve, pinned=False, log_failure=True)
    _assert_retuned_utilization(served, utilization)


def test_no_memory_for_cache_blocks_exits_78(serve: Callable[..., Served]) -> None:
    """vLLM's "No available memory for the cache blocks" cannot be retuned: exit 78 after one start."""
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090")
    served = serve(VLLM, sets={**vllm_agrees(plan), "vllm.kv_bytes": 0})
    assert_clean_exit(served, 78)
    abort = served.event("abort")
    assert "no_kv_memory" in abort["reason"] and abort["planned_tokens"] == plan["kv_cache_tokens"]
    assert len(served.starts()) == 1 and not served.events("retune")
    assert b"Available KV cache memory: 0.0 GiB" in served.out.read_bytes()


def test_vllm_error_reported_twice_is_decided_once(serve: Callable[..., Served]) -> None:
    """vLLM's two copies of one startup error (stdout log, stderr traceback) give one abort, not two."""
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090")
    served = serve(VLLM, sets={**vllm_agrees(plan), "vllm.kv_bytes": 0})
    assert_clean_exit(served, 78)
    assert served.recorded("stdout").count(b"ValueError: No available memory for the cache blocks") == 1
    assert served.recorded("stderr").count(b"ValueError: No available memory for the cache blocks") == 1
    assert len(served.events("abort")) == 1 and len(served.events("stopping the engine")) == 1


def test_cuda_oom_exits_78(serve: Callable[..., Served]) -> None:
    """torch.OutOfMemoryError during CUDA graph capture, after the KV line, exits 78 without a restart."""
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090")
    served = serve("vllm-cuda-oom-graphs.yaml", sets=vllm_agrees(plan))
    final = assert_clean_exit(served, 78)
    abort = served.event("abort")
    assert "cuda_oom" in abort["reason"] and len(served.starts()) == 1
    assert b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB." in served.err.read_bytes()
    assert final["engine_phase"] == "KV cache sized"


def test_retune_limit_exits_78_and_never_repeats_flags(serve: Callable[..., Served]) -> None:
    """--max-retunes 1 on a busy GPU: one retune (utilization), then the KV check fails too: exit 78, no argv twice."""
    engine_args = ("--gpu-memory-utilization", "0.92")
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090", engine_args)
    sets = {**vllm_agrees(plan), "vllm.free_bytes": int(20.0 * GiB), "vllm.non_kv_bytes": int(18.5 * GiB),
            "log_failure": "false"}
    served = serve(VLLM, sets=sets, engine_args=engine_args, options=("--max-retunes", "1"))
    final = assert_clean_exit(served, 78)
    assert len(served.events("retune")) == 1 and len(served.starts()) == 2
    assert_distinct_starts(served)
    abort = served.event("abort")
    assert "kv_too_small" in abort["reason"] and abort["estimated_max_model_len"] < 32768
    assert final["restarts"] == 1


# --------------------------------------------------------------------------- SGLang's fatal errors


def _sglang(serve: Callable[..., Served], engine_args: tuple[str, ...], gpu: str = "h100",
            **sets: Any) -> tuple[Served, dict[str, Any]]:
    plan = plan_json("llama-3.1-8b", "sglang", gpu, engine_args)
    merged = {**sglang_agrees(plan), **{f"sglang.{key}": value for key, value in sets.items()}}
    return serve(SGLANG, model="llama-3.1-8b", engine="sglang", gpu=gpu, sets=merged,
                 engine_args=engine_args), plan


def _weights_leave_nothing(serve: Callable[..., Served], engine_args: tuple[str, ...]) -> tuple[Served, str, int]:
    plan = plan_json("llama-3.1-8b", "sglang", "h100", engine_args)
    pre_load = budget(plan)["pre_load"] / GiB
    weights = 66.0  # on the H100's 79.19 GiB CUDA total, more than 1 - f of the pre-load free
    fraction = plan["mem_fraction_static"]
    assert pre_load - weights < pre_load * (1 - fraction)  # nothing left for the pool at the planned fraction
    served, _ = _sglang(serve, engine_args, weights_gib=weights)
    minimum = 1 - (pre_load - weights) / pre_load
    suggested = math.ceil(minimum * 1000) / 1000
    raised = f"{min(suggested + 0.02, 0.99):.3f}"
    rest = (pre_load - weights) - pre_load * (1 - float(raised))
    return served, raised, int(rest * GiB) // LLAMA_CELL_BYTES


def _assert_fraction_raised(served: Served, raised: str, tokens: int) -> None:
    ready = served.wait_ready()
    retunes = served.events("retune")
    assert retunes[0]["engine_args"][-2:] == ["--mem-fraction-static", raised]
    assert flag_value(served.starts()[1]["argv"], "--mem-fraction-static") == raised
    # The larger fraction leaves a pool smaller than the context: the second retune caps the context at it.
    assert retunes[1]["engine_args"][-2:] == ["--context-length", str(tokens)]
    assert flag_value(served.starts()[2]["argv"], "--context-length") == str(tokens)
    assert ready["retunes"] == 2 and ready["kv_tokens"] == tokens and ready["max_model_len"] == tokens
    assert_distinct_starts(served)
    assert served.stop() == 0
    assert_clean_exit(served, 0)


def test_sglang_weights_leave_nothing_raises_the_fraction(serve: Callable[..., Served]) -> None:
    """SGLang's "Raise --mem-fraction-static above S" restarts it just above S, then caps the context (flags pinned)."""
    served, raised, tokens = _weights_leave_nothing(
        serve, ("--mem-fraction-static", "0.823", "--context-length", "131072"))
    _assert_fraction_raised(served, raised, tokens)


def test_sglang_weights_leave_nothing_raises_the_planned_fraction(serve: Callable[..., Served]) -> None:
    """The same error with the plan's own fraction must restart SGLang with the raised fraction, not the planned one."""
    served, raised, tokens = _weights_leave_nothing(serve, ())
    _assert_fraction_raised(served, raised, tokens)


def test_sglang_not_enough_memory_exits_78(serve: Callable[..., Served]) -> None:
    """SGLang's "Not enough memory. Please try to increase --mem-fraction-static." exits 78 (SGLang kills itself)."""
    served, _ = _sglang(serve, ("--mem-fraction-static", "0.8"), pre_load_gib=80.0, weights_gib=63.99995)
    final = assert_clean_exit(served, 78)
    assert "not_enough_memory" in served.event("abort")["reason"] and len(served.starts()) == 1
    assert b"Received sigquit from a child process" in served.err.read_bytes()
    assert "SIGKILL" in final["reason"]


def test_sglang_unbalanced_memory_exits_75(serve: Callable[..., Served]) -> None:
    """SGLang's "The memory capacity is unbalanced" (another tenant on one of two GPUs) is temporary: exit 75."""
    served, _ = _sglang(serve, ("--tp-size", "2"), gpu="2xh100", pre_load_gib=60.0, local_free_gib=77.5)
    assert_clean_exit(served, 75)
    abort = served.event("abort")
    assert "unbalanced" in abort["reason"] and len(served.starts()) == 1
    assert b"pre_model_load_memory=60.0, local_gpu_memory=77.5" in served.err.read_bytes()


def _pool_smaller(serve: Callable[..., Served], engine_args: tuple[str, ...]) -> tuple[Served, int]:
    plan = plan_json("llama-3.1-8b", "sglang", "h100", engine_args)
    b = budget(plan)
    fraction = plan["mem_fraction_static"]
    pre_load = b["pre_load"] / GiB
    pool = 100_000
    weights = fraction * pre_load - (pool + 0.5) * LLAMA_CELL_BYTES / GiB
    served, _ = _sglang(serve, engine_args, weights_gib=weights)
    return served, pool


def _assert_context_capped(served: Served, pool: int) -> None:
    ready = served.wait_ready()
    retune = served.event("retune")
    assert retune["tokens"] == pool and retune["max_model_len"] == 131072
    assert retune["engine_args"][-2:] == ["--context-length", str(pool)]
    assert flag_value(served.starts()[1]["argv"], "--context-length") == str(pool)
    assert ready["max_model_len"] == pool and ready["kv_tokens"] == pool and ready["retunes"] == 1
    assert served.stop() == 0
    assert_clean_exit(served, 0)


def test_sglang_pool_smaller_than_context_caps_it(serve: Callable[..., Served]) -> None:
    """A pool of N tokens under a longer context restarts SGLang with --context-length N (context pinned)."""
    served, pool = _pool_smaller(serve, ("--context-length", "131072"))
    _assert_context_capped(served, pool)


def test_sglang_pool_smaller_than_planned_context_caps_it(serve: Callable[..., Served]) -> None:
    """The same with the plan's own context length: the restart must carry --context-length N last."""
    served, pool = _pool_smaller(serve, ())
    _assert_context_capped(served, pool)


# --------------------------------------------------------------------------- crashes


def test_crash_before_any_log_line_exits_70(serve: Callable[..., Served]) -> None:
    """An engine SIGKILLed before it logged anything: safe-serve exits 70 (the engine ended unasked; its
    signal in the reason), phase STARTING, no restart."""
    served = serve("vllm-crash-before-logs.yaml")
    final = assert_clean_exit(served, 70)
    assert final["phase"] == "STARTING" and final["engine_phase"] == "starting" and final["restarts"] == 0
    assert "SIGKILL" in final["reason"] and len(served.starts()) == 1
    assert not served.events("abort") and not served.events("retune")


def test_crash_during_weight_load_exits_70(serve: Callable[..., Served]) -> None:
    """SGLang dying of SIGSEGV while loading weights: safe-serve exits 70 and names the signal and the phase."""
    plan = plan_json("llama-3.1-8b", "sglang", "h100")
    served = serve("sglang-crash-loading.yaml", model="llama-3.1-8b", engine="sglang", gpu="h100",
                   sets=sglang_agrees(plan))
    final = assert_clean_exit(served, 70)
    assert final["phase"] == "STARTING" and final["engine_phase"] == "loading weights"
    assert "SIGSEGV" in final["reason"]
    assert served.err.read_bytes().count(b"Loading safetensors checkpoint shards:") == 2


def test_unknown_error_after_the_kv_line_exits_70(serve: Callable[..., Served]) -> None:
    """An error no rule knows, after the KV line: safe-serve exits 70 (vLLM's own 1 is in the reason, never
    our exit code, which would read as safe-serve's internal error) and names the phase."""
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090")
    served = serve("vllm-crash-after-kv.yaml", sets=vllm_agrees(plan))
    final = assert_clean_exit(served, 70)
    assert "exited with code 1" in final["reason"]
    assert final["phase"] == "STARTING" and final["engine_phase"] == "KV cache sized"
    assert not served.events("abort") and len(served.starts()) == 1
    stderr = served.err.read_bytes()
    assert b"RuntimeError: CUDA error: an illegal memory access was encountered" in stderr
    assert b"RuntimeError: Engine core initialization failed. See root cause above." in stderr


def test_crash_after_ready_exits_70(serve: Callable[..., Served], tmp_path: Path) -> None:
    """An engine that aborts (SIGABRT) while serving: safe-serve exits 70, phase READY, ready file gone."""
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090")
    go = tmp_path / "go"
    served = serve("vllm-crash-after-ready.yaml", sets={**vllm_agrees(plan), "vars.go": str(go)})
    served.wait_ready()
    go.touch()
    final = assert_clean_exit(served, 70)
    assert final["phase"] == "READY" and final["engine_phase"] == "serving" and "SIGABRT" in final["reason"]


# --------------------------------------------------------------------------- output


def test_log_flood_passes_through_and_the_kv_line_is_found(serve: Callable[..., Served]) -> None:
    """200,000 lines before the KV line reach our stdout whole, and the KV line after them is still verified."""
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090")
    served = serve("vllm-flood.yaml", sets=vllm_agrees(plan))
    ready = served.wait_ready()
    assert ready["kv_tokens"] == plan["kv_cache_tokens"]
    assert served.stop() == 0
    assert_clean_exit(served, 0)
    out = served.out.read_bytes()
    assert sum(1 for line in out.split(b"\n") if line.startswith(b"flood ")) == 200_000
    assert out == served.recorded("stdout")


def test_output_passes_through_byte_for_byte(serve: Callable[..., Served]) -> None:
    """Invalid UTF-8, colour codes, CR/LF and NUL pass through whole; a KV line with invalid bytes is still read."""
    plan = plan_json("qwen2.5-7b", "vllm", "rtx4090")
    served = serve("vllm-raw-bytes.yaml", sets=vllm_agrees(plan))
    ready = served.wait_ready()
    assert ready["kv_tokens"] == plan["kv_cache_tokens"]
    assert served.stop() == 0
    assert_clean_exit(served, 0)
    out, err = served.out.read_bytes(), served.err.read_bytes()
    assert out == served.recorded("stdout") and b"caf\xe9 \xe2\x82 \xff\xfe" in out
    engine_err = served.recorded("stderr")
    assert b"\xff\x00 \xc3" in engine_err
    # Our stderr is the plan, then our JSON lines between whole engine lines.
    ours = err[err.index(b'{"'):]
    kept = [line for line in ours.split(b"\n") if not line.startswith(b'{"')]
    assert b"\n".join(kept) == engine_err


def test_missing_kv_line_times_out_with_75(serve: Callable[..., Served]) -> None:
    """No KV line within --watch-timeout 3: a watch-timeout event, the engine is stopped, exit 75."""
    started = time.monotonic()
    served = serve("vllm-no-kv-line.yaml", options=("--watch-timeout", "3"))
    final = assert_clean_exit(served, 75)
    assert time.monotonic() - started >= 3
    timeout = served.event("watch-timeout")
    assert timeout["missing"] == "kv" and timeout["seconds"] == 3.0 and timeout["engine_phase"] == "weights loaded"
    assert final["engine_phase"] == "weights loaded" and len(served.starts()) == 1
    assert b"INFO:     Application shutdown complete." in served.err.read_bytes()  # stopped with SIGTERM


# --------------------------------------------------------------------------- two launches, one GPU

class OneL40S:
    """An NVML fixture with one L40S whose used memory the test changes while launches run."""

    def __init__(self, tmp: Path, lib_dir: Path) -> None:
        self.path = tmp / "nvml-fixture.txt"
        self.env = {"LD_LIBRARY_PATH": str(lib_dir), "SAFE_SERVE_NVML_STUB_FIXTURE": str(self.path)}
        self.set_used(0)

    def set_used(self, used: int) -> None:
        free = L40S_TOTAL - L40S_RESERVED - used
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("system driver=550.54.15 nvml=12.550.54.15 cuda=12040\n"
                       f'gpu name="NVIDIA L40S" uuid={L40S_UUID} total={L40S_TOTAL} reserved={L40S_RESERVED} '
                       f"used={used} free={free} cc=8.9 mig=unsupported\n")
        tmp.replace(self.path)


def _first_launch_holding_the_lock(serve: Callable[..., Served], gpu: OneL40S, go: Path) -> Served:
    first = serve("vllm-kv-after-go.yaml", gpu=None, env=gpu.env, sets={"vars.go": str(go)},
                  options=("--on-divergence", "warn"))
    first.wait_for(lambda: b"Model loading took" in first.out.read_bytes())
    lock = first.dir / "locks" / f"{L40S_UUID}.lock"
    assert lock.read_text().strip() == str(first.proc.pid)  # held by the first safe-serve
    return first


def test_second_launch_on_the_same_gpu_waits_for_the_first_kv_line(serve: Callable[..., Served], tmp_path: Path,
                                                                   nvml_stub: Path) -> None:
    """With a real GPU UUID (NVML stub) a second launch starts its engine only after the first engine's KV line."""
    gpu, go = OneL40S(tmp_path, nvml_stub), tmp_path / "go"
    first = _first_launch_holding_the_lock(serve, gpu, go)
    second = serve(VLLM, gpu=None, env={**gpu.env, "SAFE_SERVE_LOCK_DIR": str(first.dir / "locks")},
                   options=("--lock-timeout", "20", "--on-divergence", "warn"))
    time.sleep(1.5)
    assert second.proc.poll() is None and not second.starts()  # waiting for the lock
    go.touch()
    first.wait_ready()
    second.wait_ready()
    assert len(second.starts()) == 1
    assert first.stop() == 0 and second.stop() == 0
    assert_clean_exit(first, 0)
    assert_clean_exit(second, 0)


def test_second_launch_gives_up_with_75_while_the_first_holds_the_lock(serve: Callable[..., Served],
                                                                       tmp_path: Path, nvml_stub: Path) -> None:
    """--lock-timeout 0.5 while another launch is still loading on the GPU: exit 75 naming the holder, no engine."""
    gpu, go = OneL40S(tmp_path, nvml_stub), tmp_path / "go"
    first = _first_launch_holding_the_lock(serve, gpu, go)
    second = serve(VLLM, gpu=None, env={**gpu.env, "SAFE_SERVE_LOCK_DIR": str(first.dir / "locks")},
                   options=("--lock-timeout", "0.5"))
    assert second.wait() == 75
    assert f"is being started by pid {first.proc.pid}".encode() in second.err.read_bytes()
    assert not second.starts()
    go.touch()
    first.wait_ready()
    assert first.stop() == 0


def test_second_launch_measures_free_memory_after_the_lock(serve: Callable[..., Served], tmp_path: Path,
                                                           nvml_stub: Path) -> None:
    """A launch waiting for the lock must plan from the memory left once the first engine has sized its KV cache."""
    gpu, go = OneL40S(tmp_path, nvml_stub), tmp_path / "go"
    first = _first_launch_holding_the_lock(serve, gpu, go)
    gpu.set_used(10 * GiB)  # the first engine is halfway through loading: a second 7B model would still fit
    second = serve(VLLM, gpu=None, env={**gpu.env, "SAFE_SERVE_LOCK_DIR": str(first.dir / "locks")},
                   options=("--lock-timeout", "20"))
    time.sleep(1.5)
    gpu.set_used(42 * GiB)  # the first engine has taken its share: no room for another 7B model
    go.touch()
    first.wait_ready()
    code = second.wait()
    assert not second.starts(), "the second launch started an engine planned from the stale reading"
    assert code == 78 and b"will not fit" in second.err.read_bytes()


def test_sglang_prompts_quoting_fatal_words_stop_nothing(serve: Callable[..., Served], tmp_path: Path) -> None:
    """SGLang request logs (its own format) quoting every fatal and crash message while serving: the server keeps
    serving and SIGTERM stops it cleanly (tests/scenarios/sglang-prompts-quote-errors.yaml)."""
    plan = plan_json("llama-3.1-8b", "sglang", "h100")
    go = tmp_path / "go"
    served = serve("sglang-prompts-quote-errors.yaml", model="llama-3.1-8b", engine="sglang", gpu="h100",
                   sets={**sglang_agrees(plan), "vars.go": str(go)})
    served.wait_ready()
    go.touch()
    served.wait_for(lambda: b"quoted-prompts-done" in served.err.read_bytes())
    time.sleep(0.5)
    assert served.proc.poll() is None and not served.events("engine-failure") and not served.events("abort")
    assert served.stop() == 0
    assert not served.survivors() and not served.ready_file.exists()


def test_worker_nodes_as_each_engine_names_them() -> None:
    """SGLang's `--node-rank` >= 1 and vLLM's `--headless` run ranks without the server (no /health to wait for)."""
    from launcher.engines import adapter

    sglang, vllm = adapter("sglang"), adapter("vllm")
    assert sglang.worker_node(sglang.pin(["--nnodes", "2", "--node-rank", "1"]).values)
    assert not sglang.worker_node(sglang.pin(["--nnodes", "2", "--node-rank", "0"]).values)
    assert vllm.worker_node(vllm.pin(["--headless", "-dp", "4"]).values)
    assert not vllm.worker_node(vllm.pin(["-dp", "4"]).values)
