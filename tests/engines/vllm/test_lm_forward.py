"""The language model's forward as vLLM compiles it (V2 runner's profile run, 0.34's sizing warmup): budget.py's
`v2_forward_bytes` against vLLM's own pipeline (tests/data/vllm_lm_forward_oracle.json, written by
tests/oracles/vllm_lm_forward_oracle.py: 0.34.0's VLLM_COMPILE piecewise split and Inductor on the CPU, rank 0 of
TP 1, 2, 4 and 8), and the band the traced architectures carry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.common.errors import UsageError
from launcher.engines import vllm as vl
from launcher.engines.vllm import budget as vb
from launcher.engines.vllm.compilation import GraphPins, compiles_model
from launcher.model.catalog import hypothetical_gpus
from launcher.model.config import geometry_from_config
from launcher.model.resolve import ResolvedModel, resolve_model
from launcher.plan.planner import make_plan
from launcher.plan.types import PlanRequest
from tests import bench_scripts

DATA = Path(__file__).resolve().parents[2] / "data"
ORACLE = json.loads((DATA / "vllm_lm_forward_oracle.json").read_text())
# The same pipeline on the venv's 0.32.0 (TP 1 and 4): the V2 runner's forward did not change from 0.29 to 0.34.
ORACLE_032 = json.loads((DATA / "vllm_lm_forward_oracle-0.32.0.json").read_text())
# The FP8 checkpoints on 0.29.0 (TP 1 and 4; before Llama's fused activation quantization) and 0.31.0 (TP 1).
ORACLE_FP8 = [json.loads((DATA / f"vllm_lm_forward_oracle-fp8-{v}.json").read_text()) for v in ("0.29.0", "0.31.0")]
# Architectures the Transformers backend serves (OLMo 2/3, Phi-2, Seed-OSS, SmolLM3; Gemma 1 from 0.34), on 0.34.0 at
# TP 1/2/4/8 where the stand-in TP shards them, and on 0.32.0 at TP 1.
ORACLE_HF = [json.loads((DATA / f"vllm_lm_forward_oracle-transformers-{v}.json").read_text())
             for v in ("0.32.0", "0.34.0")]
RECORDS = [(r, p) for o in (ORACLE, ORACLE_032, *ORACLE_FP8, *ORACLE_HF) for r in o["results"] if "peaks" in r
           for p in r["peaks"]]
GiB = 2**30


def _geometry(model: str) -> Any:
    path = DATA / "configs" / f"{model}.json"
    if not path.exists():  # a quantized variant (tests/data/configs/quantized/README.md)
        path = DATA / "configs" / "quantized" / f"{model}.json"
    config = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    return geometry_from_config(config)


def test_the_oracle_ran_every_model() -> None:
    """0.34.0, every model at TP 1 at least, no run failed; the sizes a model cannot take are vLLM's refusals."""
    assert (ORACLE["header"]["vllm"], ORACLE_032["header"]["vllm"]) == ("0.34.0", "0.32.0")
    for oracle in (ORACLE, ORACLE_032):
        assert not [r for r in oracle["results"] if "error" in r]
        assert {r["model"] for r in oracle["results"] if r["tp"] == 1 and "peaks" in r} == \
            {r["model"] for r in oracle["results"]}
    assert len(RECORDS) >= 100


@pytest.mark.parametrize("record", RECORDS,
                         ids=[f"{r['vllm']}-{r['model']}-tp{r['tp']}-{p['tokens']}" for r, p in RECORDS])
