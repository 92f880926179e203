"""The catalog's CUDA totals are the published ones (tests/data/cuda-totals.yaml, copied from
../shared/data): per card, the median of its Linux totals and the spread as its band; the typical
reserve for cards without one from the same data."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.common.paths import load_yaml, profiles_dir
from launcher.common.units import GiB, MiB
from launcher.model import cuda_totals as ct
from launcher.model.catalog import find, hypothetical_gpus, load_catalog
from launcher.model.gpu import CUDA_RESERVE_BYTES, CUDA_RESERVE_ERROR_BYTES, GpuDevice

DATA = Path(__file__).resolve().parents[1] / "data" / "cuda-totals.yaml"
OBSERVATIONS = ct.load(DATA)
CATALOG = load_catalog()


@pytest.mark.parametrize("card", CATALOG, ids=[c.name for c in CATALOG])
def test_catalog_total_is_the_published_one(card: ct.CatalogGpu) -> None:
    derived = ct.derive(card, OBSERVATIONS, CATALOG)
    if derived is None:
        assert card.cuda_total_bytes is None, f"{card.name}: a CUDA total with no published observation"
        return
    assert (card.cuda_total_bytes, card.cuda_total_error_bytes) == (derived.total_bytes, derived.error_bytes)


def test_observations_map_to_the_right_cards() -> None:
    def card(gpu: str, variant: str, note: str = "", nvml: int | None = None) -> str | None:
        found = ct.card_for(ct.Observation(gpu, variant, 1, "s", note, nvml), CATALOG)
        return found.name if found else None

    assert card("NVIDIA H100 (80GB)", "80GB") == "NVIDIA H100 80GB HBM3"
    assert card("H100 HBM3 (8xH100 HBM3)", "80GB HBM3") == "NVIDIA H100 80GB HBM3"
    assert card("A100", "80GB (variant not stated)") == "NVIDIA A100-SXM4-80GB"
    assert card("NVIDIA A100 40GB", "40GB") == "NVIDIA A100-SXM4-40GB"
    assert card('A100 ("one A100")', "40GB class (variant not stated)") is None
    # An RTX 6000 Ada with ECC on (NVML 46068 MiB) is the card's ECC-on setup; another NVML total is
    # another memory setup nobody catalogued.
    assert card("NVIDIA RTX 6000 Ada Generation", "48GB", nvml=46068) == "NVIDIA RTX 6000 Ada Generation"
    assert card("NVIDIA RTX 6000 Ada Generation", "48GB", nvml=47000) is None
    assert card("NVIDIA L40S", "48GB", nvml=49140) is None  # L40S: ECC on, not optional in the catalog
    assert card("NVIDIA GeForce RTX 5090 Laptop GPU", "24GB") is None
    assert not ct.usable(ct.Observation("RTX 4080", "16GB", 1, "s", "a round total typical of Windows/WDDM"))


@pytest.mark.parametrize("card", [c for c in CATALOG if c.ecc_on is not None], ids=lambda c: c.name)
def test_ecc_on_total_is_the_published_one(card: ct.CatalogGpu) -> None:
    assert card.ecc_on is not None
    derived = ct.derive(card, OBSERVATIONS, CATALOG, ecc_on=True)
    on = card.ecc_on
    if derived is None:
        assert on.cuda_total_bytes is None, f"{card.name}: an ECC-on CUDA total with no published observation"
        return
    assert (on.cuda_total_bytes, on.cuda_total_error_bytes) == (derived.total_bytes, derived.error_bytes)


def test_ecc_state_of_an_observation() -> None:
    """The NVML total tells the ECC state; without it, a CUDA total under the ECC-on NVML total can only
    be ECC on (ECC takes 3 GiB of a 48 GB card, the driver's reserve under 1 GiB)."""
    ada = find("rtx6000ada")
    assert ada is not None and ada.ecc_on is not None and ada.ecc_on.nvml_total_bytes == 46068 * MiB
    def obs(total_gib: float, nvml: int | None = None) -> ct.Observation:
        return ct.Observation("NVIDIA RTX 6000 Ada Generation", "48GB", int(total_gib * GiB), "s", "", nvml)
    assert ct.with_ecc_on(obs(44.43, 46068), ada) and not ct.with_ecc_on(obs(44.43, 49140), ada)
    assert ct.with_ecc_on(obs(44.43), ada) and not ct.with_ecc_on(obs(47.45), ada)
    assert not ct.with_ecc_on(obs(44.42), find("l40s"))  # type: ignore[arg-type]
    # The only published RTX 6000 Ada total (MTVCrafter#21, NVML 46068 MiB) is its ECC-on total, not
    # the ECC-off card's: that stays NVML less the typical reserve.
    assert ada.cuda_total_bytes is None and round(ada.ecc_on.cuda_total_bytes / GiB, 2) == 44.43  # type: ignore[operator]


def test_the_spread_is_the_band() -> None:
    """RTX 3090: 23.58 (vLLM 0.6.4 host), 23.68, 23.70, 23.70 GiB: median 23.69, farthest 0.11 away."""
    card = find("rtx3090")
    assert card is not None
    assert round(card.cuda_total_bytes / GiB, 2) == 23.69 and round(card.cuda_total_error_bytes / GiB, 2) == 0.11
    device = hypothetical_gpus(["rtx3090"])[0]
    assert device.usable_total_error_bytes == card.cuda_total_error_bytes


def test_leaving_a_source_out_rebuilds_from_the_others() -> None:
    l40 = "https://github.com/NVlabs/Eagle/issues/68"  # the only L40 total
    rebuilt = {c.name: c for c in ct.catalog_without(CATALOG, OBSERVATIONS, l40)}
    assert rebuilt["NVIDIA L40"].cuda_total_bytes is None
    # Two A100-SXM4-40GB totals on two drivers (39.38 in vLLM issue 16570, 39.56 in an Unsloth notebook): the
    # catalog holds their median and half their spread; without the issue, the notebook's alone.
    a100 = "https://github.com/vllm-project/vllm/issues/16570"
    assert (find("a100-40gb").cuda_total_bytes, find("a100-40gb").cuda_total_error_bytes) == (  # type: ignore[union-attr]
        round((39.38 + 39.56) / 2 * GiB), round(0.09 * GiB))
    rebuilt = {c.name: c for c in ct.catalog_without(CATALOG, OBSERVATIONS, a100)}
    assert rebuilt["NVIDIA A100-SXM4-40GB"].cuda_total_bytes == round(39.56 * GiB)
    assert rebuilt["NVIDIA H100 80GB HBM3"].cuda_total_bytes == find("h100").cuda_total_bytes  # type: ignore[union-attr]
    ada = "https://github.com/DINGYANB/MTVCrafter/issues/21"  # the only RTX 6000 Ada total, ECC on
    rebuilt_ada = {c.name: c for c in ct.catalog_without(CATALOG, OBSERVATIONS, ada)}["NVIDIA RTX 6000 Ada Generation"]
    assert rebuilt_ada.ecc_on is not None and rebuilt_ada.ecc_on.cuda_total_bytes is None
    assert find("rtx6000ada").ecc_on.cuda_total_bytes is not None  # type: ignore[union-attr]


def _uncertain_nvml(name: str) -> bool:
    raw = load_yaml((profiles_dir() / "gpus.yaml").read_text())
    entry = next(e for e in raw if e["name"] == name)
    return "UNCERTAIN" in str(entry.get("tier_notes") or "")


def test_typical_reserve_is_from_the_data() -> None:
    """NVML less CUDA on every card with a published total (NVML totals recalled from memory left
    out): the fallback reserve is the middle of that range, its error half the range."""
    reserves = [c.nvml_total_bytes - c.cuda_total_bytes for c in CATALOG
                if c.cuda_total_bytes is not None and not _uncertain_nvml(c.name)]
    assert len(reserves) >= 10
    low, high = min(reserves), max(reserves)
    assert abs(CUDA_RESERVE_BYTES - (low + high) / 2) < 1 * MiB
    assert abs(CUDA_RESERVE_ERROR_BYTES - (high - low) / 2) < 1 * MiB
    unknown = GpuDevice(index=0, name="x", total_bytes=24 * GiB, free_bytes=None)
    assert unknown.usable_total_bytes == 24 * GiB - CUDA_RESERVE_BYTES
    assert unknown.usable_total_error_bytes == CUDA_RESERVE_ERROR_BYTES
