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


# vLLM's own record header (vllm/logger.py:28, 0.33.0 and 0.34.0) as logger.exception writes a traceback's
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


# 0.34.0's extensible KV cache: what it measured after warmup and CUDA graph capture, one INFO record per worker
# (v1/worker/extensible_kv_cache.py:693-707), as the worker's logger writes it.
MEASURED = ("Memory after warmup: 118.64 GiB free, 0.25 GiB committed to the KV cache, 3.02 GiB kept for transient "
            "activations (3.02 GiB allocated at peak, 0.0 GiB of torch reservation growth); 7214 KV cache blocks "
            "(112.72 GiB) fit within the requested 139.81 GiB. Torch may reserve up to 6.5 GiB.")
MEASURED_HEAD = "(Worker_TP0 pid=212) INFO 11-16 09:12:44 [extensible_kv_cache.py:693] "


class TestVllm034Lines:
    def test_memory_after_warmup_gives_every_figure(self) -> None:
        event = parse_vllm(MEASURED_HEAD + MEASURED)
        assert event is not None and event.kind == "kv_measured" and not event.is_fatal
        assert event.values == {"free_gib": 118.64, "committed_gib": 0.25, "transient_gib": 3.02, "peak_gib": 3.02,
                                "torch_growth_gib": 0.0, "blocks": 7214, "kv_gib": 112.72, "requested_gib": 139.81,
                                "torch_limit_gib": 6.5}
        small = MEASURED.replace("118.64", "0.9").replace("7214", "0").replace("(112.72 GiB)", "(0.0 GiB)")
        assert parse_vllm("INFO 11-16 09:12:44 [extensible_kv_cache.py:693] " + small).values["blocks"] == 0

    def test_memory_after_warmup_is_read_only_as_the_engines_record(self) -> None:
        """The words quoted by a prompt (request logs, the access log, raw output, a request's traceback), or a
        record that only quotes them later in its message: no event. So a prompt cannot feed the figures."""
        from tests.hostile_lines import quoted

        for lines in quoted("vllm", MEASURED):
            reader = adapter("vllm").log_reader({})
            assert [reader.read("stdout", line) for line in lines] == [None] * len(lines), lines
        for line in (
            MEASURED,  # raw output: no header
            f"(APIServer pid=8) INFO 11-16 09:12:44 [serving.py:88] prompt echo: {MEASURED}",
            f"(APIServer pid=8) INFO 11-16 09:12:44 [request_logger.py:65] {MEASURED}",
            f"{MEASURED_HEAD}{MEASURED.replace('118.64', '1.1.8')}",  # not a number vLLM writes
            f"{MEASURED_HEAD}{MEASURED.replace('7214', '7,214')}",  # %d: no separators
            f"{MEASURED_HEAD}{MEASURED[:-30]}",  # cut short
        ):
            assert parse_vllm(line) is None, line

    def test_memory_after_warmup_long_lines_are_linear(self) -> None:
        """1 MB of digits where a figure goes, or of the record repeated: well under the bound (no backtracking)."""
        import time

        for line in (MEASURED_HEAD + MEASURED.replace("118.64", "1" * 1_000_000),
                     MEASURED_HEAD + MEASURED.replace("0.25", "0." + "5" * 1_000_000),
                     MEASURED_HEAD + MEASURED * 5_000, MEASURED_HEAD + "Memory after warmup: " * 50_000):
            started = time.perf_counter()
            parse_vllm(line)
            assert time.perf_counter() - started < 0.5

    def test_driver_out_of_memory_while_committing_the_kv_cache(self) -> None:
        """The extensible KV cache's pages come from the driver (utils/vmm_driver.py:191): its error is fatal, read
        from the engine's exception only, never from a message or another type."""
        event = parse_vllm(f"{ERR[:-len('ValueError: ')]}RuntimeError: GPU driver error 2: out of memory")
        assert event is not None and event.kind == "fatal:kv_commit_oom"
        reader = adapter("vllm").log_reader({})
        lines = ["Traceback (most recent call last):", '  File "vllm/utils/extensible_tensor.py", line 127',
                 "RuntimeError: GPU driver error 2: out of memory"]
        assert [e.kind for e in map(lambda line: reader.read("stderr", line), lines) if e] == ["fatal:kv_commit_oom"]
        for line in (f"{ERR[:-len('ValueError: ')]}GPU driver error 2: out of memory",  # a message, not raised
                     f"{ERR}GPU driver error 2: out of memory",  # another exception type
                     f"{KV_HEAD}RuntimeError: GPU driver error 2: out of memory"):  # at INFO
            assert parse_vllm(line) is None, line

    def test_extensible_kv_cache_refusals_are_fatal(self) -> None:
        """0.34.0 extensible_kv_cache.py:517, v1/attention/backends/utils.py:395, v1/executor/abstract.py:170."""
        head = ERR[:-len("ValueError: ")]
        for raised, text in (
            ("ValueError", "The KV connector allocates the KV cache from its own memory pool, which the extensible "
                           "KV cache cannot use. Disable it with --no-enable-extensible-kv-cache."),
            ("ValueError", "KV connectors with the extensible KV cache need a block-compact layout, but none is in "
                           "every supported set: [[LHBNC, LBHNC]]."),
            ("RuntimeError", "A KV connector (e.g. LMCacheMPConnector with lmcache.mp.use_vmm_api) imports the KV "
                             "cache through POSIX file descriptors, which needs the extensible KV cache, but GPU "
                             "driver error 801: operation not supported."),
        ):
            event = parse_vllm(f"{head}{raised}: {text}")
            assert event is not None and event.kind == "fatal:extensible_kv_unsupported", text
            assert parse_vllm(f"{head}TypeError: {text}") is None and parse_vllm(f"{head}{text}") is None

    def test_the_fallback_to_sizing_before_warmup_is_read(self) -> None:
        """0.34's workers that cannot use the extensible KV cache say so (v1/executor/abstract.py:175-179); a
        prompt quoting the words is not the engine's record."""
        line = ("(EngineCore pid=107) WARNING 11-20 10:02:11 [abstract.py:175] Disabling the extensible KV cache: "
                "CUDA driver error 801: operation not supported. The KV cache will be sized from profiling estimates "
                "instead of measured memory.")
        event = parse_vllm(line)
        assert event is not None and event.kind == "sized_before_warmup"
        quoted = ("(APIServer pid=9) INFO 11-20 10:05:00 [logger.py:65] Received request x: prompt: "
                  "'Disabling the extensible KV cache: nothing'")
        assert parse_vllm(quoted) is None

    def test_kv_errors_after_warmup_keep_their_figures(self) -> None:
        """0.34.0 kv_cache_planning.py:108, :125: the hints changed (the extensible KV cache's), the figures did not."""
        event = parse_vllm(f"{ERR}To serve at least one request with the model's max seq len (131072), (16.0 GiB KV "
                           "cache is needed, which is larger than the available KV cache memory (9.5 GiB). Based on "
                           "the available memory, the estimated maximum model length is 77824. The extensible KV "
                           "cache already takes all device memory left after the model, its activations, CUDA graphs "
                           "and warmup; decrease `max_model_len` or `max_num_seqs`, or the model needs a device with "
                           "more memory.")
        assert event.kind == "fatal:kv_too_small" and event.values["estimated_max_model_len"] == 77824
        assert parse_vllm(f"{ERR}No available memory for the cache blocks. The KV cache gets what is left after the "
                          "model and its activations within `gpu_memory_utilization`=0.9; increase it").kind == \
            "fatal:no_kv_memory"

    def test_cpu_kv_memory_errors_of_0_33_and_later(self) -> None:
        """The CPU worker checks memory when it sizes the KV cache (0.34.0 cpu_worker.py:201, :224, :237)."""
        node = parse_vllm(f"{ERR}Available memory on node 1 (10.0/64.0 GiB) on kv cache allocation is less than "
                          "requested memory for kv (20.1/57.6 GiB). Reduce CPU memory used by other processes.")
        assert node.kind == "fatal:cpu_node_memory" and node.values == {"free_gib": 10.0, "total_gib": 64.0}
        explicit = parse_vllm(f"{ERR}Available memory on node 0 (3.5/16.0 GiB) on kv cache allocation is less than "
                              "requested memory for kv (8.0 GiB). Decrease --kv-cache-memory-bytes, ...")
        assert explicit.kind == "fatal:cpu_node_memory" and "cpu_node_memory" in adapter("vllm").temporary_fatal
        full = parse_vllm(f"{ERR}The worker already uses 40.2 GiB (model weights and runtime), more than the 38.4 GiB "
                          "of CPU memory reserved for it on node 0, leaving none for the KV cache. On the CPU backend, "
                          "... To resolve: increase `--gpu-memory-utilization` to more than 0.63, or set the KV cache "
                          "size explicitly with `--kv-cache-memory-bytes` or VLLM_CPU_KVCACHE_SPACE.")
        assert full.kind == "fatal:cpu_reservation_full"
        assert full.values == {"used_gib": 40.2, "reserved_gib": 38.4, "min_utilization": 0.63}


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
