"""HF checkpoint names of MoE experts -> the fused expert tensors of transformers' models.

Checkpoints (and mindrl's weight stream) name each expert's projections apart
(`mlp.experts.{e}.gate_proj.weight`, `up_proj`, `down_proj`); transformers >= 5 holds them
fused per layer (`mlp.experts.gate_up_proj` [E, 2 x ffn, hidden] with gate rows first, and
`mlp.experts.down_proj` [E, hidden, ffn]). The HF rollout engine writes a streamed expert
tensor into its slice of the fused one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_EXPERT = re.compile(
    r"^(?P<prefix>.+\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$"
)


def fused_expert_slot(name: str, state: Mapping[str, Any]) -> tuple[Any, torch.Tensor] | None:
    """(the fused parameter, the view of it) that the per-expert HF tensor `name` fills, or
    None when `name` is not a per-expert name of a fused model."""
    m = _EXPERT.match(name)
    if m is None:
        return None
    prefix, expert, proj = m.group("prefix"), int(m.group("e")), m.group("proj")
    fused = state.get(f"{prefix}.{'down_proj' if proj == 'down' else 'gate_up_proj'}")
    if fused is None or fused.dim() != 3 or expert >= fused.shape[0]:
        return None
    view = fused.data[expert]
    if proj != "down":
        half = view.shape[0] // 2
        view = view[:half] if proj == "gate" else view[half:]
    return fused, view
