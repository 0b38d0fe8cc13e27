"""The policy update, Ray-free: epochs x mini-batches x micro-batches through megatron's
forward-backward schedule, the clipped GRPO loss per micro-batch, one optimizer step per
mini-batch.

Kept apart from the Ray shell (`workers/actor.py`) so it can be driven and tested in one
process over gloo, as verl keeps its megatron actor apart from its worker. The loss is a
module-level function over a typed micro-batch; megatron's schedule calls it through a
`functools.partial`, so nothing here is a closure over string-keyed dicts.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mindrl.config.rl import AlgorithmConfig
from mindrl.data.batch import SampleBatch, micro_batch_size
from mindrl.data.packing import PackingSettings
from mindrl.models.moe_metrics import router_loss_metrics
from mindrl.models.optimizer import TrainingOptimizer, clip_grads_to_norm
from mindrl.workers.skipped_updates import SkippedUpdates
from mindrl.workers.update_micro_batch import UpdateMicroBatch

if TYPE_CHECKING:
    import torch

    from mindrl.algorithms import GRPOLossConfig
    from mindrl.models.micro_batches import PromptRows
    from mindrl.models.moe_metrics import ExpertLoadTracker
    from mindrl.models.token_select import OutputHead

logger = logging.getLogger(__name__)

# Aggregated with the global normaliser: micro-batch and DP-rank parts add up to the mean.
SUMMED_LOSS_METRICS = frozenset({"actor/pg_loss", "actor/kl_loss", "actor/entropy"})


@dataclass(frozen=True)
class LossSettings:
    """What the loss needs besides the micro-batch; fixed for one mini-batch."""

    loss: GRPOLossConfig
    vocab_size: int
    normalizer: float  # global token / sequence count of the mini-batch (all DP ranks)
    scale: float  # undoes megatron's 1/n_micro and DDP's 1/DP averaging
    entropy_grad: bool


def micro_batch_loss(
    mb: UpdateMicroBatch, settings: LossSettings, head: OutputHead, output: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The scaled GRPO loss of one micro-batch from the model's output (logits, or the
    selected hidden states when `head` holds the output layer's weight), and its metrics."""
    import torch

    from mindrl.algorithms import grpo_loss, rollout_mismatch_metrics
    from mindrl.models.logprobs import scored_log_probs

    if mb.advantages is None:
        raise ValueError("the update batch has no advantages")
    selection = mb.selection
    picked, picked_entropy = scored_log_probs(
        output,
        head,
        selection,
        mb.tokens,
        vocab_size=settings.vocab_size,
        entropy=True,
        entropy_grad=settings.entropy_grad,
    )
    assert picked_entropy is not None
    log_prob = selection.scatter(picked)
    on_policy = mb.old_log_probs is None
    old = log_prob.detach() if on_policy else mb.old_log_probs
    loss, metrics = grpo_loss(
        settings.loss,
        log_prob,
        old,
        mb.advantages,
        mb.response_mask,
        ref_log_prob=mb.ref_log_probs,
        entropy=selection.scatter(picked_entropy),
        rollout_log_prob=mb.rollout_log_probs,
        normalizer=settings.normalizer,
    )
    if on_policy and mb.rollout_log_probs is not None:
        metrics.update(rollout_mismatch_metrics(old, mb.rollout_log_probs, mb.response_mask))
    reported = {k: torch.tensor(float(v)) for k, v in metrics.items()}
    return loss * settings.scale, reported


def forward_step(
    settings: LossSettings, data_iterator: Iterator[UpdateMicroBatch], model: Any
) -> tuple[torch.Tensor, Any]:
    """megatron's `forward_step_func`: the model's output for the next micro-batch and the
    loss function the schedule applies to it (on the last pipeline stage)."""
    from mindrl.models.shared_prefix import rope_at_positions
    from mindrl.models.token_select import select_tokens

    mb = next(data_iterator)
    packed = mb.packed_seq_params
    extra = {} if packed is None else {"packed_seq_params": packed}
    with select_tokens(model, mb.selection, hidden_only=True) as head:
        with rope_at_positions(model, packed):
            output = model(mb.tokens, mb.position_ids, mb.attention_mask, **extra)
    return output, functools.partial(micro_batch_loss, mb, settings, head)


