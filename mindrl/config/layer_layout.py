"""Which transformer layers each pipeline stage holds, and which layers are MindSpeed's noop
(identity) layers: MindSpeed's `num_layer_list` ("16,17,16,15": layers per PP stage) and
`noop_layers` ("5,95": global layer indices).

One reading of both keys for the trainer, the converter, the weight sync and the memory plan.
As in MindSpeed, `num_layers` counts the noop layers: they pad the layer count so the stages
split evenly, hold no weights, and are absent from the HF checkpoint (which has
`num_layers - len(noop_layers)` layers; HF indices skip them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def parse_index_list(value: str | int | Sequence[int] | None, key: str) -> tuple[int, ...]:
    """MindSpeed's comma-separated integers ("16,17" or 16 or [16, 17]); None is empty.
    A value that is not one raises ValueError naming the key."""
    if value is None:
        return ()
    if isinstance(value, bool):
        raise ValueError(f"{key}: {value!r} is not a comma-separated list of integers")
    if isinstance(value, int):
        return (value,)
    parts = value.split(",") if isinstance(value, str) else list(value)
    try:
        return tuple(int(str(part).strip()) for part in parts if str(part).strip() != "")
    except ValueError:
        raise ValueError(f"{key}: {value!r} is not a comma-separated list of integers") from None


@dataclass(frozen=True)
class LayerLayout:
    """`num_layers` (noop layers included) split over pipeline stages."""

    num_layers: int
    stage_layers: tuple[int, ...]  # layers per PP stage (noop layers included)
    noop_layers: tuple[int, ...] = ()  # sorted global indices

    @property
    def pp(self) -> int:
        return len(self.stage_layers)

    @property
    def uneven(self) -> bool:
        return len(set(self.stage_layers)) > 1

    def stage_ranges(self) -> list[range]:
        """The global layer indices of each stage."""
        out, start = [], 0
        for count in self.stage_layers:
            out.append(range(start, start + count))
            start += count
        return out

    def weighted_layers_per_stage(self) -> tuple[int, ...]:
        """Layers with weights and compute on each stage (noop layers left out)."""
        noop = set(self.noop_layers)
        return tuple(sum(1 for i in r if i not in noop) for r in self.stage_ranges())

    def describe(self) -> str:
        """The placement line's words for a layout that is not the plain even split."""
        parts = []
        if self.uneven:
            parts.append(f"layers per stage {','.join(map(str, self.stage_layers))}")
        if self.noop_layers:
            parts.append(f"noop layers {','.join(map(str, self.noop_layers))}")
        return "; ".join(parts)

    def megatron_layout(self) -> list[list[str]] | None:
        """megatron-core's `pipeline_model_parallel_layout` for uneven stages (None: the even
        split megatron builds by itself): the embedding on the first stage, the loss on the
        last, each stage's decoder layers in between."""
        if not self.uneven:
            return None
        last = self.pp - 1
        return [
            (["embedding"] if stage == 0 else [])
            + ["decoder"] * count
            + (["loss"] if stage == last else [])
            for stage, count in enumerate(self.stage_layers)
        ]


def layout_problems(
    num_layers: int,
    pp: int,
    num_layer_list: str | int | Sequence[int] | None,
    noop_layers: str | int | Sequence[int] | None,
    *,
    virtual_pipeline: bool = False,
) -> list[str]:
    """What makes the two keys contradict the model or the layout (one line each, naming the
    numbers); empty when `layer_layout` can be built."""
    problems: list[str] = []
    try:
        counts = parse_index_list(num_layer_list, "num_layer_list")
    except ValueError as exc:
        problems.append(str(exc))
        counts = ()
    if counts:
        if len(counts) != pp:
            problems.append(
                f"num_layer_list: {','.join(map(str, counts))} has {len(counts)} stages but "
                f"pipeline_model_parallel_size is {pp}"
            )
        if sum(counts) != num_layers:
            problems.append(
                f"num_layer_list: {','.join(map(str, counts))} adds up to {sum(counts)} layers "
                f"but num_layers is {num_layers}"
            )
        if any(c < 1 for c in counts):
            problems.append(
                f"num_layer_list: {','.join(map(str, counts))}: every stage needs at least "
                "one layer"
            )
        if virtual_pipeline and len(set(counts)) > 1:
            problems.append(
                "num_layer_list with num_layers_per_virtual_pipeline_stage: uneven stages "
                "under the virtual pipeline are not built (num_layer_list gives layers per "
                "stage, not per model chunk)"
            )
    elif num_layers % pp:
        return problems  # the even split's own check names PP and num_layers
    try:
        noop = parse_index_list(noop_layers, "noop_layers")
    except ValueError as exc:
        return [*problems, str(exc)]
    outside = [i for i in noop if not 0 <= i < num_layers]
    if outside:
        problems.append(
            f"noop_layers: {','.join(map(str, outside))} outside the layers 0..{num_layers - 1} "
            f"(num_layers {num_layers} counts the noop layers)"
        )
    repeated = sorted({i for i in noop if noop.count(i) > 1})
    if repeated:
        problems.append(f"noop_layers: {','.join(map(str, repeated))} listed twice")
    if noop and len(set(noop)) >= num_layers:
        problems.append(
            f"noop_layers: all {num_layers} layers are noop layers; the model has no weights"
        )
    return problems


def layer_layout(
    num_layers: int,
    pp: int,
    num_layer_list: str | int | Sequence[int] | None = None,
    noop_layers: str | int | Sequence[int] | None = None,
) -> LayerLayout:
    """The layout the keys give (ValueError naming the numbers when they contradict)."""
    problems = layout_problems(num_layers, pp, num_layer_list, noop_layers)
    counts = parse_index_list(num_layer_list, "num_layer_list") if not problems else ()
    if not counts and not problems and num_layers % pp:
        problems.append(
            f"pipeline_model_parallel_size {pp} does not divide num_layers {num_layers}"
        )
    if problems:
        raise ValueError("; ".join(problems))
    return LayerLayout(
        num_layers=num_layers,
        stage_layers=counts or (num_layers // pp,) * pp,
        noop_layers=tuple(sorted(parse_index_list(noop_layers, "noop_layers"))),
    )
