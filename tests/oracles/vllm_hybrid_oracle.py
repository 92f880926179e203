"""Golden state sizes of hybrid / state-space models from vLLM's own classmethods (no GPU, no weights).

Run in the vLLM venv (vLLM 0.32 CPU, transformers 5.19):

    /work/main/.venv-vllm/bin/python tests/oracles/vllm_hybrid_oracle.py tests/data/vllm_hybrid_golden.json

For every hybrid config in tests/data/configs/ and every hybrid tiny model recorded in
tests/data/vllm_cpu_truth.json, at TP 1/2/4 (where the heads divide), it loads the config with
transformers (AutoConfig.for_model, as vLLM does), lets the family's own `VerifyAndUpdateConfig`
reset `mamba_ssm_cache_dtype` (vllm/model_executor/models/config.py MODELS_CONFIG_MAP), then
calls the model class's `get_mamba_state_shape_from_config` / `get_mamba_state_dtype_from_config`
and `MambaSpec(...).page_size_bytes` (v1/kv_cache_interface.py). The VllmConfig they read is a
stand-in with only the fields those classmethods touch: model_config.hf_config / hf_text_config /
dtype, parallel_config.tensor_parallel_size, cache_config mamba dtypes, no speculative decoding.

Kimi-Linear's config is read with vLLM's own KimiLinearConfig (transformers_utils/config.py
_CONFIG_REGISTRY comes before transformers, as in vLLM); its records add what the KDA layer
itself allocates (float32 recurrent state) and the MLA page the block is unified against, and a
float16 SSM dtype, which the classmethod refuses, is recorded with the engine's message.

Model modules that import torchvision for their image processors (Qwen3.5, Nemotron-H's VL
sibling) import here with a stand-in torchvision that has no working operations: the classmethods
never touch it. That is why these families are proven here and not on the CPU engine, which
cannot load them without torchvision.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HYBRID_ARCHITECTURES = (
    "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration", "NemotronHForCausalLM", "GraniteMoeHybridForCausalLM",
    "FalconH1ForCausalLM", "Zamba2ForCausalLM", "Mamba2ForCausalLM", "MambaForCausalLM", "JambaForCausalLM",
    "Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "OlmoHybridForCausalLM", "FalconMambaForCausalLM",
    "KimiLinearForCausalLM",
)
# Tiny configs of families the CPU engine cannot build (no served run in tests/data/vllm_cpu_truth.json),
# read from tests/tinymodels.py, with the class name their checkpoints carry.
TINY_KINDS = {"kimi_linear": "KimiLinearForCausalLM", "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM"}
_DTYPE_RESETS = ("NemotronHForCausalLMConfig", "Qwen3_5ForCausalLMConfig", "Qwen3_5ForConditionalGenerationConfig")
SSM_SETTINGS = ("auto", "float16")  # --mamba-ssm-cache-dtype as given to the engine (KDA refuses float16)
# KDA: bfloat16 too, which the class sizes the page with and the layer does not allocate (see _kimi_linear_extras).
SSM_SETTINGS_BY_ARCHITECTURE = {"KimiLinearForCausalLM": ("auto", "float16", "bfloat16")}


class _DummyMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Dummy

    def __getitem__(cls, item: Any) -> Any:
        return _Dummy


class _Dummy(metaclass=_DummyMeta):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Dummy:
        return _Dummy()

    def __getattr__(self, name: str) -> _Dummy:
        return _Dummy()


class _AnyModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return sys.modules.get(f"{self.__name__}.{name}", _Dummy)


class _TorchvisionFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _AnyModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _configs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted((ROOT / "data" / "configs").glob("*.json")):
        raw = json.loads(path.read_text())
        if (raw.get("architectures") or [""])[0] in HYBRID_ARCHITECTURES:
            out.append((f"configs/{path.name}", {k: v for k, v in raw.items() if not k.startswith("_")}))
    truth = json.loads((ROOT / "data" / "vllm_cpu_truth.json").read_text())
    seen = set(TINY_KINDS)
    sys.path.insert(0, str(ROOT))
    from tinymodels import KIND_CONFIGS  # type: ignore  # tests/tinymodels.py

    out += [(f"tiny/{kind}", {**KIND_CONFIGS[kind](), "architectures": [arch]}) for kind, arch in TINY_KINDS.items()]
    for case in truth["cases"]:
        arch = (case["config"].get("architectures") or [""])[0]
        if arch in HYBRID_ARCHITECTURES and case["kind"] not in seen:
            seen.add(case["kind"])
            out.append((f"tiny/{case['kind']}", case["config"]))
    return out


def _golden(name: str, raw: dict[str, Any], tp: int, ssm: str) -> dict[str, Any] | None:
    from types import SimpleNamespace

    import torch
    from transformers import AutoConfig
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    from vllm.transformers_utils.config import _CONFIG_REGISTRY  # vLLM's own config classes come first
    from vllm.v1.kv_cache_interface import MambaSpec

    with tempfile.TemporaryDirectory() as tmp:  # read as vLLM reads a checkpoint: config.json in a directory
        (Path(tmp) / "config.json").write_text(json.dumps(raw))
        own = _CONFIG_REGISTRY[raw["model_type"]] if raw.get("model_type") in _CONFIG_REGISTRY else None
        hf_config = own.from_pretrained(tmp) if own is not None else AutoConfig.from_pretrained(tmp)
    text = hf_config.get_text_config()
    arch = raw["architectures"][0]
    cache = SimpleNamespace(mamba_cache_dtype="auto", mamba_ssm_cache_dtype=ssm, use_replayssm=False,
                            replayssm_buffer_len=16, use_kda_recoverssm=False)
    model = SimpleNamespace(hf_config=hf_config, hf_text_config=text, dtype=torch.bfloat16, architecture=arch)
    vllm_config = SimpleNamespace(model_config=model, cache_config=cache,
                                  parallel_config=SimpleNamespace(tensor_parallel_size=tp), speculative_config=None,
                                  num_speculative_tokens=0, mamba_config=SimpleNamespace(backend=None))
    updater = MODELS_CONFIG_MAP.get(arch)
    if updater is not None and updater.__name__ in _DTYPE_RESETS:
        updater.verify_and_update_config(vllm_config)  # the family's mamba_ssm_cache_dtype reset
    cls = ModelRegistry._try_load_model_cls(arch)  # the class vLLM registers for the architecture
    assert cls is not None, arch
    try:
        shapes = cls.get_mamba_state_shape_from_config(vllm_config)
    except (AssertionError, ValueError):  # heads that TP does not divide: the engine refuses too
        return None
    layer_types = getattr(text, "layer_types", None) or getattr(text, "layers_block_type", None)
    record = {"name": name, "architecture": arch, "tp": tp, "mamba_ssm_cache_dtype_flag": ssm,
              "mamba_ssm_cache_dtype": cache.mamba_ssm_cache_dtype, "shapes": [list(s) for s in shapes],
              "layer_types": list(layer_types) if isinstance(layer_types, (list, tuple)) else None}
    try:
        dtypes = cls.get_mamba_state_dtype_from_config(vllm_config)
    except ValueError as error:  # an SSM dtype the family refuses (KDA: float16)
        return {**record, "dtypes": None, "page_size_bytes": None, "refused": str(error)}
    record["dtypes"] = [str(d).removeprefix("torch.") for d in dtypes]
    record["page_size_bytes"] = MambaSpec(shapes=tuple(shapes), dtypes=tuple(dtypes), block_size=-1).page_size_bytes
    if arch == "KimiLinearForCausalLM":
        record.update(_kimi_linear_extras(hf_config, text, cache, shapes))
    return record


def _kimi_linear_extras(hf_config: Any, text: Any, cache: Any, shapes: Any) -> dict[str, Any]:
    """What the KDA layers allocate and what the MLA layers' page is, from vLLM's own code.

    The KDA layer's own `get_state_dtype` (layers/mamba/gdn/kimi_gdn_linear_attn.py:157-164) calls
    `kda_state_dtype` without the SSM flag; the MLA page is `MLAAttentionSpec` for one token with
    the model config's head size and one KV head (config/model.py:1660-1662)."""
    import torch
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator
    from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase
    from vllm.v1.kv_cache_interface import MambaSpec, MLAAttentionSpec

    layer = MambaStateDtypeCalculator.kda_state_dtype(torch.bfloat16, cache.mamba_cache_dtype)
    convertor = ModelArchConfigConvertorBase(hf_config, text)
    mla = convertor.is_deepseek_mla()
    page = MLAAttentionSpec(block_size=1, num_kv_heads=1, head_size=convertor.get_head_size(), dtype=torch.bfloat16,
                            cache_dtype_str="auto").page_size_bytes if mla else None
    layer_page = MambaSpec(shapes=tuple(shapes), dtypes=tuple(layer), block_size=-1).page_size_bytes
    return {"layer_dtypes": [str(d).removeprefix("torch.") for d in layer], "layer_page_size_bytes": layer_page,
            "use_mla": mla,
            "mla_head_size": convertor.get_head_size() if mla else None, "attention_page_bytes_per_token": page}


def main(out_path: str) -> int:
    sys.meta_path.insert(0, _TorchvisionFinder())
    import transformers
    import vllm

    records = []
    configs = _configs()
    tiny = {name: raw for name, raw in configs if name.removeprefix("tiny/") in TINY_KINDS}
    for name, raw in configs:
        for tp in (1, 2, 4):
            for ssm in SSM_SETTINGS_BY_ARCHITECTURE.get(raw["architectures"][0], SSM_SETTINGS):
                record = _golden(name, raw, tp, ssm)
                if record is not None:
                    records.append(record)
                    print(name, tp, ssm, record["page_size_bytes"], record.get("refused", ""), file=sys.stderr)
    meta = {"generator": "tests/oracles/vllm_hybrid_oracle.py", "vllm": vllm.__version__,
            "transformers": transformers.__version__, "device": "none (classmethods only)"}
    Path(out_path).write_text(json.dumps({"meta": meta, "tiny_configs": tiny, "records": records}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