def test_forward_is_vllms_compiled_forward(record: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """Every record of a traced architecture to 8 B a token (Gemma's sandwich norms keep one or two fp32 variances
    more; Qwen2-MoE's at TP 1 one); GLM-4, whose pieces Inductor plans otherwise at some TP sizes, within the
    0.5 GiB band it keeps at 16,384 tokens."""
    model, peak = record
    geometry = _geometry(model["model"])
    fp8 = vb.fp8_activations(geometry, compute_capability=(9, 0), version=model["vllm"])
    ours = vb.v2_forward_bytes(geometry, batched_tokens=peak["tokens"], tp=model["tp"], act_dtype_bytes=2, fp8=fp8)
    hf_backend = vb.served_by_transformers_backend(model["architecture"], model["vllm"])
    if vb._forward_traced(geometry, fp8=fp8) and not hf_backend:
        assert 0 <= peak["peak_bytes"] - ours <= 8 * peak["tokens"]
    else:
        assert abs(peak["peak_bytes"] - ours) / peak["tokens"] * 16_384 <= vb.V2_PEAK_ERROR_BYTES


def test_the_transformers_backend_ran_at_tp_1_and_its_tp_failures_are_the_stand_ins() -> None:
    """Every Transformers-backend model ran at TP 1 on both releases (the HF decoder compiled as vLLM compiles it);
    where a run failed it is the oracle's stand-in TP not sharding a view the HF code sizes by the config's head
    count, at TP > 1 only."""
    for oracle in ORACLE_HF:
        assert {r["model"] for r in oracle["results"] if r["tp"] == 1 and "peaks" in r} == \
            {r["model"] for r in oracle["results"]} == {"olmo-2-1124-7b-instruct", "olmo-3-7b-instruct", "phi-2",
                                                        "gemma-7b", "seed-oss-36b-instruct", "smollm3-3b"}
        for failed in [r for r in oracle["results"] if "error" in r]:
            assert failed["tp"] > 1 and "Cannot view a tensor" in failed["error"], failed
    served = {r["architecture"] for o in ORACLE_HF for r in o["results"] if "peaks" in r and r["vllm"] == "0.34.0"}
    assert served == {"Olmo2ForCausalLM", "Olmo3ForCausalLM", "PhiForCausalLM", "GemmaForCausalLM",
                      "SeedOssForCausalLM", "SmolLM3ForCausalLM"} <= set(vb.TRANSFORMERS_BACKEND_SINCE)


def test_the_transformers_backends_band_covers_every_run() -> None:
    """The HF decoder's peak against the native formula, per token, inside its band's slope (7 H bytes): Seed-OSS
    at TP 8 holds 32,252 B a token more (6.3 H), OLMo 2/3 at TP 1 16,904 (4.1 H), Phi-2 6,016 less."""
    excess = {}
    for oracle in ORACLE_HF:
        for record in [r for r in oracle["results"] if "peaks" in r and
                       vb.served_by_transformers_backend(r["architecture"], r["vllm"])]:
            geometry = _geometry(record["model"])
            for peak in record["peaks"]:
                ours = vb.v2_forward_bytes(geometry, batched_tokens=peak["tokens"], tp=record["tp"], act_dtype_bytes=2)
                per_token = (peak["peak_bytes"] - ours) / peak["tokens"]
                assert abs(per_token) <= vb.TRANSFORMERS_BACKEND_EXCESS_H * geometry.hidden_size
                excess[(record["model"], record["tp"])] = round(per_token)
    assert excess[("seed-oss-36b-instruct", 8)] == 32_252 and excess[("olmo-2-1124-7b-instruct", 1)] == 16_904
    assert excess[("phi-2", 1)] == -6_016


def test_a_transformers_backend_plan_widens_the_forward_band_with_the_batch() -> None:
    """Seed-OSS 36B at TP 8 on 0.34: 0.5 GiB at 8,192 batched tokens, 7 H bytes a token at 32,768 (1.09 GiB); its
    native class on 0.29 keeps 0.5 GiB."""
    seed = _geometry("seed-oss-36b-instruct")

    def peak(version: str, tokens: int) -> Any:
        return vb.profile_peak(seed, rules=vl.rules_for(version)[0], batched_tokens=tokens, num_seqs=1024, tp=8,
                               gpu_name="NVIDIA H100 80GB HBM3")

    assert peak("0.34.0", 8192).error_bytes == vb.V2_PEAK_ERROR_BYTES
    wide = peak("0.34.0", 32768)
    assert wide.error_bytes == 32768 * 7 * 5120
    assert "the Transformers backend compiles SeedOssForCausalLM's HF decoder" in wide.forward_rule
    native = peak("0.29.0", 32768)
    assert native.error_bytes == vb.V2_PEAK_ERROR_BYTES and "Transformers" not in native.forward_rule


def test_gemma_1_is_traced_until_the_transformers_backend_serves_it() -> None:
    """Gemma 7B at 8,192 tokens: its own class on 0.33 takes the traced band (0.15 GiB + 3 % of the forward); 0.34
    serves it through the Transformers backend, whose band is 0.5 GiB there."""
    gemma = _geometry("gemma-7b")
    forward = vb.v2_forward_bytes(gemma, batched_tokens=8192, tp=1, act_dtype_bytes=2)
    own = vb.profile_peak(gemma, rules=vl.rules_for("0.33.0")[0], batched_tokens=8192, num_seqs=1024, tp=1,
                          gpu_name="NVIDIA H100 80GB HBM3")
    assert own.error_bytes == vb.V1_PEAK_ERROR_BYTES + int(forward * 0.03)
    assert own.forward_rule.startswith("forward as vLLM compiles it (Inductor's buffers, GemmaForCausalLM traced)")
    backend = vb.profile_peak(gemma, rules=vl.rules_for("0.34.0")[0], batched_tokens=8192, num_seqs=1024, tp=1,
                              gpu_name="NVIDIA H100 80GB HBM3")
    assert backend.error_bytes == vb.V2_PEAK_ERROR_BYTES and "Transformers backend" in backend.forward_rule


def test_every_traced_architecture_is_in_the_oracle() -> None:
    """The narrower band is given only to architectures whose compiled forward was run and matched (the
    multimodal wrappers through their language model)."""
    run = {r["architecture"] for o in (ORACLE, *ORACLE_HF) for r in o["results"] if "peaks" in r
           and not vb.served_by_transformers_backend(r["architecture"], r["vllm"])}
    assert vb.LM_FORWARD_TRACED | set(vb.MOE_FORWARD_HELD) == \
        run - {"Glm4ForCausalLM"}
    # Gemma 1's class was run at every TP size on 0.32.0, the last releases that have it.
    gemma = {r["tp"] for o in ORACLE_HF for r in o["results"]
             if r.get("architecture") == "GemmaForCausalLM" and r["vllm"] == "0.32.0" and "peaks" in r}
    assert gemma == {1, 2, 4, 8}


def test_phases_bind_where_the_oracle_shows_them() -> None:
    """Llama 3.1 8B: the MLP's activation binds at TP 1 and 2 (3 I + 2 H + q: 110,592 B a token at TP 1), the
    next norm's five hidden-wide buffers at TP 4 (5 H + q / 4 and the fp32 variance: 43,012 B a token); the old
    shape sum (3 I + 4 H) was 7 % high at TP 1 and 4 % low at TP 8."""
    llama = _geometry("llama-3.1-8b-instruct")
    assert vb.v2_forward_bytes(llama, batched_tokens=1, tp=1, act_dtype_bytes=2) == 2 * (3 * 14336 + 2 * 4096 + 4096)
    assert vb.v2_forward_bytes(llama, batched_tokens=1, tp=4, act_dtype_bytes=2) == 2 * (5 * 4096 + 1024) + 4
    assert vb.v2_forward_bytes(llama, batched_tokens=1, tp=8, act_dtype_bytes=2) == 2 * (5 * 4096 + 512) + 4


def test_traced_forward_narrows_the_v2_band() -> None:
    """Llama 3.1 8B on 0.32 at 8,192 tokens (the forward binds; 0.32 has no warmup pass): V1's 0.15 GiB plus 3 %
    of the forward (0.84 GiB), not 0.5 GiB; GLM-4 (its pieces planned otherwise, not traced) keeps 0.5 GiB."""
    llama = _geometry("llama-3.1-8b-instruct")
    peak = vb.profile_peak(llama, rules=vl.rules_for("0.32.0")[0], batched_tokens=8192, num_seqs=1024, tp=1,
                           gpu_name="NVIDIA H100 80GB HBM3")
    forward = 8192 * 110_592
    assert dict(peak.terms)["forward"] == forward
    assert peak.error_bytes == vb.V1_PEAK_ERROR_BYTES + int(forward * 0.03)
    assert round(peak.error_bytes / GiB, 3) == 0.175
    glm = vb.profile_peak(_geometry("glm-4-9b-0414"), rules=vl.rules_for("0.34.0")[0], batched_tokens=8192,
                          num_seqs=1024, tp=1, gpu_name="NVIDIA H100 80GB HBM3")
    assert glm.error_bytes == vb.V2_PEAK_ERROR_BYTES
    assert "Glm4ForCausalLM's compiled forward not traced" in glm.forward_rule


def test_sizing_step_takes_the_same_forward() -> None:
    """0.34's sizing warmup runs the same compiled forward (attention runs this time, below the piece's end)."""
    qwen = _geometry("qwen3-32b")
    step = vb.sizing_step(qwen, batched_tokens=8192, tp=8, max_logprobs=0)
    assert step is not None
    assert step.forward == vb.v2_forward_bytes(qwen, batched_tokens=8192, tp=8, act_dtype_bytes=2) \
        == 8192 * (2 * (5 * 5120 + 1024) + 4)


@pytest.mark.parametrize(("pins", "eager", "compiled"), [
    (GraphPins(), False, True), (GraphPins(), True, False), (GraphPins(optimization_level="0"), False, False),
    (GraphPins(optimization_level="3"), False, True), (GraphPins(config='{"mode":0}'), False, False),
    (GraphPins(config='{"mode":"NONE"}'), False, False), (GraphPins(config='{"level":0}'), False, False),
    (GraphPins(config='{"mode":3}'), False, True), (GraphPins(config='{"mode":"vllm_compile"}'), False, True),
    (GraphPins(config='{"mode":2}'), False, False), (GraphPins(config='{"mode":"STOCK_TORCH_COMPILE"}'), False, False),
    (GraphPins(config='{"cudagraph_mode":"NONE"}'), False, True)])
def test_what_compiles_the_model(pins: GraphPins, eager: bool, compiled: bool) -> None:
    """vLLM's own piecewise compile runs unless --enforce-eager, -O0 or a compilation mode (0.11: level) other
    than VLLM_COMPILE (3) is pinned; CUDA graphs off alone still compile it."""
    assert compiles_model(pins, enforce_eager=eager) is compiled


@pytest.mark.parametrize("mode", ['[1]', '{"a": 1}', '"3"', '7', '-1', '"fast"'])
def test_a_mode_vllm_refuses_is_refused(mode: str) -> None:
    """What vLLM's mode validator refuses (a list, an object, a number out of 0-3, a digit string, an unknown
    name) is one usage error, not a traceback (config/compilation.py:1003-1025)."""
    with pytest.raises(UsageError, match="compilation modes"):
        compiles_model(GraphPins(config=f'{{"mode":{mode}}}'), enforce_eager=False)


@pytest.mark.parametrize(("model", "args", "traced"), [
    ("llama-3.1-8b", (), True), ("llama-3.1-8b", ("--enforce-eager",), False), ("llama-3.1-8b", ("-O0",), False),
    ("llama-3.1-8b", ("--quantization", "fp8"), False), ("llama-3.1-8b-fp8", (), True),
    ("llama-3.1-8b-fp8", ("--quantization", "compressed-tensors"), False),
    ("qwen2.5-7b-awq", (), True), ("qwen2.5-7b-awq", ("--quantization", "awq_marlin"), False),
    ("gpt-oss-20b", (), False), ("deepseek-v2-lite", (), False)])
def test_only_the_traced_forward_narrows_a_plan(model: str, args: tuple[str, ...], traced: bool) -> None:
    """The narrower band needs what the oracle ran: a compiled dense forward, unquantized, with AWQ's weight-only
    kernels (one op each with the unquantized output) or an FP8 checkpoint's quantized activations as the oracle
    ran them. Eager kernels, run-time quantization, a pinned --quantization, MoE and MLA keep 0.5 GiB, and say
    so."""
    plan = make_plan(PlanRequest(model=resolve_model(model), engine="vllm", gpus=hypothetical_gpus(["h100"]),
                                 engine_version="0.32.0", engine_args=args))
    row = next(item for item in plan.budget if item.key == "activation")
    assert (row.error_bytes < vb.V2_PEAK_ERROR_BYTES) is traced
    assert ("ForCausalLM traced" in row.detail and "+/- 0.15 GiB + 3%" in row.detail) is traced


@pytest.mark.parametrize(("model", "card", "tp", "kernel", "scratch"), [
    # Hopper: Machete, CUTLASS's stream-K workspace bounded at two 256 x 128 fp32 tiles per SM
    ("qwen2.5-7b-awq", "h100", 1, "Machete", 2 * 132 * 256 * 128 * 4),
    ("llama-3.1-70b-awq", "h100", 4, "Machete", 2 * 132 * 256 * 128 * 4),
    # Ampere, Ada, Turing: Marlin's fp32 reduce buffer, SMs x 64 rows x 256 floats at a prefill's token count
    ("qwen2.5-7b-awq", "a10080gb", 1, "Marlin", 108 * 64 * 256 * 4),
    ("qwen3-14b-awq", "l4", 2, "Marlin", 58 * 64 * 256 * 4),
    ("qwen2.5-7b-awq", "t4", 1, "Marlin", 40 * 64 * 256 * 4),
    # Qwen2.5-72B-AWQ's checkpoint pads its MLP to 29,696 (232 groups of 128): 7,424 a rank at TP 4 takes Machete
    ("qwen2.5-72b-awq", "h100", 4, "Machete", 2 * 132 * 256 * 128 * 4)])
def test_awq_kernels_by_card(model: str, card: str, tp: int, kernel: str, scratch: int) -> None:
    """The AWQ kernel choose_mp_linear_kernel takes for each linear layer (Machete on SM 9.0 where every shard
    divides by 64 x 128, Marlin from SM 7.5) and what one call allocates beside its output."""
    gpu = hypothetical_gpus([card])[0]
    gemm = vb.int4_gemm(resolve_model(model).geometry, tp=tp, compute_capability=gpu.compute_capability,
                        gpu_name=gpu.name, tokens=8192)
    assert gemm is not None and (gemm.kernel, gemm.scratch_bytes) == (kernel, scratch)


def test_awq_shards_marlin_pads_are_not_traced() -> None:
    """Unpadded Qwen2.5-72B (intermediate 29,568) at TP 4: 7,392 a rank is no multiple of the 128-wide group or of
    Marlin's tiles, which 0.34 pads with a copy of the input (not derived); a V100 (SM 7.0) runs no AWQ kernel; a
    card not known is not assumed; an fp8 checkpoint is no AWQ."""
    geometry = resolve_model("qwen2.5-72b-awq").geometry
    unpadded = geometry_from_config({**geometry.text_config, "intermediate_size": 29568})
    assert vb.int4_gemm(unpadded, tp=4, compute_capability=(9, 0), gpu_name="H100", tokens=8192) is None
    assert vb.int4_gemm(unpadded, tp=1, compute_capability=(9, 0), gpu_name="H100", tokens=8192) is not None
    assert vb.int4_gemm(geometry, tp=4, compute_capability=(7, 0), gpu_name="V100", tokens=8192) is None
    assert vb.int4_gemm(geometry, tp=4, compute_capability=None, gpu_name="", tokens=8192) is None
    fp8 = resolve_model("qwen2.5-7b-fp8").geometry
    assert vb.int4_gemm(fp8, tp=1, compute_capability=(9, 0), gpu_name="H100", tokens=8192) is None
    marlin = vb.int4_gemm(geometry, tp=4, compute_capability=(8, 0), gpu_name="A100", tokens=20)
    assert marlin is not None and marlin.scratch_bytes == 108 * 32 * 256 * 4  # 20 rows round up to 32


def test_an_awq_plan_carries_the_traced_band_and_the_kernels_scratch() -> None:
    """Qwen2.5-7B-AWQ on an H100 at 0.34: the traced forward's band, 0.15 GiB + 3 % of the forward, plus Machete's
    bounded workspace, where it kept 0.5 GiB; the row names the kernel."""
    plan = make_plan(PlanRequest(model=resolve_model("qwen2.5-7b-awq"), engine="vllm",
                                 gpus=hypothetical_gpus(["h100"]), engine_version="0.34.0"))
    row = next(item for item in plan.budget if item.key == "activation")
    forward = vb.v2_forward_bytes(resolve_model("qwen2.5-7b-awq").geometry, batched_tokens=8192, tp=1,
                                  act_dtype_bytes=2)
    assert row.error_bytes == vb.V1_PEAK_ERROR_BYTES + int(forward * 0.03) + 2 * 132 * 256 * 128 * 4
    assert "AWQ's linear layers on Machete" in row.detail


GPTQ_4BIT = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
CT_W4A16 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "type": "int", "num_bits": 4, "strategy": "group", "group_size": 128, "symmetric": True,
                "dynamic": False, "actorder": None}}}}


