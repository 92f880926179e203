"""The start lock under data parallelism: with several engines on the node's GPUs (vLLM's DP ranks, SGLang's
replicas), each sizes its KV cache from its own reading of free memory, so the first KV line does not release
the lock; the server answering does. One engine: released at its KV line, as before."""

from __future__ import annotations

import dataclasses

from launcher.model.catalog import hypothetical_gpus
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest
from launcher.serve.watch import ServeOptions, Watch


class CountingLock:
    def __init__(self) -> None:
        self.releases = 0

    def release(self) -> None:
        self.releases += 1


def watch_for(argv: list[str]) -> tuple[Watch, CountingLock]:
    plan = make_plan(PlanRequest(model=resolve_model("qwen2.5-7b"), engine="vllm", gpus=hypothetical_gpus(["4x h100"]),
                                 engine_args=tuple(argv), engine_version="0.34.0"))
    lock = CountingLock()
    watch = Watch(dataclasses.replace(plan, engine_args=()), model="m", passthrough=tuple(argv),
                  options=ServeOptions(on_divergence="warn"), concurrency=1, lock=lock)  # type: ignore[arg-type]
    return watch, lock


KV_LINE = b"(EngineCore_DP0 pid=1) INFO 12-03 10:00:00 [kv_cache_utils.py:1169] GPU KV cache size: 1,000 tokens\n"


def test_one_engine_releases_the_lock_at_its_kv_line() -> None:
    watch, lock = watch_for(["--tensor-parallel-size", "2"])
    assert watch.release_on_kv
    watch.on_line("stdout", KV_LINE)
    assert lock.releases == 1


def test_data_parallel_ranks_hold_the_lock_past_the_first_kv_line() -> None:
    watch, lock = watch_for(["--data-parallel-size", "4"])
    assert not watch.release_on_kv
    watch.on_line("stdout", KV_LINE)
    assert lock.releases == 0 and watch.kv.get("tokens") == 1000
    watch.on_healthy()  # every engine has sized its cache: the server answers
    assert lock.releases == 1
