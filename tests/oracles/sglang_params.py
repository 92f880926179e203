#!/usr/bin/env python3
"""The tensors SGLang's loader allocates for a model, from SGLang's own modules: the golden file
tests/data/sglang_params.json.

SGLang builds the model's modules on the device (model_loader/loader.py:1012-1016 in 0.5.23,
`with target_device: _initialize_model(...)`), one tensor per parameter and registered buffer;
the caching allocator's segments that hold them are what the planner's "loader leftovers" round.
This oracle runs the same `_initialize_model` with the quantization config SGLang derives
(`_get_quantization_config`), on the meta device, and records each parameter and buffer in the
order the modules register them (the order they are created), deduplicated (a rotary embedding is
shared by all layers through get_rope's cache), with the tensors a module keeps as plain attributes.

What it does not run: loading (the checkpoint's values) and `process_weights_after_loading` (Marlin
repacks, fp8 transposes), which replace tensors by tensors of the same size and are bounded, not
derived, in the plan. It does run a model's `post_load_weights` (DeepSeek's, which the loader calls
at the end of load_weights and which adds the MLA w_kc / w_vc copies): `post_load` lists the tensors
it adds, in order (or its error where it cannot run on the meta device).

Runs in the SGLang oracle venv (tests/oracles/README.md) with two more packages that the sampler's
import chain needs (`pip install openai partial-json-parser`):

    .venv-sglang/bin/python tests/oracles/sglang_params.py --output tests/data/sglang_params.json

One rank (tp 1; --tp N builds N ranks, one gloo process each) of every profile in profiles/models/ and
every config in tests/data/configs/, as on an H100 (platform preset sm90, whose
capability also picks the quantization method: AWQ checkpoints become awq_marlin on sm80+).
Each record: the case, SGLang's quantization class, the total bytes (and those of buffers and plain
tensors, no parameter of the checkpoint's), and every tensor (name, shape, dtype, bytes, whether it is
a parameter) in creation order: those ahead of the decoder layers, each distinct layer once
(`layer_kinds`; `layers` lists the kind of each layer in turn), those after. A model SGLang cannot
build keeps its error.
"""

# ruff: noqa: BLE001
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

PLATFORM = "sm90"  # the default; --platform sm80/sm86/sm89/sm100 (sglang_oracle.PLATFORM_PRESETS)


def _cudaify() -> None:
    """SGLang's modules read the platform once, at import (`_is_cuda = is_cuda()`); on this CPU
    machine that says CPU, which picks CPU layouts. Answer as a CUDA card would."""
    for name, module in list(sys.modules.items()):
        if not name.startswith("sglang") or module is None:
            continue
        for attr, value in (("_is_cuda", True), ("_is_cuda_alike", True), ("_is_cpu", False),
                            ("_is_cpu_amx_available", False), ("_is_hip", False), ("_is_npu", False),
                            ("_is_xpu", False)):
            if isinstance(getattr(module, attr, None), bool):
                setattr(module, attr, value)


def _patch_capability(capability: tuple[int, int]) -> None:
    """`sglang.srt.utils.get_device_capability` asks torch.cuda.is_available() first (None here);
    answer the preset's capability where a module imported it (AWQ's Marlin check)."""
    def answer(device_id: int = 0) -> tuple[int, int]:
        return capability

    for name, module in list(sys.modules.items()):
        if name.startswith("sglang") and module is not None \
                and callable(getattr(module, "get_device_capability", None)):
            try:
                module.get_device_capability = answer
            except Exception:
                pass


def _patch_device() -> None:
    """Modules that place a buffer explicitly (`device=get_device()`, DeepSeek's YaRN rope) get the
    meta device, where the rest is built."""
    for name, module in list(sys.modules.items()):
        if name.startswith("sglang") and module is not None and callable(getattr(module, "get_device", None)) \
                and getattr(module.get_device, "__module__", "").startswith("sglang.srt.utils"):
            try:
                module.get_device = lambda *a, **k: "meta"
            except Exception:
                pass


