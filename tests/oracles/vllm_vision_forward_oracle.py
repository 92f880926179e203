#!/usr/bin/env python3
"""Oracle: the allocated peak of the vision towers' forward (Qwen-VL, Gemma 3, Mistral 3), from vLLM's own modules.

vLLM's profile run encodes its dummy images or video with the tower before the language model runs
(`profile_run`; all the dummy items in one batch, v1/worker/gpu/mm/encoder_runner.py:111-175), and that forward
can be the activation peak: a Qwen-VL start at long lengths, Gemma 3 where the language model's phase is small
(budget.py `encoder_profile`). This oracle runs the tower's own forward of a vLLM release's Python tree (Qwen-VL:
`model.visual(pixel_values, grid_thw=...)`; Gemma 3: `model.embed_multimodal(pixel_values=..., num_patches=...)`,
SigLIP and the projector; Mistral 3: `model.embed_multimodal(pixel_values=...)`, Pixtral-HF and the patch merger)
on the meta device, where nothing is computed, and records the peak of the bytes
alive, tensor by tensor (a TorchDispatchMode counts each new storage, a weakref finalizer frees it): what torch's
caching allocator reports as the allocated peak of that forward, without the weights and the dummy pixels it is
given (both allocated before).

    pip download --no-deps vllm==0.34.0 -d /tmp/w && unzip -q /tmp/w/vllm-0.34.0-*.whl 'vllm/*' -d /tmp/v034
    nice -n 10 .venv-vllm/bin/python tests/oracles/vllm_vision_forward_oracle.py --vllm-tree /tmp/v034 \\
        --output tests/data/vllm_vision_forward_oracle.json

The tree is imported ahead of the venv's own vLLM (`--vllm-tree` omitted: the venv's 0.32.0). The modules are
dispatched as a default CUDA start dispatches them: the language model compiled with Inductor, so every
custom op is off unless the layer enforces it (`CompilationConfig.custom_ops` ["none"], custom_op.py
`dispatch_forward`) and the IR ops take their native implementation (platforms/cuda.py
`get_default_ir_op_priority`: ["native"] under Inductor); the tower itself is not compiled
(`compile_mm_encoder` False) and runs those native ops eagerly. Stood in, by what they allocate:
- the platform (CPU, only to build the config; its config hook is skipped), the compiled `_C` ops a module
  looks up at init (never called with custom ops off), torchvision and timm (imported, not called);
- the linear layers' GEMM: `F.linear`, as CUDA's `default_unquantized_gemm`;
- the ViT attention: FlashAttention, the backend on compute capability 8.0+ (platforms/cuda.py:562-615), as
  `flash_attn_maxseqlen_wrapper` allocates (v1/attention/ops/vit_attn_wrappers.py:26-80: the output like q,
  and FlashAttention's fp32 log-sum-exp [heads, tokens], dropped at once).
Tensor parallelism is traced on one process: the tensor-parallel group answers a world size of 2, 4 or 8 (rank 0),
so every layer takes its own shard as on rank 0, and its collectives allocate as CUDA's do (all-reduce out of
place: one output like its input; all-gather: a contiguous input, the gathered output and, off dim 0, its
movedim copy; cuda_communicator.py:389-524). A size a model cannot take (heads or intermediates not divisible) is
recorded as vLLM's refusal.
`tests/engines/vllm/test_qwen_vl_profile.py` checks budget.py's `_vision_forward_bytes` against every record.
"""

# ruff: noqa: BLE001
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from vllm_params import one_gloo_rank, quiet_site, write_golden  # noqa: E402 (stdlib-only at import)

CONFIGS = os.path.join(HERE, "..", "data", "configs")
MODELS = ("qwen2-vl-7b-instruct", "qwen2.5-vl-7b", "qwen3-vl-4b-instruct", "qwen3-vl-8b-instruct", "qwen3.5-27b",
          "qwen3.5-35b-a3b", "gemma-3-4b-it", "gemma-3-12b-it", "gemma-3-27b-it", "mistral-small-3.1-24b-instruct-2503")