def _requantized(model: str, qc: dict[str, Any]) -> Any:
    """`model`'s geometry with another quantization_config (its shapes unchanged)."""
    return geometry_from_config({**resolve_model(model).geometry.text_config, "quantization_config": qc})


def test_gptq_and_compressed_tensors_w4a16_run_the_same_kernels_as_awq() -> None:
    """GPTQ 4-bit symmetric and compressed-tensors W4A16 go through choose_mp_linear_kernel as AWQ does: Machete on
    an H100, Marlin on an A100, the same per-call scratch; activation reordering, other widths, asymmetric GPTQ,
    GPTQModel's per-module rules and quantized inputs are not taken."""
    h100, a100 = (dict(compute_capability=cc, gpu_name=name, tokens=8192)
                  for cc, name in (((9, 0), "H100"), ((8, 0), "A100")))
    for qc, method in ((GPTQ_4BIT, "GPTQ"), (CT_W4A16, "compressed-tensors W4A16"),
                       ({**GPTQ_4BIT, "desc_act": True, "group_size": -1}, "GPTQ")):
        geometry = _requantized("qwen2.5-7b-awq", qc)
        machete, marlin = (vb.int4_gemm(geometry, tp=1, **card) for card in (h100, a100))
        assert machete is not None and (machete.kernel, machete.method, machete.scratch_bytes) == (
            "Machete", method, 2 * 132 * 256 * 128 * 4)
        assert marlin is not None and (marlin.kernel, marlin.scratch_bytes) == ("Marlin", 108 * 64 * 256 * 4)
    group = CT_W4A16["config_groups"]["group_0"]
    for qc in ({**GPTQ_4BIT, "desc_act": True}, {**GPTQ_4BIT, "sym": False}, {**GPTQ_4BIT, "bits": 8},
               {**GPTQ_4BIT, "dynamic": {"+:.*down_proj": {"bits": 8}}}, {**GPTQ_4BIT, "group_size": 256},
               {**CT_W4A16, "config_groups": {"g": {**group, "weights": {**group["weights"], "actorder": "group"}}}},
               {**CT_W4A16, "config_groups": {"g": {**group, "input_activations": {"type": "int", "num_bits": 8}}}}):
        assert vb.int4_gemm(_requantized("qwen2.5-7b-awq", qc), tp=1, **h100) is None, qc


