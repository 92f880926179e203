"""SGLang's data parallelism: `--dp-size` replicas planned one at a time on the tightest of all their GPUs,
what SGLang refuses about them, and data-parallel attention / all-to-all expert dispatch / redundant experts,
which safe-serve does not size yet and says so (rules.py `data_parallel`, planner.py `_data_parallel`)."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.common.errors import UnsupportedModel, WontFit
from launcher.common.units import GiB
from launcher.engines import adapter
from launcher.engines.sglang import rules as sr
from launcher.model.catalog import hypothetical_gpus
from launcher.model.resolve import resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import Plan, PlanRequest


def plan(argv: list[str], *, gpus: object = None, version: str = "0.5.23") -> Plan:
    return make_plan(PlanRequest(model=resolve_model("qwen3-8b"), engine="sglang",
                                 gpus=gpus or hypothetical_gpus(["8x h100"]), engine_args=tuple(argv),
                                 engine_version=version))


def test_replicas_and_attention_groups_as_sglang_resolves_dp_size() -> None:
    """--dp-size alone: replicas; with --enable-dp-attention (0.5.23: rewritten to --attn-dp-size): groups of
    one TP group's attention, no more GPUs (arg_groups/parallel_hook.py:39-61)."""
    def resolved(argv: list[str]) -> tuple[int, int]:
        return sr.data_parallel(sr.pinned_flags(argv))

    assert resolved(["--dp-size", "4"]) == (4, 1)
    assert resolved(["--dp-size", "8", "--enable-dp-attention"]) == (1, 8)
    assert resolved(["--attn-dp-size", "8"]) == (1, 8)
    assert resolved(["--dp-size", "1", "--enable-dp-attention"]) == (1, 1)  # SGLang turns it off at dp 1
    assert adapter("sglang").gpus_on_node(sr.pinned_flags(["--tp", "2", "--dp-size", "4"])) == 8
    assert adapter("sglang").gpus_on_node(sr.pinned_flags(["--tp", "8", "--attn-dp-size", "8"])) == 8


def test_each_replica_is_planned_like_one_server_on_the_tightest_of_their_gpus() -> None:
    gpus = hypothetical_gpus(["4x h100"])
    busy = dataclasses.replace(gpus[3], free_bytes=(gpus[3].free_bytes or 0) - 10 * GiB)
    one = plan(["--tp", "2"], gpus=gpus)
    two = plan(["--tp", "2", "--dp-size", "2"], gpus=gpus)
    assert two.kv_cache_tokens == one.kv_cache_tokens and two.gpu_count == 4
    assert plan(["--tp", "2", "--dp-size", "2"], gpus=(*gpus[:3], busy)).kv_cache_tokens < two.kv_cache_tokens
    with pytest.raises(WontFit, match=r"16 ranks \(tensor x pipeline parallel, 8 data-parallel replicas\) need 16"):
        plan(["--tp", "2", "--dp-size", "8"])


@pytest.mark.parametrize(("argv", "what"), [
    (["--tp", "8", "--dp-size", "8", "--enable-dp-attention"], "data-parallel attention (8 groups"),
    (["--tp", "8", "--attn-dp-size", "4"], "data-parallel attention (4 groups"),
    (["--tp", "4", "--moe-a2a-backend", "deepep"], "deepep all-to-all MoE backend"),
    (["--tp", "4", "--ep-num-redundant-experts", "32"], "32 redundant experts"),
])
def test_what_is_not_sized_yet_is_said_not_planned_from_the_plain_split(argv: list[str], what: str) -> None:
    with pytest.raises(UnsupportedModel, match="not sized by safe-serve yet") as caught:
        plan(argv)
    assert what in str(caught.value) and "--trust-engine" in (caught.value.hint or "")


def test_the_default_backend_and_ep_size_alone_are_planned() -> None:
    """`--moe-a2a-backend none` is the default; `--ep-size` alone splits the same bytes over the same ranks."""
    assert plan(["--tp", "4", "--moe-a2a-backend", "none"]).kv_cache_tokens == plan(["--tp", "4"]).kv_cache_tokens
    assert plan(["--tp", "4", "--ep-size", "4"]).kv_cache_tokens > 0


def test_what_sglang_refuses_about_replicas_in_its_words() -> None:
    with pytest.raises(WontFit, match="data-parallel replicas combined with attention data parallelism are not "
                                      "supported"):
        plan(["--tp", "2", "--dp-size", "2", "--attn-dp-size", "2"])
    with pytest.raises(WontFit, match="multi-node data-parallel replicas are not supported"):
        plan(["--tp", "2", "--dp-size", "2", "--nnodes", "2"])
    with pytest.raises(WontFit, match="multi-node data parallel is not supported unless dp attention!"):
        plan(["--tp", "2", "--dp-size", "2", "--nnodes", "2"], version="0.5.9")
