#!/usr/bin/env python3
"""Oracle: the allocated peak of the language model's forward as vLLM compiles it (piecewise, Inductor), per rank.

vLLM's profile run (V2 runner, every model from 0.29) and 0.34's sizing warmup run the model compiled: Dynamo
traces it, vLLM's backend splits the graph at the attention ops (`CompilationConfig._attention_ops` and the KV
cache update, compilation.py:925-947, :1321-1360), runs its own passes and has Inductor compile each piece
(compilation/backends.py, piecewise_backend.py). Inductor plans each piece's buffers: a buffer is allocated where
its kernel runs and freed after its last use, pointwise chains fuse into one kernel (SiluAndMul's silu and product,
RMSNorm's fp32 steps), and the split graph holds each piece's inputs until the piece returns. This oracle runs that
pipeline itself (a release's Python tree, mode VLLM_COMPILE, CUDA graphs off) on the CPU with the model's own
modules, and records the peak of the bytes alive during one forward over T tokens, above the weights and inputs
(torch.profiler's memory events: every allocation of the CPU allocator, the compiled pieces' and the eager ops'
between them).

    pip download --no-deps vllm==0.34.0 -d /tmp/w && unzip -q /tmp/w/vllm-0.34.0-*.whl 'vllm/*' -d /tmp/v034
    nice -n 10 .venv-vllm/bin/python tests/oracles/vllm_lm_forward_oracle.py --vllm-tree /tmp/v034 \\
        --output tests/data/vllm_lm_forward_oracle.json
    nice -n 10 .venv-vllm/bin/python tests/oracles/vllm_lm_forward_oracle.py --tp 1 4 \\
        --output tests/data/vllm_lm_forward_oracle-0.32.0.json   # the venv's own 0.32.0
    nice -n 10 .venv-vllm/bin/python tests/oracles/vllm_lm_forward_oracle.py --vllm-tree /tmp/v034 \
        --models olmo-2-1124-7b-instruct olmo-3-7b-instruct phi-2 gemma-7b seed-oss-36b-instruct smollm3-3b \
        --output tests/data/vllm_lm_forward_oracle-transformers-0.34.0.json   # the Transformers backend's
    nice -n 10 .venv-vllm/bin/python tests/oracles/vllm_lm_forward_oracle.py --vllm-tree /tmp/v029 --tp 1 4 \
        --models llama-3.1-8b-instruct-fp8 llama-3.1-8b-instruct-fp8-dynamic qwen2.5-7b-instruct-fp8-dynamic \
        qwen2.5-7b-fp8-static qwen3-8b-fp8-dynamic qwen3-8b-fp8-static \
        --output tests/data/vllm_lm_forward_oracle-fp8-0.29.0.json   # the FP8 checkpoints (0.31.0: --tp 1)

The tree is imported ahead of the venv's own vLLM (omitted: the venv's 0.32.0). Dispatched as a default CUDA start
dispatches them: custom ops off (["none"]) and the IR ops native (platforms/cuda.py `get_default_ir_op_priority`),
every piece compiled for the range up to max_num_batched_tokens. Stood in, by what they allocate:
- the platform (CPU; its config hook skipped, so the CUDA defaults above stay), the `_C` ops vLLM's passes name
  (pattern-matched, never called);
- the linear layers' GEMM (`default_unquantized_gemm`, F.linear on CUDA): an opaque op returning its output
  uncomputed, so the CPU BLAS's own scratch (oneDNN packing; cuBLAS keeps a fixed workspace instead) is not
  counted, while Inductor plans its output buffer as it plans an extern mm's;
- the attention op and the KV cache update: run, with no KV cache and no metadata (the profile run's dummy
  batch skips attention; the output buffer is allocated by the model as on CUDA);
- an FP8 checkpoint's linear layers (`_fp8_stand_in`): vLLM's own W8A8 modules with CUTLASS's kernel, as on SM
  8.9/9.0; the scaled mm's output allocated where ops.cutlass_scaled_mm allocates it, the op inert;
- a MoE layer: the opaque `moe_forward` op CUDA dispatches (the CPU platform inlines the layer instead), its body
  allocating what the Triton experts allocate per call (`_moe_stand_in`; their GEMM caches are the persistent
  workspace budget.py counts apart);
- tensor parallelism: the TP group answers a world size of 2, 4 or 8 as rank 0 (each layer its shard) and its
  all-reduce, a custom op under compile (parallel_state.py:730-751), allocates its output as CUDA's does
  (out of place). A size the model cannot take is recorded as vLLM's refusal.
Each (model, TP) runs in a process of its own (Dynamo's and vLLM's compile state), over 3 decoder layers: the
first piece (embedding, the first layer's norm and qkv), a middle piece (attention output to the next qkv) and
the last (to the final norm) all run. `tests/engines/vllm/test_lm_forward.py` checks budget.py's
`v2_forward_bytes` against every record.
"""