def test_a_gptq_plan_carries_the_traced_band_and_names_its_kernel(tmp_path: Path) -> None:
    """Qwen2.5-7B GPTQ-Int4 (desc_act false) on an L40S at 0.34: the traced forward's band with Marlin's buffer."""
    model = tmp_path / "qwen2.5-7b-gptq"
    model.mkdir()
    source = resolve_model("qwen2.5-7b-awq")
    (model / "config.json").write_text(json.dumps({**source.geometry.text_config, "quantization_config": GPTQ_4BIT}))
    header = json.dumps({"lm_head.weight": {"dtype": "F16", "shape": [152064, 3584],
                                            "data_offsets": [0, 152064 * 3584 * 2]}}).encode()
    with open(model / "model.safetensors", "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(8 + len(header) + 152064 * 3584 * 2)
    plan = make_plan(PlanRequest(model=resolve_model(str(model)), engine="vllm", gpus=hypothetical_gpus(["l40s"]),
                                 engine_version="0.34.0"))
    row = next(item for item in plan.budget if item.key == "activation")
    assert "GPTQ's linear layers on Marlin" in row.detail
    forward = vb.v2_forward_bytes(source.geometry, batched_tokens=2048, tp=1, act_dtype_bytes=2)
    assert row.error_bytes == vb.V1_PEAK_ERROR_BYTES + int(forward * 0.03) + 142 * 64 * 256 * 4


def test_v1_profile_takes_the_forward_where_it_binds() -> None:
    """The V1 runner (0.19-0.28) runs the same compiled forward before its sampler: with a small --max-num-seqs
    (16 rows of 14 B a logit) Llama 3.1 8B's forward at 8,192 tokens (0.84 GiB) is the peak, not the 30 MiB
    sampler the plan counted before, and it carries the traced forward's band."""
    llama = _geometry("llama-3.1-8b-instruct")
    few = vb.profile_peak(llama, rules=vl.rules_for("0.19.0")[0], batched_tokens=8192, num_seqs=16, tp=1,
                          gpu_name="NVIDIA H100 80GB HBM3")
    assert dict(few.terms)["forward"] == 8192 * 110_592 and "sampler" not in dict(few.terms)
    assert few.error_bytes == vb.V1_PEAK_ERROR_BYTES + int(8192 * 110_592 * 0.03)
    assert few.forward_rule.startswith("forward as vLLM compiles it (Inductor's buffers, LlamaForCausalLM traced)")
    full = vb.profile_peak(llama, rules=vl.rules_for("0.19.0")[0], batched_tokens=8192, num_seqs=1024, tp=1,
                           gpu_name="NVIDIA H100 80GB HBM3")
    assert "forward" not in dict(full.terms) and full.error_bytes == vb.V1_PEAK_ERROR_BYTES
    assert full.forward_rule == ""  # the sampler's phase: its band is V1's own


def test_a_published_h100_log_where_the_forward_binds() -> None:
    """CodeLlama-7B's 32,016-entry vocabulary keeps the 0.19 sampler at 0.49 GiB with the hidden states, below the
    compiled forward's 0.69 GiB (3 x 11,008 + 2 x 4,096 + 4,096 a token at 8,192): llm-d-planner's 0.19.0 H100 run
    logged 61.66 GiB of KV, planned 61.68 (61.87 with the sampler's phase). A real GPU's figure for the forward
    that the CPU oracle derived (tests/data/startup-logs/startup-logs-3.yaml)."""
    rows, _, _ = bench_scripts.load("startup_logs").rows()
    row = next(r for r in rows if r.case == "vllm-llmdplanner-run-h100-codellama-7b-hf-mml8192")
    assert abs(row.predicted - 61.66) <= 0.03
    peak = vb.profile_peak(_geometry("codellama-7b-hf"), rules=vl.rules_for("0.19.0")[0], batched_tokens=8192,
                           num_seqs=1024, tp=1, gpu_name="NVIDIA H100 80GB HBM3")
    assert dict(peak.terms)["forward"] == 8192 * 2 * (3 * 11_008 + 2 * 4096 + 4096)


def test_moe_op_phases() -> None:
    """Qwen3-30B-A3B at TP 4: the MoE op's phase binds: four hidden-wide buffers, the attention output, the router's
    128 logits and the post-attention norm's variance beside the op's top-k slots (12 B each, 8 a token), aligned
    rows (8 a token, 128 experts x 63 padding rows, int32, with their block experts) and output; the recorded peak
    at 512 tokens, to the byte. Qwen1.5-MoE at TP 8: its gated shared expert's product (gate_up, output, sigmoid and
    product beside what the piece holds) is the peak, above the routed experts' phase."""
    qwen3 = _geometry("qwen3-30b-a3b")
    padded = 512 * 8 + 128 * 63
    op = 512 * (2 * (4 * 2048 + 1024 + 128) + 4 + 12 * 8 + 2 * 2048) + 4 * padded + 4 * -(-padded // 64)
    assert vb.v2_forward_bytes(qwen3, batched_tokens=512, tp=4, act_dtype_bytes=2) == op == 11_766_008
    assert vb._moe_layer_bytes(qwen3, tokens=512, tp=4, out=1024, act_dtype_bytes=2) == op
    qwen2 = _geometry("qwen1.5-moe-a2.7b")
    gated = 1024 * 2 * ((3 * 2048 + 256 + 60) + 2 * (5632 // 8) + 2 * 2048 + 1)
    assert vb.v2_forward_bytes(qwen2, batched_tokens=1024, tp=8, act_dtype_bytes=2) == gated == 24_504_320


@pytest.mark.parametrize(("card", "args", "traced"), [
    ("h100", (), True), ("a100-80gb", (), True), ("l40s", (), True), ("h100", ("--moe-backend", "triton"), True),
    ("b200", (), False), ("h100", ("--moe-backend", "flashinfer_cutlass"), False)])
def test_moe_plan_takes_the_traced_band_where_triton_runs(card: str, args: tuple[str, ...], traced: bool) -> None:
    """A Qwen3-30B-A3B plan at 0.34 carries the compiled forward's band (0.15 GiB + 3 %) where its experts run the
    Triton kernels the oracle stood in (SM 8.x-9.x, --moe-backend unset or triton), and its activation row says
    where the figure comes from; on a B200 (FlashInfer's TRT-LLM experts first) or under another pinned backend
    it keeps 0.5 GiB and says why."""
    model = ResolvedModel(name="qwen3-30b-a3b", source="local", geometry=_geometry("qwen3-30b-a3b"),
                          weight_bytes=61_064_245_248, weight_bytes_source="model.safetensors.index.json total_size",
                          config={})
    plan = make_plan(PlanRequest(model=model, engine="vllm", gpus=hypothetical_gpus([f"2x {card}"]),
                                 engine_version="0.34.0", engine_args=("--tensor-parallel-size", "2", *args)))
    row = next(item for item in plan.budget if item.key == "activation")
    assert (row.error_bytes < vb.V2_PEAK_ERROR_BYTES) is traced
    assert ("Qwen3MoeForCausalLM traced" in row.detail) is traced
    assert ("its experts on another kernel than the Triton one traced" in row.detail) is not traced


@pytest.mark.parametrize(("capability", "backend", "dp", "triton"), [
    ((9, 0), None, 1, True), ((8, 0), "auto", 1, True), ((8, 9), "Triton", 1, True), ((10, 0), None, 1, False),
    ((12, 0), None, 1, False), (None, None, 1, False), ((9, 0), "flashinfer_trtllm", 1, False),
    ((9, 0), None, 2, False), ((9, 0), 7, 1, True)])
def test_moe_runs_triton(capability: tuple[int, int] | None, backend: object, dp: int, triton: bool) -> None:
    assert vb.moe_runs_triton(capability, backend, dp=dp) is triton


def test_granite_keeps_the_summed_residual() -> None:
    """Granite 3.3 8B: the gate_up GEMM's phase (3 H + q + 2 I) binds at TP 4, the next norm's four hidden-wide
    buffers (4 H + q and the variance) at TP 8, the MLP's activation at TP 1-2 as for Llama; the Llama form (5 H + q
    at the norm) was 9 % and 24 % high at TP 4 and 8."""
    granite = _geometry("granite-3.3-8b-instruct")
    assert vb.v2_forward_bytes(granite, batched_tokens=1, tp=4, act_dtype_bytes=2) == 2 * (3 * 4096 + 1024 + 6400)
    assert vb.v2_forward_bytes(granite, batched_tokens=1, tp=8, act_dtype_bytes=2) == 2 * (4 * 4096 + 512) + 4
    assert vb.v2_forward_bytes(granite, batched_tokens=1, tp=1, act_dtype_bytes=2) == 2 * (3 * 12800 + 2 * 4096 + 4096)


def test_glm_45_partial_rotary_fp32_router_and_shared_experts() -> None:
    """GLM-4.5-Air: at TP 1 the piece's end binds with the rotated halves of q and k its partial rotary embedding
    (factor 0.5) keeps beside the full ones (+ (q + kv) / 2: 13,312 B a token, 134,144 in all); at TP 8 the MoE
    op's phase, with four hidden-wide buffers, its float32 router logits (128 x 4 B), the ungated shared experts'
    output and the routed output: 52,864.5 B a token and 32,760 B of padding rows, to the byte."""
    glm = _geometry("glm-4.5-air")
    assert vb.v2_forward_bytes(glm, batched_tokens=1024, tp=1, act_dtype_bytes=2) == 1024 * 134_144
    padded = 512 * 8 + 128 * 63
    op = 512 * (2 * (4 * 4096 + 1536 + 2 * 4096) + 4 * 128 + 12 * 8) + 4 * padded + 4 * -(-padded // 64)
    assert vb.v2_forward_bytes(glm, batched_tokens=512, tp=8, act_dtype_bytes=2) == op == 27_099_384


@pytest.mark.parametrize(("factor", "expected"), [
    (0.5, 0.5), (1, 1.0), (None, 1.0), ("0.5", None), (True, None), (float("nan"), None), (float("inf"), None),
    (1e308, None), (0, None), (-0.5, None)])
def test_a_partial_rotary_factor_is_a_share_of_the_head(factor: object, expected: float | None) -> None:
    """config.json's partial_rotary_factor is a stranger's number: one in (0, 1] is a share of the head (the rotated
    part of q and k the forward keeps), anything else is refused as the config's one error line (exit 65) where NaN
    and 1e308 stopped vLLM's and SGLang's rotary-table sizing with an internal ValueError / OverflowError."""
    from launcher.common.errors import ModelConfigError
    from launcher.engines.sglang.parameters import rope_cache_bytes
    from launcher.model.config import partial_rotary_factor

    text = {} if factor is None else {"partial_rotary_factor": factor}
    assert partial_rotary_factor(text) == expected
    config = {k: v for k, v in json.loads((DATA / "configs" / "glm-4.5-air.json").read_text()).items()
              if not k.startswith("_") and k != "partial_rotary_factor"}
    if expected is None:
        with pytest.raises(ModelConfigError, match="'partial_rotary_factor' must be a number above 0 to 1"):
            geometry_from_config({**config, **text})
        return
    glm = geometry_from_config({**config, **text})
    assert vb.rope_tables(glm, dtype="bfloat16", version="0.34.0") is not None and rope_cache_bytes(glm)
    rotated = 2 * (12_288 + 1_024) * (int(128 * expected) if expected < 1 else 0) // 128
    assert vb.v2_forward_bytes(glm, batched_tokens=1, tp=1, act_dtype_bytes=2) == 2 * (
        2 * 4096 + 4 * 12_288 + 3 * 1_024) + rotated


@pytest.mark.parametrize(("model", "capability", "version", "expected"), [
    ("llama-3.1-8b-instruct-fp8", (9, 0), "0.34.0", "static-fused"),
    ("llama-3.1-8b-instruct-fp8", (8, 9), "0.32.0", "static-fused"),
    ("qwen2.5-7b-instruct-fp8-dynamic", (9, 0), "0.34.0", "dynamic"),
    ("qwen3-8b-fp8-static", (8, 9), "0.34.0", "static"),
    # A100 (W8A8 needs 8.9: the weights run Marlin), B200 and RTX 50 (FlashInfer's scaled mm first), not known
    ("llama-3.1-8b-instruct-fp8", (8, 0), "0.34.0", None), ("llama-3.1-8b-instruct-fp8", (10, 0), "0.34.0", None),
    ("llama-3.1-8b-instruct-fp8", (12, 0), "0.34.0", None), ("llama-3.1-8b-instruct-fp8", None, "0.34.0", None),
    # before 0.32 (0.29.0 holds more at TP 4 with per-token scales); an unquantized checkpoint
    ("llama-3.1-8b-instruct-fp8", (9, 0), "0.31.0", None), ("llama-3.1-8b-instruct", (9, 0), "0.34.0", None)])
def test_fp8_activations(model: str, capability: tuple[int, int] | None, version: str, expected: str | None) -> None:
    assert vb.fp8_activations(_geometry(model), compute_capability=capability, version=version) == expected


def test_fp8_phases() -> None:
    """Llama 3.1 8B FP8 (static, 0.30+): its fused silu-and-quantize leaves the activation in fp8 beside gate_up,
    2 I + 2 H + q two-byte and I one-byte entries a token at TP 1 (96,256 B, 14,336 below the bf16 forward); at TP
    8 the next norm's input quantized to fp8 beside qkv's output binds (4 H + q + qkv, H bytes, the variance).
    Per-token scales (Qwen2.5 7B FP8-dynamic) keep the activation in bf16 and gate_up beside its fp8 copy, 3 I + 3 H
    + q and I + 6 B: 161,286 B a token at TP 1, 19 % above the bf16 forward the plan counted before."""
    llama = _geometry("llama-3.1-8b-instruct-fp8")
    assert vb.v2_forward_bytes(llama, batched_tokens=1, tp=1, act_dtype_bytes=2, fp8="static-fused") == \
        2 * (2 * 14336 + 2 * 4096 + 4096) + 14336 == 96_256
    assert vb.v2_forward_bytes(llama, batched_tokens=1, tp=8, act_dtype_bytes=2, fp8="static-fused") == \
        2 * (4 * 4096 + 512 + 768) + 4096 + 4 == 39_428
    # before 0.30 (no fused op): QuantFP8 in the piece keeps one hidden-wide buffer more, as on Qwen2
    assert vb.v2_forward_bytes(llama, batched_tokens=1, tp=1, act_dtype_bytes=2, fp8="static") == \
        2 * (2 * 14336 + 3 * 4096 + 4096) + 14336 == 104_448
    qwen = _geometry("qwen2.5-7b-instruct-fp8-dynamic")
    assert vb.v2_forward_bytes(qwen, batched_tokens=1, tp=1, act_dtype_bytes=2, fp8="dynamic") == \
        2 * (3 * 18944 + 3 * 3584 + 3584) + 18944 + 6 == 161_286
    assert vb.v2_forward_bytes(qwen, batched_tokens=1, tp=1, act_dtype_bytes=2) == 135_168


def test_every_fp8_scheme_was_run_on_every_fp8_architecture() -> None:
    """FP8_FORWARD_TRACED names only architectures the oracle ran with both input scales on the releases it is
    traced for, 0.32.0 and 0.34.0 (Llama's static scale fused into its activation)."""
    for oracle in (ORACLE, ORACLE_032):
        ran = {(r["architecture"], vb.fp8_activations(_geometry(r["model"]), compute_capability=(9, 0),
                                                      version=r["vllm"]))
               for r in oracle["results"] if "peaks" in r}
        static = {a: "static-fused" if a in vb.FP8_FUSED_ACT_QUANT else "static" for a in vb.FP8_FORWARD_TRACED}
        assert {(a, s) for a in vb.FP8_FORWARD_TRACED for s in (static[a], "dynamic")} <= ran


def test_fp8_before_032_keeps_the_wider_band() -> None:
    """0.29.0 (no fused activation quantization yet: Llama's static scale quantizes in the piece, 2 I + 3 H + q)
    equals the phases at TP 1, and holds more at TP 4 with per-token scales: Qwen3 8B 2,048 B a token more, Llama
    3.1 8B 4; so releases before 0.32 keep 0.5 GiB. 0.31.0 at TP 1 equals 0.32's phases."""
    old = {(r["model"], r["tp"]): r["peaks"][-1] for r in ORACLE_FP8[0]["results"] if "peaks" in r}

    def over(model: str, tp: int, fp8: str) -> float:
        peak = old[(model, tp)]
        ours = vb.v2_forward_bytes(_geometry(model), batched_tokens=peak["tokens"], tp=tp, act_dtype_bytes=2, fp8=fp8)
        return (peak["peak_bytes"] - ours) / peak["tokens"]

    assert over("llama-3.1-8b-instruct-fp8", 1, "static") == over("llama-3.1-8b-instruct-fp8", 4, "static") == 0
    assert over("qwen3-8b-fp8-dynamic", 1, "dynamic") == 0 and over("qwen3-8b-fp8-dynamic", 4, "dynamic") == 2048
    assert over("llama-3.1-8b-instruct-fp8-dynamic", 4, "dynamic") == 4
    for record in ORACLE_FP8[1]["results"]:
        geometry = _geometry(record["model"])
        fp8 = vb.fp8_activations(geometry, compute_capability=(9, 0), version="0.32.0")
        peak = record["peaks"][-1]
        assert vb.v2_forward_bytes(geometry, batched_tokens=peak["tokens"], tp=1, act_dtype_bytes=2, fp8=fp8) == \
            peak["peak_bytes"]


def test_an_fp8_plan_takes_its_own_forward() -> None:
    """Qwen2.5-7B FP8-dynamic on an H100 at 0.34: the forward at 8,192 tokens is the per-token scheme's (1.23 GiB),
    not the bf16 one's 1.03, with the traced band; the row says how its inputs are quantized."""
    plan = make_plan(PlanRequest(model=resolve_model("qwen2.5-7b-fp8"), engine="vllm",
                                 gpus=hypothetical_gpus(["h100"]), engine_version="0.34.0"))
    row = next(item for item in plan.budget if item.key == "activation")
    assert "forward 1.23" in row.detail and "inputs quantized per token" in row.detail
    assert row.error_bytes == vb.V1_PEAK_ERROR_BYTES + int(8192 * 161_286 * 0.03)
