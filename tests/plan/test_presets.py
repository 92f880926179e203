"""Presets: each sets its values with a stated reason, an explicit flag wins, WSL2 adds its margin."""

from __future__ import annotations

import pytest

from launcher.common.errors import UsageError
from launcher.common.units import GiB, MiB
from launcher.plan import presets
from launcher.plan.presets import Explicit, apply, is_wsl2, length_args

DEFAULT = 256 * MiB
A100 = 84_987_740_160  # cudaMemGetInfo total of an A100-SXM4-80GB (79.15 GiB)
WSL2_KERNEL = ("Linux version 5.15.153.1-microsoft-standard-WSL2 (root@941d701f84f1) "
               "(gcc (GCC) 11.2.0, GNU ld (GNU Binutils) 2.37) #1 SMP Fri Mar 29 23:14:13 UTC 2024")
NATIVE_KERNEL = "Linux version 6.8.0-45-generic (buildd@lcy02-amd64-115) (x86_64-linux-gnu-gcc-13) #45-Ubuntu SMP"


def test_wsl2_detected_from_proc_version() -> None:
    assert is_wsl2(WSL2_KERNEL)
    assert is_wsl2("Linux version 4.4.0-19041-Microsoft (Microsoft@Microsoft.com)")  # WSL1 spells it capitalised
    assert not is_wsl2(NATIVE_KERNEL)
    assert not is_wsl2("")


def test_no_preset_native_kernel_changes_nothing() -> None:
    settings = apply(None, Explicit(), default_margin_bytes=DEFAULT, gpu_total_bytes=A100, proc_version=NATIVE_KERNEL)
    assert (DEFAULT, None, 1, None, ()) == (settings.margin_bytes, settings.max_gpu_memory_bytes,
                                            settings.concurrency, settings.max_model_len, settings.notes)


def test_online_long_keeps_prefill_room_and_says_so() -> None:
    settings = apply("online-long", Explicit(), default_margin_bytes=DEFAULT, gpu_total_bytes=A100)
    assert 1.5 * GiB == settings.margin_bytes
    assert 4 == settings.concurrency
    assert settings.max_gpu_memory_bytes is None and settings.max_model_len is None
    assert settings.notes[0].startswith("preset online-long: keeps 1.5 GiB free for prefill peaks")


def test_shared_caps_at_a_fraction_of_the_cuda_total() -> None:
    settings = apply("shared", Explicit(), default_margin_bytes=DEFAULT, gpu_total_bytes=A100)
    assert int(A100 * 0.45) == settings.max_gpu_memory_bytes
    assert (1 * GiB, 4) == (settings.margin_bytes, settings.concurrency)


def test_debug_caps_length_below_the_model_maximum() -> None:
    settings = apply("debug", Explicit(), default_margin_bytes=DEFAULT, gpu_total_bytes=A100)
    assert ("--max-model-len", "4096") == length_args(settings, length_flag="--max-model-len", model_max_len=32768)
    assert ("--context-length", "2048") == length_args(settings, length_flag="--context-length", model_max_len=2048)
    assert () == length_args(apply("online", Explicit(), default_margin_bytes=DEFAULT, gpu_total_bytes=A100),
                             length_flag="--max-model-len", model_max_len=32768)


def test_explicit_flags_win_and_the_notes_say_so() -> None:
    explicit = Explicit(margin_bytes=2 * GiB, max_gpu_memory_bytes=30 * GiB, concurrency=2, length_pinned=True)
    settings = apply("debug", explicit, default_margin_bytes=DEFAULT, gpu_total_bytes=A100)
    assert (2 * GiB, 30 * GiB, 2, None) == (settings.margin_bytes, settings.max_gpu_memory_bytes,
                                            settings.concurrency, settings.max_model_len)
    joined = "\n".join(settings.notes)
    assert "--margin 2.00 GiB given: preset margin 0.50 GiB not used" in joined
    assert "--max-gpu-memory given: preset cap 80% not used" in joined
    assert "--concurrency 2 given: preset's 1 not used" in joined
    assert "length pinned after --: preset cap 4096 not used" in joined


def test_pinned_memory_flag_keeps_the_preset_cap_out() -> None:
    settings = apply("shared", Explicit(memory_pinned=True), default_margin_bytes=DEFAULT, gpu_total_bytes=A100)
    assert settings.max_gpu_memory_bytes is None
    assert any("memory flag pinned" in n for n in settings.notes)


def test_cap_does_not_apply_on_cpu() -> None:
    settings = apply("shared", Explicit(), default_margin_bytes=DEFAULT, gpu_total_bytes=None)
    assert settings.max_gpu_memory_bytes is None
    assert any("does not apply on CPU" in n for n in settings.notes)


def test_wsl2_kernel_adds_margin_on_top_of_a_preset() -> None:
    settings = apply("online-long", Explicit(), default_margin_bytes=DEFAULT, gpu_total_bytes=A100,
                     proc_version=WSL2_KERNEL)
    assert 2.5 * GiB == settings.margin_bytes
    assert any(n.startswith("WSL2 (the kernel says WSL2 (/proc/version)): margin + 1.00 GiB") for n in settings.notes)


def test_wsl2_preset_and_kernel_add_the_margin_once() -> None:
    settings = apply("wsl2", Explicit(), default_margin_bytes=DEFAULT, gpu_total_bytes=A100, proc_version=WSL2_KERNEL)
    assert DEFAULT + 1 * GiB == settings.margin_bytes
    assert settings.notes[0].startswith("preset wsl2: Windows keeps part of the GPU's memory")


def test_wsl2_explicit_margin_wins() -> None:
    settings = apply(None, Explicit(margin_bytes=100 * MiB), default_margin_bytes=DEFAULT, gpu_total_bytes=A100,
                     proc_version=WSL2_KERNEL)
    assert 100 * MiB == settings.margin_bytes
    assert ("WSL2: --margin given, so no WSL2 margin is added",) == settings.notes


def test_unknown_preset_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="debug, online, online-long, shared, wsl2"):
        apply("fast", Explicit(), default_margin_bytes=DEFAULT, gpu_total_bytes=A100)


@pytest.mark.parametrize("name", presets.names())
def test_every_preset_states_a_reason_and_sets_something(name: str) -> None:
    preset = presets.get(name)
    assert len(preset.reason) > 20 and preset.summary
    assert any(v is not None for v in (preset.margin_bytes, preset.max_gpu_memory_fraction, preset.concurrency,
                                       preset.max_model_len)) or preset.wsl2
    fraction = preset.max_gpu_memory_fraction
    assert fraction is None or 0 < fraction < 1