def global_normalizer(response_mask: torch.Tensor, loss_agg_mode: str) -> float:
    """Tokens (token-mean) or sequences (other modes) of the mini-batch over all DP ranks."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if loss_agg_mode == "token-mean":
        local = response_mask.sum()
    else:
        local = (response_mask.sum(-1) > 0).float().sum()
    total = local.clone().double()
    dist.all_reduce(total, group=ps.get_data_parallel_group())
    return float(total.item())


def padding_fraction_over_dp(real: int, fed: int) -> float:
    """1 - real / fed tokens of the update, summed over the data-parallel ranks (every rank
    reports the same number)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    counts = torch.tensor([real, fed], dtype=torch.float64)
    dist.all_reduce(counts, group=ps.get_data_parallel_group())
    return 1 - float(counts[0] / counts[1]) if counts[1] > 0 else 0.0


def reduce_loss_metrics(
    losses: list[dict[str, Any]], n_micro: int, summed: frozenset[str] = SUMMED_LOSS_METRICS
) -> dict[str, float]:
    """Global values of the loss metrics, identical on every rank of the role.

    Loss terms were normalised by the global token / sequence count, so their parts add up
    (sum over micro-batches and DP ranks); rates such as clip fractions are averaged;
    `*_max` metrics take the maximum, `*_min` ones the minimum. The last pipeline stage computed them; it broadcasts
    to the other stages.
    """
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    keys = sorted(losses[0]) if losses else []
    pp_split = ps.get_pipeline_model_parallel_world_size() > 1
    if pp_split:
        names: list[Any] = [keys]
        src = ps.get_pipeline_model_parallel_last_rank()
        dist.broadcast_object_list(names, src=src, group=ps.get_pipeline_model_parallel_group())
        keys = names[0]
    values = torch.zeros(len(keys), dtype=torch.float64)
    maxima = torch.zeros(len(keys), dtype=torch.float64)
    negated_minima = torch.zeros(len(keys), dtype=torch.float64)  # max-reduced, like maxima
    for i, k in enumerate(keys):
        if losses:
            total = sum(float(m[k]) for m in losses)
            values[i] = total if k in summed else total / n_micro
            maxima[i] = max(float(m[k]) for m in losses)
            negated_minima[i] = -min(float(m[k]) for m in losses)
    every = torch.stack([values, maxima, negated_minima])
    if pp_split:
        dist.broadcast(every, src=src, group=ps.get_pipeline_model_parallel_group())
    values, extremes = every[0].clone(), every[1:].clone()
    dist.all_reduce(values, group=ps.get_data_parallel_group())
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=ps.get_data_parallel_group())
    maxima, minima = extremes[0], -extremes[1]
    dp = ps.get_data_parallel_world_size()
    out = {}
    for i, k in enumerate(keys):
        if k.endswith("_max"):
            out[k] = float(maxima[i])
        elif k.endswith("_min"):
            out[k] = float(minima[i])
        else:
            out[k] = float(values[i]) if k in summed else float(values[i]) / dp
    return out