# Qwen-VL: (temporal, height, width) patch grids of one item: an image (one temporal patch), a square video, a
# wide one. Gemma 3, Mistral 3: that many images of the profile's dummy size (Gemma 3: image_size, pan-and-scan
# off; Mistral 3: image_size padded to whole merged patches).
GRIDS = ((1, 32, 32), (2, 64, 64), (7, 36, 64))
IMAGES = (1, 4, 8)
TP_SIZES = (1, 2, 4, 8)

SITECUSTOMIZE = """import os, sys
tree = os.environ.get("SAFE_SERVE_VLLM_TREE")
if tree:
    sys.path.insert(0, tree)
sys.path.insert(0, {here!r})
from sglang_oracle import _StubFinder
sys.meta_path.insert(0, _StubFinder(["torchvision", "timm"]))
try:
    import vllm.platforms as _platforms
    from vllm.platforms.cpu import CpuPlatform
    CpuPlatform.check_and_update_config = classmethod(lambda cls, config: None)
    _platforms._current_platform = CpuPlatform()
except Exception:
    pass
"""


class LiveBytes:
    """The bytes of storages alive, and their peak, over what runs under it (`torch_dispatch_mode`)."""

    def __init__(self, torch, existing) -> None:  # type: ignore[no-untyped-def]
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        owner = self
        self.live = self.peak = 0
        self.existing = {t.untyped_storage()._cdata for t in existing}
        self.seen: set[int] = set()

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                out = func(*args, **(kwargs or {}))
                for tensor in tree_flatten(out)[0]:
                    if isinstance(tensor, torch.Tensor):
                        owner.track(tensor.untyped_storage())
                return out

        self.mode = Mode()

    def track(self, storage) -> None:  # type: ignore[no-untyped-def]
        key = storage._cdata
        if key in self.seen or key in self.existing:
            return
        size = storage.nbytes()
        self.seen.add(key)
        self.live += size
        self.peak = max(self.peak, self.live)

        def freed(key: int = key, size: int = size) -> None:
            self.live -= size
            self.seen.discard(key)

        weakref.finalize(storage, freed)


# The activations a module looks up at init (never called with custom ops off).
ACTIVATION_C_OPS = ("gelu_quick", "silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul", "gelu_new", "gelu_fast",
                    "mul_and_silu", "fatrelu_and_mul", "swigluoai_and_mul")


def _stub_c_ops(torch, names: tuple[str, ...] = ACTIVATION_C_OPS) -> object:  # type: ignore[no-untyped-def]
    """Inert `_C` ops, `(Tensor(a!) out, Tensor x) -> ()`, for those of `names` the tree's compiled `_C` lacks (a
    release's CUDA build does not load on the CPU; the venv's own CPU build registers its ops first, through the
    platform, which picks the build this CPU runs: `_C` needs AVX-512 BF16 and stops an AVX2 machine with SIGILL,
    platforms/cpu.py:631-660 in 0.32.0)."""
    with contextlib.suppress(ImportError):
        from vllm.platforms import current_platform

        current_platform.import_kernels()
    library = torch.library.Library("_C", "FRAGMENT")
    for name in names:
        if not hasattr(torch.ops._C, name):
            library.define(f"{name}(Tensor(a!) out, Tensor x) -> ()")
            library.impl(name, lambda out, x: None, "CompositeExplicitAutograd")
    return library


def _fake_tensor_parallel(torch, size: int) -> None:  # type: ignore[no-untyped-def]
    """The tensor-parallel group as rank 0 of `size`, its collectives allocating as vLLM's CUDA ones."""
    from vllm.distributed import parallel_state

    group = parallel_state.get_tp_group()
    group.world_size, group.rank_in_group = size, 0

    def all_reduce(tensor):  # type: ignore[no-untyped-def]
        return torch.empty_like(tensor)

    def all_gather(tensor, dim=-1):  # type: ignore[no-untyped-def]
        dim = dim + tensor.dim() if dim < 0 else dim
        tensor = tensor.contiguous()
        shape = tuple(tensor.shape)
        gathered = torch.empty((size, *shape), dtype=tensor.dtype, device=tensor.device).movedim(0, dim)
        return gathered.reshape((*shape[:dim], size * shape[dim], *shape[dim + 1:]))

    group.all_reduce, group.all_gather = all_reduce, all_gather


