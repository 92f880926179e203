#!/usr/bin/env python3
"""Ground-truth oracle: run SGLang's own argument resolution and KV-pool sizing code.

Runs inside a dedicated venv that has the sglang wheel (installed ``--no-deps``), a CPU
torch and a handful of import-time dependencies (see tests/oracles/README.md). It never
touches a GPU: the GPU capacity is mocked, exactly as described in
shared/reference/sglang-memory.md §1.9.

What it patches (and nothing else):
  * every ``get_device_memory_capacity`` name bound inside ``sglang.*`` modules
    (the real one lives in ``sglang/srt/utils/common.py``) -> returns the case's MiB;
  * ``sglang.srt.model_executor.cuda_graph_config.default_prefill_backend`` ->
    ``"breakable"`` (what it returns on a CUDA host; on this GPU-less host it would
    return ``"disabled"`` and the prefill-graph reserve would be missing);
  * optionally, for a case with ``"platform"``, SGLang's own
    ``runtime_context.override_platform(...)`` facts (sm80/sm89/sm90/sm100 presets) so
    the attention-backend default (and with it the page size) is the one that machine
    would get;
  * for the KV part: ``kv_cache_configurator.get_available_gpu_memory`` -> the case's
    "available after weights" GiB, ``torch.distributed.all_reduce`` -> a MIN over
    the pipeline stages computed here (the only collective on that path), and the
    module's ``gc.collect()`` -> no-op (speed only);
  * ``"mxfp4"`` is added to the quantization registry, as its module-level
    ``if is_cuda()`` branch would on a CUDA host (gpt-oss checkpoints need it);
  * ``triton`` / ``torchvision`` are replaced by inert stub modules when they cannot be
    imported (the CPU torch wheel has no triton; PyPI's torchvision is CUDA-linked).
    torch's own triton probe is primed *before* the stubs go in, so torch keeps
    believing there is no triton.

Input (JSON, from --input FILE or stdin)::

    {"cases": [
       {"id": "llama-24576",                       # optional
        "config": {...config.json dict...}         # or "config_path": "x.json"
        "gpu_mem_mib": 24576,                      # null -> capacity unknown (0.95 path)
        "flags": ["--tp-size", "2"],               # extra sglang CLI flags
        "env": {"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "1"},
        "platform": null | "sm80" | "sm89" | "sm90" | "sm100" | {fact: value},
        "kv": {"pre_model_load_gib": 23.4,         # P (GiB, per rank)
               "weights_gib": 15.0}                # W; or "available_gib": A directly
       }, ...]}

Output (JSON on stdout or --output FILE): {"meta": {...}, "results": [...]}, one result
per case in input order; errors are captured as {"type", "message"} (exact text).

Also: ``--grid`` generates the golden grid of tests/data/sglang_oracle.json for the
version that is importable (``--sglang-path DIR`` puts another sglang tree first on
sys.path, e.g. a ``pip install --no-deps --target`` of 0.5.22).
"""

# ruff: noqa: BLE001, S110  (an oracle records whatever SGLang raises)
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import io
import json
import logging
import os
import sys
import tempfile
import time
import types
from types import SimpleNamespace

# ----------------------------------------------------------------------------------------
# Stub modules for triton / torchvision (import-time only dependencies of sglang).
# ----------------------------------------------------------------------------------------


class _StubMeta(type):
    """Every attribute is another stub class; calling one with a single callable
    returns it unchanged (so ``@triton.jit`` / ``@triton.autotune(...)`` are identity
    decorators); otherwise a call returns a new stub. Being *classes*, stubs work as
    base classes and as the second argument of isinstance()."""

    def __getattr__(cls, k):
        if k.startswith("__") and k.endswith("__"):
            raise AttributeError(k)
        return _make_stub(f"{cls.__name__}.{k}")

    def __call__(cls, *a, **k):
        if cls.__name__.endswith(".get_current_target"):
            # triton.runtime.driver.active.get_current_target(): no driver on this host
            # (older fla/utils.py does getattr(torch, <backend>) with the answer).
            raise RuntimeError("oracle stub: no triton driver")
        if len(a) == 1 and not k and callable(a[0]):
            return a[0]
        return _make_stub(f"{cls.__name__}()")

    def __getitem__(cls, k):
        return _make_stub(f"{cls.__name__}[]")

    def __iter__(cls):
        return iter(())

    def __or__(cls, o):
        return cls

    __ror__ = __or__

    def __repr__(cls):
        return f"<oracle stub {cls.__name__}>"


def _make_stub(name):
    return _StubMeta(name, (), {})


