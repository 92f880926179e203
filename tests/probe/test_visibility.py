"""`CUDA_VISIBLE_DEVICES` with CUDA's rules (launcher/probe/visibility.py): pure, no NVML."""

from __future__ import annotations

import pytest

from launcher.common.units import GiB
from launcher.model.gpu import GpuDevice
from launcher.probe import resolve_visible


def _gpu(index: int, uuid: str, *, mig_mode: bool = False, name: str = "NVIDIA H100 80GB HBM3") -> GpuDevice:
    return GpuDevice(index=index, name=name, total_bytes=80 * GiB, free_bytes=80 * GiB, uuid=uuid, mig_mode=mig_mode)


def _mig(index: int, slot: int, uuid: str) -> GpuDevice:
    return GpuDevice(index=index, name="NVIDIA A100 MIG 3g.40gb", total_bytes=40 * GiB, free_bytes=40 * GiB,
                     uuid=uuid, mig_index=slot, mig_mode=True)


NODE = (
    _gpu(0, "GPU-aaaa1111-0000-0000-0000-000000000000"),
    _gpu(1, "GPU-aaaa2222-0000-0000-0000-000000000000"),
    _gpu(2, "GPU-bbbb3333-0000-0000-0000-000000000000"),
    _gpu(3, "GPU-cccc4444-0000-0000-0000-000000000000"),
)
MIG_NODE = (
    _gpu(0, "GPU-aaaa1111-0000-0000-0000-000000000000"),
    _gpu(1, "GPU-dddd5555-0000-0000-0000-000000000000", mig_mode=True),
    _mig(1, 0, "MIG-eeee0000-0000-0000-0000-000000000000"),
    _mig(1, 3, "MIG-ffff0003-0000-0000-0000-000000000000"),
)


class TestResolveVisible:
    @pytest.mark.parametrize(
        ("value", "labels"),
        [
            pytest.param(None, ["GPU 0", "GPU 1", "GPU 2", "GPU 3"], id="unset-all"),
            pytest.param("", [], id="empty-none"),
            pytest.param("  ", [], id="blank-none"),
            pytest.param("2", ["GPU 2"], id="one"),
            pytest.param("3,1", ["GPU 3", "GPU 1"], id="cuda-order"),
            pytest.param(" 1 , 2 ", ["GPU 1", "GPU 2"], id="spaces"),
            pytest.param("0,7,1", ["GPU 0"], id="stop-at-out-of-range"),
            pytest.param("0,x,1", ["GPU 0"], id="stop-at-garbage"),
            pytest.param("-1", [], id="minus-one-hides-all"),
            pytest.param("1,-1,2", ["GPU 1"], id="minus-one-stops"),
            pytest.param("2abc", ["GPU 2"], id="ordinal-prefix-like-strtol"),
            pytest.param("0,0", [], id="duplicate-none"),
            pytest.param("1,2,1", [], id="late-duplicate-none"),
            pytest.param("GPU-bbbb3333-0000-0000-0000-000000000000", ["GPU 2"], id="full-uuid"),
            pytest.param("GPU-cccc,GPU-bbbb", ["GPU 3", "GPU 2"], id="abbreviated-uuids"),
            pytest.param("GPU-CCCC", ["GPU 3"], id="uuid-case-insensitive"),
            pytest.param("GPU-aaaa", [], id="ambiguous-prefix-invalid"),
            pytest.param("GPU-aaaa2,GPU-aaaa", ["GPU 1"], id="ambiguous-prefix-stops"),
            pytest.param("GPU-9999", [], id="unknown-uuid"),
            pytest.param("0,GPU-bbbb", ["GPU 0"], id="no-mixing-index-then-uuid"),
            pytest.param("GPU-bbbb,0", ["GPU 2"], id="no-mixing-uuid-then-index"),
            pytest.param("bbbb3333-0000-0000-0000-000000000000", [], id="uuid-needs-prefix"),
        ],
    )
    def test_whole_gpus(self, value: str | None, labels: list[str]) -> None:
        """CUDA's rules for indices and UUIDs pick and order the visible GPUs."""
        assert labels == [device.label for device in resolve_visible(NODE, value)]

    @pytest.mark.parametrize(
        ("value", "labels"),
        [
            pytest.param(None, ["GPU 1 MIG 0"], id="unset-first-mig-only"),
            pytest.param("0", ["GPU 0"], id="non-mig-gpu"),
            pytest.param("1", ["GPU 1 MIG 0"], id="mig-parent-by-index"),
            pytest.param("0,1", ["GPU 1 MIG 0"], id="mig-parent-hides-others"),
            pytest.param("MIG-ffff0003-0000-0000-0000-000000000000", ["GPU 1 MIG 3"], id="mig-uuid"),
            pytest.param("MIG-ffff", ["GPU 1 MIG 3"], id="mig-uuid-prefix"),
            pytest.param("MIG-ffff,MIG-eeee", ["GPU 1 MIG 3"], id="one-mig-per-process"),
            pytest.param("GPU-dddd", ["GPU 1 MIG 0"], id="mig-parent-by-uuid"),
            pytest.param("MIG-GPU-dddd5555-0000-0000-0000-000000000000/1/0", [], id="legacy-mig-form-unsupported"),
        ],
    )
    def test_mig(self, value: str | None, labels: list[str]) -> None:
        """A process sees at most one MIG instance, and a MIG-enabled GPU only through one."""
        assert labels == [device.label for device in resolve_visible(MIG_NODE, value)]

    def test_mig_gpu_without_instances_is_skipped(self) -> None:
        """A GPU with MIG on but no instance runs nothing, so it is not visible."""
        devices = (_gpu(0, "GPU-aaaa1111-0000-0000-0000-000000000000", mig_mode=True), NODE[1])

        assert ["GPU 1"] == [device.label for device in resolve_visible(devices, None)]
