"""vLLM's startup log lines and fatal errors (0.32 formats, older variants tolerated).

Match message substrings, never the `(EngineCore pid=N) INFO ...` prefix (older releases
had none). Verbatim formats: vllm-memory.md §1 and §8, from vLLM 0.32.0's source.
"""

from __future__ import annotations

import re

from launcher.engines.events import EngineEvent, LineRule, number, parse_line

RULES = (
    LineRule("kv", re.compile(r"([A-Z]+)(?: \+ host)? KV cache size: ([\d,]+) tokens"
                              r"(?:, Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x)?"),
             lambda m: {"device": m.group(1), "tokens": int(number(m.group(2))),
                        "max_model_len": int(number(m.group(3))) if m.group(3) else None,
                        "concurrency": float(m.group(4)) if m.group(4) else None}),
    LineRule("available_kv", re.compile(r"Available KV cache memory: (-?[\d.]+) GiB"),
             lambda m: {"gib": float(m.group(1))}),
    LineRule("weights", re.compile(r"(?:Model loading|Loading model weights) took (-?[\d.]+) (?:GiB|GB)"),
             lambda m: {"gib": float(m.group(1))}),
    LineRule("fatal:startup_free", re.compile(
        r"Free memory on device(?: \S+)? \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired GPU memory "
        r"utilization \(([\d.]+), ([\d.]+) GiB\)"),
        lambda m: {"free_gib": float(m.group(1)), "total_gib": float(m.group(2)), "utilization": float(m.group(3))}),
    LineRule("fatal:kv_too_small", re.compile(
        r"max seq len \((\d+)\), \((-?[\d.]+) GiB KV cache is needed, which is larger than the available KV cache "
        r"memory \((-?[\d.]+) GiB\)\."
        r"(?: Based on the available memory, the estimated maximum model length is (\d+)\.)?"),
        lambda m: {"max_model_len": int(m.group(1)), "available_gib": float(m.group(3)),
                   "estimated_max_model_len": int(m.group(4)) if m.group(4) else None}),
    LineRule("fatal:kv_too_small_v0", re.compile(
        r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored in KV cache \((\d+)\)"),
        lambda m: {"max_model_len": int(m.group(1)), "estimated_max_model_len": int(m.group(2))}),
    LineRule("fatal:no_kv_memory", re.compile(r"No available memory for the cache blocks"), lambda m: {}),
    LineRule("fatal:autofit", re.compile(r"Cannot auto-fit max_model_len"), lambda m: {}),
    LineRule("fatal:cuda_oom", re.compile(r"CUDA out of memory|CUDA error: out of memory"), lambda m: {}),
    LineRule("fatal:cpu_node_memory", re.compile(
        r"Available memory on node \d+ \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired CPU memory"),
        lambda m: {"free_gib": float(m.group(1)), "total_gib": float(m.group(2))}),
    LineRule("ready", re.compile(r"Application startup complete\.|Starting vLLM (?:API )?server"), lambda m: {}),
    # While serving (vLLM 0.32.0): the engine core's loop died (v1/engine/core.py:1512, :2663),
    # the API server's EngineDeadError (v1/engine/exceptions.py:16) and its output handler
    # (v1/engine/async_llm.py:906); NCCL (distributed/device_communicators/pynccl_wrapper.py:448,
    # torch's ProcessGroupNCCL says "NCCL error in: ..."). vLLM then exits, often with code 0.
    LineRule("crash:engine_core", re.compile(r"EngineCore encountered a fatal error\."), lambda m: {}),
    LineRule("crash:engine_dead", re.compile(
        r"EngineDeadError|EngineCore encountered an issue\. See stack trace \(above\) for the root cause\."),
        lambda m: {}),
    LineRule("crash:output_handler", re.compile(r"AsyncLLM output_handler failed\."), lambda m: {}),
    LineRule("crash:nccl", re.compile(r"NCCL error"), lambda m: {}),
)
PREFILTER = ("KV cache", "took", "Free memory on device", "max seq len", "No available memory", "auto-fit",
             "out of memory", "Available memory on node", "Application startup complete", "Starting vLLM",
             "EngineCore encountered", "EngineDeadError", "output_handler failed", "NCCL error")


def parse(line: str) -> EngineEvent | None:
    return parse_line(RULES, PREFILTER, line)