# Keys our abridged configs in tests/data/configs lack and the checkpoints' own config.json carry
# (transformers 5 no longer defaults them); SGLang reads them while building the modules.
CONFIG_DEFAULTS = {
    "deepseek_v3": {"moe_layer_freq": 1},
    "kimi_k2": {"moe_layer_freq": 1},
    "gemma2": {"hidden_act": "gelu_pytorch_tanh"},
}


def _layer_index(name: str) -> int | None:
    found = re.search(r"\.layers\.(\d+)\.", name)
    return int(found.group(1)) if found else None


class ParamsOracle:
    def __init__(self, tp: int = 1, rank: int = 0, port: int = 29533, platform: str = PLATFORM) -> None:
        import sglang_oracle as so

        self.tp, self.rank, self.port, self.platform = tp, rank, port, platform
        self.so = so
        self.oracle = so.Oracle()
        import torch

        self.torch = torch
        # DeepSeek's decoder keeps an alternate CUDA stream for overlapped MoE (models/deepseek_v2.py).
        torch.cuda.Stream = lambda *a, **k: None  # type: ignore[assignment,misc]
        self._distributed = False

    def _facts(self) -> dict:
        import sglang.srt.runtime_context as rc

        facts = self.so.PLATFORM_PRESETS[self.platform]
        known = set(getattr(rc, "_PLATFORM_PROBES", {})) | set(getattr(rc, "_PLATFORM_VALUES", {}))
        return {k: v for k, v in facts.items() if k in known}

    def _init_distributed(self) -> None:
        """One gloo rank of `tp`, as `distributed/bootstrap.py` sets them up (every rank a process)."""
        if self._distributed:
            return
        import sglang.srt.distributed.parallel_state as ps

        ps.init_distributed_environment(backend="gloo", world_size=self.tp, rank=self.rank, local_rank=self.rank,
                                        distributed_init_method=f"tcp://127.0.0.1:{self.port}")
        ps.initialize_model_parallel()
        self._distributed = True

    def run(self, alias: str, config: dict) -> dict:
        from sglang.srt.runtime_context import SpawnRanks, override_platform, publish

        torch = self.torch
        config = {**CONFIG_DEFAULTS.get(str(config.get("model_type")), {}), **config}
        model_dir = self.oracle._config_dir(config)
        preset = self.so.PLATFORM_PRESETS[self.platform]
        capability = preset["device_capability"]
        out: dict = {"id": alias, "platform": self.platform, "tp": self.tp}
        with override_platform(**self._facts()), self.so._device_capability(preset):
            try:
                _cudaify()
                _patch_capability(capability)
                args = self.oracle.prepare_server_args(["--model-path", model_dir, "--device", "cuda",
                                                        "--tp-size", str(self.tp)])
                args.resolve_once()
                from sglang.srt.configs.load_config import LoadConfig
                from sglang.srt.configs.model_config import ModelConfig
                from sglang.srt.model_loader import loader
                from sglang.srt.model_loader.utils import get_model_architecture

                publish(args, role="scheduler", ranks=SpawnRanks(world_rank=self.rank, dp_rank=None, gpu_id=self.rank))
                self._init_distributed()
                model_config = ModelConfig.from_server_args(args)
                get_model_architecture(model_config)  # imports the model's modules: answer CUDA there too
                _cudaify()
                _patch_capability(capability)
                _patch_device()
                load_config = LoadConfig()
                quant_config = loader._get_quantization_config(model_config, load_config)
                with loader.set_default_torch_dtype(model_config.dtype), torch.device("meta"):
                    model = loader._initialize_model(model_config, load_config, quant_config)
                post_load = self._post_load(model)  # on this platform, as load_weights ends
            except Exception as error:
                out["error"] = {"type": type(error).__name__, "message": str(error)[:500]}
                return out
        out["architecture"] = type(model).__name__
        out["dtype"] = str(model_config.dtype).replace("torch.", "")
        out["quant_class"] = type(quant_config).__name__ if quant_config is not None else None
        before, kinds, sequence, after = module_tensors(torch, model)
        out["total_bytes"] = sum(r[3] for r in before + after) + sum(
            sum(r[3] for r in kinds[kind]) for kind in sequence)
        out["buffer_bytes"] = sum(r[3] for r in before + after if not r[4]) + sum(
            sum(r[3] for r in kinds[kind] if not r[4]) for kind in sequence)
        out["before_layers"] = before
        out["layer_kinds"] = kinds
        out["layers"] = sequence
        out["after_layers"] = after
        if post_load is not None:
            out["post_load"] = post_load
        return out

    def _post_load(self, model) -> list | dict | None:
        """The tensors post_load_weights adds after loading (DeepSeek's MLA w_kc / w_vc), in layer order,
        or None for a model without one. SGLang's loader calls it at the end of load_weights
        (deepseek_weight_loader.py:550; a wrapper on its language model, kimi_vl.py:361). The attributes
        it set are put back, so the record of the modules is the one before loading."""
        torch = self.torch
        owner = model if hasattr(model, "post_load_weights") else getattr(model, "language_model", None)
        if owner is None or not hasattr(owner, "post_load_weights"):
            return None
        before = {id(module): dict(vars(module)) for module in model.modules()}
        existing = {id(value) for attributes in before.values() for value in attributes.values()
                    if isinstance(value, torch.Tensor)}
        existing |= {id(t) for t in model.parameters()} | {id(t) for t in model.buffers()}
        try:
            with torch.device("meta"):
                owner.post_load_weights()
        except Exception as error:
            return {"type": type(error).__name__, "message": str(error)[:300]}
        added = []
        for module_name, module in model.named_modules():
            for name, value in list(vars(module).items()):
                if isinstance(value, torch.Tensor) and value.device.type == "meta" and id(value) not in existing:
                    added.append([f"{module_name}.{name}", list(value.shape), str(value.dtype).replace("torch.", ""),
                                  value.numel() * value.element_size()])
                    previous = before.get(id(module), {})
                    if name in previous:
                        object.__setattr__(module, name, previous[name])
                    else:
                        delattr(module, name)
        return added