# ruff: noqa: BLE001
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from vllm_params import one_gloo_rank, quiet_site, write_golden  # noqa: E402 (stdlib-only at import)
from vllm_vision_forward_oracle import ACTIVATION_C_OPS, SITECUSTOMIZE, _stub_c_ops  # noqa: E402 (stdlib-only at import)

CONFIGS = os.path.join(HERE, "..", "data", "configs")
# Decoders with a gated MLP, each an architecture (or a layout: Qwen3's q/k norms, Gemma's sandwich norms,
# Phi-3's fused gate_up, GLM-4's post-norms) of its own; Gemma 3 through its multimodal wrapper's language model.
MODELS = ("llama-3.1-8b-instruct", "qwen2.5-7b", "qwen3-8b", "qwen3-32b", "mistral-7b-instruct-v0.3", "gemma-2-9b",
          "gemma-3-12b-it", "phi-3.5-mini-instruct", "phi-4", "granite-3.3-8b-instruct", "glm-4-9b-0414",
          "gemma-3-1b-it", "mistral-nemo-instruct-2407", "llama-3.2-1b-instruct", "mistral-small-3.2-24b-instruct-2506",
          "phi-4-mini-instruct",  # Phi-3's class with a partial rotary embedding (factor 0.75)
          # MoE: routed experts alone (Qwen3-MoE, Mixtral), a gated shared expert (Qwen2-MoE), a dense first layer and
          # shared experts (GLM-4.5)
          "qwen3-30b-a3b", "mixtral-8x7b-instruct-v0.1", "qwen1.5-moe-a2.7b", "glm-4.5-air",
          # FP8 checkpoints (compressed-tensors W8A8): static per-tensor and dynamic per-token input scales, on Llama's
          # MLP (a fused silu-and-quantize op for a static scale) and Qwen2's/Qwen3's (QuantFP8 in the piece)
          "llama-3.1-8b-instruct-fp8", "llama-3.1-8b-instruct-fp8-dynamic", "qwen2.5-7b-instruct-fp8-dynamic",
          "qwen2.5-7b-fp8-static", "qwen3-8b-fp8-dynamic", "qwen3-8b-fp8-static")
# Served by the Transformers backend (budget.TRANSFORMERS_BACKEND_SINCE: OLMo 2/3, Phi-2, Seed-OSS, SmolLM3 from 0.32,
# Gemma 1 from 0.34): the HF decoder is the compiled module, called through the backend's own forward (batch
# dimension added); run apart (`TRANSFORMERS_MODELS`). The oracle's stand-in tensor parallelism does not shard the
# backend's views where the HF code names the head count (Phi-2, OLMo 2/3, Gemma at TP > 1): recorded as errors.
TRANSFORMERS_MODELS = ("olmo-2-1124-7b-instruct", "olmo-3-7b-instruct", "phi-2", "gemma-7b", "seed-oss-36b-instruct",
                       "smollm3-3b")
TP_SIZES = (1, 2, 4, 8)
TOKENS = (512, 1024)
LAYERS = 3
# vLLM's passes match these `_C` ops by name (compilation/passes/utility/fix_functionalization.py and the fusion
# passes); the tree's CUDA `_C` does not load on the CPU, so they are defined, inert.
PASS_C_OPS = ("rotary_embedding", "fused_add_rms_norm_static_fp8_quant", "rms_norm_dynamic_per_token_quant",
              "rms_norm", "rms_norm_static_fp8_quant", "silu_and_mul_quant", "silu_and_mul_nvfp4_quant",
              "fused_qk_norm_rope", "fused_add_rms_norm", "static_scaled_fp8_quant", "dynamic_scaled_fp8_quant",
              "dynamic_per_token_scaled_fp8_quant", "scaled_fp4_quant", "rms_norm_per_block_quant")
