"""The health of a MoE model's routing, per optimizer step: how evenly each layer's router
spreads the tokens over its experts, the router losses megatron-core tracks, and how far its
expert-bias rule moved the biases.

The load comes from forward hooks on megatron's `TopKRouter`: its routing map (token x expert,
which experts each token went to) counted while autograd records, as megatron counts it for
the expert-bias rule (so a no-gradient log-prob pass and the no-gradient first pass of full
recomputation are not counted). Padding tokens that reach the router are counted: they cost
the experts as much as real ones. Counts are summed over the ranks that saw different tokens
(data parallel with context parallel, and tensor parallel under sequence parallel) and gathered
over pipeline stages, so every rank of the role reports the same numbers.

Names (`moe/...` for the actor, `{role}/moe/...` for another role): per MoE layer `i` (the HF
checkpoint's `model.layers.{i}`), `layer_{i}/load_imbalance` (the busiest expert's tokens over
the mean: 1.0 is an even spread, E / top-k the worst) and `layer_{i}/load_min` (the idlest
expert's tokens over the mean: 0.0 is an expert that got none); over the layers,
`load_imbalance_max`, `load_imbalance_mean`, `load_min`, and the raw `tokens_per_expert_min` /
`tokens_per_expert_max`; with `moe_router_enable_expert_bias`, `expert_bias_update` (the mean
|change| of the biases in this step: megatron moves each by +-`moe_router_bias_update_rate`
towards an even load, 0 where an expert got exactly the mean) and `expert_bias_range` (the
largest max - min of one layer's biases after the step); the router losses as megatron tracks
them, without their coefficients: `aux_loss` (aux_loss; 1.0 for an even spread), `seq_aux_loss`,
`global_aux_loss`, `z_loss` (with `moe_z_loss_coeff`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# megatron's aux-loss tracker names -> mindrl's metric names
ROUTER_LOSS_NAMES = {
    "load_balancing_loss": "aux_loss",
    "seq_load_balancing_loss": "seq_aux_loss",
    "global_load_balancing_loss": "global_aux_loss",
    "z_loss": "z_loss",
}


def moe_prefix(role: str) -> str:
    """`moe/` for the actor, `{role}/moe/` for another role (the critic)."""
    return "moe/" if role == "actor" else f"{role}/moe/"


def expert_load_metrics(counts: torch.Tensor, prefix: str = "moe/") -> dict[str, float]:
    """The load metrics of `counts` [layers, experts] (tokens routed to each expert of each
    layer; a row of zeros is a layer without a router and is skipped)."""
    out: dict[str, float] = {}
    imbalance: list[float] = []
    lowest: list[float] = []
    totals = counts.sum(dim=1)
    for layer in range(counts.shape[0]):
        if float(totals[layer]) <= 0:
            continue
        row = counts[layer].double()
        mean = float(row.mean())
        imbalance.append(float(row.max()) / mean)
        lowest.append(float(row.min()) / mean)
        out[f"{prefix}layer_{layer}/load_imbalance"] = imbalance[-1]
        out[f"{prefix}layer_{layer}/load_min"] = lowest[-1]
    if not imbalance:
        return {}
    routed = counts[totals > 0]
    out[f"{prefix}load_imbalance_max"] = max(imbalance)
    out[f"{prefix}load_imbalance_mean"] = sum(imbalance) / len(imbalance)
    out[f"{prefix}load_min"] = min(lowest)
    out[f"{prefix}tokens_per_expert_min"] = float(routed.min())
    out[f"{prefix}tokens_per_expert_max"] = float(routed.max())
    return out


def expert_bias_metrics(
    before: torch.Tensor, after: torch.Tensor, prefix: str = "moe/"
) -> dict[str, float]:
    """`expert_bias_update` and `expert_bias_range` of the biases [layers, experts] of the
    MoE layers before and after one optimizer step."""
    if before.numel() == 0:
        return {}
    spread = after.max(dim=1).values - after.min(dim=1).values
    return {
        f"{prefix}expert_bias_update": float((after - before).abs().mean()),
        f"{prefix}expert_bias_range": float(spread.max()),
    }


def moe_layer_count(num_layers: int, moe_layer_freq: int | list[int] | None) -> int:
    """The MoE layers of a model, from megatron's `moe_layer_freq` (a per-layer 0/1 list, or
    every n-th layer)."""
    if isinstance(moe_layer_freq, list):
        return sum(moe_layer_freq)
    freq = moe_layer_freq or 1
    return sum(1 for i in range(num_layers) if i % freq == 0)


@dataclass
class _RouterHook:
    """Adds one router's routing map to its layer's row of the tracker's counts."""

    tracker: ExpertLoadTracker
    row: int

    def __call__(self, module: Any, inputs: tuple[Any, ...], output: Any) -> None:
        import torch

        if not (self.tracker.recording and module.training and torch.is_grad_enabled()):
            return
        routing_map = output[1].detach()
        padding = inputs[1] if len(inputs) > 1 else None
        if padding is not None:  # True marks padding (as megatron's expert-bias count reads it)
            routing_map = routing_map & ~padding.reshape(-1, 1)
        self.tracker.counts[self.row] += routing_map.sum(dim=0).to(self.tracker.counts.dtype)


