"""Start a real vLLM (CPU) OpenAI server, capture its startup lines, stop it.

Used by the CI integration tests and by the script that (re)generates
``tests/data/vllm_cpu_truth.json``.  Standard library only.

    run = run_vllm_cpu(model_dir, ["--max-model-len", "4096"],
                       {"VLLM_CPU_KVCACHE_SPACE": "1"}, python="/venv/bin/python",
                       timeout=240, keep_alive=lambda run: complete(run.base_url, "hi"))
    run.kv_tokens, run.concurrency, run.exit_code, run.lines

The server is started in its own session / process group.  At the end the API
server gets SIGTERM (it stops its EngineCore cleanly); whatever is left of the
group after 10 s gets SIGTERM, then SIGKILL, so EngineCore/Worker children
never leak.  A printed KV line does not mean the server came up (e.g. a
--block-size that is not a multiple of 32 fails right after it): check
``run.ready`` / ``run.ok``.

``architecture_matrix()`` adds two or more settings for every further family of
``tests/tinymodels.py`` (the proof of ``launcher/engines/vllm/architectures.py``); each
record carries ``engine_version``.

CLI:
    python tests/engine_harness.py MODEL_DIR [vllm args...]     # one run, log echoed
    python tests/engine_harness.py truth OUT.json MODELS_DIR [--python PY] [--only ID ...]
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# "(EngineCore pid=1) INFO 01-02 03:04:05 [kv_cache_utils.py:2330] CPU KV cache size: 1,048,576 tokens,
#  Maximum concurrency for 4,096 tokens per request: 256.00x"
KV_LINE_RE = re.compile(
    r"(?P<dev>[A-Z]+)(?: \+ host)? KV cache size: (?P<tokens>[\d,]+) tokens, "
    r"Maximum concurrency for (?P<mml>[\d,]+) tokens per request: (?P<conc>[\d.]+)x"
)
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")

# Lines worth keeping verbatim in ground-truth records (substring match).
INTERESTING = (
    "KV cache size",
    "block size",
    "block_size",
    "kv cache group",
    "kv lcm block",
    "padding layers",
    "sliding window",
    "sliding_window",
    "Sliding window",
    "hybrid",
    "Hybrid",
    "Explicitly set",
    "Auto set",
    "Using max model len",
    "max_num_batched_tokens",
    "kv cache",
    "KV cache",
    "kv_cache_dtype",
    "data type to store kv cache",
    "Chunked prefill",
    "chunked prefill",
    "prefix caching",
    "MLA",
    "Error",
    "ERROR",
    "error",
    "Traceback",
    "failed",
    "not supported",
    "Using ",
)


@dataclass
class EngineRun:
    cmd: list[str]
    env_extra: dict[str, str]
    lines: list[str] = field(default_factory=list)  # stdout+stderr, ANSI stripped, in arrival order
    kv_line: str | None = None  # message part of the "KV cache size" line (from "CPU KV cache size")
    kv_line_full: str | None = None  # the whole log line
    kv_tokens: int | None = None
    concurrency: float | None = None
    concurrency_str: str | None = None  # exactly as printed, e.g. "256.00"
    max_model_len_printed: int | None = None
    ready: bool = False  # GET /health returned 200
    exit_code: int | None = None  # None if it was still running when we stopped it
    killed: bool = False
    timed_out: bool = False
    port: int | None = None
    t_kv_line: float | None = None  # seconds from spawn
    t_ready: float | None = None
    t_total: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # results of keep_alive etc.
    n_lines_before_stop: int | None = None  # len(lines) when we began stopping the server

    @property
    def startup_lines(self) -> list[str]:
        """Lines printed before the harness began shutting the server down."""
        return self.lines if self.n_lines_before_stop is None else self.lines[: self.n_lines_before_stop]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ok(self) -> bool:
        return self.kv_tokens is not None and self.ready

    def interesting_lines(self) -> list[str]:
        return [ln for ln in self.lines if any(s in ln for s in INTERESTING)]

    def error_lines(self) -> list[str]:
        keys = ("Error", "error:", "ERROR", "Exception", "raise ", "failed")
        return [ln for ln in self.lines if any(k in ln for k in keys)]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(method: str, url: str, body: dict | None = None, timeout: float = 5.0) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def health(base_url: str, timeout: float = 2.0) -> bool:
    try:
        return _http("GET", base_url + "/health", timeout=timeout)[0] == 200
    except (OSError, urllib.error.URLError):
        return False


def complete(base_url: str, prompt: str = "Hello world", max_tokens: int = 4,
             model: str | None = None, timeout: float = 120.0) -> dict:
    """Fire one /v1/completions request; returns the parsed JSON (raises on HTTP error)."""
    if model is None:
        model = models(base_url, timeout=timeout)[0]
    st, txt = _http("POST", base_url + "/v1/completions",
                    {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
                    timeout=timeout)
    if st != 200:
        raise RuntimeError(f"/v1/completions -> HTTP {st}: {txt[:500]}")
    return json.loads(txt)


def chat(base_url: str, content: str = "Hello", max_tokens: int = 4,
         model: str | None = None, timeout: float = 120.0) -> dict:
    """Fire one /v1/chat/completions request; returns the parsed JSON (raises on HTTP error)."""
    if model is None:
        model = models(base_url, timeout=timeout)[0]
    st, txt = _http("POST", base_url + "/v1/chat/completions",
                    {"model": model, "messages": [{"role": "user", "content": content}],
                     "max_tokens": max_tokens, "temperature": 0},
                    timeout=timeout)
    if st != 200:
        raise RuntimeError(f"/v1/chat/completions -> HTTP {st}: {txt[:500]}")
    return json.loads(txt)


def models(base_url: str, timeout: float = 10.0) -> list[str]:
    st, txt = _http("GET", base_url + "/v1/models", timeout=timeout)
    if st != 200:
        raise RuntimeError(f"/v1/models -> HTTP {st}: {txt[:500]}")
    return [m["id"] for m in json.loads(txt)["data"]]


def metrics(base_url: str, timeout: float = 10.0) -> str:
    return _http("GET", base_url + "/metrics", timeout=timeout)[1]


def parse_kv_line(line: str) -> dict | None:
    m = KV_LINE_RE.search(line)
    if not m:
        return None
    return {
        "device": m.group("dev"),
        "tokens": int(m.group("tokens").replace(",", "")),
        "max_model_len": int(m.group("mml").replace(",", "")),
        "concurrency": float(m.group("conc")),
        "concurrency_str": m.group("conc"),
        "message": line[m.start():],
    }


# vLLM <= 0.27 logs the line in two halves (v1/core/kv_cache_utils.py:2235-2240 in 0.27.1):
#   "GPU KV cache size: 1,048,576 tokens" and "Maximum concurrency for 4,096 tokens per request: 256.00x"
KV_SIZE_ONLY_RE = re.compile(r"(?P<dev>[A-Z]+)(?: \+ host)? KV cache size: (?P<tokens>[\d,]+) tokens\s*$")
KV_CONC_ONLY_RE = re.compile(r"Maximum concurrency for (?P<mml>[\d,]+) tokens per request: (?P<conc>[\d.]+)x")


def parse_split_kv_line(lines: list[str]) -> dict | None:
    """The two-line form: a concurrency line (the last one) completes the latest size-only line.

    The joined message reads like the one-line form, so records compare alike."""
    m_conc = KV_CONC_ONLY_RE.search(lines[-1]) if lines else None
    if not m_conc:
        return None
    for prev in reversed(lines[-50:-1]):
        m_size = KV_SIZE_ONLY_RE.search(prev)
        if m_size:
            return parse_kv_line(prev[m_size.start():].rstrip() + ", " + lines[-1][m_conc.start():])
    return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _kill_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Stop the server and everything it spawned.

    SIGTERM to the API server first (it shuts its EngineCore down cleanly), then SIGTERM
    and finally SIGKILL to the whole process group for whatever is left.
    """
    pgid = proc.pid  # start_new_session=True -> the leader's pid is the pgid

    def wait_group(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            proc.poll()
            if not _group_alive(pgid):
                return True
            time.sleep(0.2)
        return not _group_alive(pgid)

    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    if not wait_group(grace):
        for sig, secs in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            if wait_group(secs):
                break
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def run_vllm_cpu(
    model_dir: str,
    args: list[str],
    env_extra: dict[str, str] | None = None,
    python: str = sys.executable,
    timeout: float = 300.0,
    port: int | None = None,
    keep_alive: Callable[[EngineRun], Any] | None = None,
    echo: bool = False,
) -> EngineRun:
    """Start ``python -m vllm.entrypoints.openai.api_server --model MODEL_DIR ARGS`` and
    return once the ``KV cache size`` line was seen AND ``/health`` is 200, or the process
    exited, or ``timeout`` seconds passed.  ``keep_alive(run)`` (e.g. firing a request) is
    called while the server is up and its result stored in ``run.extra['keep_alive']``
    (exceptions in ``run.extra['keep_alive_error']``).  The process group is always killed.
    """
    port = port or free_port()
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--host", "127.0.0.1", "--port", str(port), *args]
    env = dict(os.environ)
    env.update({"PYTHONUNBUFFERED": "1", "NO_COLOR": "1", "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    env.update(env_extra or {})
    run = EngineRun(cmd=cmd, env_extra=dict(env_extra or {}), port=port)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, start_new_session=True, text=True, errors="replace", bufsize=1)
    lock = threading.Lock()

    def reader() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = ANSI_RE.sub("", raw.rstrip("\n"))
            if echo:
                print(line, file=sys.stderr, flush=True)
            with lock:
                run.lines.append(line)
                if run.kv_line is None:
                    p = parse_kv_line(line) or parse_split_kv_line(run.lines)
                    if p:
                        run.kv_line, run.kv_line_full = p["message"], line
                        run.kv_tokens, run.concurrency = p["tokens"], p["concurrency"]
                        run.concurrency_str = p["concurrency_str"]
                        run.max_model_len_printed = p["max_model_len"]
                        run.t_kv_line = time.monotonic() - t0

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    try:
        while True:
            if proc.poll() is not None:
                run.exit_code = proc.returncode
                break
            if time.monotonic() - t0 > timeout:
                run.timed_out = True
                break
            with lock:
                have_kv = run.kv_tokens is not None
            if have_kv and health(run.base_url):
                run.ready = True
                run.t_ready = time.monotonic() - t0
                break
            time.sleep(0.5)
        if run.ready and keep_alive is not None:
            try:
                run.extra["keep_alive"] = keep_alive(run)
            except Exception as e:  # noqa: BLE001 - recorded for the caller
                run.extra["keep_alive_error"] = f"{type(e).__name__}: {e}"
    finally:
        with lock:
            run.n_lines_before_stop = len(run.lines)
        if proc.poll() is None:
            run.killed = True
            _kill_group(proc)
        else:
            _kill_group(proc)  # reap any orphaned children in the group
            run.exit_code = proc.returncode
        th.join(timeout=10)
        run.t_total = time.monotonic() - t0
    return run


# --------------------------------------------------------------------------------------
# Ground-truth matrix (tests/data/vllm_cpu_truth.json)
# --------------------------------------------------------------------------------------

PREFIX_RE = re.compile(r"^\((?P<proc>[^ )]+) pid=\d+\) (?P<lvl>[A-Z]+) \d\d-\d\d \d\d:\d\d:\d\d ")
ENGINE_CFG_RE = re.compile(
    r"dtype=(?P<dtype>[\w.]+), max_seq_len=(?P<max_seq_len>\d+),.*?kv_cache_dtype=(?P<kv_cache_dtype>\w+),"
    r".*?enable_prefix_caching=(?P<enable_prefix_caching>\w+), enable_chunked_prefill=(?P<enable_chunked_prefill>\w+)"
)
CACHE_INFO_RE = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.M)
LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

# Lines that say nothing about KV sizing (environment noise on the reference machine).
NOISE = ("ulimit", "libtcmalloc", "libiomp", "Triton", "triton", "DeprecationWarning", "deprecated",
         "Route:", "leaked", "resource_tracker", "FutureWarning", "nanobind", "Enforce eager",
         "Inductor compilation", "reduce_op", "NUMA binding", "Final IR op priority", "dump_input.py")
KEYWORDS = ("KV cache", "kv cache", "block size", "block_size", "sliding", "Sliding", "hybrid", "Hybrid",
            "padding layers", "Explicitly set", "Auto set", "Using max model len", "max_num_batched_tokens",
            "data type to store kv cache", "MLA", "chunked prefill", "prefix caching", "Resolved architecture",
            "Error", "error", "Exception", "not supported", "Unsupported", "unsupported", "failed")


def normalize_line(line: str) -> str:
    """Drop the pid and timestamp from vLLM's log prefix (they change every run)."""
    return PREFIX_RE.sub(lambda m: f"({m.group('proc')}) {m.group('lvl')} ", line)


def _is_traceback_noise(msg: str) -> bool:
    """Traceback frames, source excerpts and caret markers (keep the exception lines)."""
    st = msg.strip()
    return (not st or msg[:1].isspace() or st.startswith(("File \"", "Traceback", "^", "~", "raise ", "return "))
            or set(st) <= set("^~ "))


def relevant_lines(lines: list[str]) -> list[str]:
    out: list[str] = []
    for ln in lines:
        if not ln.strip() or any(n in ln for n in NOISE):
            continue
        m = PREFIX_RE.match(ln)
        lvl = m.group("lvl") if m else ""
        msg = ln[m.end():] if m else ln
        if m and msg.startswith("["):  # "[file.py:123] message"
            msg = msg.split("] ", 1)[1] if "] " in msg else ""
        if _is_traceback_noise(msg):
            continue
        if lvl in ("WARNING", "ERROR", "CRITICAL") or any(k in ln for k in KEYWORDS):
            if "Initializing a V1 LLM engine" in ln or "non-default args" in ln:
                continue
            nl = normalize_line(ln)
            if nl not in out:
                out.append(nl)
    return out


def parse_cache_config_info(metrics_text: str) -> dict[str, str] | None:
    m = CACHE_INFO_RE.search(metrics_text)
    if not m:
        return None
    return {k: v for k, v in LABEL_RE.findall(m.group("labels"))}


BASE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
BASE_ARGS = ["--enforce-eager", "--max-model-len", "4096"]


def _case(cid: str, kind: str, args: list[str] | None = None, env: dict[str, str] | None = None,
          note: str = "") -> dict[str, Any]:
    return {"id": cid, "kind": kind, "args": args if args is not None else list(BASE_ARGS),
            "env": env if env is not None else dict(BASE_ENV), "note": note}


def truth_matrix() -> list[dict[str, Any]]:
    cases = [_case(f"{k}-base", k) for k in
             ("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "deepseek_v2", "gpt_oss")]
    E = lambda *a: ["--enforce-eager", *a]  # noqa: E731
    cases += [
        _case(f"qwen2-kv-{d}", "qwen2", E("--max-model-len", "4096", "--kv-cache-dtype", d))
        for d in ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "bfloat16")
    ]
    cases += [
        _case("llama-mml32768", "llama", E("--max-model-len", "32768"), note="long context"),
        _case("llama-mml5000", "llama", E("--max-model-len", "5000"), note="mml not a multiple of block size"),
        _case("llama-mml-default", "llama", E(), note="no --max-model-len: derived from config (32768)"),
        _case("llama-bs32", "llama", E("--max-model-len", "4096", "--block-size", "32")),
        _case("qwen2-bs16", "qwen2", E("--max-model-len", "4096", "--block-size", "16"),
              note="not a multiple of 32 (CPU_ATTN wants MultipleOf(32))"),
        _case("qwen2-kv2GiB", "qwen2", env={"VLLM_CPU_KVCACHE_SPACE": "2"}),
        _case("qwen2-kvbytes1e9", "qwen2", E("--max-model-len", "4096", "--kv-cache-memory-bytes", "1000000000"),
              env={}, note="explicit bytes instead of the env var"),
        _case("mistral-mnbt512", "mistral", E("--max-model-len", "4096", "--max-num-batched-tokens", "512")),
        _case("mistral-mml1024", "mistral", E("--max-model-len", "1024"),
              note="window + in-flight tokens capped by max_model_len"),
        _case("mistral-bs64", "mistral", E("--max-model-len", "4096", "--block-size", "64")),
        _case("mistral-bs16", "mistral", E("--max-model-len", "4096", "--block-size", "16"),
              note="SW layers pick their own kernel block (MultipleOf(32) -> 32)"),
        _case("gemma2-disable-hybrid", "gemma2", E("--max-model-len", "4096", "--disable-hybrid-kv-cache-manager")),
        _case("gemma2-mnbt1024", "gemma2", E("--max-model-len", "4096", "--max-num-batched-tokens", "1024")),
        _case("gemma2-bs16", "gemma2", E("--max-model-len", "4096", "--block-size", "16"),
              note="full layers 16, SW layers 32 -> page unification"),
        _case("gpt_oss-mml8192", "gpt_oss", E("--max-model-len", "8192")),
        _case("deepseek_v2-bs128", "deepseek_v2", E("--max-model-len", "4096", "--block-size", "128"),
              note="CPU reference MLA forces block 16"),
        _case("deepseek_v2-mml1000", "deepseek_v2", E("--max-model-len", "1000")),
        _case("deepseek_v2-kv-fp8", "deepseek_v2", E("--max-model-len", "4096", "--kv-cache-dtype", "fp8"),
              note="CPU_MLA lists only 'auto' as supported kv-cache dtype"),
        _case("qwen2-env-and-bytes", "qwen2", E("--max-model-len", "4096", "--kv-cache-memory-bytes", "1000000000"),
              note="VLLM_CPU_KVCACHE_SPACE overrides --kv-cache-memory-bytes"),
    ]
    return cases + architecture_matrix()


# Second settings per architecture family (launcher/engines/vllm/architectures.py cites these ids):
# lengths that cross the window or chunk, fp8 KV (is the dtype honoured?), other block sizes.
_FP8 = ("--kv-cache-dtype", "fp8")
_BS64 = ("--block-size", "64")
ARCH_SECOND: dict[str, tuple[tuple[str, tuple[str, ...], str], ...]] = {
    "qwen3": (("kv-fp8", ("--max-model-len", "4096", *_FP8), ""),),
    "gemma3": (("mml1024", ("--max-model-len", "1024"), "window 256 + 2048 in flight capped by mml"),),
    "qwen3_moe": (("kv-fp8", ("--max-model-len", "4096", *_FP8), ""),),
    "qwen2_moe": (("bs64", ("--max-model-len", "4096", *_BS64), ""),),
    "mixtral": (("kv-fp8", ("--max-model-len", "4096", *_FP8), ""),),
    "gemma": (("kv-fp8", ("--max-model-len", "4096", *_FP8), "head_dim 64 != hidden/heads"),),
    "phi3": (("mml1024", ("--max-model-len", "1024"), "every layer slides (window 255, no layer_types)"),),
    "phi": (("kv-fp8", ("--max-model-len", "2048", *_FP8), "Transformers backend"),),
    "granite": (("bs64", ("--max-model-len", "4096", *_BS64), ""),),
    "granitemoe": (("mml1000", ("--max-model-len", "1000"), ""),),
    "cohere": (("kv-fp8", ("--max-model-len", "4096", *_FP8), ""),),
    "cohere2": (("mml1024", ("--max-model-len", "1024"), "window passed as sliding_window + 1"),
                ("mnbt512", ("--max-model-len", "4096", "--max-num-batched-tokens", "512"), ""),
                ("mnbt513", ("--max-model-len", "4096", "--max-num-batched-tokens", "513"),
                 "256 + 513 = 769 tokens held: one block more than with the plain window")),
    "starcoder2": (("mml1024", ("--max-model-len", "1024"), "model-wide window, no layer_types"),),
    "gpt_bigcode": (("kv-fp8", ("--max-model-len", "4096", *_FP8), "multi_query"),),
    "falcon": (("kv-fp8", ("--max-model-len", "4096", *_FP8), "multi_query, old decoder"),),
    "falcon_ndarch": (("bs64", ("--max-model-len", "4096", *_BS64), "new_decoder_architecture"),),
    "gpt_neox": (("kv-fp8", ("--max-model-len", "4096", *_FP8), "Transformers backend"),),
    "gptj": (("mml2048", ("--max-model-len", "2048"), ""),),
    "olmo": (("kv-fp8", ("--max-model-len", "4096", *_FP8), ""),),
    "olmo2": (("bs64", ("--max-model-len", "4096", *_BS64), ""),),
    "olmo3": (("mml1024", ("--max-model-len", "1024"), "3 sliding : 1 full"),),
    "glm4": (("kv-fp8", ("--max-model-len", "4096", *_FP8), ""),),
    "deepseek_v3": (("mml1000", ("--max-model-len", "1000"), "MLA"),),
    "minicpm3": (("kv-fp8", ("--max-model-len", "4096", *_FP8), "MLA-like fields, plain K/V"),),
    "llama4": (("mml8192", ("--max-model-len", "8192"), "chunked local attention, chunk 256"),
               ("mml200", ("--max-model-len", "200"), "length under the chunk")),
    "exaone4": (("mml1024", ("--max-model-len", "1024"), "3 sliding : 1 full"),),
    "stablelm": (("kv-fp8", ("--max-model-len", "4096", *_FP8), ""),),
    "ernie4_5": (("bs64", ("--max-model-len", "4096", *_BS64), ""),),
    "hunyuan_dense": (("kv-fp8", ("--max-model-len", "4096", *_FP8), "Transformers backend"),),
    "bloom": (("kv-fp8", ("--max-model-len", "2048", *_FP8), "ALiBi"),),
    "opt": (("kv-fp8", ("--max-model-len", "2048", *_FP8), ""),),
    "gpt2": (("kv-fp8", ("--max-model-len", "1024", *_FP8), ""),),
    "smollm3": (("kv-fp8", ("--max-model-len", "4096", *_FP8), "Transformers backend"),),
    "phimoe": (("bs64", ("--max-model-len", "4096", *_BS64), ""),),
    "glm4_moe": (("kv-fp8", ("--max-model-len", "4096", *_FP8), "partial rotary, MoE"),),
    "ernie4_5_moe": (("bs64", ("--max-model-len", "4096", *_BS64), ""),),
    "olmoe": (("kv-fp8", ("--max-model-len", "4096", *_FP8), ""),),
    "nemotron": (("mml2048", ("--max-model-len", "2048"), ""),),
    "apertus": (("kv-fp8", ("--max-model-len", "4096", *_FP8), ""),),
    "arcee": (("bs64", ("--max-model-len", "4096", *_BS64), "Transformers backend"),),
    "granitemoeshared": (("kv-fp8", ("--max-model-len", "4096", *_FP8), ""),),
    "minimax_m2": (("mml2048", ("--max-model-len", "2048"),
                    "sigmoid routing: sized, then the CPU MoE router asserts softmax on the first request"),),
    "minimax_m2_softmax": (("kv-fp8", ("--max-model-len", "4096", *_FP8), "softmax routing serves on CPU"),),
    "glm": (("kv-fp8", ("--max-model-len", "4096", *_FP8), "Transformers backend"),),
    "phimoe_tf": (("bs64", ("--max-model-len", "4096", *_BS64),
                   "PhimoeForCausalLM: Transformers-backend MoE, sized, then the first request fails"),),
    "dbrx": (("kv-fp8", ("--max-model-len", "4096", *_FP8), "attn_config.kv_n_heads"),),
    "seed_oss": (("kv-fp8", ("--max-model-len", "4096", *_FP8), "Transformers backend"),),
    # Hybrid state models: prefix caching on (the default: mamba cache mode 'align') and off ('none').
    **{k: (("noprefix", ("--max-model-len", "4096", "--no-enable-prefix-caching"),
            "prefix caching off: mamba cache mode 'none', one state block per request"),)
       for k in ("qwen3_next", "granitemoehybrid", "falcon_h1", "mamba2", "mamba", "lfm2", "zamba2")},
    "nemotron_h": (("noprefix", ("--max-model-len", "4096", "--no-enable-prefix-caching"),
                    "prefix caching off: mamba cache mode 'none', one state block per request"),
                   ("mns2", ("--max-model-len", "4096", "--max-num-seqs", "2"),
                    "max_num_seqs reserves no state slots in 0.32: the same blocks as the base run")),
    "qwen3_next_gdn32": (("mml2048", ("--max-model-len", "2048"), "GDN heads of 32: the CPU kernel refuses"),),
    "qwen3_5_text": (("mml2048", ("--max-model-len", "2048"), "Qwen3_5ForCausalLM"),),
    "jamba": (("mml2048", ("--max-model-len", "2048"), "Mamba-1 with attention every 4th layer"),),
    # CPU attention head sizes (the kernels compiled into vllm/_C*.so): 48 serves, 16 and 40 fail.
    **{f"llama_h{head}": (("kv-fp8", ("--max-model-len", "3000", *_FP8),
                           "fp8 KV: the kernel needs a head size divisible by 32"),) for head in (16, 40, 48)},
    "qwen2_moe_sw": (("mml1024", ("--max-model-len", "1024"), "use_sliding_window true, window 256"),),
    "gemma4_text": (("mml1024", ("--max-model-len", "1024"), "local head 32, global head 64"),),
    "gemma3_swp": (("mml1024", ("--max-model-len", "1024"),
                    "config-level sliding_window 128 and sliding_window_pattern 3, no layer_types"),),
    "kimi_linear": (("noprefix", ("--max-model-len", "4096", "--no-enable-prefix-caching"),
                     "KDA + MLA: the CPU engine cannot build the model (no KV line)"),),
}
# A pinned bfloat16 SSM state: the CPU backend keeps it only for the accelerated GDN backend
# (vllm/platforms/cpu.py:301-320); a Mamba-2 mixer is reset to float32.
for _kind in ("qwen3_next", "nemotron_h"):
    ARCH_SECOND[_kind] += (("ssm-bf16", ("--max-model-len", "4096", "--mamba-ssm-cache-dtype", "bfloat16"),
                            "pinned --mamba-ssm-cache-dtype bfloat16"),)
# Base length per family where the model's own maximum is under 4096.
ARCH_BASE_LEN = {"phi": "2048", "bloom": "2048", "opt": "2048", "gpt2": "1024"}
# transformers 5 saves DBRX experts under names vLLM 0.32's loader does not map
# (KeyError 'blocks.0.ffn.experts.w13_weight'): random weights from the config instead.
# minimax_m2_softmax: without routing bias vLLM has no e_score_correction_bias for the saved tensor.
# kimi_linear: config.json only (tests/tinymodels.py CONFIG_ONLY).
ARCH_EXTRA_ARGS = {"dbrx": ("--load-format", "dummy"), "minimax_m2_softmax": ("--load-format", "dummy"),
                   "kimi_linear": ("--load-format", "dummy")}


def architecture_matrix() -> list[dict[str, Any]]:
    """Every further family at a base setting first, then its second settings (run in this order)."""
    E = lambda *a: ["--enforce-eager", *a]  # noqa: E731
    base = [_case(f"{k}-base", k, E("--max-model-len", ARCH_BASE_LEN.get(k, "4096"), *ARCH_EXTRA_ARGS.get(k, ())))
            for k in ARCH_SECOND if k not in ("qwen3", "gemma3")]
    second = [_case(f"{k}-{suffix}", k, E(*args, *ARCH_EXTRA_ARGS.get(k, ())), note=note)
              for k, settings in ARCH_SECOND.items() for suffix, args, note in settings]
    return base + second


def run_case(case: dict[str, Any], models_root: str, python: str, timeout: float = 300.0,
             engine_version: str | None = None) -> dict[str, Any]:
    from tinymodels import build, load_config  # type: ignore  # same directory

    model_dir = build(models_root, case["kind"])

    def probe(run: EngineRun) -> dict[str, Any]:
        res: dict[str, Any] = {}
        res["cache_config_info"] = parse_cache_config_info(metrics(run.base_url))
        try:
            res["completion_text"] = complete(run.base_url, "Hello world", max_tokens=4)["choices"][0]["text"]
        except Exception as e:  # noqa: BLE001
            res["completion_error"] = f"{type(e).__name__}: {e}"[:500]
        try:
            res["chat_text"] = chat(run.base_url, "Hello", max_tokens=4)["choices"][0]["message"]["content"]
        except Exception as e:  # noqa: BLE001
            res["chat_error"] = f"{type(e).__name__}: {e}"[:500]
        return res

    run = run_vllm_cpu(model_dir, case["args"], case["env"], python=python, timeout=timeout, keep_alive=probe)
    engine_cfg = None
    for ln in run.lines:
        if "Initializing a V1 LLM engine" in ln:
            m = ENGINE_CFG_RE.search(ln)
            if m:
                engine_cfg = m.groupdict()
            break
    probe_res = run.extra.get("keep_alive", {})
    cci = probe_res.get("cache_config_info") or {}
    return {
        **{k: case[k] for k in ("id", "kind", "args", "env", "note")},
        "config": load_config(model_dir),
        "kv_line": run.kv_line,
        "tokens": run.kv_tokens,
        "concurrency": run.concurrency,
        "concurrency_str": run.concurrency_str,
        "max_model_len": run.max_model_len_printed,
        "num_blocks": int(cci["num_gpu_blocks"]) if cci.get("num_gpu_blocks") not in (None, "", "None") else None,
        "block_size": int(cci["block_size"]) if cci.get("block_size") not in (None, "", "None") else None,
        "cache_config_info": cci or None,
        "engine_config": engine_cfg,
        "ok": run.ok,
        "exit_code": run.exit_code,
        "timed_out": run.timed_out,
        "completion_ok": "completion_text" in probe_res,
        "chat_ok": "chat_text" in probe_res,
        "probe_errors": {k: v for k, v in probe_res.items() if k.endswith("_error")},
        "relevant_lines": relevant_lines(run.startup_lines),
        "error_tail": [normalize_line(x) for x in run.lines if x.strip()][-15:] if not run.ok else [],
        "seconds_to_kv_line": round(run.t_kv_line, 1) if run.t_kv_line else None,
        "seconds_to_ready": round(run.t_ready, 1) if run.t_ready else None,
        "seconds_total": round(run.t_total or 0, 1),
        "engine_version": engine_version,
    }


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def generate_truth(out_path: str, models_root: str, python: str, only: list[str] | None = None) -> None:
    import platform

    results: dict[str, Any] = {}
    if only and os.path.exists(out_path):
        with open(out_path) as f:
            results = json.load(f)
    versions = subprocess.run(
        [python, "-c", "import vllm, torch, transformers, json; print(json.dumps({'vllm': vllm.__version__, "
         "'torch': torch.__version__, 'transformers': transformers.__version__, "
         "'amx': torch.cpu._is_amx_tile_supported(), 'avx512_bf16': torch.cpu._is_avx512_bf16_supported()}))"],
        capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    results.setdefault("meta", {}).update({
        "generator": "python tests/engine_harness.py truth OUT.json MODELS_DIR [--python PY] [--only ID ...]",
        "versions": json.loads(versions),
        "cpu": _cpu_model() or platform.machine(),
        "nproc": os.cpu_count(),
        "launch": "python -m vllm.entrypoints.openai.api_server --model DIR --host 127.0.0.1 --port P ARGS",
    })
    cases_by_id = {c["id"]: c for c in results.get("cases", [])}
    t0 = time.monotonic()
    for case in truth_matrix():
        if only and case["id"] not in only:
            continue
        print(f"[truth] {case['id']} ...", file=sys.stderr, flush=True)
        r = run_case(case, models_root, python, engine_version=results["meta"]["versions"].get("vllm"))
        print(f"[truth] {case['id']}: {r['kv_line'] or r['error_tail'][-3:]} ({r['seconds_total']} s)",
              file=sys.stderr, flush=True)
        cases_by_id[case["id"]] = r
        order = [c["id"] for c in truth_matrix()]
        results["cases"] = sorted(cases_by_id.values(),
                                  key=lambda c: order.index(c["id"]) if c["id"] in order else 999)
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
            f.write("\n")
    results["meta"]["last_run_seconds"] = round(time.monotonic() - t0, 1)
    results["meta"]["last_run_cases"] = only or "all"
    results["meta"]["sum_case_seconds"] = round(sum(c.get("seconds_total") or 0 for c in results["cases"]), 1)
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")


# --------------------------------------------------------------------------------------
# Several engine versions in one file (tests/data/vllm_cpu_truth_versions.json)
# --------------------------------------------------------------------------------------

VERSIONS_SUBSET = ("llama-base", "qwen2-kv-fp8", "mistral-base", "gemma2-base", "gemma3-base",
                   "deepseek_v2-base", "mistral-mnbt512", "llama-bs32")


# Cases only older releases can run (recorded in tests/data/vllm_cpu_truth_versions.json only):
# `--mamba-cache-mode all` is accepted until 0.31 (gone from 0.32's config/cache.py MambaCacheMode).
VERSION_ONLY_CASES = (
    _case("nemotron_h-mode-all", "nemotron_h", [*BASE_ARGS, "--mamba-cache-mode", "all"],
          note="mamba cache mode 'all': a state block per block of tokens (SupportsMambaPrefixCaching)"),
    _case("qwen3_next-mode-all", "qwen3_next", [*BASE_ARGS, "--mamba-cache-mode", "all"],
          note="mamba cache mode 'all' on a class without Mamba prefix caching: falls back to 'align'"),
    # Before 0.28 prefix caching is opt-in for hybrid models (0.27.1 engine/arg_utils.py:2602-2605).
    _case("nemotron_h-prefix-on", "nemotron_h", [*BASE_ARGS, "--enable-prefix-caching"],
          note="prefix caching asked for: on 0.27 mamba cache mode 'all' for a SupportsMambaPrefixCaching class"),
)
HYBRID_VERSION_CASES = tuple(f"{kind}-{suffix}" for kind in ("qwen3_next", "nemotron_h", "granitemoehybrid",
                                                             "falcon_h1", "zamba2", "mamba2", "lfm2")
                             for suffix in ("base", "noprefix"))


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])


def generate_truth_versions(out_path: str, models_root: str, python: str, only: list[str] | None = None) -> None:
    """Record `only` (default VERSIONS_SUBSET) on the engine in `python` into OUT.json.

    Each case gets "engine_version"; records of other versions (or other cases) already in
    OUT.json are kept, a record with the same (engine_version, id) is replaced.
    """
    import platform

    probe = ("import vllm, torch, transformers, json; print(json.dumps({'vllm': vllm.__version__, "
             "'torch': torch.__version__, 'transformers': transformers.__version__, "
             "'amx': torch.cpu._is_amx_tile_supported(), 'avx512_bf16': torch.cpu._is_avx512_bf16_supported()}))")
    versions = json.loads(subprocess.run([python, "-c", probe], capture_output=True, text=True,
                                         check=True).stdout.strip().splitlines()[-1])
    version = versions["vllm"]
    results: dict[str, Any] = {}
    if os.path.exists(out_path):
        with open(out_path) as f:
            results = json.load(f)
    meta = results.setdefault("meta", {})
    meta.update({
        "generator": "python tests/engine_harness.py truth-versions OUT.json MODELS_DIR --python PY [--only ID ...]",
        "cpu": _cpu_model() or platform.machine(),
        "nproc": os.cpu_count(),
        "launch": "python -m vllm.entrypoints.openai.api_server --model DIR --host 127.0.0.1 --port P ARGS",
    })
    meta.setdefault("versions", {})[version] = versions
    wanted = list(only or VERSIONS_SUBSET)
    matrix = truth_matrix() + list(VERSION_ONLY_CASES)
    order = [c["id"] for c in matrix]
    by_key = {(c["engine_version"], c["id"]): c for c in results.get("cases", [])}
    for case in matrix:
        if case["id"] not in wanted:
            continue
        print(f"[truth {version}] {case['id']} ...", file=sys.stderr, flush=True)
        r = run_case(case, models_root, python, engine_version=version)
        print(f"[truth {version}] {case['id']}: {r['kv_line'] or r['error_tail'][-3:]} ({r['seconds_total']} s)",
              file=sys.stderr, flush=True)
        by_key[(version, case["id"])] = {**r, "engine_version": version}
        results["cases"] = sorted(by_key.values(), key=lambda c: (
            _version_tuple(c["engine_version"]), order.index(c["id"]) if c["id"] in order else 999))
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    # engine_harness.py truth OUT.json MODELS_DIR [--python PY] [--only ID ...]
    # engine_harness.py MODEL_DIR [vllm args...]            (manual single run, echoes the log)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    # engine_harness.py truth-versions OUT.json MODELS_DIR --python PY [--only ID ...]  (engine_version per case)
    if len(sys.argv) > 1 and sys.argv[1] in ("truth", "truth-versions"):
        a = sys.argv[2:]
        py = sys.executable
        if "--python" in a:
            i = a.index("--python")
            py = a[i + 1]
            del a[i:i + 2]
        only = None
        if "--only" in a:
            i = a.index("--only")
            only = a[i + 1:]
            del a[i:]
        (generate_truth if sys.argv[1] == "truth" else generate_truth_versions)(a[0], a[1], py, only)
        raise SystemExit(0)
    r = run_vllm_cpu(sys.argv[1], sys.argv[2:],
                     {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")},
                     timeout=float(os.environ.get("TIMEOUT", "300")), echo=True,
                     keep_alive=lambda run: complete(run.base_url))
    print(json.dumps({k: getattr(r, k) for k in ("kv_line", "kv_tokens", "concurrency", "ready", "exit_code",
                                                "t_kv_line", "t_ready", "t_total")} | {"extra": r.extra}, indent=1))