# The `_C` ops an FP8 checkpoint's forward calls on CUDA, with their schemas (csrc/torch_bindings.cpp): CUTLASS's
# scaled mm writes into the output ops.cutlass_scaled_mm allocates (_custom_ops.py:748-795), Llama's MLP quantizes
# with a static scale inside its activation (layers/fusion/fused_act_quant.py); both inert here, their outputs
# allocated by the traced code as on CUDA.
FP8_C_OPS = {
    "cutlass_scaled_mm": "(Tensor(a!) out, Tensor a, Tensor b, Tensor a_scales, Tensor b_scales, Tensor? bias) -> ()",
    "silu_and_mul_quant": "(Tensor(a!) result, Tensor input, Tensor scale) -> ()",
}


def _profiled_peak(torch, forward) -> int:  # type: ignore[no-untyped-def]
    """The peak of the CPU allocator's total over `forward()`, above where it started (profiler memory events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        forward()
    with tempfile.TemporaryDirectory(prefix="vllm-lm-trace-") as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as handle:
            events = json.load(handle)["traceEvents"]
    memory = sorted((e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0),
                    key=lambda e: e["ts"])
    if not memory:
        return 0
    start = memory[0]["args"]["Total Allocated"] - memory[0]["args"]["Bytes"]
    return max(e["args"]["Total Allocated"] for e in memory) - start


def _gemm_stand_in(torch):  # type: ignore[no-untyped-def]
    """`default_unquantized_gemm` as an opaque op: its output allocated, nothing computed."""

    @torch.library.custom_op("safe_serve_oracle::linear", mutates_args=(),
                             schema="(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor")
    def linear(x, weight, bias=None):  # type: ignore[no-untyped-def]
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @linear.register_fake
    def _(x, weight, bias=None):  # type: ignore[no-untyped-def]
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    def gemm(layer, x, weight, bias=None):  # type: ignore[no-untyped-def]
        return torch.ops.safe_serve_oracle.linear(x, weight, bias)

    return gemm


# The Triton experts' alignment block (BLOCK_SIZE_M of try_get_optimal_moe_config at a prefill's token count; its
# E x (block - 1) padding rows are a few KB either way).
MOE_ALIGN_BLOCK = 64


def _moe_stand_in(torch, model) -> int:  # type: ignore[no-untyped-def]
    """Each MoE layer as a default CUDA start runs it: through the opaque `moe_forward` op (runner/moe_runner.py:
    205-219, :313-335; the CPU platform calls the layer's function instead, traced into the graph), whose body
    allocates what the Triton experts' modular kernel allocates per call on an unquantized checkpoint (SM 8.x-9.x;
    oracle/unquantized.py:50-95): the shared experts first, their output held (no aux stream above 256 tokens,
    shared_experts.py:130-145), `fused_topk`'s weights, ids and expert indices (router/fused_topk_router.py:
    172-183), the modular kernel's output (modular_kernel.py:1595-1600), `moe_align_block_size`'s sorted ids and
    block experts (moe_align_block_size.py:83-97); the GEMM caches live in the workspace manager's persistent
    workspace (:1267-1281; budget.py's "MoE workspace"), so none are allocated here. Returns the layers stood in."""
    import types

    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    def experts(runner, hidden_states, router_logits, shared_experts_input, input_ids=None,  # type: ignore[no-untyped-def]
                shared_experts_overlapping=False, hidden_states_scale=None):
        shared = runner._shared_experts._layer(shared_experts_input) if runner._shared_experts is not None else None
        tokens, topk, experts = hidden_states.shape[0], runner.moe_config.experts_per_token, \
            runner.moe_config.num_local_experts
        weights = torch.empty(tokens, topk, dtype=torch.float32)
        ids = torch.empty(tokens, topk, dtype=torch.int32)
        indices = torch.empty(tokens, topk, dtype=torch.int32)
        output = hidden_states.new_empty(hidden_states.shape)
        padded = tokens * topk + experts * (MOE_ALIGN_BLOCK - 1)
        sorted_ids = torch.empty(padded, dtype=torch.int32)
        block_experts = torch.empty(-(-padded // MOE_ALIGN_BLOCK), dtype=torch.int32)
        del weights, ids, indices, sorted_ids, block_experts
        return shared, output

    count = 0
    for module in model.modules():
        if isinstance(module, MoERunner):
            module._forward_entry = (torch.ops.vllm.moe_forward if module._shared_experts is None
                                     else torch.ops.vllm.moe_forward_shared)
            module._apply_quant_method = types.MethodType(experts, module)
            count += 1
    return count


def _fp8_stand_in(torch) -> object:  # type: ignore[no-untyped-def]
    """An FP8 checkpoint's linear layers as a CUDA start on SM 8.9/9.0 builds them: CUTLASS's scaled mm (FlashInfer's
    runs from SM 10.0 only, kernels/linear/scaled_mm/flashinfer.py:41-51), chosen here whatever the platform; its
    input quantized by QuantFP8's native code (custom ops off), compiled into the pieces."""
    library = torch.library.Library("_C", "FRAGMENT")
    for name, schema in FP8_C_OPS.items():
        if not hasattr(torch.ops._C, name):
            library.define(name + schema)
            library.impl(name, lambda *args: None, "CompositeExplicitAutograd")
    with contextlib.suppress(ImportError):
        import vllm.model_executor.kernels.linear as kernels
        from vllm.model_executor.kernels.linear.scaled_mm.cutlass import CutlassFP8ScaledMMLinearKernel

        choose = kernels.choose_scaled_mm_linear_kernel

        def cutlass(config, possible_kernels, *args, **kwargs):  # type: ignore[no-untyped-def]
            if "block" in str(kwargs.get("quantization")):
                return choose(config, possible_kernels, *args, **kwargs)
            return CutlassFP8ScaledMMLinearKernel

        kernels.choose_scaled_mm_linear_kernel = cutlass
        CutlassFP8ScaledMMLinearKernel.is_supported = classmethod(lambda cls, compute_capability=None: (True, None))
        from vllm.platforms import current_platform

        current_platform.fp8_dtype = lambda: torch.float8_e4m3fn
    return library


def _fake_tensor_parallel(torch, size: int) -> None:  # type: ignore[no-untyped-def]
    from vllm.distributed import parallel_state

    group = parallel_state.get_tp_group()
    group.world_size, group.rank_in_group = size, 0
    group.use_custom_op_call = True  # torch.ops.vllm.all_reduce, as under compile on CUDA
    group._all_reduce_out_place = lambda tensor: torch.empty_like(tensor)


def run_one(name: str, tp: int) -> dict:
    """One (model, TP) record: the compiled forward's peak at each of TOKENS."""
    site = quiet_site(SITECUSTOMIZE.format(here=HERE), "vllm-lm-site-")
    import torch
    import vllm

    library = _stub_c_ops(torch, ACTIVATION_C_OPS + tuple(name for name in PASS_C_OPS if name not in FP8_C_OPS))
    with contextlib.suppress(RuntimeError):  # 0.29-0.31 name its out variant (_custom_ops.py:107, the passes)
        library.define("scaled_fp4_quant.out(Tensor input, Tensor input_scale, bool is_sf_swizzled_layout, *, "
                       "Tensor(a!) output, Tensor(b!) output_scale) -> ()")
    fp8_library = _fp8_stand_in(torch)
    gemm = _gemm_stand_in(torch)
    path = os.path.join(CONFIGS, f"{name}.json")
    if not os.path.exists(path):  # a quantized variant of a config (tests/data/configs/quantized/README.md)
        path = os.path.join(CONFIGS, "quantized", f"{name}.json")
    with open(path, encoding="utf-8") as handle:
        config = {k: v for k, v in json.load(handle).items() if not k.startswith("_")}
    text = config.get("text_config", config)
    text["num_hidden_layers"] = LAYERS
    if isinstance(text.get("layer_types"), list):  # per-layer kinds (OLMo 3's sliding windows): the first LAYERS
        text["layer_types"] = text["layer_types"][:LAYERS]
    out: dict = {"model": name, "architecture": config["architectures"][0], "tp": tp, "layers": LAYERS,
                 "vllm": vllm.__version__}
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    model_dir = tempfile.mkdtemp(prefix="vllm-lm-model-")
    with open(os.path.join(model_dir, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle)
    tokens = max(TOKENS)
    with contextlib.redirect_stdout(io.StringIO()):
        engine = EngineArgs(
            model=model_dir, skip_tokenizer_init=True, load_format="dummy",
            max_model_len=min(4096, int(text.get("max_position_embeddings", 4096))), max_num_batched_tokens=tokens,
            compilation_config={"mode": 3, "cudagraph_mode": "NONE", "backend": "inductor", "custom_ops": ["none"],
                                "compile_sizes": []}).create_engine_config()
    context = set_current_vllm_config(engine)
    context.__enter__()
    one_gloo_rank(first=True, port=29900 + os.getpid() % 1000)
    if tp > 1:
        _fake_tensor_parallel(torch, tp)
    with contextlib.suppress(ImportError):
        from vllm import ir

        for op in ("rms_norm", "fused_add_rms_norm"):
            getattr(ir.ops, op).set_default(["native"])
    try:
        with set_default_torch_dtype(engine.model_config.dtype), torch.device("cpu"):
            model = initialize_model(vllm_config=engine)
    except (AssertionError, ValueError) as refused:
        out["refused"] = f"{type(refused).__name__}: {str(refused)[:200]}"
        return out
    for module in model.modules():  # what loading does to an FP8 layer: (K, N) weights, one static scale
        if getattr(module, "scheme", None) is not None:
            module.scheme.process_weights_after_loading(module)
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None and hasattr(method, "_gemm_impl"):
            method._gemm_impl = gemm
    with contextlib.suppress(ImportError):
        out["moe_layers"] = _moe_stand_in(torch, model)
    import vllm.model_executor.layers.attention.attention as attention

    class _NoAttention:
        @staticmethod
        def forward(*args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            return None

    layer = type("Layer", (), {"impl": _NoAttention()})()
    attention.get_attention_context = lambda layer_name: (None, layer, None, None)
    language = model.get_language_model() if hasattr(model, "get_language_model") else model
    inner = language.model

    # The Transformers backend (models/transformers/base.py) compiles the HF decoder itself, which takes keyword
    # arguments with a batch dimension: its own forward adds it (base.py:773-799) and drops it after.
    hf_backend = type(language).__name__.startswith("Transformers")

    def forward(count: int):  # type: ignore[no-untyped-def]
        ids = torch.zeros(count, dtype=torch.int64)
        positions = torch.arange(count, dtype=torch.int64)
        return (lambda: language(ids, positions)) if hf_backend else (lambda: inner(ids, positions, None))

    out["peaks"] = []
    with torch.no_grad():
        for count in TOKENS:
            run = forward(count)
            with set_forward_context(None, engine, num_tokens=count):
                run()  # compiles (once), warms
                peak = _profiled_peak(torch, run)
            out["peaks"].append({"tokens": count, "peak_bytes": peak})
    del library, fp8_library, site
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-tree", help="a vLLM release's unpacked Python tree, imported first")
    parser.add_argument("--output", help="write the golden file here (default: stdout)")
    parser.add_argument("--models", nargs="*", default=list(MODELS), help="configs in tests/data/configs")
    parser.add_argument("--tp", nargs="*", type=int, default=list(TP_SIZES), help="tensor-parallel sizes")
    parser.add_argument("--update", action="store_true",
                        help="keep --output's other records, replacing only those of the models run")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "TP"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vllm_tree:
        os.environ["SAFE_SERVE_VLLM_TREE"] = os.path.abspath(args.vllm_tree)
    if args.one:
        print(json.dumps(run_one(args.one[0], int(args.one[1]))))
        return 0
    environment = {**os.environ, "VLLM_DISABLE_COMPILE_CACHE": "1",
                   "VLLM_CACHE_ROOT": tempfile.mkdtemp(prefix="vllm-lm-cache-")}
    records = []
    for name in args.models:
        for tp in args.tp:
            done = subprocess.run([sys.executable, __file__, "--one", name, str(tp)], env=environment,
                                  capture_output=True, text=True, check=False)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            failed = done.stderr.strip().splitlines() or ["no output"]
            said = [line for line in failed if "Error" in line] or failed  # the exception, not Dynamo's footer
            record = json.loads(lines[-1]) if lines else {"model": name, "tp": tp, "error": said[-1][:300]}
            print(json.dumps(record), file=sys.stderr)
            records.append(record)
    if args.update and args.output and os.path.exists(args.output):
        with open(args.output, encoding="utf-8") as handle:
            kept = [r for r in json.load(handle)["results"] if r["model"] not in args.models]
        order = {name: index for index, name in enumerate(MODELS)}
        records = sorted(kept + records, key=lambda r: (order.get(r["model"], len(order)), r["tp"]))
    version = next((r["vllm"] for r in records if "vllm" in r), None)
    doc = {"header": {"vllm": version, "layers": LAYERS, "tokens": list(TOKENS), "tp": args.tp,
                      "dispatch": "CUDA start under Inductor: VLLM_COMPILE piecewise, custom ops off, IR ops native, "
                                  "GEMM, all-reduce and the MoE op's experts by what they allocate, FP8 layers on "
                                  "CUTLASS"},
           "results": records}
    write_golden(doc, args.output)
    return 0 if all("error" not in r for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
