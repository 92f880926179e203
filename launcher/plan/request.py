"""Gathering a plan's inputs at the edge, once: model, GPUs (probe or catalog), engine version,
pinned flags, calibration. The CLI hands over typed options; the planner gets a `PlanRequest`.

This is the only place (with `launcher.probe`) that reads the machine and the environment for
a plan, so everything below it stays pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.common.errors import ProbeError, UsageError
from launcher.model.gpu import GpuDevice, HostMemory
from launcher.plan import presets
from launcher.plan.types import DEFAULT_MARGIN_BYTES, Calibration, PinnedFlags, PlanRequest

if TYPE_CHECKING:
    from launcher.common.devlock import DeviceLock



@dataclass(frozen=True)
class PlanOptions:
    """What the operator asked for on the command line, before anything is probed."""

    model: str
    engine: str = "vllm"
    gpu_specs: tuple[str, ...] = ()  # --gpu: hypothetical GPUs instead of the probe
    device: str = "cuda"
    concurrency: int | None = None  # None: not given (1, or the preset's)
    max_gpu_memory: str | None = None  # a size as typed (parsed here)
    margin: str | None = None  # a size as typed; None: DEFAULT_MARGIN_BYTES (or the preset's)
    preset: str | None = None  # launcher.plan.presets: a deployment shape; explicit options win
    engine_version: str | None = None
    trust_engine: bool = False
    use_calibration: bool = True
    engine_args: tuple[str, ...] = ()  # after `--`, exactly as given
    # `engine_args` parsed by the engine's adapter, once per command: the lock, the plan, the
    # calibration key, the health address and the argv all read this.
    pinned: PinnedFlags = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        from launcher.engines import adapter

        try:
            engine = adapter(self.engine)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        object.__setattr__(self, "pinned", engine.pin(self.engine_args))


def engine_args_after_dashes(raw: Sequence[str]) -> tuple[str, ...]:
    """The engine flags given after `--` (click normally drops the `--` itself)."""
    args = tuple(raw)
    return args[1:] if args[:1] == ("--",) else args


def build_request(options: PlanOptions, env: Mapping[str, str]) -> PlanRequest:
    """The `PlanRequest` for `options`: resolves the model, probes or builds the GPUs."""
    from launcher.engines import adapter
    from launcher.engines.versions import installed_beside, installed_version
    from launcher.model.resolve import load_profile, model_from_profile, resolve_model

    engine = adapter(options.engine)
    installed = installed_version(options.engine)
    version = options.engine_version or installed
    # What is installed beside the engine describes the engine that will run: only when it is the one planned.
    packages = installed_beside(options.engine) if installed is not None and version == installed else None
    flag_warnings = engine.check_engine_args(options.engine_args, version)  # exit 2 before any Hub lookup
    # --trust-engine: a checkpoint whose weights cannot be sized still resolves; the planner
    # refuses it and the engine sizes it (launcher.serve.start.prepare).
    model = resolve_model(options.model, env=env, unsized_ok=options.trust_engine)
    variants = tuple(model_from_profile(p) for p in (load_profile(a) for a in model.quantized_variants) if p)
    gpus, host = _devices(options, env)
    calibration: Calibration | None = None
    calibration_warnings: tuple[str, ...] = ()
    if options.use_calibration:
        device_bytes = max((g.usable_total_bytes for g in gpus), default=host.total_bytes if host else None)
        calibration, calibration_warnings = _load_calibration(
            env, calibration_key_for(options.engine, version, gpus, model.name, options.pinned), device_bytes)
    settings = _preset_settings(options, gpus, model.geometry.text_config)
    pinned = options.pinned
    preset_length = presets.length_value(settings, model_max_len=_model_max_len(model.geometry.text_config))
    if preset_length is not None:
        pinned = engine.pinned_with(pinned, engine.length_flag, preset_length)
    return PlanRequest(
        model=model, engine=options.engine, device=options.device, gpus=gpus, host=host, engine_version=version,
        engine_version_assumed=version is None,
        engine_args=pinned.argv, pinned=pinned, engine_env={k: env[k] for k in engine.env_keys if k in env},
        engine_packages=packages,
        concurrency=settings.concurrency, max_gpu_memory_bytes=settings.max_gpu_memory_bytes,
        margin_bytes=settings.margin_bytes, trust_engine=options.trust_engine, variants=variants,
        calibration=calibration, notes=(*settings.notes, *flag_warnings, *_spanned_totals(gpus)),
        warnings=calibration_warnings,
        allow_long_max_model_len=env.get(engine.allow_long_env, "").strip().lower() in ("1", "true"),
        vmm_unavailable="WSL2's GPU driver maps no virtual memory" if settings.wsl2 else None,
    )


def _preset_settings(options: PlanOptions, gpus: Sequence[GpuDevice], text_config: Mapping[str, object]
                     ) -> presets.Settings:
    """Margin, cap, concurrency and length from the options, the preset where none was given,
    and the WSL2 margin where the kernel says so."""
    from launcher.common.units import parse_size_or_share
    from launcher.engines import adapter

    engine = adapter(options.engine)
    pinned = options.pinned
    total = presets.smallest_total([g.usable_total_bytes for g in gpus])  # what `50%` is a share of
    explicit = presets.Explicit(
        margin_bytes=parse_size_or_share(options.margin, total) if options.margin else None,
        max_gpu_memory_bytes=parse_size_or_share(options.max_gpu_memory, total) if options.max_gpu_memory else None,
        concurrency=options.concurrency, length_pinned=engine.length_flag in pinned,
        memory_pinned=bool(set(pinned.values) & engine.memory_flags))
    return presets.apply(options.preset, explicit, default_margin_bytes=DEFAULT_MARGIN_BYTES,
                         gpu_total_bytes=total,
                         proc_version=_read_proc_version() if options.device == "cuda" else "")


def _model_max_len(text_config: Mapping[str, object]) -> int:
    """An upper bound for a preset's length cap; the engine's own rule still applies after it."""
    value = text_config.get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else 1 << 30


def _read_proc_version() -> str:
    try:
        return Path("/proc/version").read_text(errors="replace")
    except OSError:
        return ""


def _spanned_totals(gpus: Sequence[GpuDevice]) -> tuple[str, ...]:
    """Catalog cards whose CUDA total spans setups (ECC state unknown): said once per card name."""
    return tuple(dict.fromkeys(f"{gpu.name}: {gpu.notes[0]}" for gpu in gpus if gpu.cuda_total_why and gpu.notes))


def _devices(options: PlanOptions, env: Mapping[str, str]) -> tuple[tuple[GpuDevice, ...], HostMemory | None]:
    """The host for --device cpu, hypothetical GPUs for --gpu, else what NVML shows."""
    if options.device == "cpu":
        from launcher.probe import probe_host

        return (), probe_host()
    if options.gpu_specs:
        from launcher.model.catalog import hypothetical_gpus

        return hypothetical_gpus(options.gpu_specs), None
    from launcher.probe import probe_inventory

    inventory = probe_inventory(env)
    if not inventory.visible:
        raise ProbeError("no GPU is visible to the engine (CUDA_VISIBLE_DEVICES hides them all)",
                         hint="use --gpu NAME for a hypothetical plan, or --device cpu")
    return inventory.visible, inventory.host


def _load_calibration(env: Mapping[str, str], key: str, device_bytes: int | None
                      ) -> tuple[Calibration | None, tuple[str, ...]]:
    """The checked calibration of `key` and at most one warning about what in the file was ignored."""
    from launcher.common.paths import state_dir
    from launcher.plan.calibration import read_calibration

    return read_calibration(state_dir(env), key, max_bytes=device_bytes)


def calibration_key_for(engine: str, version: str | None, gpus: Sequence[GpuDevice], model: str,
                        pinned: PinnedFlags) -> str:
    """The setup a measurement belongs to: engine, version, GPUs, model, memory-relevant flags."""
    from launcher.engines import adapter
    from launcher.plan.calibration import calibration_key

    engine_adapter = adapter(engine)
    gpu_name = f"{len(gpus)} x {gpus[0].name}" if gpus else "cpu"
    return calibration_key(gpu_name=gpu_name, model=model, engine=engine, engine_version=version or "newest",
                           key_flags=engine_adapter.calibration_key_flags,
                           pinned=pinned.values)


def lock_live_devices(options: PlanOptions, timeout_s: float) -> DeviceLock | None:
    """Take the start lock on the GPUs the engine will use, before the plan reads free memory.

    Concurrent starts on one GPU must not mis-size each other (vLLM #55827): the lock is held
    from reading free memory until the engine has sized its KV cache.
    """
    from launcher.common.devlock import DeviceLock
    from launcher.engines import adapter

    if options.device == "cpu":  # CPU launches size their KV cache from the same free RAM
        from launcher.common.devlock import host_lock

        host = host_lock(timeout_s=timeout_s)
        host.acquire()
        return host
    if options.gpu_specs:
        return None  # a hypothetical GPU: nothing shared to lock
    from launcher.probe import probe_inventory

    engine = adapter(options.engine)
    used = engine.gpus_on_node(options.pinned.values)
    visible = probe_inventory(cuda_totals=False).visible[:used]  # identities only: no CUDA query
    lock = DeviceLock([g.uuid for g in visible if g.uuid], timeout_s=timeout_s)
    lock.acquire()
    return lock
