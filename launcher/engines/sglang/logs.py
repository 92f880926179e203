"""SGLang's log lines as its own records: startup figures, fatal start errors, crashes while serving.

SGLang's logger format (srt/utils/common.py:2630, ``configure_logger``, 0.5.23)::

    [%(asctime)s{.%(msecs)03d with SGLANG_LOG_MS}{prefix}] %(message)s

with ``datefmt="%Y-%m-%d %H:%M:%S"`` and ``prefix`` the ranks, e.g. `` DP0 TP1 EP1``
(managers/scheduler.py:6279-6291). There is no level: a rule's pattern must begin the message
(events.LineRule), which is the engine's own text. A message of several lines (a manager's
"hit an exception: {traceback}") carries the header on its first line only; the traceback
follows raw and its last line is read as the exception. Request logs
(srt/utils/request_logger.py:116, ``Receive: obj=...``; ``Finish: ...`` at :197) quote prompts
with ``repr`` (no raw newline) inside messages that start with their own words, so they never
match. uvicorn's own lines read ``INFO:     message``.
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
)

_HEADER = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})?(?: [A-Z_]{1,16}\d{1,6}){0,8}\] ")
_UVICORN = re.compile(r"(TRACE|DEBUG|INFO|WARNING|ERROR|CRITICAL):\s{1,16}")
_CONTEXT_LEN = re.compile(r", context_len=(\d{1,12})")
_AVAIL_MEM = re.compile(r", avail mem=([\d.]{1,32}) GB")
_MEM_USAGE = re.compile(r", mem usage=([\d.]{1,32}) GB")


def _kv(m: re.Match[str]) -> dict[str, int | None]:
    length = field_after(m, _CONTEXT_LEN)
    return {"tokens": int(m.group(1)), "max_model_len": int(length.group(1)) if length else None}


def _weights(m: re.Match[str]) -> dict[str, float | None]:
    avail, usage = field_after(m, _AVAIL_MEM), field_after(m, _MEM_USAGE)
    return {"avail_gib": float(avail.group(1)) if avail else None, "gib": float(usage.group(1)) if usage else None}


RULES = (
    # managers/scheduler.py "max_total_num_tokens=..., chunked_prefill_size=..., ..., context_len=..."
    LineRule("kv", re.compile(r"max_total_num_tokens=(\d{1,12}), chunked_prefill_size=(-?\d{1,12}), "), _kv),
    LineRule("kv_alloc", re.compile(r"KV Cache is allocated\. (?:dtype: [\w.]{1,64}, )?#tokens: (\d{1,12})"),
             lambda m: {"tokens": int(m.group(1))}),
    LineRule("weights", re.compile(r"Load weight end\. "), _weights),
    LineRule("pre_load", re.compile(r"Load weight begin\. avail mem=([\d.]{1,32}) GB"),
             lambda m: {"gib": float(m.group(1))}),
    LineRule("fatal:weights_leave_nothing", re.compile(
        r"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=([\d.]{1,32})\. "
        r"Raise --mem-fraction-static above ([\d.]{1,32})"),
        lambda m: {"fraction": float(m.group(1)), "minimum": float(m.group(2))}, raised=frozenset({"ValueError"})),
    LineRule("fatal:not_enough_memory", re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static"),
             lambda m: {}, raised=frozenset({"RuntimeError", "ValueError"})),
    LineRule("fatal:unbalanced", re.compile(r"The memory capacity is unbalanced"), lambda m: {},
             raised=frozenset({"RuntimeError", "ValueError"})),
    LineRule("fatal:graph_capture", re.compile(r"Capture cuda graph failed"), lambda m: {},
             raised=frozenset({"Exception", "RuntimeError"})),
    LineRule("fatal:cuda_oom", re.compile(r"CUDA out of memory"), lambda m: {},
             raised=frozenset({"OutOfMemoryError", "RuntimeError"}), logged=False),
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
    LineRule("crash:nccl", re.compile(r"NCCL error"), lambda m: {},
             raised=frozenset({"RuntimeError", "DistBackendError"}), logged=False),
)
PREFILTER = ("max_total_num_tokens", "KV Cache is allocated", "Load weight", "Loaded weights leave",
             "Not enough memory", "unbalanced", "Capture cuda graph failed", "out of memory", "fired up",
             "hit an exception", "Received sigquit", "NCCL error", TRACEBACK, REQUEST_ERROR)


def header(line: str) -> tuple[str, str | None, str]:
    """Split a line into (source, level, message) by SGLang's format (no level, no file) or uvicorn's."""
    match = _HEADER.match(line)
    if match is not None:
        return "engine", None, line[match.end():]
    web = _UVICORN.match(line)
    if web is not None:
        return WEB, web.group(1), line[web.end():]
    return "", None, line


def header_parser() -> HeaderParser:
    return header


def reader(env: Mapping[str, str] | None = None) -> LogReader:
    """A reader for one engine start (SGLang's format does not depend on the environment)."""
    return LogReader(RULES, PREFILTER, header, levelled=False)


def parse(line: str) -> EngineEvent | None:
    """One line on its own (no traceback before it): the event its rule gives, or None."""
    return reader().read("stderr", line)
