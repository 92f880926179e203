"""The serve flow's decisions: engine argv, log rules, retuned flags from the engine's numbers."""

from __future__ import annotations

import dataclasses

from launcher.engines import adapter
from launcher.engines.sglang.logs import parse as parse_sglang
from launcher.engines.vllm.logs import parse as parse_vllm
from launcher.model.catalog import hypothetical_gpus
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest
from launcher.serve import diverges


def retuned_args(plan, args, event, concurrency: int = 1):
    return adapter(plan.engine).retuned_args(plan, args, event, concurrency=concurrency)


def engine_argv(plan, model, passthrough, engine_cmd):
    return adapter(plan.engine).engine_argv(plan, model, passthrough, engine_cmd)


# vLLM's own record header (vllm/logger.py:28, 0.33.0) as logger.exception writes a traceback's
# last line: the ERROR header, then "ValueError: ...".
ERR = "(EngineCore pid=107) ERROR 07-06 22:52:09 [core.py:1512] ValueError: "
KV_HEAD = "INFO 07-06 22:52:09 [kv_cache_utils.py:1319] "
S_HEAD = "[2026-11-29 07:42:31] "


def _plan(engine: str = "vllm", args: tuple[str, ...] = ()):
    return make_plan(PlanRequest(model=resolve_model("qwen2.5-7b"), engine=engine,
                                 gpus=hypothetical_gpus(["rtx4090"]), engine_args=args))


class TestVllmLines:
    def test_kv_line_0_32(self) -> None:
        """The 0.32 one-line KV report gives tokens, length and concurrency."""
        event = parse_vllm("(EngineCore pid=107) INFO 07-06 22:52:09 [kv_cache_utils.py:2146] CPU KV cache size: "
                           "1,048,576 tokens, Maximum concurrency for 2,048 tokens per request: 512.00x")
        assert event is not None and event.kind == "kv"
        assert event.values == {"device": "CPU", "tokens": 1048576, "max_model_len": 2048, "concurrency": 512.0}

    def test_kv_too_small_error(self) -> None:
        """vLLM's error carries the estimated maximum model length."""
        line = (f"{ERR}To serve at least one request with the models's max seq len (221000), (10.12 GiB KV "
                "cache is needed, which is larger than the available KV cache memory (5.59 GiB). Based on the "
                "available memory, the estimated maximum model length is 122080. Try increasing ...")
        event = parse_vllm(line)
        assert event.kind == "fatal:kv_too_small" and event.values["estimated_max_model_len"] == 122080

    def test_free_memory_error(self) -> None:
        """The startup free-memory refusal gives free, total and the utilization asked."""
        event = parse_vllm(f"{ERR}Free memory on device cuda:0 (7.34/15.49 GiB) on startup is less than desired GPU "
                           "memory utilization (0.8, 12.39 GiB). Decrease GPU memory utilization ...")
        assert event.values == {"free_gib": 7.34, "total_gib": 15.49, "utilization": 0.8}

    def test_ordinary_lines_cost_nothing(self) -> None:
        """A line with none of the prefilter words is not parsed."""
        assert parse_vllm("INFO 07-06 Route: /v1/models, Methods: GET") is None


class TestRetune:
    def test_estimated_length_becomes_the_new_length(self) -> None:
        """A rejected length is retuned to the engine's estimate, floored to the block."""
        plan = _plan(args=("--max-model-len", "32768"))
        event = parse_vllm(f"{ERR}To serve at least one request with the model's max seq len (32768), (1.75 GiB KV "
                           "cache is needed, which is larger than the available KV cache memory (1.20 GiB). Based on "
                           "the available memory, the estimated maximum model length is 22471. Try")
        assert retuned_args(plan, ["--max-model-len", "32768"], event) == ["--max-model-len", "22464"]

    def test_free_memory_sets_utilization_from_the_engine_figures(self) -> None:
        """(free - 0.25 GiB margin) / total, floored to 4 decimals."""
        plan = _plan()
        event = parse_vllm(f"{ERR}Free memory on device cuda:0 (7.34/15.49 GiB) on startup is less than desired GPU "
                           "memory utilization (0.92, 14.25 GiB).")
        assert retuned_args(plan, [], event) == ["--gpu-memory-utilization", "0.4577"]

    def test_sglang_pool_smaller_than_context_caps_it(self) -> None:
        """SGLang's silent cap becomes an explicit --context-length."""
        plan = dataclasses.replace(_plan("sglang"), max_model_len=32768)
        event = parse_sglang("[2026-11-29 07:42:31] max_total_num_tokens=20000, chunked_prefill_size=4096, "
                             "max_prefill_tokens=16384, max_running_requests=2048, context_len=32768, "
                             "available_gpu_mem=2.10 GB")
        assert retuned_args(plan, [], event) == ["--context-length", "20000"]

    def test_divergence_tolerance(self) -> None:
        """2 % off the planned tokens is tolerated, 3 % is not."""
        plan = _plan()
        near = parse_vllm(f"{KV_HEAD}GPU KV cache size: {int(plan.kv_cache_tokens * 0.98) + 1:,} tokens")
        far = parse_vllm(f"{KV_HEAD}GPU KV cache size: {int(plan.kv_cache_tokens * 0.97):,} tokens")
        assert not diverges(plan, near, 0.02) and diverges(plan, far, 0.02)


def test_engine_cmd_for_the_api_server_takes_model_flag() -> None:
    """The CPU build's api_server module takes --model; `vllm serve` takes it positionally."""
    plan = _plan()
    assert engine_argv(plan, "m", ["--x"], None)[:3] == ["vllm", "serve", "m"]
    argv = engine_argv(plan, "m", ["--x"], "python -m vllm.entrypoints.openai.api_server")
    assert argv[:5] == ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    assert argv[-4:] == list(plan.engine_args)


def test_kv_cache_memory_bytes_reads_like_vllm() -> None:
    """16M is 16 x 2**20 and 1k is 1000, as vLLM's human_readable_int reads them."""
    from launcher.engines.vllm import pinned_flags

    assert pinned_flags(["--kv-cache-memory-bytes", "16M"]) == {"--kv-cache-memory-bytes": 16 * 2**20}
    assert pinned_flags(["--kv-cache-memory-bytes=25.6k"]) == {"--kv-cache-memory-bytes": 25600}


def test_sglang_pool_within_tolerance_is_no_reason_to_restart() -> None:
    """A pool 4 tokens short of the context (0.015 %) is within 2 %; 10 % short is not."""
    plan = dataclasses.replace(_plan("sglang"), max_model_len=27576)

    def pool_short(event, concurrency: int, tolerance: float) -> bool:
        return adapter("sglang").kv_shortfall(plan, event, concurrency=concurrency, tolerance=tolerance) is not None

    near = parse_sglang(S_HEAD + "max_total_num_tokens=27572, chunked_prefill_size=4096, max_prefill_tokens=16384, "
                        "max_running_requests=2048, context_len=27576, available_gpu_mem=2.10 GB")
    far = parse_sglang(S_HEAD + "max_total_num_tokens=24818, chunked_prefill_size=4096, max_prefill_tokens=16384, "
                       "max_running_requests=2048, context_len=27576, available_gpu_mem=2.10 GB")
    assert not pool_short(near, 1, 0.02) and pool_short(far, 1, 0.02)
