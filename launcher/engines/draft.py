"""The weights an engine's main model loads: the checkpoint less its MTP tensors (launcher.model.draft).

Each engine's planner calls `request_without_draft` first, saying whether a speculative draft is asked for:
without it the MTP layers stay on disk (vLLM's and SGLang's main model skip them while loading);
with it a draft may load them, and they stay counted (the draft itself is a warning, not sized).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from launcher.common.units import format_gib

if TYPE_CHECKING:
    from launcher.plan.types import PlanRequest


def request_without_draft(request: PlanRequest, *, engine: str, speculating: bool, source: str) -> PlanRequest:
    """`request` whose model weighs what `engine`'s main model loads, the change said in the weights' source;
    `speculating`: a speculative draft is asked for (the engine's own spellings of it)."""
    model, draft = request.model, request.model.draft
    if draft is None or not model.weights_sized:
        return request
    if speculating:
        why = f"; {draft.describe()} counted: the speculative draft asked for may load them"
    elif draft.bytes is None:
        why = (f"; {draft.describe()} counted: the shards holding them are not here to size them "
               f"({engine}'s model does not load them, so the plan is on the safe side)")
    elif 0 < draft.bytes < model.weight_bytes:
        return dataclasses.replace(request, model=dataclasses.replace(
            model, weight_bytes=model.weight_bytes - draft.bytes,
            weight_bytes_source=f"{model.weight_bytes_source} less {format_gib(draft.bytes)}, {draft.describe()}, "
                                f"which {engine}'s model does not load ({source})"))
    else:
        return request
    return dataclasses.replace(request, model=dataclasses.replace(
        model, weight_bytes_source=model.weight_bytes_source + why))
