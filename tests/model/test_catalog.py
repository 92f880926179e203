"""Hypothetical GPUs for --gpu: catalog spellings, sizes, counts, and the bounds on them."""

from __future__ import annotations

import time

import pytest

from launcher.common.errors import UsageError
from launcher.common.units import GiB, MiB
from launcher.model.catalog import MAX_GPUS, hypothetical_gpus, normalise


class TestGpuSpellings:
    @pytest.mark.parametrize("spec", ["rtx4090", "RTX-4090", "RTX 4090", "NVIDIA GeForce RTX 4090", "rtx_4090"])
    def test_rtx4090_as_people_type_it(self, spec: str) -> None:
        """Every common spelling finds the RTX 4090 entry (24564 MiB in nvidia-smi)."""
        (gpu,) = hypothetical_gpus([spec])
        assert gpu.name == "NVIDIA GeForce RTX 4090" and gpu.total_bytes == 24564 * MiB

    @pytest.mark.parametrize(("spec", "name"), [("a100-80gb", "NVIDIA A100-SXM4-80GB"), ("l40s", "NVIDIA L40S"),
                                                ("h100", "NVIDIA H100 80GB HBM3")])
    def test_catalog_names(self, spec: str, name: str) -> None:
        """Data-centre cards match their short names."""
        assert hypothetical_gpus([spec])[0].name == name

    def test_l40s_cuda_total_is_below_nvml(self) -> None:
        """The L40S shows 46068 MiB to nvidia-smi but 44.42 GiB to CUDA; vLLM sizes from CUDA's."""
        (gpu,) = hypothetical_gpus(["l40s"])
        assert gpu.total_bytes == 46068 * MiB and round(gpu.usable_total_bytes / GiB, 2) == 44.42

    @pytest.mark.parametrize(("spec", "count", "total"), [
        ("24GiB", 1, 24 * GiB), ("44.4GiB", 1, int(44.4 * GiB)), ("24576MiB", 1, 24576 * MiB),
        ("80GB", 1, 80 * 10**9), ("2xA100-80GB", 2, 81920 * MiB), ("1x24576MiB", 1, 24576 * MiB),
    ])
    def test_sizes_and_counts(self, spec: str, count: int, total: int) -> None:
        """Sizes with units and decimals, and counts, give that many idle devices."""
        gpus = hypothetical_gpus([spec])
        assert len(gpus) == count and all(g.total_bytes == total for g in gpus)
        assert [g.index for g in gpus] == list(range(count))

    def test_unknown_gpu_names_the_catalog(self) -> None:
        """A name that is not in the catalog says so and lists what is."""
        with pytest.raises(UsageError, match="not a GPU in the catalog"):
            hypothetical_gpus(["rtx9999"])


class TestBounds:
    def test_a_hundred_million_gpus_is_refused_at_once(self) -> None:
        """`100000000xrtx4090` used to build 10**8 device records (minutes, 1.6 GB) before failing."""
        started = time.monotonic()
        with pytest.raises(UsageError) as caught:
            hypothetical_gpus(["100000000xrtx4090"])
        assert time.monotonic() - started < 0.5
        assert str(caught.value) == "--gpu '100000000xrtx4090': at most 1024 GPUs in all can be planned for"

    def test_limit_is_inclusive_and_counts_all_specs(self) -> None:
        """1024 is fine; 1024 plus one more spec is not."""
        assert len(hypothetical_gpus([f"{MAX_GPUS}xh100"])) == 1024
        with pytest.raises(UsageError, match="at most 1024 GPUs in all"):
            hypothetical_gpus([f"{MAX_GPUS}xh100", "rtx4090"])

    def test_count_of_5000_digits_is_a_usage_error(self) -> None:
        """int() of more than 4300 digits raises ValueError; the count is bounded before that."""
        with pytest.raises(UsageError, match="at most 1024"):
            hypothetical_gpus(["9" * 5000 + "xh100"])

    @pytest.mark.parametrize("spec", ["0xh100", "000xh100"])
    def test_zero_count(self, spec: str) -> None:
        with pytest.raises(UsageError, match="the count must be at least 1"):
            hypothetical_gpus([spec])

    @pytest.mark.parametrize(("spec", "fragment"), [
        ("1" + "0" * 310 + "GiB", "cannot read size"), ("2x1" + "0" * 310, "cannot read size"),
        ("512KiB", "a GPU needs some memory"), ("4096TiB", "larger than 1 PiB"),
    ])
    def test_absurd_sizes(self, spec: str, fragment: str) -> None:
        with pytest.raises(UsageError, match=fragment):
            hypothetical_gpus([spec])

    def test_long_unknown_name_is_cut_short(self) -> None:
        with pytest.raises(UsageError) as caught:
            hypothetical_gpus(["z" * 10_000])
        assert str(caught.value).startswith("--gpu '" + "z" * 40 + "...': not a GPU in the catalog")

    def test_normalise(self) -> None:
        assert normalise("NVIDIA GeForce RTX-4090") == "rtx4090" and normalise("Tesla_V100 16GB") == "v10016gb"


