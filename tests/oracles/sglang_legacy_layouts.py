"""The layouts oracle's KV drivers for every SGLang release (tests/oracles/sglang_layouts.py).

`LayoutOracle` is `sglang_oracle.Oracle` (same patches: no GPU, capacity mocked) with a KV
driver chosen by feature detection in the release that is importable, each calling that
release's own code and returning the record of `Oracle._kv` (0.5.19+):

  resolve_once      0.5.19+: `Oracle._kv` itself (KVCacheConfigurator + pool configurators);
  configurator      0.5.16-0.5.18: `mem_cache/kv_cache_configurator.py` KVCacheConfigurator built
                    as model_runner.py builds it (a ParallelState, `adjust_hybrid_swa_layer_ids`
                    per stage), then `create_memory_pool_configurator` and
                    `_resolve_memory_pool_config`, as in 0.5.19+;
  runner_configurator  0.5.13-0.5.15: the pool configurators take the ModelRunner; a stand-in
                    runner (the release's ModelRunner class, its __init__ skipped, the attributes
                    its __init__ / load_model set) gets `_resolve_memory_pool_config`;
  runner            0.5.1-0.5.12: the stand-in runner's own `init_memory_pool`, run until the
                    first pool is allocated (the request-table class, patched to stop there and
                    report its size): profile_max_num_token, the mamba cache, the hybrid SWA
                    split, the page floor and max_num_reqs are all the release's.

Releases without ``runtime_context.override_platform`` (<= 0.5.18) get the platform facts by
patching the probe functions (`is_sm90_supported`, `is_hopper_with_cuda_12_3`, ...) wherever a
sglang module bound them, for the case's duration. Where a driver cannot reproduce a step
without the model's weights or modules (0.5.1-0.5.2's hybrid SWA split walks the loaded model's
attention layers), the record keeps an `OracleUnsupported` error instead of a guess.
"""

# ruff: noqa: BLE001
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import sys
from types import SimpleNamespace

from sglang_oracle import Oracle, _err

# runtime_context._PLATFORM_PROBES / _PLATFORM_VALUES (0.5.21): fact -> probe name(s) in utils.
_PROBES = {
    "is_cuda": ("is_cuda",),
    "is_sm90": ("is_sm90_supported",),
    "is_sm100": ("is_sm100_supported",),
    "is_sm100_or_sm110": ("is_sm100_or_sm110_supported",),
    "is_sm110": ("is_sm110_supported",),
    "is_sm120": ("is_sm120_supported",),
    "is_blackwell": ("is_blackwell_supported", "is_blackwell"),
    "is_hopper_with_cuda_12_3": ("is_hopper_with_cuda_12_3",),
    "has_flashinfer": ("is_flashinfer_available",),
    "device_sm": ("get_device_sm",),
    "device_capability": ("get_device_capability",),
}


