"""Weights as vLLM holds them for the dtype and the pipeline stage it runs: every parameter is created in the
model dtype (--dtype float32 on a bf16 checkpoint holds twice its bytes), and each pipeline stage loads its own
layers and one vocabulary table. Checked against llm-d-planner's vLLM 0.19.0 H100 sweep of Llama-3.1-8B
(tests/data/startup-logs/startup-logs-3.yaml): "Model loading took 29.98 GiB" at --dtype float32, 7.51 GiB on
both stages at --pipeline-parallel-size 2, 4.26 / 3.28 / 3.28 / 4.26 GiB at 4."""

from __future__ import annotations

import pytest

from launcher.common.units import GiB
from launcher.engines.vllm import budget as vb
from launcher.engines.vllm import parallel as vpar
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.resolve import model_from_profile, profile_for_repo
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest

LLAMA = model_from_profile(profile_for_repo("meta-llama/Llama-3.1-8B-Instruct"))  # type: ignore[arg-type]
SWEEP = ("--max-model-len", "8192", "--gpu-memory-utilization", "0.95", "--no-enable-prefix-caching")


def _plan(*args: str, gpus: str = "h100"):  # type: ignore[no-untyped-def]
    request = PlanRequest(model=LLAMA, engine="vllm", gpus=hypothetical_gpus([gpus]), engine_version="0.19.0",
                          engine_args=(*SWEEP, *args))
    plan = make_plan(request)
    return plan, {item.key: item.bytes / GiB for item in plan.budget}


def test_float32_holds_the_bf16_checkpoint_in_four_bytes_a_parameter() -> None:
    plan, items = _plan("--dtype", "float32")
    assert abs(items["weights"] - 29.98) < 0.05  # logged: Model loading took 29.98 GiB
    assert abs(items["activation"] - 2.21) < 0.05  # logged: torch peak memory increase 2.21 GiB
    assert abs(plan.kv_cache_bytes / GiB - 42.80) < 0.05  # logged: Available KV cache memory 42.8 GiB
    _, half = _plan("--dtype", "float16")
    assert abs(half["weights"] - 14.99) < 0.05 and abs(half["activation"] - 1.89) < 0.05


def test_only_a_wider_model_dtype_changes_the_weights() -> None:
    geometry = LLAMA.geometry
    delta, rule = vb.upcast_weights_delta(geometry, checkpoint_bytes=1000, model_dtype="float32", quantization=None)
    assert delta == 1000 and "x2" in rule
    assert vb.upcast_weights_delta(geometry, checkpoint_bytes=1000, model_dtype="float16", quantization=None)[0] == 0
    assert vb.upcast_weights_delta(geometry, checkpoint_bytes=1000, model_dtype="float32", quantization="fp8")[0] == 0
    fp32 = geometry_from_config({**geometry.text_config, "architectures": ["LlamaForCausalLM"],
                                 "torch_dtype": "float32"})
    # a float32 config run in bf16 keeps the stored bytes: the files may not be float32
    assert vb.upcast_weights_delta(fp32, checkpoint_bytes=1000, model_dtype="bfloat16", quantization=None)[0] == 0
    awq = geometry_from_config({**geometry.text_config, "architectures": ["LlamaForCausalLM"],
                                "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}})
    assert vb.upcast_weights_delta(awq, checkpoint_bytes=1000, model_dtype="float32", quantization=None)[0] == 0


@pytest.mark.parametrize(("pp", "logged"), [(2, 7.51), (4, 4.26)])
def test_the_heaviest_stage_holds_its_layers_and_one_vocabulary_table(pp: int, logged: float) -> None:
    """Logged "Model loading took" on stage 0, the rotary table (32 MiB, every stage) included."""
    staged = vpar.pipeline_stage_weights(LLAMA.weight_bytes, LLAMA.geometry, tp=1, pp=pp)
    rope = vb.counted_rope_tables(LLAMA.geometry, dtype="bfloat16", version="0.19.0").bytes
    assert staged is not None and rope == 32 * 2**20
    assert abs((staged[0] + rope) / GiB - logged) < 0.01, staged
    assert "the embedding first, the lm_head last" in staged[1]
    halves = vpar.pipeline_stage_weights(LLAMA.weight_bytes, LLAMA.geometry, tp=2, pp=pp)
    assert halves is not None and abs(halves[0] - staged[0] / 2) <= 1
    assert vpar.pipeline_stage_weights(LLAMA.weight_bytes, LLAMA.geometry, tp=2, pp=1) is None  # the split by T


def test_an_uneven_split_gives_the_first_stage_the_extra_layers() -> None:
    """32 layers over 3 stages: 11, 11, 10 (get_pp_indices); the first holds 11 and the embedding."""
    geometry = LLAMA.geometry
    table = geometry.vocab_size * geometry.hidden_size * 2
    body = LLAMA.weight_bytes - 2 * table  # Llama-3.1-8B's lm_head is not tied
    staged = vpar.pipeline_stage_weights(LLAMA.weight_bytes, geometry, tp=1, pp=3)
    assert staged is not None and staged[0] == body * 11 // 32 + table
    assert "11 of 32 layers" in staged[1]


def test_a_pipeline_plan_is_the_last_stages_budget() -> None:
    """vLLM keeps the smallest stage's block count; here the last stage binds (its sampler peak): 1,075,312
    tokens at PP 2 = 65.63 GiB, 2,257,264 at PP 4 = 68.89 GiB. Stages only send and receive: no all-reduce
    buffers (0.07 GiB of non-torch memory logged on every stage), the one-rank figure is planned."""
    for pp, logged in ((2, 65.63), (4, 68.89)):
        plan, items = _plan("--pipeline-parallel-size", str(pp), gpus=f"{pp}xh100")
        assert abs(plan.kv_cache_bytes / GiB - logged) < 0.1, (pp, plan.kv_cache_bytes / GiB)
        assert plan.kv_cache_bytes / GiB < logged + 0.02  # never the favourable side of the stage that binds
        assert abs(items["non_torch"] - 0.26) < 0.01
    _, tp2 = _plan("--tensor-parallel-size", "2", gpus="2xh100")
    assert tp2["non_torch"] > 2.0  # tensor parallelism keeps the symmetric-memory all-reduce