def module_tensors(torch, model) -> tuple[list[list], list[list[list]], list[int], list[list]]:
    """(before, layer kinds, the kind of each layer, after): every parameter and registered buffer of
    `model` in the order the modules register them, deduplicated (a rotary embedding shared by the
    layers through get_rope's cache counts once), with the tensors a module keeps as plain attributes
    on the meta device; each [name, shape, dtype, bytes, is a parameter]. Shared with vllm_params.py."""
    seen: set[int] = set()
    before: list[list] = []  # tensors ahead of the decoder layers, then those after them
    after: list[list] = []
    per_layer: dict[int, list[list]] = {}
    for module_name, module in model.named_modules():
        own = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
        # Tensors kept as plain attributes (some rope classes, attention scales) are allocated all the same.
        own += [(name, value) for name, value in vars(module).items()
                if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter)
                and value.device.type == "meta"]
        for name, tensor in own:
            if tensor is None or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            full = f"{module_name}.{name}" if module_name else name
            record = [full, list(tensor.shape), str(tensor.dtype).replace("torch.", ""),
                      tensor.numel() * tensor.element_size(), isinstance(tensor, torch.nn.Parameter)]
            index = _layer_index(full)
            if index is None:
                (after if per_layer else before).append(record)
            else:
                record[0] = full.split(f".layers.{index}.", 1)[1]
                per_layer.setdefault(index, []).append(record)
    kinds: list[list[list]] = []
    sequence: list[int] = []
    for index in sorted(per_layer):
        tensors = per_layer[index]
        if tensors not in kinds:
            kinds.append(tensors)
        sequence.append(kinds.index(tensors))
    return before, kinds, sequence, after


