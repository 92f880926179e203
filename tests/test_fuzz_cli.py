"""Property-based fuzz of the command line and of model directories (hypothesis).

Whatever is typed and whatever a model directory holds, `safe-serve plan` ends with a
documented exit code, one line on stderr for a refusal, no traceback, and within seconds.
Runs in-process through `launcher.edge.cli.main` (milliseconds per plan), with the Hub offline
and an empty Hugging Face cache, hypothetical GPUs (`--gpu`) so no NVML is needed, and a
SIGALRM watchdog so a hang (a FIFO opened for reading) fails the example instead of CI.
Derandomized and database-less: CI runs the same examples every time.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.edge.cli import main
from tests.model.test_config import QWEN25_7B, _write_safetensors

DOCUMENTED = {0, 2, 65, 66, 69, 75, 78}
HANG_S = 10  # far above a plan (milliseconds in-process): only a hang reaches it
SLOW_S = 5  # "finishes within a few seconds"
FUZZ = settings(max_examples=400, deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
REPO = Path(__file__).resolve().parent.parent


class Hang(BaseException):
    """Raised by the watchdog; a BaseException so that no `except Exception` swallows it."""


@pytest.fixture(scope="module", autouse=True)
def _offline_hub() -> Iterator[Path]:
    """No network in the fuzz: the Hub offline, an empty cache, state in a temporary directory, bugs raised."""
    from huggingface_hub import constants

    root = Path(tempfile.mkdtemp(prefix="ss-fuzz-"))
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "SAFE_SERVE_STATE_DIR", "SAFE_SERVE_DEBUG")}
    patched = {"HF_HUB_OFFLINE": constants.HF_HUB_OFFLINE, "HF_HUB_CACHE": constants.HF_HUB_CACHE}
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["SAFE_SERVE_STATE_DIR"] = str(root / "state")
    os.environ["SAFE_SERVE_DEBUG"] = "1"  # an internal error re-raises, so the failing example shows its traceback
    constants.HF_HUB_OFFLINE = True
    constants.HF_HUB_CACHE = str(root / "hf")
    try:
        yield root
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE = patched["HF_HUB_OFFLINE"], patched["HF_HUB_CACHE"]
        shutil.rmtree(root, ignore_errors=True)


def run_cli(argv: list[str]) -> tuple[int, str, str, float]:
    """`safe-serve ARGV` in-process: (exit code, stdout, stderr, seconds); an escaped exception fails."""
    out, err = io.StringIO(), io.StringIO()

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise Hang(f"no exit within {HANG_S} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(HANG_S)
    started = time.monotonic()
    code: Any = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(argv)
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # a traceback (or a hang): the property fails with the argv that did it
        pytest.fail(f"safe-serve {argv!r:.2000} raised:\n{traceback.format_exc()}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return (code if isinstance(code, int) else 1), out.getvalue(), err.getvalue(), time.monotonic() - started


def check_outcome(argv: list[str], code: int, stderr: str, took: float) -> None:
    where = f"safe-serve {argv!r:.2000}\n{stderr[-3000:]}"
    assert code in DOCUMENTED, where
    assert "Traceback" not in stderr, where
    assert took < SLOW_S, f"{took:.1f} s: {where}"
    if code not in (0, 78):  # a refusal that is not a plan: one line (plus click's usage lines for 2)
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert lines, where
        assert code == 2 or len(lines) == 1, where


# --------------------------------------------------------------------------- (a) the command line

ALIASES = ["qwen2.5-7b", "llama-3.1-8b", "gpt-oss-20b", "deepseek-v2-lite", "gemma-2-9b", "llama-3.1-70b",
           "qwen2.5-7b-awq", "mistral-7b", "Qwen/Qwen2.5-7B-Instruct"]
ODD_MODELS = ["a" * 256, "~nosuchuser", "~nosuchuser/x", "org/ünï", "a/b/c", "someorg/uncached", "/nonexistent",
              "./nope", "..", "", "-", "x" * 5000, "org/" + "n" * 97, "org/a..b", "qwen2.5-7b\t"]
GPU_NAMES = ["rtx4090", "h100", "a100-80gb", "l40s", "t4", "v10016gb", "RTX 4090", "h200", "b200", "rtx9999", ""]


@st.composite
def gpu_spec(draw: st.DrawFn) -> str:
    what = draw(st.one_of(
        st.sampled_from(GPU_NAMES), st.sampled_from(GPU_NAMES), st.sampled_from(GPU_NAMES),
        st.builds(lambda n, u: f"{n}{u}", st.one_of(st.integers(0, 10**6), st.just(10**310),
                                                    st.floats(0, 1e6, allow_nan=False).map(lambda f: round(f, 3))),
                  st.sampled_from(["GiB", "MiB", "GB", "TiB", "", "KiB", "PiB", "gib"])),
        st.text(max_size=12),
    ))
    count = draw(st.one_of(st.none(), st.none(), st.integers(1, 8), st.integers(0, 2048),
                           st.sampled_from(["100000000", "1" + "0" * 20, "9" * 5000])))
    sep = draw(st.sampled_from(["x", "X", "×", "*", " x "]))
    return what if count is None else f"{count}{sep}{what}"


def number_text() -> st.SearchStrategy[str]:
    """Mostly plausible whole numbers (to reach the planner), sometimes junk (to reach the parsers)."""
    plausible = st.one_of(st.integers(-2, 64), st.integers(1, 1 << 20), st.sampled_from([256, 1000, 4096, 32768]))
    return st.one_of(
        plausible.map(str), plausible.map(str), plausible.map(str),
        st.integers(-(10**6), 10**12).map(str),
        st.sampled_from(["0", "-1", "1e3", "nan", "inf", "2.5", "9" * 400, "", "abc", "0x10", " 3 "]),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
    )


def size_text() -> st.SearchStrategy[str]:
    return st.one_of(
        st.builds(lambda n, u: f"{n}{u}", st.integers(0, 10**5), st.sampled_from(["GiB", "MiB", "GB", "", "TiB"])),
        st.sampled_from(["1" + "0" * 310, "1" + "0" * 310 + "GiB", "-1GiB", "0", "1e400", "nan", "24 GiB", "lots"]),
        st.text(max_size=10),
    )


def version_text() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(["0.32.0", "0.10.2", "0.5.23", "0.4.0", "0.7.1", "99.0", "0.0.1", "banana", "", "v0.10.2",
                         "0.8.5.dev169+g1234abc", "0.11.0rc1", "1" * 400, "0..1"]),
        st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,3}", fullmatch=True),
        st.text(max_size=12),
    )


ENGINE_FLAGS_INT = ["--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp", "--max-num-seqs",
                    "--max-model-len", "--tp-size", "--pp-size", "--context-length", "--max-running-requests",
                    "--max-total-tokens", "--block-size", "--page-size", "--max-num-batched-tokens",
                    "--data-parallel-size", "--chunked-prefill-size", "--cpu-offload-gb"]
ENGINE_FLAGS_FLOAT = ["--gpu-memory-utilization", "--mem-fraction-static"]
ENGINE_FLAGS_WORD = ["--kv-cache-dtype", "--dtype", "--quantization", "--kv-cache-memory-bytes",
                     "--max-model-len", "--attention-backend"]
ENGINE_WORDS = ["auto", "fp8", "fp8_e5m2", "bfloat16", "float16", "half", "awq", "gptq", "banana", "1k", "32K", ""]


@st.composite
def engine_flags(draw: st.DrawFn) -> list[str]:
    flags: list[str] = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.integers(0, 4))
        if kind == 0:
            flags += [draw(st.sampled_from(ENGINE_FLAGS_INT)), draw(number_text())]
        elif kind == 1:
            value = draw(st.one_of(st.floats(-1, 2).map(lambda f: f"{f:.3f}"), number_text()))
            flags += [draw(st.sampled_from(ENGINE_FLAGS_FLOAT)), value]
        elif kind == 2:
            flags += [draw(st.sampled_from(ENGINE_FLAGS_WORD)), draw(st.sampled_from(ENGINE_WORDS))]
        elif kind == 3:
            flags.append(draw(st.sampled_from(["--enforce-eager", "--trust-remote-code", "--port", "8000",
                                               "--max-model-len=4096", "--tensor-parallel-size=2", "--"])))
        else:
            flags.append(draw(st.text(max_size=10)))
    return flags


@st.composite
def command_line(draw: st.DrawFn) -> list[str]:
    command = draw(st.sampled_from(["plan", "plan", "plan", "fit"]))
    model = draw(st.one_of(st.sampled_from(ALIASES), st.sampled_from(ALIASES), st.sampled_from(ALIASES),
                           st.sampled_from(ALIASES), st.sampled_from(ODD_MODELS), st.text(max_size=20)))
    argv = [command, model]
    device_cpu = command != "fit" and draw(st.booleans()) and draw(st.booleans())
    if device_cpu:
        argv += ["--device", "cpu"]
    if not device_cpu or draw(st.booleans()):  # always a --gpu without --device cpu: no NVML probe
        for _ in range(draw(st.integers(1, 3))):
            argv += ["--gpu", draw(gpu_spec())]
    if command == "fit":
        argv += ["--concurrency", draw(number_text()), "--tokens", draw(number_text())]
    options: list[list[str]] = []
    for _ in range(draw(st.integers(0, 5))):
        choice = draw(st.integers(0, 7 if command != "fit" else 3))
        if choice == 0:
            options.append(["--engine", draw(st.sampled_from(["vllm", "sglang", "vllm", "sglang", "tgi"]))])
        elif choice == 1:
            options.append(["--engine-version", draw(version_text())])
        elif choice == 2:
            options.append(["--margin", draw(size_text())])
        elif choice == 3:
            options.append([draw(st.sampled_from(["--json", "--json", "--json", "--concurency", "-h", "--nope"]))])
        elif choice == 4:
            options.append(["--concurrency", draw(number_text())])
        elif choice == 5:
            options.append(["--max-gpu-memory", draw(size_text())])
        elif choice == 6:
            options.append([draw(st.sampled_from(["--trust-engine", "--no-calibration", "--json"]))])
        else:
            options.append(["--device", draw(st.sampled_from(["cuda", "cpu", "cuda", "cpu", "tpu"]))])
    for option in options:
        argv += option
    flags = draw(engine_flags())
    if flags:
        argv += ["--", *flags]
    return argv


PLAUSIBLE_FLAGS = st.one_of(
    st.tuples(st.sampled_from(["--tensor-parallel-size", "--pipeline-parallel-size", "--tp-size", "--pp-size"]),
              st.integers(1, 16).map(str)),
    st.tuples(st.sampled_from(["--max-model-len", "--context-length", "--max-num-seqs", "--max-running-requests",
                               "--max-num-batched-tokens", "--max-total-tokens", "--block-size", "--page-size"]),
              st.one_of(st.integers(1, 1 << 20), st.sampled_from([16, 32, 64, 128, 256, 4096, 131072])).map(str)),
    st.tuples(st.sampled_from(["--gpu-memory-utilization", "--mem-fraction-static"]),
              st.floats(0.05, 0.99).map(lambda f: f"{f:.2f}")),
    st.tuples(st.sampled_from(["--kv-cache-dtype"]), st.sampled_from(["auto", "fp8", "fp8_e5m2", "fp8_e4m3"])),
    st.tuples(st.sampled_from(["--dtype"]), st.sampled_from(["auto", "bfloat16", "float16", "half", "float32"])),
    st.tuples(st.sampled_from(["--kv-cache-memory-bytes"]), st.sampled_from(["1G", "8G", "100M", "1000000000"])),
    st.tuples(st.sampled_from(["--quantization"]), st.sampled_from(["awq", "gptq", "fp8", "awq_marlin"])),
)


@st.composite
def plausible_command_line(draw: st.DrawFn) -> list[str]:
    """Only valid options with plausible values: these reach the planners and their refusals."""
    model = draw(st.sampled_from(ALIASES))
    engine = draw(st.sampled_from(["vllm", "sglang"]))
    argv = ["plan", model, "--engine", engine]
    if draw(st.integers(0, 5)) == 0:
        argv += ["--device", "cpu"]
    else:
        count = draw(st.sampled_from(["", "", "2x", "4x", "8x", "3x", "16x"]))
        argv += ["--gpu", count + draw(st.sampled_from([g for g in GPU_NAMES if g not in ("", "rtx9999")]
                                                       + ["24GiB", "80GB", "16384MiB", "141GiB"]))]
    if draw(st.booleans()):
        argv += ["--concurrency", str(draw(st.one_of(st.integers(1, 8), st.integers(1, 5000))))]
    if draw(st.booleans()):
        argv += ["--engine-version", draw(st.sampled_from(["0.32.0", "0.10.2", "0.8.5", "0.11.0", "0.5.23",
                                                            "0.4.10", "0.7.1", "0.9.0"]))]
    if draw(st.integers(0, 3)) == 0:
        argv += ["--max-gpu-memory", f"{draw(st.integers(0, 200))}GiB"]
    if draw(st.integers(0, 3)) == 0:
        argv += ["--margin", f"{draw(st.integers(0, 40000))}MiB"]
    argv += draw(st.sampled_from([[], ["--json"], ["--trust-engine"], ["--no-calibration", "--json"]]))
    flags = [token for pair in draw(st.lists(PLAUSIBLE_FLAGS, max_size=3)) for token in pair]
    return argv + (["--", *flags] if flags else [])


@FUZZ
@given(st.one_of(plausible_command_line(), command_line()))
def test_fuzzed_command_lines_end_with_a_documented_code(argv: list[str]) -> None:
    """Random options, sizes, GPU specs, engine versions and engine flags: a documented code, no traceback."""
    code, _, stderr, took = run_cli(argv)
    check_outcome(argv, code, stderr, took)


# --------------------------------------------------------------------------- (b) model directories

def json_values(max_leaves: int = 6) -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.integers(-(10**400), 10**400),
        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
        st.sampled_from([0, 1, -1, 2**16, 2**16 + 1, 2**24, 2**31, 2**63, 2**64 + 1, 10**30, 0.5, 1e308, "bfloat16",
                         "banana",
                         "full_attention", "sliding_attention", "linear_attention"]),
    )
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=max_leaves)


CONFIG_KEYS = sorted(QWEN25_7B) + ["head_dim", "layer_types", "rope_scaling", "rope_parameters", "dtype", "seq_length",
                                   "quantization_config", "model_max_length", "kv_lora_rank", "qk_rope_head_dim",
                                   "text_config", "vision_config", "num_local_experts", "num_experts_per_tok",
                                   "sliding_window", "use_sliding_window", "tie_word_embeddings", "multi_query"]


def _encode(value: Any) -> str:
    """JSON as Python writes it: NaN/Infinity allowed (HF configs sometimes carry them)."""
    return json.dumps(value, allow_nan=True)


@st.composite
def config_text(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 15))
    if kind == 0:  # not JSON, or not an object, or nested beyond the recursion limit
        return draw(st.sampled_from(["{not json", "", "[]", "null", "3", "[" * 100_000 + "]" * 100_000,
                                     '{"a": ' * 50_000 + "1" + "}" * 50_000, "\xff\xfe", '{"hidden_size": 1' +
                                     "0" * 5000 + "}"]))
    config: dict[str, Any] = dict(QWEN25_7B)
    if kind == 1:  # a count far too large: per-layer lists and the planners' loops must not blow up
        config[draw(st.sampled_from(["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                                     "hidden_size", "vocab_size", "intermediate_size", "sliding_window"]))] = \
            draw(st.sampled_from([2**12, 2**12 + 1, 2**16, 2**24, 2**31, 2**32, 2**32 + 1]))
    for _ in range(draw(st.integers(0 if kind > 10 else 1, 4))):
        key = draw(st.sampled_from(CONFIG_KEYS))
        if draw(st.integers(0, 5)) == 0:
            config.pop(key, None)
        else:
            config[key] = draw(json_values())
    if draw(st.integers(0, 6)) == 0:  # a well-formed layer_types list holding odd entries
        config["layer_types"] = draw(st.lists(json_values(2), min_size=28, max_size=28))
    return _encode(config)


@st.composite
def index_text(draw: st.DrawFn) -> str | None:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return None
    if kind >= 6:
        return _encode({"metadata": {"total_size": draw(st.integers(1, 10**12))}, "weight_map": {}})
    if kind == 1:
        return _encode({"metadata": {"total_size": 15231233024}, "weight_map": {}})
    if kind == 2:
        return _encode({"metadata": {"total_size": draw(json_values(3))}})
    if kind == 3:
        return _encode({"metadata": draw(json_values(4))})
    if kind == 4:
        return _encode(draw(json_values(5)))
    return draw(st.sampled_from(["{not json", "", "[" * 100_000 + "]" * 100_000, '{"metadata": []}',
                                 '{"metadata": {"total_size": NaN}}',
                                 '{"metadata": {"total_size": 1' + "0" * 400 + "}}"]))


WEIGHT_KINDS = ["none", "good", "garbage", "short", "huge_header", "bad_offsets", "directory", "fifo",
                "dangling", "loop", "good_link"]


def _write_weight(model: Path, name: str, kind: str, header: Any) -> None:
    path = model / name
    if kind == "good":
        _write_safetensors(path, {"w": ("BF16", [64, 32])})
    elif kind == "garbage":
        path.write_bytes(os.urandom(64))
    elif kind == "short":
        path.write_bytes(b"\x01\x02")
    elif kind == "huge_header":
        path.write_bytes((2**63).to_bytes(8, "little") + b"{}")
    elif kind == "bad_offsets":
        raw = _encode(header).encode()
        path.write_bytes(len(raw).to_bytes(8, "little") + raw)
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dangling":
        path.symlink_to(model / "no-such-blob")
    elif kind == "loop":
        path.symlink_to(model / f"{name}.loop")
        (model / f"{name}.loop").symlink_to(path)
    elif kind == "good_link":
        _write_safetensors(model / f"{name}.blob", {"w": ("F32", [8])})
        path.symlink_to(model / f"{name}.blob")


@st.composite
def model_dir_spec(draw: st.DrawFn) -> dict[str, Any]:
    config_kind = draw(st.sampled_from(["file"] * 12 + ["missing", "directory", "fifo", "dangling"]))
    weights = [draw(st.sampled_from(["good"] * 8 + WEIGHT_KINDS)) for _ in range(draw(st.integers(0, 3)))]
    index_kind = draw(st.sampled_from(["file"] * 12 + ["directory", "fifo", "dangling"]))
    return {"config_kind": config_kind, "config": draw(config_text()), "index_kind": index_kind,
            "index": draw(index_text()), "weights": weights,
            "header": draw(st.one_of(json_values(4), st.just({"w": {"data_offsets": [0, -1]}}),
                                     st.just({"w": {"data_offsets": [0, 2**70]}}))),
            "gpu": draw(st.sampled_from(["h100", "rtx4090", "2xa100-80gb", "t4", "24GiB"])),
            "engine": draw(st.sampled_from(["vllm", "sglang"])),
            "flags": draw(st.one_of(st.just([]), engine_flags()))}


def _build(root: Path, spec: dict[str, Any]) -> Path:
    model = root / "model"
    model.mkdir()
    config = model / "config.json"
    if spec["config_kind"] == "file":
        config.write_text(spec["config"], errors="surrogateescape")
    elif spec["config_kind"] == "directory":
        config.mkdir()
    elif spec["config_kind"] == "fifo":
        os.mkfifo(config)
    elif spec["config_kind"] == "dangling":
        config.symlink_to(model / "gone.json")
    if spec["index"] is not None:
        index = model / "model.safetensors.index.json"
        if spec["index_kind"] == "file":
            index.write_text(spec["index"])
        elif spec["index_kind"] == "directory":
            index.mkdir()
        elif spec["index_kind"] == "fifo":
            os.mkfifo(index)
        else:
            index.symlink_to(model / "gone-index.json")
    for i, kind in enumerate(spec["weights"]):
        if kind != "none":
            _write_weight(model, f"model-{i:05d}-of-00003.safetensors", kind, spec["header"])
    return model


@FUZZ
@given(model_dir_spec())
def test_fuzzed_model_directories_end_with_a_documented_code(spec: dict[str, Any]) -> None:
    """Malformed config.json values, index files and weight files of odd types: a documented code, never a hang."""
    root = Path(tempfile.mkdtemp(prefix="ss-fuzz-model-"))
    try:
        model = _build(root, spec)
        argv = ["plan", str(model), "--gpu", spec["gpu"], "--engine", spec["engine"], "--json"]
        if spec["flags"]:
            argv += ["--", *spec["flags"]]
        code, stdout, stderr, took = run_cli(argv)
        check_outcome(argv[:7], code, stderr, took)
        if code == 0:
            assert json.loads(stdout)["schema"] == "safe-serve.plan/1"
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- the issue's cases, as processes

ISSUE_CASES = [
    (["plan", "a" * 256, "--gpu", "h100"], 66),
    (["plan", "~nosuchuser", "--gpu", "h100"], 66),
    (["plan", "org/ünï", "--gpu", "h100"], 66),
    (["plan", "qwen2.5-7b", "--gpu", "100000000xrtx4090"], 2),
    (["plan", "qwen2.5-7b", "--gpu", "1" + "0" * 310 + "GiB"], 2),
    (["plan", "qwen2.5-7b", "--gpu", "h100", "--margin", "1" + "0" * 310], 2),
    (["plan", "qwen2.5-7b", "--gpu", "h100", "--max-gpu-memory", "9" * 310 + "MiB"], 2),
]


@pytest.mark.parametrize(("argv", "code"), ISSUE_CASES, ids=lambda v: str(v)[:40])
def test_issue_cases_as_a_process(argv: list[str], code: int, tmp_path: Path) -> None:
    """The fuzzed invocations issue 14 listed, through `python -m launcher`: one line, their code, fast."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1",
           "HF_ENDPOINT": "http://127.0.0.1:9", "SAFE_SERVE_STATE_DIR": str(tmp_path / "state")}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "launcher", *argv], capture_output=True, text=True, timeout=30,
                         env=env, cwd=REPO)
    assert run.returncode == code, run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert time.monotonic() - started < 10


def test_fifo_model_as_a_process(tmp_path: Path) -> None:
    """The plan that hung forever on a FIFO weight file now ends at once with 65."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    os.mkfifo(tmp_path / "model.safetensors")
    run = subprocess.run([sys.executable, "-m", "launcher", "plan", str(tmp_path), "--gpu", "h100"],
                         capture_output=True, text=True, timeout=30, cwd=REPO)
    assert run.returncode == 65 and run.stderr.strip() == \
        f"safe-serve: {tmp_path}/model.safetensors: is a FIFO, not a regular file"


def test_watchdog_catches_a_hang() -> None:
    """The fuzz's watchdog itself works: a blocking read is interrupted and reported, not waited out."""
    assert math.isfinite(HANG_S)
    read_fd, write_fd = os.pipe()
    previous = signal.signal(signal.SIGALRM, lambda s, f: (_ for _ in ()).throw(Hang("hang")))
    signal.alarm(1)
    try:
        with pytest.raises(Hang):
            os.read(read_fd, 1)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        os.close(read_fd)
        os.close(write_fd)