class _Stop(Exception):
    """Raised by the patched request-table class: init_memory_pool has sized everything."""

    def __init__(self, kwargs: dict):
        super().__init__("pool sized")
        self.kwargs = kwargs


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _call(fn, **kwargs):
    """`fn` with the keyword arguments its signature takes (releases add and drop some)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(**kwargs)
    return fn(**{k: v for k, v in kwargs.items() if k in params})


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


class LayoutOracle(Oracle):
    def __init__(self, quiet: bool = True):
        super().__init__(quiet=quiet)
        if not self.legacy:
            self.kv_driver = "resolve_once"
        elif _has("sglang.srt.mem_cache.kv_cache_configurator"):
            self.kv_driver = "configurator"
        elif _has("sglang.srt.model_executor.pool_configurator"):
            self.kv_driver = "runner_configurator"
        else:
            self.kv_driver = "runner"
        if self.legacy:
            # Import the KV path once, before any case patches the platform probes: a module
            # imported under a patched is_cuda() would take its CUDA-only import-time branches
            # (0.5.13 layers/moe/topk.py registers sgl_kernel fakes under `if _is_cuda`).
            self._stub_runner_imports()
            for name in ("sglang.srt.model_executor.model_runner", "sglang.srt.mem_cache.kv_cache_configurator",
                         "sglang.srt.model_executor.pool_configurator"):
                if _has(name):
                    importlib.import_module(name)

    # -- platform facts on releases without override_platform -------------------------------

    def _legacy_platform(self, facts: dict):
        return _patched_probes(facts)

    # -- KV ----------------------------------------------------------------------------------

    def _kv_legacy(self, sa, spec: dict) -> dict:
        with _process_groups(sa):
            if self.kv_driver == "configurator":
                with _parallel_context(sa):
                    return self._kv_configurator(sa, spec)
            return self._kv_runner(sa, spec)

    # 0.5.16-0.5.18 ------------------------------------------------------------------------

    def _kv_configurator(self, sa, spec: dict) -> dict:
        self._stub_runner_imports()
        import sglang.srt.mem_cache.kv_cache_configurator as kvcm
        import torch
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.distributed.parallel_state_wrapper import ParallelState
        from sglang.srt.distributed.utils import get_pp_indices
        from sglang.srt.mem_cache import kv_cache_dtype as kvd
        from sglang.srt.model_executor.model_runner_components import layer_setup
        from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator
        from sglang.srt.runtime_context import get_schedule, publish
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        publish(sa, role="scheduler")
        mc = self._mc
        tp, pp = sa.tp_size, sa.pp_size
        attn_tp = tp // (sa.dp_size if getattr(sa, "enable_dp_attention", False) else 1)
        page_size = get_schedule().page_size
        spec_alg = SpeculativeAlgorithm.from_string(sa.speculative_algorithm)
        resolved_str, kv_dtype = _call(
            kvd.configure_kv_cache_dtype, server_args_kv_cache_dtype=sa.kv_cache_dtype, model=None,
            model_dtype=mc.dtype, is_draft_worker=False, is_dflash=False,
            speculative_draft_attention_backend=None, speculative_draft_kv_cache_dtype=None)
        kv_dtype_str = resolved_str if resolved_str is not None else sa.kv_cache_dtype
        sliding = self._sliding_window(mc)
        spec_aux = self._spec_aux(sa, mc, spec_alg)

        def make_kvc(pp_rank: int):
            # model_runner.py: adjust_hybrid_swa_layer_ids trims the config's full/SWA layer ids
            # to this stage, so each stage gets its own ModelConfig.
            stage_mc = ModelConfig.from_server_args(sa) if pp > 1 else mc
            start, end = get_pp_indices(stage_mc.num_hidden_layers, pp_rank, pp)
            li = _call(layer_setup.resolve_layer_indices, model=SimpleNamespace(start_layer=start, end_layer=end),
                       model_config=stage_mc, is_draft_worker=False, spec_algorithm=spec_alg)
            adjust = getattr(layer_setup, "adjust_hybrid_swa_layer_ids", None)
            if adjust is not None:
                adjust(model_config=stage_mc, start_layer=li.start_layer, end_layer=li.end_layer,
                       is_hybrid_swa=stage_mc.is_hybrid_swa)
            ps = ParallelState.trivial(tp_size=tp, pp_size=pp, pp_rank=pp_rank, attn_tp_size=attn_tp,
                                       dp_size=sa.dp_size)
            fields = {f.name for f in dataclasses.fields(kvcm.KVCacheConfigurator) if f.init}
            values = dict(
                device="cuda", gpu_id=0, ps=ps, pp_group=None, model=None, model_config=stage_mc, server_args=sa,
                kv_cache_dtype=kv_dtype, kv_cache_dtype_str=kv_dtype_str, model_dtype=stage_mc.dtype,
                page_size=page_size, sliding_window_size=sliding, spec_algorithm=spec_alg, is_draft_worker=False,
                post_capture_kv_active=False, spec_aux_config=spec_aux, is_hybrid_swa=stage_mc.is_hybrid_swa,
                is_hybrid_swa_compress=getattr(stage_mc, "is_hybrid_swa_compress", False),
                use_mla_backend=stage_mc.attention_arch.name == "MLA", layer_info=li, forward_stream=None,
                req_to_token_pool=None, token_to_kv_pool_allocator=None, memory_pool_config=None,
                draft_model_idx=None, attn_dp_size=1, pp_size=pp)
            missing = fields - set(values)
            if missing:
                raise RuntimeError(f"oracle: KVCacheConfigurator fields not provided: {sorted(missing)}")
            return kvcm.KVCacheConfigurator(**{k: v for k, v in values.items() if k in fields}), li, stage_mc

        res = self._kv_head(mc, kv_dtype, attn_tp, page_size, sliding)
        if mc.attention_arch.name == "MLA":
            res["mla_kv_cache_dim"] = _call(kvcm.calculate_mla_kv_cache_dim, model_config=mc,
                                            kv_cache_dtype=kv_dtype, server_args=sa)
        kvcs = []
        for r in range(pp):
            kvc, li, stage_mc = make_kvc(r)
            conf = create_memory_pool_configurator(kvc)
            st = {"pp_rank": r, "layers": li.num_effective_layers, "configurator": type(conf).__name__,
                  "cell_size": conf._cell_size}
            if stage_mc.is_hybrid_swa and getattr(stage_mc, "full_attention_layer_ids", None) is not None:
                st["full_layers"] = len(stage_mc.full_attention_layer_ids)
                st["swa_layers"] = len(stage_mc.swa_attention_layer_ids or [])
            res["stages"].append(st)
            kvcs.append(kvc)
        res["cell_size"] = res["stages"][0]["cell_size"]
        P, A = self._scenario(spec)
        if P is None:
            return res
        res["pre_model_load_gib"], res["available_gib"] = P, A
        with self._kv_patches(kvcm, A) as pp_min:
            if pp > 1:
                caps = []
                for kvc in kvcs:
                    caps.append(kvc.config_from_budget(kvc._profile_available_bytes(P)).max_total_num_tokens)
                pp_min["v"] = min(caps)
                res["per_stage_tokens"] = caps
            kvc = kvcs[0]
            try:
                res["budget_bytes"] = kvc._profile_available_bytes(P)
                cfg = kvc._resolve_memory_pool_config(P)
            except Exception as e:
                res["error"] = _err(e)
                return res
        res["max_total_num_tokens"] = cfg.max_total_num_tokens
        if kvc.mambaish_config is not None:
            res["mamba"] = self._mamba_record(kvc.mambaish_config, slots_per_request=kvc._calculate_mamba_ratio())
        res["max_running_requests"] = cfg.max_running_requests
        if cfg.full_max_total_num_tokens is not None:
            res["full_max_total_num_tokens"] = cfg.full_max_total_num_tokens
            res["swa_max_total_num_tokens"] = cfg.swa_max_total_num_tokens
        del torch
        return res

    # 0.5.1-0.5.15 -------------------------------------------------------------------------

    def _kv_runner(self, sa, spec: dict) -> dict:
        """A stand-in of the release's ModelRunner (its class, __init__ skipped) with the attributes
        its __init__ and load_model set, then its own pool code."""
        import torch

        self._stub_runner_imports()
        from sglang.srt.model_executor.model_runner import ModelRunner

        mc = self._mc
        tp, pp = sa.tp_size, sa.pp_size
        attn_tp = tp // (sa.dp_size if getattr(sa, "enable_dp_attention", False) else 1)
        runner_mod = sys.modules[ModelRunner.__module__]
        mixin_mod = sys.modules.get("sglang.srt.model_executor.model_runner_kv_cache_mixin")
        mods = [m for m in (runner_mod, mixin_mod) if m is not None]
        res = None
        runners = []
        P, A = self._scenario(spec)
        for r in range(pp):
            runner = self._stand_in(ModelRunner, sa, r)
            runners.append(runner)
            if res is None:
                res = self._kv_head(runner.model_config, runner.kv_cache_dtype, attn_tp, sa.page_size,
                                    runner.sliding_window_size)
                if mc.attention_arch.name == "MLA" and hasattr(runner, "calculate_mla_kv_cache_dim"):
                    with self._runner_patches(mods, A, attn_tp):
                        res["mla_kv_cache_dim"] = runner.calculate_mla_kv_cache_dim()
            res["stages"].append(self._runner_stage(runner, r, mods, A, attn_tp))
        res["cell_size"] = res["stages"][0]["cell_size"]
        if P is None:
            return res
        res["pre_model_load_gib"], res["available_gib"] = P, A
        if self.kv_driver == "runner_configurator":
            return self._runner_configurator_pool(runners, res, mods, P, A, attn_tp)
        return self._runner_pool(runners, res, mods, P, A, attn_tp, torch)

    def _runner_stage(self, runner, r: int, mods, A, attn_tp) -> dict:
        st = {"pp_rank": r, "layers": runner.num_effective_layers}
        with self._runner_patches(mods, A, attn_tp):
            if self.kv_driver == "runner_configurator":
                from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator

                conf = create_memory_pool_configurator(runner)
                st["configurator"] = type(conf).__name__
                st["cell_size"] = conf._cell_size
            else:
                st["configurator"] = "ModelRunner"  # profile_max_num_token / get_cell_size_per_token
                st["cell_size"] = self._runner_cell_size(runner)
        mc = runner.model_config
        if getattr(runner, "is_hybrid_swa", getattr(runner, "is_hybrid", False)) and \
                getattr(mc, "full_attention_layer_ids", None) is not None:
            st["full_layers"] = len(mc.full_attention_layer_ids)
            st["swa_layers"] = len(mc.swa_attention_layer_ids or [])
        return st

    @staticmethod
    def _runner_cell_size(runner) -> int | None:
        """The cell the release's profile_max_num_token divides by: its get_cell_size_per_token
        (0.5.3+), or, in 0.5.1-0.5.2 where the arithmetic sits inside profile_max_num_token, that
        function run on a budget of exactly 2^30 bytes (rest = 1 GiB) with a cell recovered as
        2^30 // tokens only where it divides; else None."""
        if hasattr(runner, "get_cell_size_per_token"):
            if getattr(runner, "mambaish_config", None) is not None:
                mamba = runner.mambaish_config
                layers = len([i for i in mamba.full_attention_layer_ids
                              if runner.start_layer <= i < runner.end_layer])
            else:
                layers = runner.num_effective_layers
            return runner.get_cell_size_per_token(layers)
        return None

    def _runner_configurator_pool(self, runners, res, mods, P, A, attn_tp) -> dict:
        runner = runners[0]
        with self._runner_patches(mods, A, attn_tp, pp_min=None) as pp_min:
            if len(runners) > 1:
                caps = []
                for other in runners:
                    budget = other._profile_available_bytes(P)
                    caps.append(self._runner_budget_tokens(other, budget))
                pp_min["v"] = min(caps)
                res["per_stage_tokens"] = caps
            try:
                res["budget_bytes"] = runner._profile_available_bytes(P)
                cfg = runner._resolve_memory_pool_config(P)
            except Exception as e:
                res["error"] = _err(e)
                return res
        res["max_total_num_tokens"] = cfg.max_total_num_tokens
        if getattr(runner, "mambaish_config", None) is not None:
            res["mamba"] = self._mamba_record(runner.mambaish_config, slots_per_request=runner._calculate_mamba_ratio(),
                                              server_args=runner.server_args)
        res["max_running_requests"] = cfg.max_running_requests
        if getattr(cfg, "full_max_total_num_tokens", None) is not None:
            res["full_max_total_num_tokens"] = cfg.full_max_total_num_tokens
            res["swa_max_total_num_tokens"] = cfg.swa_max_total_num_tokens
        return res

    @staticmethod
    def _runner_budget_tokens(runner, budget: int) -> int:
        from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator

        return create_memory_pool_configurator(runner).calculate_pool_sizes(
            budget, runner.server_args.page_size).max_total_num_tokens

    def _runner_pool(self, runners, res, mods, P, A, attn_tp, torch) -> dict:
        """init_memory_pool until its first allocation (every stage for the PP minimum)."""
        caps = []
        stop = None
        runner = runners[0]
        if self._legacy_swa_from_model() and getattr(runner, "is_hybrid", False) and \
                not any("Llama4" in a for a in runner.model_config.hf_config.architectures or []):
            # 0.5.1-0.5.2 set_num_token_hybrid (model_runner.py:1142-1222) splits the pool by walking
            # the loaded model's attention layers (layer.self_attn.attn.sliding_window_size): not
            # without the model.
            res["error"] = {"type": "OracleUnsupported",
                            "message": "hybrid SWA split needs the loaded model's layers (set_num_token_hybrid)"}
            return res
        takes_reqs = "max_num_reqs" in inspect.signature(type(runner).init_memory_pool).parameters
        sa = runner.server_args
        args = (P, sa.max_running_requests, sa.max_total_tokens) if takes_reqs else (P,)
        for runner in reversed(runners):  # stage 0 last: its state is the record's
            with self._runner_patches(mods, A, attn_tp, pp_min=None, stop=True) as pp_min:
                if len(runners) > 1 and runner is runners[0]:
                    pp_min["v"] = min(caps)
                try:
                    runner.init_memory_pool(*args)
                except _Stop as s:
                    stop = s
                except Exception as e:
                    if runner is runners[0]:
                        res["error"] = _err(e)
                        return res
                    raise
                else:
                    raise RuntimeError("oracle: init_memory_pool allocated no request table")
            caps.append(int(runner.max_total_num_tokens))
        if len(runners) > 1:
            res["per_stage_tokens"] = list(reversed(caps))
        runner = runners[0]
        budget = self._runner_budget(runner, mods, P, A, attn_tp)
        if budget is not None:
            res["budget_bytes"] = budget
        res["max_total_num_tokens"] = int(runner.max_total_num_tokens)
        if getattr(runner, "full_max_total_num_tokens", None) is not None and \
                getattr(runner, "is_hybrid_swa", getattr(runner, "is_hybrid", False)):
            res["full_max_total_num_tokens"] = int(runner.full_max_total_num_tokens)
            res["swa_max_total_num_tokens"] = int(runner.swa_max_total_num_tokens)
        res["max_running_requests"] = int(stop.kwargs["size"])
        mamba = getattr(runner, "mambaish_config", None)
        if mamba is not None:
            res["mamba"] = self._mamba_record(mamba, slots_per_request=self._runner_mamba_ratio(runner),
                                              server_args=runner.server_args)
        elif getattr(runner, "is_hybrid_gdn", False):
            res["mamba"] = self._gdn_record_052(runner)
        return res

    @staticmethod
    def _gdn_record_052(runner) -> dict:
        """0.5.1-0.5.2: Qwen3NextConfig.hybrid_gdn_params / mamba_cache_per_req (configs/qwen3_next.py:284-330);
        one state slot per request (init_memory_pool: max_num_reqs = min(.., max_mamba_cache_size))."""
        cfg = runner.model_config.hf_config
        conv, temporal, conv_dtype, ssm_dtype, layers = cfg.hybrid_gdn_params
        sa = runner.server_args
        return {"extra_buffer": False, "config_class": type(cfg).__name__, "state_layers": len(layers),
                "full_attention_layers": len(cfg.full_attention_layer_ids), "conv_shapes": [list(conv)],
                "temporal_shape": list(temporal), "conv_dtype": _dtype_name(conv_dtype),
                "temporal_dtype": _dtype_name(ssm_dtype), "cache_per_req": int(cfg.mamba_cache_per_req),
                "mamba_full_memory_ratio": None, "max_mamba_cache_size": sa.max_mamba_cache_size,
                "slots_per_request": 1}

    def _runner_budget(self, runner, mods, P, A, attn_tp) -> int | None:
        """The bytes profile_max_num_token divides by the cell: the release's own profile run once more
        with a cell of one byte (0.5.3-0.5.12, where the cell is get_cell_size_per_token; after
        init_memory_pool, so that the state pool it sized is taken as set). None in 0.5.1-0.5.2."""
        if not hasattr(runner, "get_cell_size_per_token") or not hasattr(runner, "profile_max_num_token"):
            return None
        runner.get_cell_size_per_token = lambda num_layers: 1
        try:
            with self._runner_patches(mods, A, attn_tp):
                return int(runner.profile_max_num_token(P))
        finally:
            del runner.get_cell_size_per_token

    @staticmethod
    def _runner_mamba_ratio(runner) -> int | None:
        """init_memory_pool's inline ratio (0.5.7-0.5.12 mixin), or _calculate_mamba_ratio where it exists."""
        if hasattr(runner, "_calculate_mamba_ratio"):
            return runner._calculate_mamba_ratio()
        mod = sys.modules.get("sglang.srt.model_executor.model_runner_kv_cache_mixin")
        sa = runner.server_args
        if mod is None:
            return None
        extra = 0
        if callable(getattr(sa, "enable_mamba_extra_buffer", None)) and sa.enable_mamba_extra_buffer():
            extra = mod.MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP if runner.spec_algorithm.is_none() else \
                mod.MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_OVERLAP
        return 1 if sa.disable_radix_cache else mod.MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO + extra

    # -- the stand-in runner ---------------------------------------------------------------

    def _stand_in(self, ModelRunner, sa, pp_rank: int):
        """The release's ModelRunner without __init__, given what __init__ / load_model set on
        the path to init_memory_pool (read from each release's model_runner.py)."""
        import torch
        from sglang.srt.configs.model_config import AttentionArch, ModelConfig
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        mc = ModelConfig.from_server_args(sa) if sa.pp_size > 1 else self._mc
        runner = object.__new__(type("OracleRunner", (ModelRunner,), {}))
        tp, pp = sa.tp_size, sa.pp_size
        try:
            from sglang.srt.distributed.utils import get_pp_indices

            start, end = get_pp_indices(mc.num_hidden_layers, pp_rank, pp)
        except Exception:
            start, end = 0, mc.num_hidden_layers
        values = dict(
            mem_fraction_static=sa.mem_fraction_static, device="cuda", gpu_id=0, tp_rank=0, tp_size=tp,
            moe_ep_rank=0, moe_ep_size=1, pp_rank=pp_rank, pp_size=pp, dp_size=sa.dp_size, model_config=mc,
            server_args=sa, is_draft_worker=False, is_generation=True, is_multimodal=mc.is_multimodal,
            spec_algorithm=SpeculativeAlgorithm.from_string(sa.speculative_algorithm), page_size=sa.page_size,
            req_to_token_pool=None, token_to_kv_pool_allocator=None,
            use_mla_backend=mc.attention_arch == AttentionArch.MLA,
            attention_chunk_size=getattr(mc, "attention_chunk_size", None), start_layer=start, end_layer=end,
            num_effective_layers=end - start, dtype=mc.dtype, model=SimpleNamespace(start_layer=start, end_layer=end),
            memory_pool_config=None, forward_stream=None,
        )
        values.update(dp_size=sa.dp_size if getattr(sa, "enable_dp_attention", False) else 1,
                      attn_cp_size=getattr(sa, "attn_cp_size", 1), moe_dp_size=getattr(sa, "moe_dp_size", 1),
                      is_hybrid_swa_compress=getattr(mc, "is_hybrid_swa_compress", False), draft_model_idx=None,
                      enable_hisparse=getattr(sa, "enable_hisparse", False))
        unset = getattr(sys.modules[ModelRunner.__module__], "_UNSET", None)
        if unset is not None:
            values["_linear_attn_registry_cache"] = unset
        for k, v in values.items():
            with contextlib.suppress(AttributeError):  # read-only properties (is_hybrid_gdn, mambaish_config)
                setattr(runner, k, v)
        self._stand_in_hybrid(runner, mc, sa)
        runner.sliding_window_size = self._sliding_window_legacy(mc)
        self._stand_in_swa(runner, mc, sa, start, end)
        adjust = getattr(runner, "adjust_hybrid_swa_layers_for_pp", None)  # 0.5.13-0.5.15, after start/end
        if adjust is not None:
            adjust()
        elif _inline_stage_split(ModelRunner):
            # 0.5.7-0.5.12: the same trim inline in ModelRunner.initialize (0.5.9 model_runner.py:538-551),
            # after start/end are known; copied here as the release writes it.
            full = [i for i in range(start, end + 1) if hasattr(mc, "full_attention_layer_ids")
                    and i in mc.full_attention_layer_ids]
            swa = [i for i in range(start, end + 1) if hasattr(mc, "swa_attention_layer_ids")
                   and i in mc.swa_attention_layer_ids]
            mc.swa_attention_layer_ids = swa
            mc.full_attention_layer_ids = full
        self._stand_in_kv_dtype(runner, sa, torch)
        if not hasattr(ModelRunner, "mambaish_config") and getattr(runner, "is_hybrid_gdn", False):
            # 0.5.1-0.5.2 model_runner.py:308-322: a hybrid GDN model (Qwen3-Next) turns the radix
            # cache off and sizes its state pool at --max-running-requests, else 512 slots.
            sa.disable_radix_cache = True
            if sa.max_mamba_cache_size is None:
                sa.max_mamba_cache_size = sa.max_running_requests if sa.max_running_requests is not None else 512
            sa.max_mamba_cache_size //= sa.dp_size if sa.enable_dp_attention else 1
        return runner

    @staticmethod
    def _stand_in_hybrid(runner, mc, sa) -> None:
        """`is_hybrid` (0.5.1-0.5.5) / `is_hybrid_swa` (0.5.6+): the model config's, as __init__ copies it."""
        for name in ("is_hybrid", "is_hybrid_swa"):
            if hasattr(mc, name):
                with contextlib.suppress(AttributeError):
                    setattr(runner, name, getattr(mc, name))

    def _stand_in_swa(self, runner, mc, sa, start: int, end: int) -> None:
        """0.5.1-0.5.2: __init__ turns the pool hybrid after load_model when the model has a
        sliding window (model_runner.py:298-306) and set_num_token_hybrid walks the loaded model's
        layers; 0.5.3+: the layer ids come from the config (get_hybrid_layer_ids)."""
        if self._legacy_swa_from_model() and not sa.disable_hybrid_swa_memory and \
                runner.sliding_window_size is not None and runner.sliding_window_size > 0:
            archs = mc.hf_config.architectures or []
            if archs and not any("Llama4" in a for a in archs):
                runner.is_hybrid = mc.is_hybrid = True

    def _legacy_swa_from_model(self) -> bool:
        from sglang.srt.model_executor.model_runner import ModelRunner

        return hasattr(ModelRunner, "set_num_token_hybrid")

    def _sliding_window_legacy(self, mc):
        """`self.sliding_window_size` as load_model sets it (0.5.2 model_runner.py:769-775, 0.5.9
        :1021-1031, 0.5.13 :1410-1420): the model class's get_attention_sliding_window_size() where
        the class defines one (every such class returns its module's function of the config, or
        `config.sliding_window - 1`), else the config's window for a hybrid SWA config (0.5.5+),
        else the attention chunk."""
        arch = (mc.hf_config.architectures or [""])[0]
        module = model_classes().get(arch)
        if module is not None and module in window_modules():
            try:
                m = importlib.import_module(f"sglang.srt.models.{module}")
                fn = getattr(m, "get_attention_sliding_window_size", None)
                if fn is not None:
                    return fn(mc.hf_text_config)
            except Exception:
                pass
            window = getattr(mc.hf_text_config, "sliding_window", None)
            return window - 1 if isinstance(window, int) else None
        if getattr(mc, "is_hybrid_swa", False) and getattr(mc, "sliding_window_size", None) is not None \
                and not self._legacy_swa_from_model():
            return mc.sliding_window_size
        return getattr(mc, "attention_chunk_size", None)

    @staticmethod
    def _stand_in_kv_dtype(runner, sa, torch) -> None:
        """`self.kv_cache_dtype` as the release sets it before init_memory_pool (0.5.3+ in
        configure_kv_cache_dtype; 0.5.1-0.5.2 inside init_memory_pool itself)."""
        fn = getattr(runner, "configure_kv_cache_dtype", None)
        if fn is not None:
            try:
                fn()
                return
            except Exception:
                pass
        table = {"auto": runner.dtype, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
                 "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
        runner.kv_cache_dtype = table.get(sa.kv_cache_dtype, runner.dtype)

    def _stub_runner_imports(self) -> None:
        if getattr(self, "_legacy_runner_stubs", False):
            return
        from sglang_oracle import stub_legacy_runner_imports

        stub_legacy_runner_imports()
        self._legacy_runner_stubs = True

    # -- shared pieces -----------------------------------------------------------------------

    @staticmethod
    def _scenario(spec: dict) -> tuple[float | None, float | None]:
        P = spec.get("pre_model_load_gib")
        if P is None:
            return None, None
        A = spec.get("available_gib")
        if A is None:
            A = P - float(spec.get("weights_gib", 0.0))
        return P, A

    @staticmethod
    def _kv_head(mc, kv_dtype, attn_tp: int, page_size: int, sliding) -> dict:
        import torch

        return {"kv_dtype": _dtype_name(kv_dtype), "kv_dtype_bytes": torch._utils._element_size(kv_dtype),
                "num_kv_heads_per_rank": mc.get_num_kv_heads(attn_tp), "head_dim": mc.head_dim,
                "v_head_dim": getattr(mc, "v_head_dim", mc.head_dim), "page_size": page_size,
                "sliding_window_size": sliding, "stages": []}

    @contextlib.contextmanager
    def _kv_patches(self, kvcm, A):
        """get_available_gpu_memory -> A, all_reduce -> the PP minimum, gc.collect -> no-op."""
        import torch

        pp_min: dict = {"v": None}

        def fake_all_reduce(tensor, op=None, group=None, async_op=False):
            if pp_min["v"] is not None:
                tensor.fill_(min(int(tensor.item()), pp_min["v"]))

        saved = (kvcm.get_available_gpu_memory, torch.distributed.all_reduce, getattr(kvcm, "gc", None),
                 kvcm.__dict__.get("get_world_group", _MISSING))
        kvcm.get_available_gpu_memory = lambda *a, **k: A
        kvcm.get_world_group = lambda: SimpleNamespace(world_size=1, cpu_group=None)
        torch.distributed.all_reduce = fake_all_reduce
        if saved[2] is not None:
            kvcm.gc = SimpleNamespace(collect=lambda *a, **k: 0)
        try:
            yield pp_min
        finally:
            kvcm.get_available_gpu_memory, torch.distributed.all_reduce = saved[0], saved[1]
            if saved[3] is _MISSING:
                kvcm.__dict__.pop("get_world_group", None)
            else:
                kvcm.get_world_group = saved[3]
            if saved[2] is not None:
                kvcm.gc = saved[2]

    @contextlib.contextmanager
    def _runner_patches(self, mods, A, attn_tp: int, pp_min=None, stop: bool = False):
        """The runner modules' globals: free memory A, a one-rank world, the attention TP size,
        the PP minimum; with `stop`, the request-table classes raise _Stop with their arguments."""
        import torch

        state: dict = {"v": None}

        def fake_all_reduce(tensor, op=None, group=None, async_op=False):
            if state["v"] is not None:
                tensor.fill_(min(int(tensor.item()), state["v"]))

        def stopper(*a, **k):
            raise _Stop(k)

        patches = {"get_available_gpu_memory": lambda *a, **k: A,
                   "get_world_group": lambda: SimpleNamespace(world_size=1, cpu_group=None),
                   "get_attention_tp_size": lambda: attn_tp}
        if stop:
            for name in ("ReqToTokenPool", "HybridReqToTokenPool"):
                patches[name] = stopper
        saved = [(mod, k, mod.__dict__.get(k, _MISSING)) for mod in mods for k in patches]
        for mod in mods:
            for k, v in patches.items():
                if k in mod.__dict__ or k.startswith("get_"):
                    mod.__dict__[k] = v
        pc = sys.modules.get("sglang.srt.model_executor.pool_configurator")
        pc_saved = []
        if pc is not None:
            for k in ("get_attention_tp_size",):
                if k in pc.__dict__:
                    pc_saved.append((k, pc.__dict__[k]))
                    pc.__dict__[k] = patches[k]
        saved_ar = torch.distributed.all_reduce
        torch.distributed.all_reduce = fake_all_reduce
        try:
            yield state
        finally:
            torch.distributed.all_reduce = saved_ar
            for mod, k, v in saved:
                if v is _MISSING:
                    mod.__dict__.pop(k, None)
                else:
                    mod.__dict__[k] = v
            for k, v in pc_saved:
                pc.__dict__[k] = v

    @staticmethod
    def _mamba_record(config, *, slots_per_request, server_args=None) -> dict:
        """As Oracle._mamba_summary, from whichever release holds the sizes (the schedule bag
        0.5.16+, else server_args)."""
        cp = config.mamba2_cache_params
        ratio = max_size = None
        try:
            from sglang.srt.runtime_context import get_schedule

            sched = get_schedule()
            ratio, max_size = sched.mamba_full_memory_ratio, sched.max_mamba_cache_size
        except Exception:
            pass
        if server_args is not None and max_size is None:
            ratio = getattr(server_args, "mamba_full_memory_ratio", None)
            max_size = getattr(server_args, "max_mamba_cache_size", None)
        extra = None
        try:
            from sglang.srt.runtime_context import mamba_extra_buffer_enabled

            extra = bool(mamba_extra_buffer_enabled())
        except Exception:
            fn = getattr(server_args, "enable_mamba_extra_buffer", None)
            if callable(fn):
                extra = bool(fn())
        shape = cp.shape
        return {
            "extra_buffer": extra,
            "config_class": type(config).__name__,
            "state_layers": len(cp.layers),
            "full_attention_layers": len(config.full_attention_layer_ids),
            "conv_shapes": [list(s) for s in shape.conv],
            "temporal_shape": list(shape.temporal),
            "conv_dtype": _dtype_name(cp.dtype.conv),
            "temporal_dtype": _dtype_name(cp.dtype.temporal),
            "cache_per_req": int(cp.mamba_cache_per_req),
            "mamba_full_memory_ratio": ratio,
            "max_mamba_cache_size": max_size,
            "slots_per_request": slots_per_request,
        }


_MISSING = object()


def _inline_stage_split(ModelRunner) -> bool:
    """Whether ModelRunner.initialize trims the hybrid SWA layer ids to the stage inline."""
    try:
        return "range(self.start_layer, self.end_layer + 1)" in inspect.getsource(ModelRunner.initialize)
    except (OSError, TypeError, AttributeError):
        return False


def _models_dir() -> str:
    import sglang.srt.models as models

    return list(models.__path__)[0]


_SCAN: dict = {}


def model_classes() -> dict[str, str]:
    """architecture -> module name in sglang/srt/models of the release importable: the names its
    ModelRegistry collects (each module's `EntryClass`, models/registry.py import_model_classes),
    read from the source so that a module that cannot be imported on this host still counts."""
    if "classes" not in _SCAN:
        import ast
        import os

        found: dict[str, str] = {}
        root = _models_dir()
        for fname in sorted(os.listdir(root)):
            if not fname.endswith(".py"):
                continue
            try:
                tree = ast.parse(open(os.path.join(root, fname)).read())
            except (SyntaxError, UnicodeDecodeError):
                continue
            for node in tree.body:
                targets = node.targets if isinstance(node, ast.Assign) else []
                if any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in targets):
                    value = node.value
                    items = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
                    for item in items:
                        if isinstance(item, ast.Name):
                            found.setdefault(item.id, fname[:-3])
        _SCAN["classes"] = found
    return _SCAN["classes"]


