"""vLLM's adapter: the `EngineAdapter` through which the rest of safe-serve meets vLLM."""

from __future__ import annotations

from launcher.engines.base import PackageAdapter
from launcher.engines.vllm import architectures, logs, rules, runtime


class VllmAdapter(PackageAdapter):
    name = "vllm"
    newest = rules.NEWEST
    length_flag = rules.LENGTH_FLAG
    tp_flag = rules.TP_FLAG
    pp_flag = rules.PP_FLAG
    fp8_kv_dtype = rules.FP8_KV
    default_port = rules.DEFAULT_PORT
    figure_keys = ("gpu_memory_utilization", "cpu_kvcache_space_gib")  # Plan.engine_figures
    log_prefilter = logs.PREFILTER
    temporary_fatal = runtime.TEMPORARY_FATAL
    _rules, _logs, _runtime, _architectures = rules, logs, runtime, architectures
    _planner_module = "launcher.engines.vllm.planner"


ADAPTER = VllmAdapter()