class PolicyUpdater:
    """Trains `model_chunks` with `opt` on this DP rank's share of each RL batch."""

    role = "actor"  # metric prefix and log name
    summed_metrics = SUMMED_LOSS_METRICS

    def __init__(
        self,
        model_chunks: list[Any],
        opt: TrainingOptimizer,
        alg: AlgorithmConfig,
        *,
        vocab_size: int,
        micro_batch: int,
        clip_grad: float,
        dp_size: int,
        seed: int,
        max_tokens: int | None = None,
        packing: PackingSettings | None = None,
    ) -> None:
        self.model_chunks = model_chunks
        self.max_tokens = max_tokens
        self.packing = packing or PackingSettings()
        if self.packing.share_prompts:
            from mindrl.models.micro_batches import check_shared_prefix_chunks

            check_shared_prefix_chunks(model_chunks)
        # this update's tokens: the samples', theirs fed (a shared prompt once), all fed
        self.tokens = {"samples": 0, "real": 0, "fed": 0}
        self.opt = opt
        self.alg = alg
        self.vocab_size = vocab_size
        self.micro_batch = micro_batch
        self.clip_grad = clip_grad
        self.dp_size = dp_size
        self.seed = seed
        self.skips = SkippedUpdates()  # non-finite steps: over the run, and in a row now
        self._expert_load: ExpertLoadTracker | None = None

    @property
    def expert_load(self) -> ExpertLoadTracker:
        """The routers' load and bias tracker (hooks on the routers: made on first use)."""
        if self._expert_load is None:
            from mindrl.models.moe_metrics import ExpertLoadTracker, moe_prefix

            self._expert_load = ExpertLoadTracker(self.model_chunks, moe_prefix(self.role))
        return self._expert_load

    def mini_batches(self, size: int, step: int, epoch: int) -> list[Any]:
        """The rows of each mini-batch of `epoch` over this DP rank's chunk of `size` rows."""
        import torch

        alg = self.alg
        mini = (alg.mini_batch_samples or size * self.dp_size) // self.dp_size
        if alg.shuffle_minibatch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 97 + epoch)
            order = torch.randperm(size, generator=gen)
        else:
            order = torch.arange(size)
        return [order[start : start + mini] for start in range(0, size, mini)]

    def update(
        self, batch: SampleBatch, step: int, first_on_policy: bool = False
    ) -> dict[str, float]:
        """PPO/GRPO epochs over this DP rank's chunk, in mini-batches of micro-batches.
        `first_on_policy`: the first mini-batch takes its old log-probs from its own forward
        (the policy has not moved yet; the batch's old_log_probs cover the other rows)."""
        from dataclasses import replace

        for chunk in self.model_chunks:
            # training mode: the log-prob passes leave the chunks in eval, where megatron's
            # router skips its load-balancing loss (and dropout would be off)
            chunk.train()
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        extremes: dict[str, float] = {}  # `*_max` / `*_min` metrics: over every mini-batch
        phases = {"timing/update_fwd_bwd": 0.0, "timing/update_optimizer": 0.0}
        self.tokens = {"samples": 0, "real": 0, "fed": 0}
        for epoch in range(self.alg.epochs):
            for i, rows in enumerate(self.mini_batches(batch.size, step, epoch)):
                mini = batch.select(rows)
                if first_on_policy and epoch == 0 and i == 0:
                    kept = {k: v for k, v in mini.tensors.items() if k != "old_log_probs"}
                    mini = replace(mini, tensors=kept)
                metrics = self.train_mini_batch(mini, phases)
                for k, v in metrics.items():
                    if k.endswith(("_max", "_min")):
                        pick = max if k.endswith("_max") else min
                        extremes[k] = pick(extremes.get(k, v), v)
                        continue
                    sums[k] = sums.get(k, 0.0) + v
                    counts[k] = counts.get(k, 0) + 1
        out = {k: sums[k] / counts[k] for k in sums}
        out.update(extremes)
        out.update(self.skips.metrics(self.role))
        out.update(phases)  # summed over mini-batches
        out[f"perf/padding_fraction_{self.role}_update"] = padding_fraction_over_dp(
            self.tokens["real"], self.tokens["fed"]
        )
        if self.packing.share_prompts:  # the samples' tokens not fed: prompts run once
            out[f"perf/shared_prompt_fraction_{self.role}_update"] = padding_fraction_over_dp(
                self.tokens["real"], self.tokens["samples"]
            )
        return out

    def micro_groups(self, mini: SampleBatch) -> list[list[int]]:
        """The rows of each micro-batch: `micro_batch` rows each, or by the update's token
        budget (use_dynamic_bsz)."""
        from mindrl.data.packing import fixed_partitions
        from mindrl.models.micro_batches import pass_groups

        if self.packing.active:
            return pass_groups(
                mini.attention_mask, self.packing, self.micro_batch, self.shared_prompts(mini)
            )
        return fixed_partitions(mini.size, micro_batch_size(self.micro_batch, mini.size))

    def shared_prompts(self, mini: SampleBatch) -> PromptRows | None:
        """The rows' prompts when the update runs a shared prompt once."""
        from mindrl.models.micro_batches import PromptRows

        if not self.packing.share_prompts:
            return None
        return PromptRows(mini.input_ids, mini.prompt_lengths)

    def forward_inputs(
        self, mini: SampleBatch, groups: list[list[int]], multiple: int
    ) -> tuple[Any, list[Any], int, int]:
        """megatron's forward_step_func for this mini-batch, its micro-batches, and the
        schedule's sequence length and micro-batch size."""
        from mindrl.models.micro_batches import fixed_packed_length, schedule_loss_scale

        settings = LossSettings(
            loss=self.alg.loss_config(self.max_tokens),
            vocab_size=self.vocab_size,
            normalizer=global_normalizer(mini.response_mask, self.alg.loss_agg_mode),
            scale=schedule_loss_scale(len(groups)),
            entropy_grad=self.alg.entropy_coeff > 0,
        )
        parts = [mini.select(g) for g in groups]
        prompts = self.shared_prompts(mini)
        if prompts is not None:
            fixed = fixed_packed_length(mini.attention_mask, groups, multiple, prompts)
            micro = [UpdateMicroBatch.shared_prompts(p, multiple, fixed) for p in parts]
            seq, mbs = micro[0].tokens.shape[1], 1
        elif self.packing.remove_padding:
            fixed = fixed_packed_length(mini.attention_mask, groups, multiple)
            micro = [UpdateMicroBatch.packed(p, multiple, fixed) for p in parts]
            seq, mbs = micro[0].tokens.shape[1], 1
        else:
            micro = [UpdateMicroBatch.from_rows(p, multiple) for p in parts]
            seq, mbs = mini.input_ids.shape[1], len(groups[0])
        return functools.partial(forward_step, settings), micro, seq, mbs

    def train_mini_batch(self, mini: SampleBatch, phases: dict[str, float]) -> dict[str, float]:
        """Forward + backward over the micro-batches, then one optimizer step (skipped, and
        counted, when the loss or the grad norm is not finite)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from mindrl.data.batch import pad_columns_to_multiple
        from mindrl.models.logprobs import sequence_multiple

        multiple = sequence_multiple(self.model_chunks)
        mini = pad_columns_to_multiple(mini, multiple)
        groups = self.micro_groups(mini)
        n_micro = len(groups)
        step_func, micro, seq, mbs = self.forward_inputs(mini, groups, multiple)
        self.tokens["samples"] += int(mini.attention_mask.sum())
        self.tokens["real"] += sum(m.real_tokens for m in micro)
        self.tokens["fed"] += sum(int(m.tokens.numel()) for m in micro)
        optimizer = self.opt.optimizer
        started = time.perf_counter()
        for chunk in self.model_chunks:
            chunk.zero_grad_buffer()
        optimizer.zero_grad()
        chunks = self.model_chunks
        self.expert_load.start()
        losses = get_forward_backward_func()(
            forward_step_func=step_func,
            # a virtual pipeline runs every chunk over the same micro-batches
            data_iterator=[iter(micro) for _ in chunks] if len(chunks) > 1 else iter(micro),
            model=chunks if len(chunks) > 1 else chunks[0],
            num_microbatches=n_micro,
            seq_length=seq,
            micro_batch_size=mbs,
            forward_only=False,
        )
        phases["timing/update_fwd_bwd"] += time.perf_counter() - started
        started = time.perf_counter()
        # megatron's optimizer.step(), split so a non-finite update is never applied
        found_inf = optimizer.prepare_grads()
        grad_norm = float(optimizer.get_grad_norm())
        out = reduce_loss_metrics(losses, n_micro, self.summed_metrics)
        load = self.expert_load  # the routers' losses and load: {} unless the model has experts
        out.update(router_loss_metrics(n_micro, load.moe_layers, load.prefix))
        finite = math.isfinite(grad_norm) and all(math.isfinite(v) for v in out.values())
        out.update(load.step_metrics())  # the expert bias moved in the schedule's last call
        prefix = "" if self.role == "actor" else f"{self.role}/"
        if found_inf or not finite:
            self.skips.skipped()
            optimizer.zero_grad()
            logger.warning(
                "%s: non-finite loss or grad norm (%s); update skipped", self.role, grad_norm
            )
            out[f"{prefix}grad_norm"] = float("nan")
            return out
        if self.clip_grad > 0:
            clip_grads_to_norm(optimizer, self.clip_grad, grad_norm)
        optimizer.step_with_ready_grads()
        self.skips.applied()
        self.opt.scheduler.step(increment=1)
        phases["timing/update_optimizer"] += time.perf_counter() - started
        out[f"{prefix}grad_norm"] = grad_norm
        out[f"{self.role}/lr"] = float(optimizer.param_groups[0]["lr"])
        return out