def window_modules() -> set[str]:
    """Modules in sglang/srt/models whose classes define get_attention_sliding_window_size."""
    if "window" not in _SCAN:
        import os

        root = _models_dir()
        _SCAN["window"] = {f[:-3] for f in os.listdir(root) if f.endswith(".py")
                           and "def get_attention_sliding_window_size(self" in open(os.path.join(root, f)).read()}
    return _SCAN["window"]


@contextlib.contextmanager
def _process_groups(sa):
    """The process groups a GPU run initializes (distributed/parallel_state.py `_WORLD`, `_TP`,
    `_ATTN_TP`, `_PP`, ...; layers/dp_attention.py's attention-DP sizes), as one rank of the case's
    TP x PP sees them: the config classes' `mamba2_cache_params` and the pool code ask them for
    the attention TP size. Restored afterwards."""
    import sglang.srt.distributed.parallel_state as ps

    tp, pp = sa.tp_size, sa.pp_size
    dp = sa.dp_size if getattr(sa, "enable_dp_attention", False) else 1
    attn_tp = tp // dp

    def group(n):
        return SimpleNamespace(world_size=n, rank_in_group=0, rank=0, local_rank=0, ranks=list(range(n)),
                               cpu_group=None, device_group=None, first_rank=0, last_rank=n - 1,
                               is_first_rank=True, is_last_rank=n == 1)

    groups = {"_WORLD": group(1), "_TP": group(tp), "_ATTN_TP": group(attn_tp), "_ATTN_CP": group(1),
              "_MOE_DP": group(1), "_MOE_EP": group(1), "_MOE_TP": group(tp), "_PP": group(pp)}
    saved = {k: ps.__dict__[k] for k in groups if k in ps.__dict__}
    for k in saved:
        if saved[k] is None:
            ps.__dict__[k] = groups[k]
    dpa = sys.modules.get("sglang.srt.layers.dp_attention")
    dp_values = {"_ATTN_DP_RANK": 0, "_ATTN_DP_SIZE": dp, "_LOCAL_ATTN_DP_SIZE": dp, "_LOCAL_ATTN_DP_RANK": 0,
                 "_ATTN_TP_SIZE": attn_tp, "_ATTN_TP_RANK": 0}
    dp_saved = {k: dpa.__dict__[k] for k in dp_values if dpa is not None and k in dpa.__dict__}
    for k in dp_saved:
        if dp_saved[k] is None:
            dpa.__dict__[k] = dp_values[k]
    try:
        yield
    finally:
        ps.__dict__.update(saved)
        if dpa is not None:
            dpa.__dict__.update(dp_saved)