def cases(only: list[str] | None) -> list[tuple[str, str, dict]]:
    """(id, source, config) for every profile and every config in tests/data/configs (shared with
    vllm_params.py)."""
    import yaml

    cases: list[tuple[str, str, dict]] = []
    for path in sorted(glob.glob(os.path.join(ROOT, "profiles", "models", "*.yaml"))):
        with open(path, encoding="utf-8") as handle:
            profile = yaml.safe_load(handle)
        cases.append((profile["alias"], os.path.relpath(path, ROOT), profile["config"]))
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "data", "configs", "*.json"))):
        with open(path, encoding="utf-8") as handle:
            cases.append(("config:" + os.path.basename(path)[:-5], os.path.relpath(path, ROOT), json.load(handle)))
    return [case for case in cases if not only or case[0] in only]


def _run(tp: int, rank: int, port: int, only: list[str] | None, platform: str = PLATFORM) -> list[dict]:
    oracle = ParamsOracle(tp, rank, port, platform)
    results = []
    for case_id, source, config in cases(only):
        result = oracle.run(case_id, config)
        result["source"] = source
        if rank == 0:
            print(f"{case_id}: {result.get('quant_class')} {result.get('total_bytes', result.get('error'))}",
                  file=sys.stderr)
        results.append(result)
    return results


def _other_rank(tp: int, rank: int, port: int, only: list[str] | None, platform: str) -> None:
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (the ranks beyond 0 build the same, quietly)
    _run(tp, rank, port, only, platform)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", help="write the golden file here (default: stdout)")
    parser.add_argument("--only", nargs="*", help="case ids: profile aliases, config:NAME (default: all)")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel ranks, one process each (rank 0 kept)")
    parser.add_argument("--platform", default=PLATFORM, help="platform preset (sglang_oracle.PLATFORM_PRESETS)")
    parser.add_argument("--digest", action="store_true",
                        help="per case only the quantization class, the total and the SHA-256 of the tensors' bytes "
                             "in creation order (a compact record of another platform)")
    args = parser.parse_args()
    import multiprocessing

    started = time.time()
    port = 29500 + os.getpid() % 1000
    spawn = multiprocessing.get_context("spawn")
    others = [spawn.Process(target=_other_rank, args=(args.tp, rank, port, args.only, args.platform))
              for rank in range(1, args.tp)]
    for process in others:
        process.start()
    results = _run(args.tp, 0, port, args.only, args.platform)
    for process in others:
        process.join()
    import sglang

    if args.digest:
        results = [digest(result) for result in results]
    document = {"meta": {"sglang": sglang.__version__, "platform": args.platform, "tp": args.tp,
                         "seconds": round(time.time() - started, 1),
                         "what": "parameters and buffers of _initialize_model, in creation order, before loading; "
                                 "post_load: the tensors post_load_weights adds after it"},
                "results": results}
    write(document, args.output)
    return 0


def sequence(result: dict) -> list[int]:
    """Every tensor's bytes in creation order, from a record."""
    sizes = [tensor[3] for tensor in result["before_layers"]]
    for kind in result["layers"]:
        sizes += [tensor[3] for tensor in result["layer_kinds"][kind]]
    return sizes + [tensor[3] for tensor in result["after_layers"]]


def digest(result: dict) -> dict:
    import hashlib

    if "error" in result:
        return {"id": result["id"], "error": result["error"]}
    text = json.dumps(sequence(result), separators=(",", ":")).encode()
    return {"id": result["id"], "source": result["source"], "dtype": result["dtype"],
            "quant_class": result["quant_class"], "total_bytes": result["total_bytes"],
            "sha256": hashlib.sha256(text).hexdigest()}


def write(document: dict, output: str | None) -> None:
    """The golden file, compact (one line), or stdout."""
    text = json.dumps(document, separators=(",", ":"))
    if output:
        with open(output, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    sys.exit(main())