class ExpertLoadTracker:
    """Counts the tokens each router of `model_chunks` sends to each expert during one
    optimizer step's forward passes, and reads the expert biases around it.

    Every rank of the role makes the same collectives in `step_metrics` (a pipeline stage
    holding only dense layers too), so a dense model makes none.
    """

    def __init__(self, model_chunks: list[Any], prefix: str = "moe/") -> None:
        import torch
        from megatron.core.transformer.moe.router import TopKRouter
        from megatron.core.utils import get_model_config

        config = get_model_config(model_chunks[0])
        self.prefix = prefix
        self.enabled = config.num_moe_experts is not None
        self.sequence_parallel = bool(config.sequence_parallel)
        self.recording = False
        experts = config.num_moe_experts or 0
        self.moe_layers = moe_layer_count(config.num_layers, config.moe_layer_freq)
        # on the model's device, for the collectives (fp32: exact up to 2^24 tokens per expert)
        self.device = next(model_chunks[0].parameters()).device
        self.counts = torch.zeros(config.num_layers, experts, device=self.device)
        self.routers: list[tuple[int, Any]] = []  # (layer row, router)
        for chunk in model_chunks:
            for module in chunk.modules():
                if isinstance(module, TopKRouter):
                    row = int(module.layer_number) - 1  # megatron's global 1-based number
                    module.register_forward_hook(_RouterHook(self, row))
                    self.routers.append((row, module))
        self.bias_before: dict[int, torch.Tensor] = {}

    def start(self) -> None:
        """Zero the counts and read the biases before an optimizer step's passes."""
        self.counts.zero_()
        self.bias_before = {
            row: router.expert_bias.detach().float().clone()
            for row, router in self.routers
            if router.expert_bias is not None
        }
        self.recording = True

    def step_metrics(self) -> dict[str, float]:
        """The step's load and bias metrics, reduced over the role; stops recording."""
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        self.recording = False
        if not self.enabled:
            return {}
        counts = self.counts.clone()
        dist.all_reduce(counts, group=ps.get_pipeline_model_parallel_group())
        dist.all_reduce(counts, group=ps.get_data_parallel_group(with_context_parallel=True))
        if self.sequence_parallel:  # each TP rank routed its slice of the sequence
            dist.all_reduce(counts, group=ps.get_tensor_model_parallel_group())
        out = expert_load_metrics(counts.cpu().double(), self.prefix)
        # the biases: the same on every data / tensor parallel rank, each stage its own layers
        layers, experts = self.counts.shape
        biased = torch.zeros(layers, device=self.device)
        before = torch.zeros(layers, experts, device=self.device)
        after = torch.zeros(layers, experts, device=self.device)
        for row, router in self.routers:
            if row in self.bias_before:
                biased[row] = 1.0
                before[row] = self.bias_before[row]
                after[row] = router.expert_bias.detach().float()
        stacked = torch.cat([biased[:, None], before, after], dim=1)
        dist.all_reduce(stacked, group=ps.get_pipeline_model_parallel_group())
        stacked = stacked.cpu().double()
        rows = stacked[:, 0] > 0
        out.update(
            expert_bias_metrics(
                stacked[rows, 1 : 1 + experts], stacked[rows, 1 + experts :], self.prefix
            )
        )
        return out


def router_loss_metrics(n_micro: int, moe_layers: int, prefix: str = "moe/") -> dict[str, float]:
    """The router losses megatron-core logged during this optimizer step's forwards, reduced
    as its training loop reduces them (over PP, the router's group and DP), averaged over the
    tensor and data parallel ranks, the `moe_layers` MoE layers and the micro-batches, without
    their coefficients; the tracker is then cleared. {} for a dense model (no collective)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.moe.moe_utils import (
        clear_aux_losses_tracker,
        get_moe_layer_wise_logging_tracker,
        reduce_aux_losses_tracker_across_ranks,
    )

    tracker = get_moe_layer_wise_logging_tracker()
    if not tracker:
        return {}
    names = sorted(tracker)
    reduce_aux_losses_tracker_across_ranks(names)
    # megatron leaves a loss it tracks without a group (the z-loss) rank-local: the mean over
    # the ranks that routed different tokens makes every rank report the same number (a no-op
    # for the losses megatron already reduced over them)
    group = ps.get_tensor_and_data_parallel_group(with_context_parallel=True)
    device = tracker[names[0]]["values"].device
    sums = torch.stack([tracker[n]["values"].sum().float() for n in names]).to(device)
    dist.all_reduce(sums, group=group)
    sums = sums.cpu().double() / dist.get_world_size(group)
    clear_aux_losses_tracker()
    scale = max(moe_layers, 1) * max(n_micro, 1)
    return {f"{prefix}{ROUTER_LOSS_NAMES.get(n, n)}": float(v) / scale for n, v in zip(names, sums)}