@contextlib.contextmanager
def _parallel_context(sa):
    """0.5.16-0.5.18 read the parallel sizes from `runtime_context.get_parallel()`, which falls back
    to the process groups a GPU run initializes: forced to one rank of the case's TP x PP."""
    from sglang.srt.runtime_context import get_parallel

    par = get_parallel()
    tp, pp = sa.tp_size, sa.pp_size
    attn_tp = tp // (sa.dp_size if getattr(sa, "enable_dp_attention", False) else 1)
    values = dict(world_size=tp * pp, world_rank=0, tp_size=tp, tp_rank=0, pp_size=pp, pp_rank=0,
                  moe_ep_size=1, moe_ep_rank=0, moe_dp_size=1, moe_dp_rank=0, moe_tp_size=tp, moe_tp_rank=0,
                  attn_tp_size=attn_tp, attn_tp_rank=0, attn_cp_size=1, attn_cp_rank=0, dcp_size=1, dcp_rank=0,
                  dcp_enabled=False, attn_dcp_size=1, attn_dcp_rank=0, attn_dp_size=1, attn_dp_rank=0,
                  world_group=SimpleNamespace(cpu_group=None, world_size=1), pp_group=None)
    import sglang.srt.runtime_context as rc

    known = getattr(rc, "_PARALLEL_FIELDS", set(values))
    with par.override(**{k: v for k, v in values.items() if k in known}):
        yield


@contextlib.contextmanager
def _patched_probes(facts: dict):
    """Every sglang module's binding of a platform probe answers the fact for the case."""
    fakes = {}
    for fact, value in facts.items():
        for name in _PROBES.get(fact, ()):
            fakes[name] = (lambda v: (lambda *a, **k: v))(tuple(value) if isinstance(value, list) else value)
    originals: dict[str, object] = {}

    def apply():
        for modname, mod in list(sys.modules.items()):
            if mod is None or not modname.startswith("sglang"):
                continue
            d = getattr(mod, "__dict__", {})
            for name, fake in fakes.items():
                cur = d.get(name)
                if callable(cur) and cur is not fake:
                    originals.setdefault(name, cur)
                    d[name] = fake

    apply()
    try:
        yield
    finally:
        for modname, mod in list(sys.modules.items()):
            if mod is None or not modname.startswith("sglang"):
                continue
            d = getattr(mod, "__dict__", {})
            for name, fake in fakes.items():
                if d.get(name) is fake and name in originals:
                    d[name] = originals[name]
