"""Engine lines as each engine prints them, the same messages quoted by strangers, and hostile lines.

Used by tests/test_hostile_logs.py (assertions) and bench/log_rules.py (the worst time on a 1 MB
line). Each rule of both engines has a genuine record here, written in the engine's own format:
vLLM's logger header (vllm/logger.py:28, 0.33.0 and 0.34.0; ``logger.exception`` repeats it on every
traceback line, logging_utils/formatter.py:74) and SGLang's (srt/utils/common.py:2630, 0.5.23;
a manager's logged traceback follows its header raw).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

MB = 1 << 20
V_INFO = "(EngineCore pid=7) INFO 12-01 10:00:00 [{file}] "
V_ERROR = "(EngineCore pid=7) ERROR 12-01 10:00:00 [core.py:1586] "
S_HEAD = "[2026-12-01 10:00:00 TP0] "
RAW_TRACEBACK = ("Traceback (most recent call last):", '  File "x.py", line 1, in <module>')
S_TRACEBACK = (f"{S_HEAD}Scheduler hit an exception: Traceback (most recent call last):",
               '  File "sglang/srt/managers/scheduler.py", line 6370, in run_scheduler_process')


@dataclass(frozen=True)
class Sample:
    engine: str
    kind: str
    lines: tuple[str, ...]  # the last one is the rule's line; the others come before it (a traceback)
    message: str  # the engine's own words, as a stranger could quote them

    @property
    def line(self) -> str:
        return self.lines[-1]


def _v(kind: str, message: str, file: str = "kv_cache_utils.py:1148") -> Sample:
    return Sample("vllm", kind, (V_INFO.format(file=file) + message,), message)


def _v_err(kind: str, message: str) -> Sample:
    return Sample("vllm", kind, (V_ERROR + message,), message)


def _s(kind: str, message: str) -> Sample:
    return Sample("sglang", kind, (S_HEAD + message,), message)


def _s_raised(kind: str, message: str) -> Sample:
    return Sample("sglang", kind, (*S_TRACEBACK, message), message)


SAMPLES = (
    _v("kv", "GPU KV cache size: 1,048,576 tokens, Maximum concurrency for 32,768 tokens per request: 32.00x"),
    _v("available_kv", "Available KV cache memory: 5.25 GiB", "gpu_worker.py:773"),
    _v("weights", "Model loading took 14.19 GiB memory and 6.734512 seconds", "gpu_model_runner.py:5089"),
    _v_err("fatal:startup_free", "ValueError: Free memory on device cuda:0 (7.34/15.49 GiB) on startup is less than "
           "desired GPU memory utilization (0.9, 13.94 GiB). Decrease GPU memory utilization or reduce GPU memory "
           "used by other processes."),
    _v_err("fatal:kv_too_small", "ValueError: To serve at least one request with the model's max seq len (32768), "
           "(4.00 GiB KV cache is needed, which is larger than the available KV cache memory (1.20 GiB). Based on "
           "the available memory, the estimated maximum model length is 9824. Try increasing "
           "`gpu_memory_utilization`"),
    _v_err("fatal:kv_too_small_v0", "ValueError: The model's max seq len (32768) is larger than the maximum number "
           "of tokens that can be stored in KV cache (9824). Try increasing `gpu_memory_utilization`"),
    _v_err("fatal:no_kv_memory", "ValueError: No available memory for the cache blocks. Try increasing "
           "`gpu_memory_utilization` when initializing the engine."),
    _v_err("fatal:autofit", "ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to serve "
           "even a single token. Try increasing `gpu_memory_utilization`."),
    _v_err("fatal:cuda_oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
           "total capacity of 79.19 GiB of which 1.06 GiB is free."),
    Sample("vllm", "fatal:cuda_oom", (*RAW_TRACEBACK, "torch.OutOfMemoryError: CUDA out of memory. Tried to "
                                      "allocate 2.00 GiB."), "torch.OutOfMemoryError: CUDA out of memory."),
    _v_err("fatal:cpu_node_memory", "ValueError: Available memory on node 0 (10.00/64.00 GiB) on startup is less "
           "than desired CPU memory utilization (0.9, 57.60 GiB)."),
    # 0.33+ (cpu_worker.py:237 in 0.34.0): the node's memory checked when the KV cache is sized
    _v_err("fatal:cpu_node_memory", "ValueError: Available memory on node 0 (10.0/64.0 GiB) on kv cache allocation "
           "is less than requested memory for kv (20.1/57.6 GiB). Reduce CPU memory used by other processes."),
    _v_err("fatal:cpu_reservation_full", "ValueError: The worker already uses 40.2 GiB (model weights and runtime), "
           "more than the 38.4 GiB of CPU memory reserved for it on node 0, leaving none for the KV cache. On the CPU "
           "backend, the `--gpu-memory-utilization` flag controls the fraction of CPU memory reserved (despite its "
           "name). To resolve: increase `--gpu-memory-utilization` to more than 0.63, or set the KV cache size "
           "explicitly with `--kv-cache-memory-bytes` or VLLM_CPU_KVCACHE_SPACE."),
    # 0.34's extensible KV cache (v1/worker/extensible_kv_cache.py:693, utils/vmm_driver.py:191, :517)
    _v("kv_measured", "Memory after warmup: 118.64 GiB free, 0.25 GiB committed to the KV cache, 3.02 GiB kept for "
       "transient activations (3.02 GiB allocated at peak, 0.0 GiB of torch reservation growth); 7214 KV cache "
       "blocks (112.72 GiB) fit within the requested 139.81 GiB. Torch may reserve up to 6.5 GiB.",
       "extensible_kv_cache.py:693"),
    _v_err("fatal:kv_commit_oom", "RuntimeError: GPU driver error 2: out of memory"),
    _v_err("fatal:extensible_kv_unsupported", "ValueError: The KV connector allocates the KV cache from its own "
           "memory pool, which the extensible KV cache cannot use. Disable it with --no-enable-extensible-kv-cache."),
    Sample("vllm", "ready", ("INFO:     Application startup complete.",), "Application startup complete."),
    _v("ready", "Starting vLLM server on http://0.0.0.0:8000", "entry.py:139"),
    _v_err("crash:engine_core", "EngineCore encountered a fatal error."),
    Sample("vllm", "crash:engine_dead", ("(APIServer pid=8) ERROR 12-01 10:00:00 [async_llm.py:943] "
                                         "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an "
                                         "issue. See stack trace (above) for the root cause.",),
           "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause."),
    _v_err("crash:output_handler", "AsyncLLM output_handler failed."),
    _v_err("crash:nccl", "RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)"),
    _s("kv", "max_total_num_tokens=20000, chunked_prefill_size=4096, max_prefill_tokens=16384, "
       "max_running_requests=2048, context_len=32768, available_gpu_mem=2.10 GB"),
    _s("kv_alloc", "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 20000, K size: 1.22 GB, V size: 1.22 GB"),
    _s("weights", "Load weight end. elapsed=4.93 s, type=LlamaForCausalLM, avail mem=62.46 GB, mem usage=15.05 GB."),
    _s("pre_load", "Load weight begin. avail mem=77.51 GB"),
    _s_raised("fatal:weights_leave_nothing", "ValueError: Loaded weights leave no GPU memory for the KV cache under "
              "--mem-fraction-static=0.5. Raise --mem-fraction-static above 0.620 (minimum viable = 1 - "
              "available/pre = 0.6195)."),
    _s_raised("fatal:not_enough_memory", "RuntimeError: Not enough memory. Please try to increase "
              "--mem-fraction-static."),
    _s_raised("fatal:unbalanced", "RuntimeError: The memory capacity is unbalanced. Some GPUs may be occupied by "
              "other processes. pre_model_load_memory=60.1, local_gpu_memory=77.5"),
    _s_raised("fatal:graph_capture", "Exception: Capture cuda graph failed: CUDA error: out of memory"),
    _s_raised("fatal:cuda_oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB."),
    _s("ready", "The server is fired up and ready to roll!"),
    Sample("sglang", "crash:scheduler", (S_TRACEBACK[0],), "Scheduler hit an exception: Traceback"),
    _s("crash:child_failed", "Received sigquit from a child process. It usually means the child failed."),
    _s_raised("crash:nccl", "RuntimeError: NCCL error: unhandled system error"),
)


def quoted(engine: str, text: str) -> Iterator[tuple[str, ...]]:
    """``text`` where strangers put it, as line sequences: request logs in the engine's own format
    (as the engine escapes prompts and, harsher, raw), the web server's access log, a multi-line
    record's next line, an exception raised while serving a request (uvicorn's traceback)."""
    asgi = ("ERROR:    Exception in ASGI application", "", *RAW_TRACEBACK)  # uvicorn httptools_impl.py
    if engine == "vllm":
        head = "(APIServer pid=8) {level} 12-01 10:00:00 [request_logger.py:{line}] "
        yield (head.format(level="INFO", line=65)  # entrypoints/serve/utils/request_logger.py:65 (0.32)
               + f"Received request cmpl-1: params: SamplingParams(n=1, stop=[{text!r}]), lora_request: None.",)
        yield (head.format(level="DEBUG", line=55)
               + f"Request cmpl-1 details: prompt: {text!r}, prompt_token_ids: [1, 2], prompt_embeds shape: None.",)
        yield (head.format(level="INFO", line=92)  # Generated response (0.19 entrypoints/logger.py:92)
               + f"Generated response cmpl-1: output: {text!r}, output_token_ids: [3], finish_reason: stop",)
        yield (head.format(level="INFO", line=65) + f"Received request {text}: params: SamplingParams(n=1)",)
        yield (head.format(level="INFO", line=65) + "Received request x:\r", head.format(level="INFO", line=65) + text)
        yield (head.format(level="WARNING", line=70) + text,)
        yield (f'INFO:     127.0.0.1:5000 - "POST /v1/completions?q={text} HTTP/1.1" 200 OK',)
        yield (f"INFO:     {text}",)
        yield (*asgi, text)
        yield (*asgi, f"ValueError: {text}")
    else:
        yield (f"{S_HEAD}Receive: obj=GenerateReqInput(text={text!r}, sampling_params={{'max_new_tokens': 8}})",)
        yield (f"{S_HEAD}Finish: obj=GenerateReqInput(rid='x'), out={{'text': {text!r}}}",)
        yield (f"{S_HEAD}Receive: obj=GenerateReqInput(text='{text}')",)
        yield (f'[2026-12-01 10:00:00] INFO:     127.0.0.1:5000 - "POST /generate?q={text} HTTP/1.1" 200 OK',)
        yield (f"INFO:     {text}",)
        yield (*asgi, text)
        yield (*asgi, f"RuntimeError: {text}")
    yield (f"prompt: {text}",)  # raw output with no traceback open
    yield (text,)
    yield (f"  {text}",)  # an indented line


_NUMBER = re.compile(r"\d[\d,.]*")


def adversarial(sample: Sample, size: int = MB) -> Iterator[tuple[str, str]]:
    """(shape, line) pairs of about ``size`` characters built from one rule's genuine line."""
    line = sample.line
    start = len(line) - len(sample.message) if line.endswith(sample.message) else 0
    yield "message repeated", line + line[start:] * (size // max(len(line) - start, 1))
    yield "line repeated", line * (size // len(line))
    for cut in sorted({start + 8, start + len(sample.message) // 2, len(line) - 2}):
        char = line[cut] if cut < len(line) else "A"
        yield f"run of {char!r} at {cut}", line[:cut] + char * size
    yield "numbers 1 MB long", _NUMBER.sub(lambda m: "9" * (size // 4), line)
    yield "letters after the first word", line[:start] + "A" * size
    yield "header only", line[:start] * (size // max(start, 1))
    yield "colour codes", "\x1b[0m" * (size // 4) + line
    yield "invalid bytes", "\ufffd" * size + line
    yield "process name 1 MB", "(" + "E" * size + " pid=1) " + line[start:]
    yield "file name 1 MB", "(EngineCore pid=7) INFO 12-01 10:00:00 [" + "a" * size + ":1] " + line[start:]
    yield "words of the rule, spaced", " ".join(line[start:].split()[:3]) + " " + "A " * (size // 2)
