"""SGLang 0.5.22/0.5.23 startup lines and fatal errors (sglang-memory.md §3 and §6)."""

from __future__ import annotations

import re

from launcher.engines.events import EngineEvent, LineRule, parse_line

RULES = (
    LineRule("kv", re.compile(r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), .*?context_len=(\d+)"),
             lambda m: {"tokens": int(m.group(1)), "max_model_len": int(m.group(3))}),
    LineRule("kv_alloc", re.compile(r"KV Cache is allocated\. (?:dtype: [\w.]+, )?#tokens: (\d+)"),
             lambda m: {"tokens": int(m.group(1))}),
    LineRule("weights", re.compile(r"Load weight end\..*?avail mem=([\d.]+) GB(?:, mem usage=([\d.]+) GB)?"),
             lambda m: {"avail_gib": float(m.group(1)), "gib": float(m.group(2)) if m.group(2) else None}),
    LineRule("pre_load", re.compile(r"Load weight begin\. avail mem=([\d.]+) GB"),
             lambda m: {"gib": float(m.group(1))}),
    LineRule("fatal:weights_leave_nothing", re.compile(
        r"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=([\d.]+)\. "
        r"Raise --mem-fraction-static above ([\d.]+)"),
        lambda m: {"fraction": float(m.group(1)), "minimum": float(m.group(2))}),
    LineRule("fatal:not_enough_memory", re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static"),
             lambda m: {}),
    LineRule("fatal:unbalanced", re.compile(r"The memory capacity is unbalanced"), lambda m: {}),
    LineRule("fatal:graph_capture", re.compile(r"Capture cuda graph failed"), lambda m: {}),
    LineRule("fatal:cuda_oom", re.compile(r"CUDA out of memory"), lambda m: {}),
    LineRule("ready", re.compile(r"The server is fired up and ready to roll!"), lambda m: {}),
    # While serving (SGLang 0.5.23): a manager process died (managers/scheduler.py:6372,
    # tokenizer_manager.py:4043, detokenizer_manager.py:566), the parent noticed
    # (entrypoints/engine.py:1978) and kills its process tree; NCCL
    # (distributed/device_communicators/pynccl_wrapper.py:474).
    LineRule("crash:scheduler", re.compile(r"(Scheduler|TokenizerManager|DetokenizerManager) hit an exception"),
             lambda m: {"process": m.group(1)}),
    LineRule("crash:child_failed",
             re.compile(r"Received sigquit from a child process\. It usually means the child failed\."),
             lambda m: {}),
    LineRule("crash:nccl", re.compile(r"NCCL error"), lambda m: {}),
)
PREFILTER = ("max_total_num_tokens", "KV Cache is allocated", "Load weight", "Loaded weights leave",
             "Not enough memory", "unbalanced", "Capture cuda graph failed", "out of memory", "fired up",
             "hit an exception", "Received sigquit", "NCCL error")


def parse(line: str) -> EngineEvent | None:
    return parse_line(RULES, PREFILTER, line)