class VisionOracle:
    def __init__(self) -> None:
        self._site = quiet_site(SITECUSTOMIZE.format(here=HERE), "vllm-vision-site-")
        import torch
        import vllm

        self.torch = torch
        self.version = vllm.__version__
        self._library = _stub_c_ops(torch)
        self._distributed = False

    def _build(self, config: dict, tp: int):  # type: ignore[no-untyped-def]
        torch = self.torch
        from vllm.config import set_current_vllm_config
        from vllm.engine.arg_utils import EngineArgs
        from vllm.model_executor.model_loader.utils import initialize_model
        from vllm.utils.torch_utils import set_default_torch_dtype

        model_dir = tempfile.mkdtemp(prefix="vllm-vision-model-")
        with open(os.path.join(model_dir, "config.json"), "w", encoding="utf-8") as handle:
            json.dump(config, handle)
        with contextlib.redirect_stdout(io.StringIO()):
            engine = EngineArgs(model=model_dir, skip_tokenizer_init=True, enforce_eager=True, load_format="dummy",
                                max_model_len=1024).create_engine_config()
        engine.compilation_config.custom_ops = ["none"]  # as under Inductor, the default on CUDA
        context = set_current_vllm_config(engine)
        context.__enter__()
        one_gloo_rank(first=not self._distributed, port=29800 + os.getpid() % 1000)
        self._distributed = True
        if tp > 1:
            _fake_tensor_parallel(torch, tp)
        with contextlib.suppress(ImportError):
            from vllm import ir

            for op in ("rms_norm", "fused_add_rms_norm"):
                getattr(ir.ops, op).set_default(["native"])
        with set_default_torch_dtype(engine.model_config.dtype), torch.device("meta"):
            model = initialize_model(vllm_config=engine)
        return engine, model, context

    def _cuda_dispatch(self, model) -> None:  # type: ignore[no-untyped-def]
        import einops
        import vllm.model_executor.layers.attention.mm_encoder_attention as encoder_attention
        from vllm.model_executor.layers.utils import default_unquantized_gemm
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        torch = self.torch

        def flash_attention(q, k, v, batch_size, is_rocm_aiter, fa_version, scale=None, cu_seqlens=None,  # type: ignore[no-untyped-def]
                            max_seqlen=None):
            q, k, v = (einops.rearrange(x, "b s ... -> (b s) ...") for x in (q, k, v))
            out = torch.empty_like(q, memory_format=torch.contiguous_format)
            lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
            del lse
            return einops.rearrange(out, "(b s) h d -> b s h d", b=batch_size)

        encoder_attention.vit_flash_attn_wrapper = flash_attention
        for module in model.modules():
            if hasattr(module, "attn_backend"):
                with contextlib.suppress(AttributeError):  # a property reading its layers' own
                    module.attn_backend = AttentionBackendEnum.FLASH_ATTN
            method = getattr(module, "quant_method", None)
            if method is not None and hasattr(method, "_gemm_impl"):
                method._gemm_impl = default_unquantized_gemm
            if isinstance(module, encoder_attention.MMEncoderAttention):
                module._forward_method = (
                    lambda m: lambda query, key, value, cu_seqlens=None, max_seqlen=None, sequence_lengths=None:
                    m._forward_fa(query, key, value, cu_seqlens, max_seqlen))(module)

    def _peak(self, model, pixels, forward):  # type: ignore[no-untyped-def]
        """(allocated peak, output) of `forward`, the weights and the pixels allocated before it."""
        live = LiveBytes(self.torch, [*model.parameters(), *model.buffers(), pixels])
        with self.torch.no_grad(), live.mode:
            output = forward()
        return live.peak, output

    def run(self, name: str) -> dict:
        with open(os.path.join(CONFIGS, f"{name}.json"), encoding="utf-8") as handle:
            config = {k: v for k, v in json.load(handle).items() if not k.startswith("_")}
        out: dict = {"model": name, "architecture": config["architectures"][0], "grids": [], "refused": {}}
        try:
            for tp in TP_SIZES:
                self._run_tp(config, tp, out)
        except BaseException as error:
            if isinstance(error, KeyboardInterrupt):
                raise
            out["error"] = {"type": type(error).__name__, "message": str(error)[:300]}
        return out

    def _run_tp(self, config: dict, tp: int, out: dict) -> None:
        """The records of one tensor-parallel size: each grid's (or image count's) peak on rank 0."""
        torch = self.torch
        try:
            _, model, context = self._build(config, tp)
        except (AssertionError, ValueError) as refused:
            if tp == 1:
                raise
            out["refused"][str(tp)] = f"{type(refused).__name__}: {str(refused)[:200]}"
            return
        images = hasattr(model, "vision_tower")
        tower = model.vision_tower if images else model.visual
        self._cuda_dispatch(model)
        vision = config["vision_config"]
        dtype = next(tower.parameters()).dtype
        if images:
            size, patch = vision.get("image_size", 896), vision.get("patch_size", 14)
            if config["architectures"][0] == "Mistral3ForConditionalGeneration":
                merged = patch * config.get("spatial_merge_size", 1)
                size = ((size - 1) // merged + 1) * merged
            for count in IMAGES:
                pixels = torch.empty(count, 3, size, size, dtype=dtype, device="meta")
                kwargs = {"pixel_values": pixels}
                if config["architectures"][0] == "Gemma3ForConditionalGeneration":
                    kwargs["num_patches"] = torch.ones(count, dtype=torch.int64)
                peak, embeds = self._peak(model, pixels, lambda kw=kwargs: model.embed_multimodal(**kw))
                out["grids"].append({"tp": tp, "images": count, "patches": count * (size // patch) ** 2,
                                     "peak_bytes": peak, "pixel_bytes": pixels.numel() * pixels.element_size(),
                                     "output_shape": [list(e.shape) for e in embeds]})
        else:
            per_patch = 3 * vision.get("temporal_patch_size", 2) * vision.get("patch_size", 14) ** 2
            for t, h, w in GRIDS:
                pixels = torch.empty(t * h * w, per_patch, dtype=dtype, device="meta")
                grid = torch.tensor([[t, h, w]], dtype=torch.int64)
                peak, embeds = self._peak(model, pixels, lambda p=pixels, g=grid: tower(p, grid_thw=g))
                shape = [list(e.shape) for e in embeds] if isinstance(embeds, (list, tuple)) else list(embeds.shape)
                out["grids"].append({"tp": tp, "grid": [t, h, w], "patches": t * h * w, "peak_bytes": peak,
                                     "pixel_bytes": pixels.numel() * pixels.element_size(), "output_shape": shape})
        context.__exit__(None, None, None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-tree", help="a vLLM release's unpacked Python tree, imported first")
    parser.add_argument("--output", help="write the golden file here (default: stdout)")
    args = parser.parse_args()
    if args.vllm_tree:
        os.environ["SAFE_SERVE_VLLM_TREE"] = os.path.abspath(args.vllm_tree)
    oracle = VisionOracle()
    records = [oracle.run(name) for name in MODELS]
    doc = {"header": {"vllm": oracle.version, "torch": oracle.torch.__version__,
                      "dispatch": "CUDA start under Inductor: custom ops off, IR ops native, ViT FlashAttention",
                      "tp": list(TP_SIZES)},
           "results": records}
    write_golden(doc, args.output)
    return 0 if all("error" not in r for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