class _StubModule(types.ModuleType):
    def __getattr__(self, k):
        if k.startswith("__") and k.endswith("__"):
            raise AttributeError(k)
        return _make_stub(f"{self.__name__}.{k}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots):
        self.roots = set(roots)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        m.__version__ = "3.5.0"
        m.__oracle_stub__ = True
        return m

    def exec_module(self, module):
        pass


STUBBED: list[str] = []
# Stubbed for the legacy (<= 0.5.18) KV path only: imported by model_runner.py there.
LEGACY_RUNNER_STUBS = ("sgl_kernel", "flashinfer")


def stub_legacy_runner_imports() -> None:
    """Stub the CUDA kernel packages an older model_runner.py imports at module level, where they do not import."""
    roots = []
    for name in LEGACY_RUNNER_STUBS:
        try:
            importlib.import_module(name)
        except Exception:
            sys.modules.pop(name, None)
            roots.append(name)
    if roots:
        sys.meta_path.insert(0, _StubFinder(roots))
        STUBBED.extend(roots)


def write_or_print(text: str, output: str | None) -> None:
    """The run's text to `output`, or to stdout without one."""
    if output:
        with open(output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


def _prepare_imports():
    """Import torch, settle its triton probe, then stub what cannot be imported."""
    import torch

    try:
        import torch.utils._triton as _tt

        _tt.has_triton_package()
        _tt.has_triton()
    except Exception:
        pass
    try:  # torch.compile decorators at sglang import time build inductor state
        torch.compile(lambda x: x)
    except Exception:
        pass

    roots = []
    try:
        import triton  # noqa: F401
    except Exception:
        sys.modules.pop("triton", None)
        roots.append("triton")
    try:
        import torchvision  # noqa: F401
    except Exception:
        for m in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
            sys.modules.pop(m, None)
        roots.append("torchvision")
    if roots:
        sys.meta_path.insert(0, _StubFinder(roots))
        STUBBED.extend(roots)


# ----------------------------------------------------------------------------------------
# Platform presets (facts understood by sglang.srt.runtime_context.override_platform).
# ----------------------------------------------------------------------------------------

_CUDA_BASE = {
    "is_cuda": True,
    "is_sm90": False,
    "is_sm100": False,
    "is_sm100_or_sm110": False,
    "is_sm110": False,
    "is_sm120": False,
    "is_blackwell": False,
    "is_hopper_with_cuda_12_3": False,
}
PLATFORM_PRESETS = {
    # A100 / A10 / 3090 (Ampere): flashinfer present, not Hopper.
    "sm80": dict(
        _CUDA_BASE, has_flashinfer=True, device_sm=80, device_capability=(8, 0)
    ),
    "sm86": dict(
        _CUDA_BASE, has_flashinfer=True, device_sm=86, device_capability=(8, 6)
    ),
    # L4 / L40 / 4090 (Ada)
    "sm89": dict(
        _CUDA_BASE, has_flashinfer=True, device_sm=89, device_capability=(8, 9)
    ),
    # H100 / H200 / H20 (Hopper, CUDA >= 12.3)
    "sm90": dict(
        _CUDA_BASE,
        is_sm90=True,
        is_hopper_with_cuda_12_3=True,
        has_flashinfer=True,
        device_sm=90,
        device_capability=(9, 0),
    ),
    # B200 / GB200 (Blackwell datacenter)
    "sm100": dict(
        _CUDA_BASE,
        is_sm100=True,
        is_sm100_or_sm110=True,
        is_blackwell=True,
        has_flashinfer=True,
        device_sm=100,
        device_capability=(10, 0),
    ),
}


# ----------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------

GiB = 1 << 30


@contextlib.contextmanager
def _patched_env(env: dict):
    saved = {}
    for k, v in (env or {}).items():
        saved[k] = os.environ.get(k)
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = str(v)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _device_capability(facts):
    """Some model hooks ask torch itself (arg_groups/model_hook.py: DeepSeek V3.2's DSA
    backend pick calls ``torch.cuda.get_device_capability()``); under a platform preset
    it answers the preset's capability, as that card would."""
    cap = (facts or {}).get("device_capability")
    if cap is None:
        yield
        return
    import torch

    saved = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda *a, **k: tuple(cap)
    try:
        yield
    finally:
        torch.cuda.get_device_capability = saved


def _err(e: BaseException) -> dict:
    return {"type": type(e).__name__, "message": str(e)}


class Oracle:
    def __init__(self, quiet: bool = True):
        # Determinism: no SGLANG_* knobs from the caller's environment leak in
        # (CI sets CI=true, which sglang does not read; SGLANG_IS_IN_CI it does).
        for k in list(os.environ):
            if k.startswith(("SGLANG_", "SGL_")):
                os.environ.pop(k)
        _prepare_imports()
        t0 = time.time()
        # Import the pipeline first so module-level GPU probes run unpatched.
        import importlib.util

        import sglang

        # 0.5.19+ resolve through arg_groups/pipeline.py (resolve_once); 0.5.1-0.5.18 do
        # everything in ServerArgs.__post_init__ ("legacy" mode, see LEGACY below).
        try:
            self.legacy = importlib.util.find_spec("sglang.srt.arg_groups.pipeline") is None
        except ModuleNotFoundError:  # no arg_groups package at all (<= 0.5.11)
            self.legacy = True
        if not self.legacy:
            import sglang.srt.arg_groups.pipeline  # noqa: F401
            import sglang.srt.model_executor.cuda_graph_config as cgc
        from sglang.version import __version__ as _v

        if self.legacy and tuple(int(x) for x in _v.split(".")[:3] if x.isdigit()) < (0, 5, 3):
            # 0.5.1-0.5.2: ModelConfig -> quantization registry -> MoE kernels import
            # sgl_kernel at module level; an inert stub lets resolution run.
            sys.meta_path.insert(0, _StubFinder(LEGACY_RUNNER_STUBS))
            STUBBED.extend(LEGACY_RUNNER_STUBS)
            self._legacy_runner_stubs = True
        try:
            from sglang.srt.server_args import prepare_server_args
        except ModuleNotFoundError as e:
            # 0.5.1-0.5.2 import sgl_kernel from server_args' import chain (MoE kernels):
            # stub the legacy runner modules and import again.
            if not self.legacy or e.name not in LEGACY_RUNNER_STUBS:
                raise
            for m in [m for m in sys.modules if m.startswith("sglang.srt")]:
                sys.modules.pop(m, None)
            sys.meta_path.insert(0, _StubFinder(LEGACY_RUNNER_STUBS))
            STUBBED.extend(LEGACY_RUNNER_STUBS)
            self._legacy_runner_stubs = True
            from sglang.srt.server_args import prepare_server_args

        self.import_s = time.time() - t0
        self.sglang = sglang
        self.version = getattr(sglang, "__version__", None)
        if self.version is None:
            from sglang.version import __version__ as v

            self.version = v
        self.prepare_server_args = prepare_server_args
        if not self.legacy:
            cgc.default_prefill_backend = lambda *a, **k: "breakable"
        self._register_cuda_quant_methods()
        self._gpu_mem = None
        self._patch_capacity()
        self._cfg_dirs: dict[str, str] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="sglang-oracle-")
        if quiet:
            logging.disable(logging.WARNING)
        import gc

        gc.collect()
        gc.freeze()  # keep later collections cheap: the import heap is large
        self.quiet = quiet

    # -- patches -------------------------------------------------------------------------

    def _legacy_platform(self, facts: dict):
        """A context manager that answers `facts` on a release without
        ``runtime_context.override_platform`` (<= 0.5.18), or None: not here (the grid
        records such cases as OracleUnsupported); tests/oracles/sglang_layouts.py has one."""
        return None

    def _patch_capacity(self):
        def fake_capacity(device=None, *a, **k):
            return self._gpu_mem

        n = 0
        for name, mod in list(sys.modules.items()):
            if not name.startswith("sglang") or mod is None:
                continue
            if callable(getattr(mod, "get_device_memory_capacity", None)):
                try:
                    mod.get_device_memory_capacity = fake_capacity
                    n += 1
                except Exception:
                    pass
        self.patched_capacity_refs = n

    @staticmethod
    def _register_cuda_quant_methods():
        """layers/quantization/__init__.py registers "mxfp4" only when is_cuda() (or
        cpu/gfx95/xpu) is true at import time; redo the CUDA branch (gpt-oss needs it).
        The dicts are mutated in place so every module that imported them sees it."""
        try:  # 0.5.1-0.5.2: the registry imports sgl_kernel (not installed; resolution does not need it)
            import sglang.srt.layers.quantization as q
        except ModuleNotFoundError:
            return
        try:
            from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config
        except Exception:
            return
        for name in ("BASE_QUANTIZATION_METHODS", "QUANTIZATION_METHODS"):
            d = getattr(q, name, None)
            if isinstance(d, dict):
                d.setdefault("mxfp4", Mxfp4Config)

    def _config_dir(self, config: dict) -> str:
        clean = {k: v for k, v in config.items() if not k.startswith("_")}
        key = json.dumps(clean, sort_keys=True)
        d = self._cfg_dirs.get(key)
        if d is None:
            d = os.path.join(self._tmp.name, f"model{len(self._cfg_dirs)}")
            self._cfg_dirs[key] = d
        if not os.path.exists(os.path.join(d, "config.json")):
            # (re)written on demand: a /tmp cleaner must not break a long run
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(clean, f)
        return d

    # -- one case ------------------------------------------------------------------------

    def run_case(self, case: dict) -> dict:
        if self.legacy:
            override_platform = None
        else:
            from sglang.srt.runtime_context import override_platform

        config = case.get("config")
        if config is None:
            with open(case["config_path"]) as f:
                config = json.load(f)
        for k, val in (case.get("config_overrides") or {}).items():
            config = dict(config)
            if val is None:
                config.pop(k, None)
            else:
                config[k] = val
        model_dir = self._config_dir(config)
        if case.get("model_path_name"):
            # e.g. a path containing "llama-2" changes the prefill-graph cap
            alias = os.path.join(self._tmp.name, case["model_path_name"])
            if not os.path.lexists(alias):
                os.symlink(model_dir, alias)
            model_dir = alias
        flags = [str(x) for x in case.get("flags", [])]
        argv = ["--model-path", model_dir, "--device", "cuda"] + flags
        self._gpu_mem = (
            None if case.get("gpu_mem_mib") is None else float(case["gpu_mem_mib"])
        )
        platform = case.get("platform")
        facts = PLATFORM_PRESETS[platform] if isinstance(platform, str) else platform
        if facts and override_platform is not None:
            # A release knows only the facts it probes (0.5.21 has no is_sm110): drop
            # the others, which that release cannot read anyway.
            import sglang.srt.runtime_context as rc

            known = set(getattr(rc, "_PLATFORM_PROBES", {})) | set(getattr(rc, "_PLATFORM_VALUES", {}))
            if known:
                facts = {k: v for k, v in facts.items() if k in known}
        platform_ctx = contextlib.nullcontext()
        if facts and override_platform is not None:
            platform_ctx = override_platform(**facts)
        elif facts:
            platform_ctx = self._legacy_platform(facts)
            if platform_ctx is None:
                return {**({"id": case["id"]} if "id" in case else {}),
                        "error": {"type": "OracleUnsupported",
                                  "message": "platform facts need runtime_context.override_platform (0.5.19+)"}}
        out: dict = {}
        if "id" in case:
            out["id"] = case["id"]
        with (
            _patched_env(case.get("env", {})),
            platform_ctx,
            _device_capability(facts),
        ):
            err_sink = io.StringIO()
            try:
                with contextlib.redirect_stderr(err_sink):
                    sa = self.prepare_server_args(argv)
                if not self.legacy:
                    sa.resolve_once()
            except BaseException as e:  # argparse exits with SystemExit
                if isinstance(e, KeyboardInterrupt):
                    raise
                out["error"] = _err(e)
                if isinstance(e, SystemExit):
                    # argparse prints "usage: ..." then "prog: error: <message>"
                    lines = [line for line in err_sink.getvalue().splitlines() if line.strip()]
                    msg = lines[-1] if lines else f"exit {e.code}"
                    if ": error: " in msg:
                        msg = msg.split(": error: ", 1)[1]
                    out["error"] = {"type": "ArgumentError", "message": msg}
                return out
            try:
                out.update(self._summarize_legacy(sa) if self.legacy else self._summarize(sa))
            except Exception as e:
                out["summary_error"] = _err(e)
                return out
            if case.get("kv", "default") is not None:
                try:
                    kv_spec = case.get("kv") or {}
                    out["kv"] = self._kv_legacy(sa, kv_spec) if self.legacy else self._kv(sa, kv_spec)
                except Exception as e:
                    out["kv"] = {"error": _err(e)}
        return out

    def _summarize(self, sa) -> dict:
        from sglang.srt.arg_groups.overrides import resolving_view

        v = resolving_view(sa)
        cg = v.cuda_graph_config
        # The scheduler builds a fresh ModelConfig from the *resolved* args
        # (managers/scheduler.py: ModelConfig.from_server_args); the memo that the
        # resolution hooks used was built before model overrides such as gpt-oss's
        # dtype=bfloat16 were applied.
        from sglang.srt.configs.model_config import ModelConfig

        mc = ModelConfig.from_server_args(sa)
        self._mc = mc
        dec, pre = cg.decode, cg.prefill
        return {
            "mem_fraction_static": v.mem_fraction_static,
            "chunked_prefill_size": v.chunked_prefill_size,
            "max_prefill_tokens": v.max_prefill_tokens,
            "max_running_requests": v.max_running_requests,
            "max_total_tokens": v.max_total_tokens,
            "decode_graph": {
                "backend": str(dec.backend),
                "max_bs": dec.max_bs,
                "num_bs": len(dec.bs or []),
            },
            "prefill_graph": {
                "backend": str(pre.backend),
                "max_bs": pre.max_bs,
                "num_buckets": len(pre.bs or []),
            },
            "attention_backend": v.attention_backend,
            "page_size": v.page_size,
            "kv_cache_dtype": v.kv_cache_dtype,
            "dtype": str(mc.dtype).replace("torch.", ""),
            "context_len": mc.context_len,
            "attention_arch": getattr(
                mc.attention_arch, "name", str(mc.attention_arch)
            ),
            "is_multimodal": bool(mc.is_multimodal),
            "is_hybrid_swa": bool(mc.is_hybrid_swa),
            "disable_hybrid_swa_memory": bool(v.disable_hybrid_swa_memory),
            "tp_size": v.tp_size,
            "pp_size": v.pp_size,
        }

    # -- KV pool -------------------------------------------------------------------------

    def _kv(self, sa, spec: dict) -> dict:
        import sglang.srt.mem_cache.kv_cache_configurator as kvcm
        import torch
        from sglang.srt.distributed.utils import get_pp_indices
        from sglang.srt.mem_cache import kv_cache_dtype as kvd
        from sglang.srt.model_executor.model_runner_components.layer_setup import (
            resolve_layer_indices,
        )
        from sglang.srt.model_executor.pool_configurator import (
            create_memory_pool_configurator,
        )
        from sglang.srt.runtime_context import (
            get_parallel,
            get_schedule,
            get_spec,
            publish,
        )
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        publish(sa, role="scheduler")
        mc = self._mc
        par = get_parallel()
        try:
            _ = par.world_group
        except Exception:
            par.override_permanently(world_group=SimpleNamespace(cpu_group=None))
        pp_size = par.pp_size
        page_size = get_schedule().page_size

        from sglang.srt.arg_groups.overrides import resolving_view

        kv_cache_dtype_arg = resolving_view(sa).kv_cache_dtype
        # model=None: a checkpoint whose quant config says kv_cache_quant_algo=FP8
        # would get fp8_e4m3 under "auto"; none of the grid configs does.
        resolved_str, kv_dtype = kvd.configure_kv_cache_dtype(
            server_args_kv_cache_dtype=kv_cache_dtype_arg,
            model=None,
            model_dtype=mc.dtype,
            is_draft_worker=False,
            is_dflash=False,
            speculative_draft_attention_backend=None,
            speculative_draft_kv_cache_dtype=None,
        )
        kv_dtype_str = resolved_str if resolved_str is not None else kv_cache_dtype_arg
        sliding = self._sliding_window(mc)
        spec_alg = SpeculativeAlgorithm.from_string(get_spec().speculative_algorithm)
        spec_aux = self._spec_aux(sa, mc, spec_alg)

        def make_kvc(pp_rank: int):
            start, end = get_pp_indices(mc.num_hidden_layers, pp_rank, pp_size)
            fake_model = SimpleNamespace(start_layer=start, end_layer=end)
            layer_info = resolve_layer_indices(
                model=fake_model, model_config=mc, is_draft_worker=False
            )
            return kvcm.KVCacheConfigurator(
                device="cuda",
                gpu_id=0,
                attn_dp_size=par.attn_dp_size,
                pp_size=pp_size,
                pp_group=None,
                model=None,
                model_config=mc,
                server_args=sa,
                kv_cache_dtype=kv_dtype,
                kv_cache_dtype_str=kv_dtype_str,
                model_dtype=mc.dtype,
                page_size=page_size,
                sliding_window_size=sliding,
                spec_algorithm=spec_alg,
                is_draft_worker=False,
                post_capture_kv_active=False,
                spec_aux_config=spec_aux,
                is_hybrid_swa=mc.is_hybrid_swa,
                is_hybrid_swa_compress=mc.is_hybrid_swa_compress,
                use_mla_backend=mc.attention_arch.name == "MLA",
                layer_info=layer_info,
                forward_stream=None,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=None,
                memory_pool_config=None,
            ), layer_info

        res: dict = {
            "kv_dtype": str(kv_dtype).replace("torch.", ""),
            "kv_dtype_bytes": torch._utils._element_size(kv_dtype),
            "num_kv_heads_per_rank": mc.get_num_kv_heads(
                par.attn_tp_size, par.attn_dcp_size
            ),
            "head_dim": mc.head_dim,
            "v_head_dim": mc.v_head_dim,
            "page_size": page_size,
            "sliding_window_size": sliding,
            "stages": [],
        }
        if mc.attention_arch.name == "MLA":
            res["mla_kv_cache_dim"] = kvcm.calculate_mla_kv_cache_dim(
                model_config=mc, kv_cache_dtype=kv_dtype
            )
        kvcs = []
        for r in range(pp_size):
            kvc, li = make_kvc(r)
            conf = create_memory_pool_configurator(kvc)
            st = {
                "pp_rank": r,
                "layers": li.num_effective_layers,
                "configurator": type(conf).__name__,
                "cell_size": conf._cell_size,
            }
            if li.full_attention_layer_ids is not None:
                st["full_layers"] = len(li.full_attention_layer_ids)
                st["swa_layers"] = len(li.swa_attention_layer_ids or [])
            res["stages"].append(st)
            kvcs.append(kvc)
        res["cell_size"] = res["stages"][0]["cell_size"]

        P = spec.get("pre_model_load_gib")
        if P is None:
            return res
        A = spec.get("available_gib")
        if A is None:
            A = P - float(spec.get("weights_gib", 0.0))
        res["pre_model_load_gib"] = P
        res["available_gib"] = A

        orig_avail = kvcm.get_available_gpu_memory
        orig_ar = torch.distributed.all_reduce
        pp_min = {"v": None}

        def fake_all_reduce(tensor, op=None, group=None, async_op=False):
            if pp_min["v"] is not None:
                tensor.fill_(min(int(tensor.item()), pp_min["v"]))

        kvcm.get_available_gpu_memory = lambda *a, **k: A
        torch.distributed.all_reduce = fake_all_reduce
        # _profile_available_bytes starts with gc.collect() (0.4 s on this heap and
        # irrelevant to the arithmetic): make it a no-op for the duration.
        orig_gc = kvcm.gc
        kvcm.gc = SimpleNamespace(collect=lambda *a, **k: 0)
        try:
            if pp_size > 1:
                caps = []
                for kvc in kvcs:
                    budget = kvc._profile_available_bytes(P)
                    caps.append(kvc.config_from_budget(budget).max_total_num_tokens)
                pp_min["v"] = min(caps)
                res["per_stage_tokens"] = caps
            kvc = kvcs[0]
            try:
                budget = kvc._profile_available_bytes(P)
                res["budget_bytes"] = budget
                cfg = kvc._resolve_memory_pool_config(P)
            except Exception as e:
                res["error"] = _err(e)
                return res
        finally:
            kvcm.get_available_gpu_memory = orig_avail
            torch.distributed.all_reduce = orig_ar
            kvcm.gc = orig_gc
        res["max_total_num_tokens"] = cfg.max_total_num_tokens
        if kvc.mambaish_config is not None:
            res["mamba"] = self._mamba_summary(kvc)
        res["max_running_requests"] = cfg.max_running_requests
        if cfg.full_max_total_num_tokens is not None:
            res["full_max_total_num_tokens"] = cfg.full_max_total_num_tokens
            res["swa_max_total_num_tokens"] = cfg.swa_max_total_num_tokens
        # What the "KV Cache is allocated" lines would print (memory_pool.py: every
        # per-layer buffer has size + page_size rows; GB = 2^30 bytes).
        eb = res["kv_dtype_bytes"]
        st0 = res["stages"][0]
        if (
            mc.is_hybrid_swa
            and cfg.full_max_total_num_tokens is not None
            and "mla_kv_cache_dim" not in res
        ):
            # swa_memory_pool.py SWAKVPool: a "Full" and a "SWA" MHA sub-pool.
            n = res["num_kv_heads_per_rank"]
            n_swa = mc.get_swa_num_kv_heads(par.attn_tp_size)
            full_rows = cfg.full_max_total_num_tokens + page_size
            swa_rows = cfg.swa_max_total_num_tokens + page_size
            res["log_full_k_size_gb"] = round(
                full_rows * n * mc.head_dim * st0.get("full_layers", 0) * eb / GiB, 2
            )
            res["log_swa_k_size_gb"] = round(
                swa_rows
                * n_swa
                * mc.swa_head_dim
                * st0.get("swa_layers", 0)
                * eb
                / GiB,
                2,
            )
        if not mc.is_hybrid_swa:
            rows = cfg.max_total_num_tokens + page_size
            layers = st0["layers"]
            if "mla_kv_cache_dim" in res:
                res["log_kv_size_gb"] = round(
                    rows * res["mla_kv_cache_dim"] * layers * eb / GiB, 2
                )
            else:
                n = res["num_kv_heads_per_rank"]
                res["log_k_size_gb"] = round(
                    rows * n * mc.head_dim * layers * eb / GiB, 2
                )
                res["log_v_size_gb"] = round(
                    rows * n * mc.v_head_dim * layers * eb / GiB, 2
                )
        return res


    # -- 0.5.1 ... 0.5.18 ("legacy": ServerArgs.__post_init__ resolves everything) -------

    def _summarize_legacy(self, sa) -> dict:
        """The same fields as _summarize, read from a ServerArgs that __post_init__ resolved.
        Decode graph: ``cuda_graph_max_bs``/``cuda_graph_bs`` (<= 0.5.13) or
        ``cuda_graph_config.decode`` (0.5.14+). Prefill graph: the piecewise CUDA graph,
        ``enable_piecewise_cuda_graph`` (0.5.4-0.5.9, default off) or
        ``disable_piecewise_cuda_graph`` (0.5.10-0.5.13), ``cuda_graph_config.prefill``
        (0.5.14+)."""
        from sglang.srt.configs.model_config import ModelConfig

        mc = ModelConfig.from_server_args(sa)
        self._mc = mc
        cgc = getattr(sa, "cuda_graph_config", None)
        if cgc is not None and hasattr(cgc, "decode"):
            dec, pre = cgc.decode, cgc.prefill
            decode = {"backend": str(dec.backend), "max_bs": dec.max_bs, "num_bs": len(dec.bs or [])}
            prefill = {"backend": str(pre.backend), "max_bs": pre.max_bs, "num_buckets": len(pre.bs or [])}
        else:
            off = bool(getattr(sa, "disable_cuda_graph", False))
            decode = {"backend": "disabled" if off else "full", "max_bs": sa.cuda_graph_max_bs,
                      "num_bs": len(sa.cuda_graph_bs or [])}
            if hasattr(sa, "disable_piecewise_cuda_graph"):
                pw_on = not sa.disable_piecewise_cuda_graph
            else:
                pw_on = bool(getattr(sa, "enable_piecewise_cuda_graph", False))
            tokens = getattr(sa, "piecewise_cuda_graph_tokens", None) or []
            prefill = {"backend": "piecewise" if pw_on else "disabled",
                       "max_bs": getattr(sa, "piecewise_cuda_graph_max_tokens", None),
                       "num_buckets": len(tokens)}
        arch = getattr(mc.attention_arch, "name", str(mc.attention_arch))
        return {
            "mem_fraction_static": sa.mem_fraction_static,
            "chunked_prefill_size": sa.chunked_prefill_size,
            "max_prefill_tokens": sa.max_prefill_tokens,
            "max_running_requests": sa.max_running_requests,
            "max_total_tokens": sa.max_total_tokens,
            "decode_graph": decode,
            "prefill_graph": prefill,
            "attention_backend": sa.attention_backend,
            "page_size": sa.page_size,
            "kv_cache_dtype": sa.kv_cache_dtype,
            "dtype": str(mc.dtype).replace("torch.", ""),
            "context_len": mc.context_len,
            "attention_arch": arch,
            "is_multimodal": bool(mc.is_multimodal),
            "is_hybrid_swa": bool(getattr(mc, "is_hybrid_swa", getattr(mc, "is_hybrid", False))),
            "disable_hybrid_swa_memory": bool(getattr(sa, "disable_hybrid_swa_memory", False)),
            "tp_size": sa.tp_size,
            "pp_size": sa.pp_size,
        }

    def _kv_legacy(self, sa, spec: dict) -> dict:
        """Cell size and pool tokens from the version's own ModelRunner code, called on a
        stand-in runner: ``profile_max_num_token`` (model_runner.py in 0.5.1-0.5.6,
        model_runner_kv_cache_mixin.py in 0.5.7-0.5.12) or ``_profile_available_bytes``
        (mixin 0.5.13-0.5.15, KVCacheConfigurator 0.5.16-0.5.18: budget bytes only).
        Its globals get_available_gpu_memory / get_world_group / get_attention_tp_size
        are patched to the scenario. The page floor and --max-total-tokens cap that
        init_memory_pool applies afterwards are applied here the same way; hybrid SWA
        models report the raw profiled count only (no full/SWA split)."""
        import torch

        if not getattr(self, "_legacy_runner_stubs", False):
            # model_runner.py imports sgl_kernel (CUDA kernels) at module level in these
            # releases; stub it only here, after resolution has run, so resolution never
            # sees it.
            stub_legacy_runner_imports()
            self._legacy_runner_stubs = True
        from sglang.srt.model_executor.model_runner import ModelRunner

        mc = self._mc
        pp = sa.pp_size
        try:
            from sglang.srt.distributed.utils import get_pp_indices

            start, end = get_pp_indices(mc.num_hidden_layers, 0, pp)
        except Exception:
            start, end = 0, mc.num_hidden_layers
        dtypes = {"auto": mc.dtype, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
                  "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
        kv_dtype = dtypes[sa.kv_cache_dtype]
        mla = getattr(mc.attention_arch, "name", "") == "MLA"
        attn_tp = sa.tp_size // (sa.dp_size if getattr(sa, "enable_dp_attention", False) else 1)
        fake = SimpleNamespace(
            device="cuda", gpu_id=0, is_draft_worker=False, num_effective_layers=end - start,
            start_layer=start, end_layer=end, model_config=mc, use_mla_backend=mla,
            kv_cache_dtype=kv_dtype, mem_fraction_static=sa.mem_fraction_static, mambaish_config=None,
            server_args=sa, page_size=sa.page_size, pp_size=pp, tp_size=sa.tp_size, dp_size=sa.dp_size,
            is_hybrid_swa=False, is_hybrid_gdn=False, is_hybrid=False, spec_algorithm=None,
        )
        fake.get_cell_size_per_token = lambda n: ModelRunner.get_cell_size_per_token(fake, n)
        res: dict = {"kv_dtype": str(kv_dtype).replace("torch.", ""),
                     "kv_dtype_bytes": torch._utils._element_size(kv_dtype),
                     "num_kv_heads_per_rank": mc.get_num_kv_heads(attn_tp),
                     "head_dim": mc.head_dim, "v_head_dim": getattr(mc, "v_head_dim", mc.head_dim),
                     "page_size": sa.page_size, "layers": end - start}
        P = spec.get("pre_model_load_gib")
        A = spec.get("available_gib")
        if P is not None and A is None:
            A = P - float(spec.get("weights_gib", 0.0))
        fn_name = ("profile_max_num_token" if hasattr(ModelRunner, "profile_max_num_token")
                   else "_profile_available_bytes")
        fn = getattr(ModelRunner, fn_name, None)
        mods = {sys.modules[f.__module__] for f in (fn, getattr(ModelRunner, "get_cell_size_per_token", None)) if f}
        patches = {"get_available_gpu_memory": lambda *a, **k: A,
                   "get_world_group": lambda: SimpleNamespace(world_size=1, cpu_group=None),
                   "get_attention_tp_size": lambda: attn_tp}
        saved = [(mod, k, mod.__dict__.get(k)) for mod in mods for k in patches]
        for mod in mods:
            mod.__dict__.update(patches)
        try:
            if hasattr(ModelRunner, "get_cell_size_per_token"):
                try:
                    res["cell_size"] = ModelRunner.get_cell_size_per_token(fake, end - start)
                except Exception as e:
                    res["cell_size_error"] = _err(e)
            if P is None:
                return res
            res["pre_model_load_gib"] = P
            res["available_gib"] = A
            if fn is None:
                res["pool_error"] = {"type": "OracleUnsupported", "message": "no ModelRunner pool function"}
                return res
            try:
                value = fn(fake, P)
            except Exception as e:
                res["error"] = _err(e)
                return res
        finally:
            for mod, k, v in saved:
                if v is None:
                    mod.__dict__.pop(k, None)
                else:
                    mod.__dict__[k] = v
        res["pool_function"] = f"{fn.__module__}.{fn_name}"
        if fn_name == "_profile_available_bytes":
            res["budget_bytes"] = value
            return res
        res["profiled_tokens"] = value
        tokens = value
        if sa.max_total_tokens is not None:
            tokens = min(tokens, sa.max_total_tokens)
        tokens = tokens // sa.page_size * sa.page_size
        res["max_total_num_tokens"] = tokens
        return res

    @staticmethod
    def _mamba_summary(kvc) -> dict:
        """The per-request state pool of a hybrid (mamba / linear-attention) model as
        KVCacheConfigurator._handle_max_mamba_cache sized it: the state shapes and dtypes
        of one request (mamba2_cache_params), the slots it allocated and the ratios."""
        from sglang.srt.runtime_context import get_exec, get_schedule

        cp = kvc.mambaish_config.mamba2_cache_params
        sched = get_schedule()
        return {
            "config_class": type(kvc.mambaish_config).__name__,
            "state_layers": len(cp.layers),
            "full_attention_layers": len(kvc.mambaish_config.full_attention_layer_ids),
            "conv_shapes": [list(s) for s in cp.shape.conv],
            "temporal_shape": list(cp.shape.temporal),
            "conv_dtype": str(cp.dtype.conv).replace("torch.", ""),
            "temporal_dtype": str(cp.dtype.temporal).replace("torch.", ""),
            "cache_per_req": int(cp.mamba_cache_per_req),
            "mamba_full_memory_ratio": sched.mamba_full_memory_ratio,
            "max_mamba_cache_size": sched.max_mamba_cache_size,
            "slots_per_request": kvc._calculate_mamba_ratio(),
            "extra_buffer": bool(get_exec().mamba.enable_mamba_extra_buffer),
        }

    @staticmethod
    def _sliding_window(mc):
        from sglang.srt.model_executor.model_runner_components.load_model_utils import (
            resolve_sliding_window_size,
        )

        arch = (mc.hf_config.architectures or [""])[0]
        fake_model = SimpleNamespace()
        # The model classes of these archs define get_attention_sliding_window_size()
        # as config.sliding_window - 1 (models/gpt_oss.py, models/gemma2.py).
        mod = {"GptOssForCausalLM": "gpt_oss", "Gemma2ForCausalLM": "gemma2"}.get(arch)
        if mod is not None:
            try:
                m = importlib.import_module(f"sglang.srt.models.{mod}")
                fn = m.get_attention_sliding_window_size
                fake_model.get_attention_sliding_window_size = lambda: fn(
                    mc.hf_text_config
                )
            except Exception:
                fake_model.get_attention_sliding_window_size = lambda: (
                    mc.hf_text_config.sliding_window - 1
                )
        return resolve_sliding_window_size(fake_model, mc)

    @staticmethod
    def _spec_aux(sa, mc, spec_alg):
        from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
            resolve_spec_aux_hidden_state_config,
        )

        return resolve_spec_aux_hidden_state_config(
            server_args=sa,
            model_config=mc,
            spec_algorithm=spec_alg,
            is_draft_worker=False,
        )


# ----------------------------------------------------------------------------------------
# Golden grid
# ----------------------------------------------------------------------------------------

GRID_GPUS = [
    15360,
    16384,
    20480,
    23028,
    24564,
    24576,
    40960,
    46068,
    49140,
    61440,
    81559,
    81920,
    97871,
    143771,
    183359,
]
GRID_TPS = [1, 2, 4, 8]
GRID_FLAGS = {
    "none": [],
    "disable-cuda-graph": ["--disable-cuda-graph"],
    "disable-prefill-cuda-graph": ["--disable-prefill-cuda-graph"],
    "max-running-requests-16": ["--max-running-requests", "16"],
    "chunked-2048": ["--chunked-prefill-size", "2048"],
    "chunked-8192": ["--chunked-prefill-size", "8192"],
    "chunked-off": ["--chunked-prefill-size", "-1"],
    "max-total-tokens-2000": ["--max-total-tokens", "2000"],
    "pp-2": ["--pp-size", "2"],
    "context-length-8192": ["--context-length", "8192"],
    "kv-fp8-e4m3": ["--kv-cache-dtype", "fp8_e4m3"],
    "page-size-16": ["--page-size", "16"],
}
# Flag variants are crossed with every GPU and model at these tp sizes (the no-flag
# baseline uses every tp size).
GRID_FLAG_TPS = [1, 4]
# bf16 weight bytes per model (GiB, parameter count x 2 / 2^30; gpt-oss: MXFP4 experts).
# These are *inputs* of the KV scenario only: W per rank = weights_gib / (tp * pp).
GRID_WEIGHTS_GIB = {
    "llama-3.1-8b": 14.96,
    "qwen2.5-7b": 14.19,
    "deepseek-v2-lite": 29.26,
    "qwen2.5-vl-7b": 15.45,
    "gemma-2-9b": 17.22,
    "gpt-oss-20b": 12.82,
}
# P = gpu_mem_mib / 1024 - this (CUDA context + NCCL, GiB): a fixed scenario input.
GRID_CONTEXT_OVERHEAD_GIB = 0.5
# Platform variants (attention backend / page size per GPU generation).
GRID_PLATFORMS = ["sm80", "sm89", "sm90", "sm100"]


def grid_cases(configs_dir: str) -> list[dict]:
    # The grid is the six configs the golden file was built on (their weights above); the whole
    # real-config corpus in that folder is SGLang-checked by sglang_layouts.py instead.
    names = sorted(n for n in GRID_WEIGHTS_GIB if os.path.exists(os.path.join(configs_dir, n + ".json")))
    cases = []

    def kv_for(name, gpu, flags, tp):
        pp = 2 if "--pp-size" in flags else 1
        P = round(gpu / 1024 - GRID_CONTEXT_OVERHEAD_GIB, 4)
        W = round(GRID_WEIGHTS_GIB.get(name, 0.0) / (tp * pp), 4)
        return {"pre_model_load_gib": P, "weights_gib": W}

    for name in names:
        cfg_path = os.path.join(configs_dir, name + ".json")
        for fkey, flags in GRID_FLAGS.items():
            tps = GRID_TPS if fkey == "none" else GRID_FLAG_TPS
            for tp in tps:
                for gpu in GRID_GPUS:
                    f = list(flags) + (["--tp-size", str(tp)] if tp != 1 else [])
                    cases.append(
                        {
                            "id": f"{name}|{fkey}|tp{tp}|{gpu}",
                            "model": name,
                            "variant": fkey,
                            "tp": tp,
                            "gpu_mem_mib": gpu,
                            "config_path": cfg_path,
                            "flags": f,
                            "kv": kv_for(name, gpu, f, tp),
                        }
                    )
        # GPU-generation presets: attention backend + page size (no KV scenario
        # needed beyond the cell size).
        for plat in GRID_PLATFORMS:
            for gpu in (24576, 81920):
                cases.append(
                    {
                        "id": f"{name}|platform-{plat}|tp1|{gpu}",
                        "model": name,
                        "variant": f"platform-{plat}",
                        "tp": 1,
                        "gpu_mem_mib": gpu,
                        "config_path": cfg_path,
                        "flags": [],
                        "platform": plat,
                        "kv": kv_for(name, gpu, [], 1),
                    }
                )
        # Post-capture KV sizing switch.
        for gpu in (24576, 81920):
            cases.append(
                {
                    "id": f"{name}|post-capture|tp1|{gpu}",
                    "model": name,
                    "variant": "post-capture-kv-sizing",
                    "tp": 1,
                    "gpu_mem_mib": gpu,
                    "config_path": cfg_path,
                    "flags": [],
                    "env": {"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "1"},
                    "kv": None,
                }
            )
    # A few error / edge cases.
    llama = os.path.join(configs_dir, "llama-3.1-8b.json")
    gemma = os.path.join(configs_dir, "gemma-2-9b.json")
    extra = [
        (
            "llama-3.1-8b",
            "context-length-too-long",
            llama,
            ["--context-length", "200000"],
            {},
        ),
        (
            "llama-3.1-8b",
            "context-length-too-long-allowed",
            llama,
            ["--context-length", "200000"],
            {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"},
        ),
        (
            "gemma-2-9b",
            "context-length-too-long",
            gemma,
            ["--context-length", "16384"],
            {},
        ),
        (
            "llama-3.1-8b",
            "ambiguous-cuda-graph-max-bs",
            llama,
            ["--cuda-graph-max-bs", "64"],
            {},
        ),
        (
            "llama-3.1-8b",
            "cuda-graph-max-bs-decode-64",
            llama,
            ["--cuda-graph-max-bs-decode", "64"],
            {},
        ),
        (
            "llama-3.1-8b",
            "explicit-mem-fraction-0.8",
            llama,
            ["--mem-fraction-static", "0.8"],
            {},
        ),
        (
            "llama-3.1-8b",
            "swa-disable-hybrid",
            llama,
            ["--disable-hybrid-swa-memory"],
            {},
        ),
    ]
    for name, variant, path, flags, env in extra:
        cases.append(
            {
                "id": f"{name}|{variant}|tp1|24576",
                "model": name,
                "variant": variant,
                "tp": 1,
                "gpu_mem_mib": 24576,
                "config_path": path,
                "flags": flags,
                "env": env,
                "kv": kv_for(name, 24576, flags, 1),
            }
        )
    gptoss = os.path.join(configs_dir, "gpt-oss-20b.json")
    for variant, flags, kv in [
        (
            "swa-ratio-0.5",
            ["--swa-full-tokens-ratio", "0.5"],
            kv_for("gpt-oss-20b", 81920, [], 1),
        ),
        (
            "disable-hybrid-swa-memory",
            ["--disable-hybrid-swa-memory"],
            kv_for("gpt-oss-20b", 81920, [], 1),
        ),
        (
            "weights-exceed-budget",
            [],
            {"pre_model_load_gib": 79.5, "available_gib": 5.0},
        ),
    ]:
        cases.append(
            {
                "id": f"gpt-oss-20b|{variant}|tp1|81920",
                "model": "gpt-oss-20b",
                "variant": variant,
                "tp": 1,
                "gpu_mem_mib": 81920,
                "config_path": gptoss,
                "flags": flags,
                "kv": kv,
            }
        )
    # Context-length derivation (utils/hf_transformers/common.py get_context_length):
    # max_position_embeddings 4096 with various rope_scaling blocks.
    for variant, rope in [
        ("rope-none", None),
        ("rope-linear-2", {"type": "linear", "factor": 2.0}),
        ("rope-dynamic-2", {"rope_type": "dynamic", "factor": 2.0}),
        ("rope-yarn-4-no-original", {"rope_type": "yarn", "factor": 4.0}),
        (
            "rope-yarn-4-original-4096",
            {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 4096,
            },
        ),
    ]:
        cases.append(
            {
                "id": f"llama-3.1-8b|{variant}|tp1|24576",
                "model": "llama-3.1-8b",
                "variant": variant,
                "tp": 1,
                "gpu_mem_mib": 24576,
                "config_path": llama,
                "config_overrides": {
                    "max_position_embeddings": 4096,
                    "rope_scaling": rope,
                },
                "flags": [],
                "kv": None,
            }
        )
    cases.append(
        {
            "id": "llama-3.1-8b|unknown-capacity|tp1|null",
            "model": "llama-3.1-8b",
            "variant": "unknown-capacity",
            "tp": 1,
            "gpu_mem_mib": None,
            "config_path": llama,
            "flags": [],
            "kv": None,
        }
    )
    return cases


# ----------------------------------------------------------------------------------------
# Venv setup (run with any python3.11; does not import sglang)
# ----------------------------------------------------------------------------------------

# Import-time dependencies of sglang's argument resolution + KV sizing code path, found
# by running the oracle and listing the distributions of every imported module. Not
# needed: triton and torchvision (stubbed, see above), uvicorn/uvloop/fastapi, flashinfer,
# sgl-kernel and all CUDA wheels.
ORACLE_DEPS = [
    "transformers==5.19.0",  # sglang 0.5.22/0.5.23 pin
    "apache-tvm-ffi==0.1.11",  # sglang pin
    "loguru",  # compressed-tensors (installed --no-deps below)
    "aiohttp",
    "starlette",
    "ipython",
    "pillow",
    "msgspec",
    "orjson",
    "psutil",
    "pybase64",
    "pydantic",
    "pyzmq",
    "requests",
    "sentencepiece",
    "gguf",
    "dill",
    "einops",  # 0.5.22's KV path imports it
    "nvidia-ml-py",
]
ORACLE_NODEPS = ["compressed-tensors==0.18.0"]
TORCH_SPEC = "torch==2.13.0"
TORCH_LOCAL_GLOB = "/opt/wheels/torch-2.13.0+cpu-cp311-*.whl"


def setup_venv(venv: str, versions: list[str], allow_cuda_torch: bool) -> dict:
    import glob
    import subprocess

    t0 = time.time()
    timings = {}

    def run(cmd):
        print("+", " ".join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True)

    if sys.version_info[:2] != (3, 11):
        raise SystemExit("the sglang wheels are cp311: run --setup with python3.11")
    run([sys.executable, "-m", "venv", venv])
    pip = [
        os.path.join(venv, "bin", "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
    ]
    local = sorted(glob.glob(TORCH_LOCAL_GLOB))
    if local:
        torch_req = local[-1]
    elif allow_cuda_torch:
        torch_req = TORCH_SPEC  # PyPI: the ~5 GB CUDA build
    else:
        raise SystemExit(
            f"no CPU torch wheel matches {TORCH_LOCAL_GLOB}; PyPI only has the ~5 GB CUDA "
            "build (pass --allow-cuda-torch to use it anyway)"
        )
    run(pip + [torch_req] + ORACLE_DEPS)
    timings["deps_s"] = round(time.time() - t0, 1)
    main_v, *others = versions
    run(pip + ["--no-deps"] + ORACLE_NODEPS + [f"sglang=={main_v}"])
    for v in others:
        run(
            pip
            + [
                "--no-deps",
                "--target",
                os.path.join(venv, f"sglang-{v}"),
                f"sglang=={v}",
            ]
        )
    timings["total_s"] = round(time.time() - t0, 1)
    size = 0
    for root, _dirs, files in os.walk(venv):
        for f in files:
            try:
                size += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    info = {
        "venv": venv,
        "versions": versions,
        "torch": torch_req,
        "size_mib": round(size / 2**20),
        **timings,
    }
    with open(os.path.join(venv, "oracle-setup.json"), "w") as f:
        json.dump(info, f, indent=2)
    return info


# ----------------------------------------------------------------------------------------
# Golden file helpers (pure Python)
# ----------------------------------------------------------------------------------------

SMOKE_GPUS = (16384, 24576, 81920)


def compact_result(r: dict) -> dict:
    """Drop what the case input already says or what is at its default, so the golden
    file stays small. Dropped when absent means: max_running_requests None,
    max_prefill_tokens 16384, is_multimodal/is_hybrid_swa/disable_hybrid_swa_memory
    False, sliding_window_size None, kv.stages only when pp > 1 (else its single
    entry is merged into kv)."""
    r = dict(r)
    for k in ("tp_size", "pp_size", "max_total_tokens", "variant", "tp"):
        r.pop(k, None)
    if r.get("max_running_requests") is None:
        r.pop("max_running_requests", None)
    if r.get("max_prefill_tokens") == 16384:
        r.pop("max_prefill_tokens", None)
    for k in ("is_multimodal", "is_hybrid_swa", "disable_hybrid_swa_memory"):
        if r.get(k) is False:
            r.pop(k)
    kv = r.get("kv")
    if isinstance(kv, dict) and "stages" in kv:
        kv = dict(kv)
        for k in ("pre_model_load_gib", "available_gib", "kv_dtype", "page_size"):
            kv.pop(k, None)
        if kv.get("sliding_window_size") is None:
            kv.pop("sliding_window_size", None)
        if len(kv["stages"]) == 1:
            st = dict(kv.pop("stages")[0])
            st.pop("pp_rank", None)
            st.pop("cell_size", None)
            kv.update(st)
        r["kv"] = kv
    return r


def smoke_subset(cases: list[dict]) -> list[dict]:
    """A quick subset for a live CI check: tp 1, three GPU sizes, every model/variant."""
    return [
        c
        for c in cases
        if c.get("tp") == 1
        and c.get("gpu_mem_mib") in SMOKE_GPUS
        or c.get("gpu_mem_mib") is None
    ]


def compact_subset(cases: list[dict]) -> list[dict]:
    """The grid kept for releases other than the newest (file size): the smoke subset
    plus the no-flag baseline at every GPU size for tp 1 and 4."""
    smoke = {c["id"] for c in smoke_subset(cases)}
    return [
        c
        for c in cases
        if c["id"] in smoke or (c.get("variant") == "none" and c.get("tp") in (1, 4))
    ]


def _dump_run(payload: dict) -> str:
    """One result per line: diff-friendly and still valid JSON."""
    lines = ['{"meta":' + json.dumps(payload["meta"], sort_keys=True) + ',"results":[']
    res = payload["results"]
    for i, r in enumerate(res):
        lines.append(
            json.dumps(r, separators=(",", ":")) + ("," if i < len(res) - 1 else "")
        )
    lines.append("]}")
    return "\n".join(lines) + "\n"


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def compare_results(expected: list[dict], actual: list[dict]) -> list[str]:
    """Differences between two result lists (matched by id)."""
    exp = {r["id"]: r for r in expected}
    problems = []
    for r in actual:
        e = exp.get(r["id"])
        if e is None:
            problems.append(f"{r['id']}: not in the golden file")
            continue
        fe, fa = _flat(e), _flat(r)
        for k in sorted(set(fe) | set(fa)):
            if fe.get(k) != fa.get(k):
                problems.append(
                    f"{r['id']}: {k}: golden={fe.get(k)!r} live={fa.get(k)!r}"
                )
    return problems


def _summarize_diffs(lines: list[str]) -> dict:
    out: dict = {}
    for line in lines:
        case_id, field, _rest = line.split(": ", 2)
        e = out.setdefault(field, {"cases": 0, "models": [], "variants": []})
        e["cases"] += 1
        parts = case_id.split("|")
        if parts[0] not in e["models"]:
            e["models"].append(parts[0])
        if len(parts) > 1 and parts[1] not in e["variants"]:
            e["variants"].append(parts[1])
    return out


def merge_runs(paths: list[str], command: str) -> str:
    runs = []
    for p in paths:
        with open(p) as f:
            runs.append(json.load(f))
    by_version = {}
    for run in runs:  # shards of one version are concatenated
        v = run["meta"]["sglang_version"]
        if v in by_version:
            by_version[v]["results"].extend(run["results"])
            by_version[v]["meta"]["run_seconds"] += run["meta"]["run_seconds"]
            by_version[v]["meta"]["cases"] += run["meta"]["cases"]
        else:
            by_version[v] = run
    versions = sorted(
        by_version, key=lambda v: [int(x) for x in v.split(".")], reverse=True
    )
    diffs = []
    if len(versions) >= 2:
        a, b = versions[1], versions[0]
        ids_a = {r["id"] for r in by_version[a]["results"]}
        common = [r for r in by_version[b]["results"] if r["id"] in ids_a]  # older runs: compact grid
        for line in compare_results(by_version[a]["results"], common):
            diffs.append(line.replace("golden=", f"{a}=").replace("live=", f"{b}="))
    head = {
        "description": (
            "Ground truth from SGLang's own resolution code (server_args pipeline, "
            "ModelConfig, KVCacheConfigurator/pool configurators) run on a GPU-less host "
            "with the GPU capacity mocked; see tests/oracles/README.md."
        ),
        "generator": {
            "merged_by": command,
            "regenerate": [
                "python3.11 tests/oracles/sglang_oracle.py --setup $VENV",
                "$VENV/bin/python tests/oracles/sglang_oracle.py --grid --output /tmp/v0523.json",
                (
                    "$VENV/bin/python tests/oracles/sglang_oracle.py --sglang-path "
                    "$VENV/sglang-0.5.22 --grid --output /tmp/v0522.json"
                ),
                (
                    "python3 tests/oracles/sglang_oracle.py --merge /tmp/v0523.json "
                    "/tmp/v0522.json --output tests/data/sglang_oracle.json"
                ),
            ],
            "live_check": "$VENV/bin/python tests/oracles/sglang_oracle.py --grid --subset "
            "smoke --output /dev/null --compare tests/data/sglang_oracle.json",
        },
        "record_format": compact_result.__doc__.strip(),
        "versions": versions,
        "grid": {
            "gpus_mib": GRID_GPUS,
            "tp_sizes": GRID_TPS,
            "flag_variants": GRID_FLAGS,
            "flag_variant_tp_sizes": GRID_FLAG_TPS,
            "platform_presets": {k: PLATFORM_PRESETS[k] for k in GRID_PLATFORMS},
            "kv_scenario": {
                "pre_model_load_gib": f"gpu_mem_mib/1024 - {GRID_CONTEXT_OVERHEAD_GIB}",
                "weights_gib": "weights_gib[model] / (tp * pp)",
                "weights_gib_per_model": GRID_WEIGHTS_GIB,
            },
        },
        "differences": {
            "between": versions[:2][::-1],
            "count": len(diffs),
            "by_field": _summarize_diffs(diffs),
            "lines": diffs,
        },
    }
    parts = ["{" + json.dumps("header") + ":" + json.dumps(head, indent=1) + ","]
    parts.append('"runs":{')
    for i, v in enumerate(versions):
        body = _dump_run(by_version[v]).rstrip("\n")
        parts.append(
            json.dumps(v) + ":" + body + ("," if i < len(versions) - 1 else "")
        )
    parts.append("}}")
    return "\n".join(parts) + "\n"


# ----------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", help="cases JSON file ('-' = stdin, default)")
    ap.add_argument("--output", help="write results here (default stdout)")
    ap.add_argument(
        "--sglang-path",
        help="directory to put first on sys.path (a --target install of another sglang)",
    )
    ap.add_argument("--grid", action="store_true", help="run the golden grid")
    ap.add_argument(
        "--subset",
        choices=["all", "smoke", "compact"],
        default="all",
        help="with --grid: 'smoke' = tp 1 and GPUs 16384/24576/81920 only",
    )
    ap.add_argument("--shard", help="K/N: run every N-th case starting at K (0-based)")
    ap.add_argument(
        "--configs-dir",
        default=os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "..", "data", "configs"
        ),
    )
    ap.add_argument("--limit", type=int, help="only the first N cases (debugging)")
    ap.add_argument("--match", help="only cases whose id contains this substring")
    ap.add_argument("--verbose", action="store_true", help="keep sglang's log output")
    ap.add_argument(
        "--compare",
        metavar="GOLDEN",
        help="compare the results with this golden file (exit 1 on mismatch)",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        metavar="RUN",
        help="merge run outputs (one or more versions) into a golden file",
    )
    ap.add_argument("--setup", metavar="VENV", help="create the oracle venv and exit")
    ap.add_argument(
        "--versions",
        default="0.5.23,0.5.22",
        help="with --setup: main version, then extra versions (--target installs)",
    )
    ap.add_argument("--allow-cuda-torch", action="store_true")
    args = ap.parse_args(argv)

    if args.setup:
        info = setup_venv(args.setup, args.versions.split(","), args.allow_cuda_torch)
        print(json.dumps(info, indent=2))
        return 0
    if args.merge:
        text = merge_runs(
            args.merge,
            "tests/oracles/sglang_oracle.py --merge "
            + " ".join(os.path.basename(p) for p in args.merge),
        )
        write_or_print(text, args.output)
        return 0

    if args.sglang_path:
        sys.path.insert(0, os.path.abspath(args.sglang_path))

    if args.grid:
        cases = grid_cases(os.path.normpath(args.configs_dir))
        if args.subset == "smoke":
            cases = smoke_subset(cases)
        elif args.subset == "compact":
            cases = compact_subset(cases)
    else:
        if args.input in (None, "-"):
            data = json.load(sys.stdin)
        else:
            with open(args.input) as f:
                data = json.load(f)
        cases = data["cases"] if isinstance(data, dict) else data
    if args.match:
        cases = [c for c in cases if args.match in c.get("id", "")]
    if args.shard:
        k, n = (int(x) for x in args.shard.split("/"))
        cases = cases[k::n]
    if args.limit:
        cases = cases[: args.limit]

    # sglang may print while importing/resolving: keep stdout for the JSON only.
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    t0 = time.time()
    oracle = Oracle(quiet=not args.verbose)
    t1 = time.time()
    results = []
    for c in cases:
        r = oracle.run_case(c)
        if args.grid:
            for k in (
                "model",
                "variant",
                "tp",
                "gpu_mem_mib",
                "flags",
                "env",
                "platform",
                "config_overrides",
            ):
                if c.get(k) not in (None, {}, []) or k in ("gpu_mem_mib", "flags"):
                    r.setdefault(k, c.get(k))
            r.setdefault("kv_input", c.get("kv"))
            r = compact_result(r)
        results.append(r)
    t2 = time.time()
    import torch
    import transformers

    meta = {
        "sglang_version": oracle.version,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "python": sys.version.split()[0],
        "stubbed_modules": STUBBED,
        "capacity_refs_patched": oracle.patched_capacity_refs,
        "import_seconds": round(oracle.import_s, 2),
        "startup_seconds": round(t1 - t0, 2),
        "cases": len(cases),
        "run_seconds": round(t2 - t1, 2),
    }
    payload = {"meta": meta, "results": results}
    text = _dump_run(payload)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        real_stdout.write(text)
        real_stdout.flush()

    if args.compare:
        with open(args.compare) as f:
            golden = json.load(f)
        runs = golden.get("runs", {})
        if oracle.version not in runs:
            print(
                f"golden file has no run for sglang {oracle.version}", file=sys.stderr
            )
            return 1
        problems = compare_results(runs[oracle.version]["results"], results)
        for p in problems[:50]:
            print("MISMATCH", p, file=sys.stderr)
        print(
            f"compared {len(results)} cases against {args.compare} "
            f"(sglang {oracle.version}): {len(problems)} mismatches",
            file=sys.stderr,
        )
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