class TestEccOptionalCards:
    """RTX A6000 / RTX 6000 Ada: ECC optional. Unknown state spans ECC on (low end) to ECC off."""

    ON_ADA = 47706349240  # 44.43 GiB published with ECC on (NVML 46068 MiB), +/- 5368709 B of print
    RESERVE, RESERVE_ERROR = 542 * MiB, 226 * MiB  # the typical reserve where no total is published

    def test_unknown_state_spans_both(self) -> None:
        (ada,) = hypothetical_gpus(["rtx6000ada"])
        low = self.ON_ADA - 5368709
        high = 49140 * MiB - self.RESERVE + self.RESERVE_ERROR
        assert ada.usable_total_bytes == (low + high) // 2 == 49448327577
        assert ada.usable_total_error_bytes == (high - low) // 2 == 1747347046
        assert ada.cuda_total_why and ada.total_bytes == 46068 * MiB  # SGLang's default fraction: ECC on's
        assert "--gpu rtx6000ada-ecc or rtx6000ada-noecc" in ada.notes[0]
        assert "44.42-47.68 GiB" in ada.notes[0]

    @pytest.mark.parametrize("spec", ["rtx6000ada-ecc", "RTX 6000 Ada ECC", "rtx6000ada_eccon"])
    def test_ecc_on_is_the_published_total(self, spec: str) -> None:
        (ada,) = hypothetical_gpus([spec])
        assert (ada.total_bytes, ada.usable_total_bytes, ada.usable_total_error_bytes) == (
            46068 * MiB, self.ON_ADA, 5368709)
        assert ada.cuda_total_why is None and ada.notes[0] == "ECC on, as given"

    @pytest.mark.parametrize("spec", ["rtx6000ada-noecc", "rtx6000ada-ecc-off"])
    def test_ecc_off_is_nvml_less_the_reserve(self, spec: str) -> None:
        (ada,) = hypothetical_gpus([spec])
        assert (ada.total_bytes, ada.usable_total_bytes, ada.usable_total_error_bytes) == (
            49140 * MiB, 49140 * MiB - self.RESERVE, self.RESERVE_ERROR)

    def test_a6000_has_no_published_total_either_way(self) -> None:
        (a6000,) = hypothetical_gpus(["a6000"])
        low, high = 46068 * MiB - self.RESERVE - self.RESERVE_ERROR, 49140 * MiB - self.RESERVE + self.RESERVE_ERROR
        assert (a6000.usable_total_bytes, a6000.usable_total_error_bytes) == ((low + high) // 2, (high - low) // 2)
        (on,) = hypothetical_gpus(["2xa6000-ecc"])[:1]
        assert on.usable_total_bytes == 46068 * MiB - self.RESERVE

    @pytest.mark.parametrize("spec", ["h100-ecc", "l40s-noecc", "t4-ecc"])
    def test_cards_with_one_setup_refuse_a_state(self, spec: str) -> None:
        with pytest.raises(UsageError, match="knows one memory setup"):
            hypothetical_gpus([spec])

    def test_ecc_alone_is_not_a_card(self) -> None:
        with pytest.raises(UsageError, match="not a GPU in the catalog"):
            hypothetical_gpus(["ecc"])
