"""SGLang's adapter: the `EngineAdapter` through which the rest of safe-serve meets SGLang.

The spec is data from `rules.py`; `ModuleAdapter` answers the rest from this package's own
modules, each checked by mypy against its module protocol (`launcher/engines/base.py`), and
`ADAPTER: EngineAdapter` checks the whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.engines.base import EngineAdapter, EngineSpec, ModuleAdapter
from launcher.engines.sglang import architectures, logs, rules, runtime

if TYPE_CHECKING:
    from launcher.engines.base import PlannerModule

SPEC = EngineSpec(
    name="sglang", newest=rules.NEWEST, distributions=("sglang",), length_flag=rules.LENGTH_FLAG,
    tp_flag=rules.TP_FLAG, pp_flag=rules.PP_FLAG, fp8_kv_dtype=rules.FP8_KV, default_port=rules.DEFAULT_PORT,
    flags=rules.FLAGS, parse=rules.pinned_flags, other_flags=rules.OTHER_FLAGS,
    secret_flags=rules.SECRET_FLAGS, plain_flags_like_secrets=rules.PLAIN_FLAGS_LIKE_SECRETS,
    as_written=rules.AS_WRITTEN, oldest=rules.RULES[0].version, accepted_module="launcher.engines.sglang.accepted",
    # memory_knob_flag: the fraction an alternative may set
    memory_knob_flag="--mem-fraction-static", cpu_offload_flag=None,
    online_quantization=rules.ONLINE_QUANTIZATION,
    memory_flags=rules.MEMORY_FLAGS, calibration_key_flags=rules.CALIBRATION_KEY_FLAGS, env_keys=rules.ENV_KEYS,
    allow_long_env=rules.ALLOW_LONG_ENV, log_prefilter=logs.PREFILTER, temporary_fatal=runtime.TEMPORARY_FATAL,
    figure_keys=("mem_fraction_static", "max_total_tokens"),  # Plan.engine_figures
)


def _planner() -> PlannerModule:
    from launcher.engines.sglang import planner  # on first plan: keeps `safe-serve gpus` light

    return planner


ADAPTER: EngineAdapter = ModuleAdapter(SPEC, rules=rules, architectures=architectures, planner=_planner,
                                       runtime=runtime, logs=logs)
