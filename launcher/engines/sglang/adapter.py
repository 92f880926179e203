"""SGLang's adapter: the `EngineAdapter` through which the rest of safe-serve meets SGLang."""

from __future__ import annotations

from launcher.engines.base import PackageAdapter
from launcher.engines.sglang import architectures, logs, rules, runtime


class SglangAdapter(PackageAdapter):
    name = "sglang"
    newest = rules.NEWEST
    length_flag = rules.LENGTH_FLAG
    tp_flag = rules.TP_FLAG
    pp_flag = rules.PP_FLAG
    fp8_kv_dtype = rules.FP8_KV
    default_port = rules.DEFAULT_PORT
    figure_keys = ("mem_fraction_static",)  # Plan.engine_figures
    log_prefilter = logs.PREFILTER
    temporary_fatal = runtime.TEMPORARY_FATAL
    _rules, _logs, _runtime, _architectures = rules, logs, runtime, architectures
    _planner_module = "launcher.engines.sglang.planner"


ADAPTER = SglangAdapter()
