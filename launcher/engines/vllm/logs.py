"""vLLM's log lines as its own records: startup figures, fatal start errors, crashes while serving.

vLLM's logger format (vllm/logger.py:28 in 0.33.0 and 0.34.0, :22 in 0.19.0)::

    {VLLM_LOGGING_PREFIX}(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s
        [%(fileinfo)s:%(lineno)d] %(message)s          (one line)

with ``datefmt="%m-%d %H:%M:%S"``. Before 0.32 the ``(Name pid=N) `` part is written by the
stream wrapper of child processes (so raw child output carries it too) and the API server's
records may have none. A multi-line message repeats the header on every line, after ``\\r\\n``
(logging_utils/formatter.py:74, ``NewLineFormatter``); ``logger.exception`` therefore puts the
header on every traceback line, at ERROR. With forced colour (``ColoredFormatter``) the header
carries SGR codes, which the reader drops. uvicorn's own lines read ``INFO:     message``.

Each rule's pattern is matched at the start of a record's message (events.LineRule); fatal and
crash rules need an ERROR/CRITICAL record or a traceback's last line, and name the exception
types vLLM raises them with. Request logs (entrypoints/serve/utils/request_logger.py:65 in
0.32: ``Received request %s: params: %s``, prompts at DEBUG with ``%r``) are INFO/DEBUG records
whose messages start with their own words, so the prompts they quote never match.

Every source line below was read again in 0.34.0 (the same text where the rule matches it, the lines cited;
the CPU worker's memory refusal has had another text since 0.33, which its rule now reads too). 0.34.0 sizes the KV
cache after warmup on CUDA by default (the extensible KV cache, v1/worker/extensible_kv_cache.py): it skips
the startup free-memory refusal (v1/worker/utils.py:783-787), still prints "Available KV cache memory" (the
profiling estimate the address range is reserved for) and reports what it measured after warmup and CUDA
graph capture in one INFO record (``kv_measured``) before the KV cache size line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from launcher.engines.events import (
    REQUEST_ERROR,
    TRACEBACK,
    WEB,
    EngineEvent,
    HeaderParser,
    LineRule,
    LogReader,
    field_after,
    number,
)

_HEADER = re.compile(
    r"(?:\([A-Za-z_][\w.:-]{0,63} pid=\d{1,10}\) )?"  # the process, when vLLM names it
    r"(?:(DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d{1,6})? \[([^\]\s]{1,255}:\d{1,7})\] )?")
_UVICORN = re.compile(r"(TRACE|DEBUG|INFO|WARNING|ERROR|CRITICAL):\s{1,16}")  # uvicorn/logging.py's levelprefix
_TORCH_OOM = frozenset({"OutOfMemoryError", "RuntimeError"})  # torch.OutOfMemoryError, torch.cuda.OutOfMemoryError
# A GiB figure as vLLM's format_gib writes it (`str(round(b / GiB, 2))`, utils/mem_utils.py:31-32 in 0.34.0): digits,
# then at most one fraction; one way to read it, so nothing to backtrack into.
_GIB = r"(-?\d{1,16}(?:\.\d{1,16})?)"
_FIELD_MIN_UTILIZATION = re.compile(r"`--gpu-memory-utilization` to more than (\d{1,3}\.\d{1,4})")

RULES = (
    # v1/core/kv_cache_utils.py:1169 (0.34.0), :1148 (0.33.0); "GPU KV cache size: %s tokens" at :1319 (0.19.0).
    # 0.34's extensible KV cache logs it once, after warmup, with the measured size (v1/engine/core.py:382-409,
    # v1/core/kv_cache_planning.py:1905).
    LineRule("kv", re.compile(r"([A-Z]{1,16})(?: \+ host)? KV cache size: ([\d,]{1,32}) tokens"
                              r"(?:, Maximum concurrency for ([\d,]{1,32}) tokens per request: ([\d.]{1,32})x)?"),
             lambda m: {"device": m.group(1), "tokens": int(number(m.group(2))),
                        "max_model_len": int(number(m.group(3))) if m.group(3) else None,
                        "concurrency": float(m.group(4)) if m.group(4) else None}),
    # v1/worker/gpu_worker.py:796 (0.34.0), :773 (0.33.0). Under 0.34's extensible KV cache this is the profiling
    # estimate at the requested memory (1.0 of the GPU when unset), not the cache: `kv_measured` has that.
    LineRule("available_kv", re.compile(r"Available KV cache memory: (-?[\d.]{1,32}) GiB"),
             lambda m: {"gib": float(m.group(1))}),
    # v1/worker/gpu/model_runner.py:442 (0.34.0: the only GPU runner), v1/worker/gpu_model_runner.py:5089 (0.33.0)
    LineRule("weights", re.compile(r"(?:Model loading|Loading model weights) took (-?[\d.]{1,32}) (?:GiB|GB)"),
             lambda m: {"gib": float(m.group(1))}),
    # 0.34's extensible KV cache, sized from the memory free after warmup and CUDA graph capture, per worker
    # (v1/worker/extensible_kv_cache.py:693-707 in measure_kv_cache_blocks): free, committed KV, the transient
    # reserve kept free (max of the allocated peak and torch's reservation growth), the blocks that fit
    # (before the minimum over ranks) and their GiB, the requested budget, torch's cap.
    LineRule("kv_measured", re.compile(
        rf"Memory after warmup: {_GIB} GiB free, {_GIB} GiB committed to the KV cache, {_GIB} GiB kept for "
        rf"transient activations \({_GIB} GiB allocated at peak, {_GIB} GiB of torch reservation growth\); "
        rf"(\d{{1,12}}) KV cache blocks \({_GIB} GiB\) fit within the requested {_GIB} GiB\. "
        rf"Torch may reserve up to {_GIB} GiB\."),
        lambda m: {"free_gib": float(m.group(1)), "committed_gib": float(m.group(2)),
                   "transient_gib": float(m.group(3)), "peak_gib": float(m.group(4)),
                   "torch_growth_gib": float(m.group(5)), "blocks": int(m.group(6)), "kv_gib": float(m.group(7)),
                   "requested_gib": float(m.group(8)), "torch_limit_gib": float(m.group(9))}),
    # 0.34: the workers cannot use the extensible KV cache (no virtual memory management on this driver, or another
    # rank cannot) and size it before warmup, from the utilization (WARNING, v1/executor/abstract.py:175-179).
    LineRule("sized_before_warmup", re.compile(r"Disabling the extensible KV cache: "), lambda m: {}),
    # v1/worker/utils.py:790 (0.34.0; not raised under the extensible KV cache, :783-787), :763 (0.33.0), ValueError
    LineRule("fatal:startup_free", re.compile(
        r"Free memory on device(?: [^\s(]{1,64})? \(([\d.]{1,32})/([\d.]{1,32}) GiB\) on startup is less than desired "
        r"GPU memory utilization \(([\d.]{1,32}), ([\d.]{1,32}) GiB\)"),
        lambda m: {"free_gib": float(m.group(1)), "total_gib": float(m.group(2)), "utilization": float(m.group(3))},
        raised=frozenset({"ValueError"})),
    # v1/core/kv_cache_planning.py:125 (0.34.0), :78 (0.33.0), v1/core/kv_cache_utils.py:645 (0.19.0). 0.34 also
    # raises it (and no_kv_memory) after warmup when the measured extensible KV cache is too small (:1849-1861).
    LineRule("fatal:kv_too_small", re.compile(
        r"To serve at least one request with the models?'s max seq len \((\d{1,12})\), \((-?[\d.]{1,32}) GiB KV "
        r"cache is needed, which is larger than the available KV cache memory \((-?[\d.]{1,32}) GiB\)\."
        r"(?: Based on the available memory, the estimated maximum model length is (\d{1,12})\.)?"),
        lambda m: {"max_model_len": int(m.group(1)), "available_gib": float(m.group(3)),
                   "estimated_max_model_len": int(m.group(4)) if m.group(4) else None},
        raised=frozenset({"ValueError"})),
    LineRule("fatal:kv_too_small_v0", re.compile(  # V0 (before 0.10): vllm/worker/worker.py raise_if_cache_size_invalid
        r"The model's max seq len \((\d{1,12})\) is larger than the maximum number of tokens that can be stored in "
        r"KV cache \((\d{1,12})\)"),
        lambda m: {"max_model_len": int(m.group(1)), "estimated_max_model_len": int(m.group(2))},
        raised=frozenset({"ValueError"})),
    LineRule("fatal:no_kv_memory", re.compile(r"No available memory for the cache blocks"), lambda m: {},
             raised=frozenset({"ValueError"})),  # v1/core/kv_cache_planning.py:108 (0.34.0), :58 (0.33.0)
    LineRule("fatal:autofit", re.compile(r"Cannot auto-fit max_model_len"), lambda m: {},
             raised=frozenset({"ValueError"})),  # v1/core/kv_cache_planning.py:1437 (0.34.0), :1382 (0.33.0)
    # 0.34's extensible KV cache commits physical pages through the driver (cuMemCreate/hipMemCreate) as warmup
    # and the final sizing need them; out of device memory that is the driver's error, not torch's, raised after
    # one retry with torch's cache emptied (utils/extensible_tensor.py:118-127, utils/vmm_driver.py:188-191 with
    # cuGetErrorString/hipGetErrorString :372-375, :453-455).
    LineRule("fatal:kv_commit_oom", re.compile(r"GPU driver error -?\d{1,6}: out of memory"), lambda m: {},
             raised=frozenset({"RuntimeError"}), logged=False),
    # 0.34: the extensible KV cache (on by default on CUDA) cannot serve this KV connector; the engine stops. Each
    # names its way out (--no-enable-extensible-kv-cache, or another connector): v1/worker/extensible_kv_cache.py:517
    # (ValueError, a connector with its own memory pool), v1/attention/backends/utils.py:395 (ValueError, no
    # block-compact layout every backend takes), v1/executor/abstract.py:170 (RuntimeError, a connector importing
    # the cache by POSIX fd where VMM is unusable). Refusals of the flag itself (config/vllm.py:3241, :3263) come as
    # pydantic's ValidationError, the reason on the next line: the planner refuses those before the start.
    LineRule("fatal:extensible_kv_unsupported", re.compile(
        r"The KV connector allocates the KV cache from its own memory pool, which the extensible KV cache cannot use"
        r"|KV connectors with the extensible KV cache need a block-compact layout"
        r"|A KV connector \(e\.g\. [\w.]{1,64} with [\w.]{1,64}\) imports the KV cache through POSIX file "
        r"descriptors, which needs the extensible KV cache"), lambda m: {},
        raised=frozenset({"ValueError", "RuntimeError"}), logged=False),
    LineRule("fatal:cuda_oom", re.compile(r"CUDA out of memory|CUDA error: out of memory"), lambda m: {},
             raised=_TORCH_OOM, logged=False),  # torch's own exceptions, never a message vLLM logs
    # The CPU worker, ValueError: before 0.33 at startup (cpu_worker.py:84 in 0.32.0, "on startup is less than
    # desired CPU memory utilization"); from 0.33 when it sizes the KV cache (0.34.0 cpu_worker.py:201, :237;
    # 0.33.0 :207, :243: "on kv cache allocation is less than requested memory for kv").
    LineRule("fatal:cpu_node_memory", re.compile(
        r"Available memory on node \d{1,4} \(([\d.]{1,32})/([\d.]{1,32}) GiB\) on (?:startup is less than desired "
        r"CPU memory|kv cache allocation is less than requested memory for kv)"),
        lambda m: {"free_gib": float(m.group(1)), "total_gib": float(m.group(2))},
        raised=frozenset({"ValueError"})),
    # From 0.33 the CPU worker's own footprint (weights and runtime) can fill its reservation, leaving no KV cache:
    # only a larger --gpu-memory-utilization (the CPU share) or an explicit KV size helps (0.34.0 cpu_worker.py:224,
    # 0.33.0 :230, ValueError); vLLM names the smallest utilization that leaves room.
    LineRule("fatal:cpu_reservation_full", re.compile(
        rf"The worker already uses {_GIB} GiB \(model weights and runtime\), more than the {_GIB} GiB of CPU memory "
        r"reserved for it on node \d{1,4}, leaving none for the KV cache\."),
        lambda m: {"used_gib": float(m.group(1)), "reserved_gib": float(m.group(2)),
                   "min_utilization": float(f.group(1)) if (f := field_after(m, _FIELD_MIN_UTILIZATION)) else None},
        raised=frozenset({"ValueError"})),
    # uvicorn's "Application startup complete."; entrypoints/launchers/api_server/entry.py:139 (0.33.0, 0.34.0)
    LineRule("ready", re.compile(r"Application startup complete\.|Starting vLLM (?:API )?server"), lambda m: {},
             web=True),
    # While serving: the engine core's loop died (v1/engine/core.py:1759, :3089 in 0.34.0; :1586, :2806 in
    # 0.33.0), the API server's EngineDeadError (v1/engine/exceptions.py:20) and its output handler
    # (v1/engine/async_llm.py:957 in 0.34.0, :943 in 0.33.0); NCCL
    # (distributed/device_communicators/pynccl_wrapper.py:464, torch's DistBackendError says "NCCL error in: ...").
    # vLLM then exits, often with code 0.
    LineRule("crash:engine_core", re.compile(r"EngineCore encountered a fatal error\."), lambda m: {}),
    LineRule("crash:engine_dead", re.compile(
        r"EngineCore encountered an issue\. See stack trace \(above\) for the root cause\."), lambda m: {},
        raised=frozenset({"EngineDeadError"}), logged=False),
    LineRule("crash:output_handler", re.compile(r"AsyncLLM output_handler failed\."), lambda m: {}),
    LineRule("crash:nccl", re.compile(r"NCCL error"), lambda m: {},
             raised=frozenset({"RuntimeError", "DistBackendError"}), logged=False),
)
PREFILTER = ("KV cache", "took", "Free memory on device", "max seq len", "No available memory", "auto-fit",
             "out of memory", "Available memory on node", "The worker already uses", "Memory after warmup",
             "Application startup complete", "Starting vLLM", "EngineCore encountered", "output_handler failed",
             "NCCL error", TRACEBACK, REQUEST_ERROR)


# The request logger's records quote prompts, parameters and outputs: no rule reads them
# (entrypoints/serve/utils/request_logger.py in 0.32+, entrypoints/logger.py before; a multi-line
# record repeats its header, so even a raw newline in a prompt stays inside such records).
QUOTING_SOURCES = frozenset({"request_logger.py", "logger.py"})


def header_parser(prefix: str = "") -> HeaderParser:
    """Split a line into (source, level, message) by vLLM's format; ``prefix`` is VLLM_LOGGING_PREFIX."""

    def header(line: str) -> tuple[str, str | None, str]:
        if prefix and line.startswith(prefix):
            line = line[len(prefix):]
        match = _HEADER.match(line)
        assert match is not None  # every part is optional
        if match.group(1):
            return match.group(2), match.group(1), line[match.end():]
        if match.end() == 0 and (web := _UVICORN.match(line)) is not None:
            return WEB, web.group(1), line[web.end():]
        return "", None, line[match.end():]  # raw output, maybe a child's "(Name pid=N) " in front

    return header


def reader(env: Mapping[str, str] | None = None) -> LogReader:
    """A reader for one engine start; ``env`` is the engine's environment (its logging prefix)."""
    prefix = (env or {}).get("VLLM_LOGGING_PREFIX", "")
    return LogReader(RULES, PREFILTER, header_parser(prefix), quoting=QUOTING_SOURCES)


def parse(line: str) -> EngineEvent | None:
    """One line on its own (no traceback before it): the event its rule gives, or None."""
    return reader().read("stdout", line)
