#!/usr/bin/env python3
"""Oracle: vLLM's own Qwen2-VL / Qwen2.5-VL processing info sizes the profile run's dummy item.

Runs in the vLLM CPU venv (vLLM 0.32.0):

    nice -n 10 .venv-vllm/bin/python tests/oracles/vllm_qwen_vl_dummy_oracle.py \\
        --output tests/data/vllm_qwen_vl_dummy_oracle.json

For each (max_model_len, max_pixels, temporal patch, limits) it calls `Qwen2VLProcessingInfo`'s
`get_mm_max_tokens_per_item` (model_executor/models/qwen2_vl.py: the factorized image with most features,
`_get_max_video_frames`, `get_num_frames_with_most_features`) and `MultiModalBudget`'s modality pick
(`max(..., key=lambda x: (x[1], x[0]))`), as `MultiModalBudget.__init__` calls them with one item of each
active modality. `tests/engines/vllm/test_qwen_vl_profile.py` replays every record through
`launcher.engines.vllm.budget._qwen_vl_dummy`.

What is stood in: the processing context (a config namespace with the vision config's patch, merge and
temporal sizes, an image processor namespace whose `size` holds max_pixels, no --mm-processor-kwargs to
merge), and torchvision, which
transformers' Qwen2-VL image processor imports and this CPU torch lacks (a module of mocks: the sizing
code calls none of it; `smart_resize` is transformers' own). Nothing else is patched.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import sys
from types import SimpleNamespace
from unittest import mock


class _TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        module = mock.MagicMock(name=spec.name)
        module.__spec__, module.__path__, module.__name__, module.__version__ = spec, [], spec.name, "0.0.0"
        return module

    def exec_module(self, module):  # type: ignore[no-untyped-def]
        return None


LENGTHS = (512, 2048, 8192, 16383, 16384, 32768, 40000, 65536, 114688, 128000, 262144, 1_000_000)
MAX_PIXELS = (3136 * 4, 1_003_520, 12_845_056, 16_777_216, 50_176 * 3 + 7)
TEMPORAL = (1, 2, 3)
LIMITS = ({}, {"video": 0}, {"image": 0})


def _item(info, length: int, limits: dict[str, int]) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """As MultiModalBudget.__init__: one item of each active modality, then the one with the most tokens."""
    active = [m for m in ("image", "video") if limits.get(m, 999) > 0]
    tokens = info.get_mm_max_tokens_per_item(seq_len=length, mm_counts=dict.fromkeys(active, 1))
    tokens = {m: t for m, t in tokens.items() if m in active}
    modality, most = max(tokens.items(), key=lambda x: (x[1], x[0]))
    return {"tokens": tokens, "modality": modality, "item_tokens": most}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    sys.meta_path.insert(0, _TorchvisionStandIn())
    import vllm
    from vllm.model_executor.models import qwen2_vl

    class Info(qwen2_vl.Qwen2VLProcessingInfo):
        def __init__(self, max_pixels: int, temporal: int) -> None:  # no processing context
            self._config = SimpleNamespace(vision_config=SimpleNamespace(
                patch_size=14, spatial_merge_size=2, temporal_patch_size=temporal))
            self._processor = SimpleNamespace(size={"shortest_edge": 3136, "longest_edge": max_pixels})
            self.ctx = SimpleNamespace(get_merged_mm_kwargs=lambda kwargs: dict(kwargs))

        def get_hf_config(self):  # type: ignore[no-untyped-def]
            return self._config

        def get_image_processor(self, **kwargs):  # type: ignore[no-untyped-def]
            return self._processor

        def _merge_and_resolve_mm_processor_kwargs(self, mm_kwargs):  # type: ignore[no-untyped-def]
            return {}  # no --mm-processor-kwargs: the processor's own size decides

    records = []
    for max_pixels in MAX_PIXELS:
        for temporal in TEMPORAL:
            for length in LENGTHS:
                for limits in LIMITS:
                    records.append({"max_model_len": length, "max_pixels": max_pixels, "temporal_patch_size": temporal,
                                    "limits": limits, **_item(Info(max_pixels, temporal), length, limits)})
    from vllm.model_executor.models import qwen3_vl

    class Info3(qwen3_vl.Qwen3VLProcessingInfo):
        """Qwen3-VL: the image sized by the image processor, the video (two frames) by the video processor."""

        def __init__(self, image_pixels: int, video_pixels: int) -> None:
            self._config = SimpleNamespace(vision_config=SimpleNamespace(
                patch_size=16, spatial_merge_size=2, temporal_patch_size=2))
            self._image = SimpleNamespace(size={"shortest_edge": 65_536, "longest_edge": image_pixels})
            self._video = qwen3_vl.Qwen3VLVideoProcessor.__new__(qwen3_vl.Qwen3VLVideoProcessor)
            self._video.size = {"shortest_edge": 4096, "longest_edge": video_pixels}
            self._video.temporal_patch_size = 2
            self.ctx = SimpleNamespace(get_merged_mm_kwargs=lambda kwargs: dict(kwargs))

        def get_hf_config(self):  # type: ignore[no-untyped-def]
            return self._config

        def get_image_processor(self, **kwargs):  # type: ignore[no-untyped-def]
            return self._image

        def get_video_processor(self, **kwargs):  # type: ignore[no-untyped-def]
            return self._video

        def _merge_and_resolve_mm_processor_kwargs(self, mm_kwargs):  # type: ignore[no-untyped-def]
            return {}

    qwen3 = []
    for image_pixels in (1_003_520, 16_777_216, 4_194_304):
        for video_pixels in (25_165_824, 50_331_648, 1_048_576):
            for length in (2048, 8192, 131_072, 262_144):
                for limits in LIMITS:
                    qwen3.append({"max_model_len": length, "image_max_pixels": image_pixels,
                                  "video_max_pixels": video_pixels, "limits": limits,
                                  **_item(Info3(image_pixels, video_pixels), length, limits)})
    json.dump({"vllm": vllm.__version__, "records": records, "qwen3_vl": qwen3}, open(args.output, "w"), indent=0)
    print(f"{len(records)} Qwen2-VL records, {len(qwen3)} Qwen3-VL records, vLLM {vllm.__version__}")


if __name__ == "__main__":
    main()
