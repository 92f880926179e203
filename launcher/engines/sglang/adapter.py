"""SGLang's adapter: the `EngineAdapter` through which the rest of safe-serve meets SGLang."""

from __future__ import annotations

from launcher.engines import sglang as rules
from launcher.engines.base import PackageAdapter
from launcher.engines.sglang import logs, runtime


class SglangAdapter(PackageAdapter):
    name = "sglang"
    newest = rules.NEWEST
    length_flag = "--context-length"
    tp_flag = "--tp-size"
    pp_flag = "--pp-size"
    fp8_kv_dtype = "fp8_e4m3"
    default_port = 30000
    log_prefilter = logs.PREFILTER
    temporary_fatal = runtime.TEMPORARY_FATAL
    _rules, _logs, _runtime = rules, logs, runtime
    _planner_module = "launcher.engines.sglang.planner"
    _accepted_module = "launcher.engines.sglang.accepted"
    oldest = rules.RULES[0].version  # 0.5.1: every 0.5.x release is read from its own code
    memory_knob_flag = "--mem-fraction-static"  # the fraction an alternative may set
    cpu_offload_flag = None  # weights offloaded to CPU memory, where the plan models it


ADAPTER = SglangAdapter()
