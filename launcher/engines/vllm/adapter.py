"""vLLM's adapter: the `EngineAdapter` through which the rest of safe-serve meets vLLM."""

from __future__ import annotations

from launcher.engines import vllm as rules
from launcher.engines.base import PackageAdapter
from launcher.engines.vllm import logs, runtime


class VllmAdapter(PackageAdapter):
    name = "vllm"
    newest = rules.NEWEST
    length_flag = "--max-model-len"
    tp_flag = "--tensor-parallel-size"
    pp_flag = "--pipeline-parallel-size"
    fp8_kv_dtype = "fp8"
    default_port = 8000
    log_prefilter = logs.PREFILTER
    temporary_fatal = runtime.TEMPORARY_FATAL
    _rules, _logs, _runtime = rules, logs, runtime
    _planner_module = "launcher.engines.vllm.planner"
    _accepted_module = "launcher.engines.vllm.accepted"
    # The oldest release whose code the rules were read from (docs/engine-versions.md: 0.8.5 on).
    oldest = rules.RULES[0].version
    memory_knob_flag = None  # vLLM sizes its utilization from free memory: more would take what is not free
    cpu_offload_flag = "--cpu-offload-gb"  # weights offloaded to CPU memory, where the plan models it


ADAPTER = VllmAdapter()
