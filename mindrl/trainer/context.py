"""Everything the GRPO loop needs around it, so `grpo.py` shows only the algorithm: data and
sampler, tokenizer, reward scoring, the roles' worker groups, advantages, metrics, checkpoints
(save / resume) and validation."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from mindrl.config.run import RunConfig
from mindrl.trainer.batch import SampleBatch, build_sample_batch

logger = logging.getLogger("mindrl.trainer")


class TrainContext:
    def __init__(self, run: RunConfig, raw: dict[str, Any]):
        from transformers import AutoTokenizer

        from mindrl.algorithms import KLControlConfig, make_kl_controller
        from mindrl.config import save_resolved_config
        from mindrl.data.dataset import PromptDataset
        from mindrl.data.sampler import ResumableSampler

        self.run = run
        self.out_dir = Path(run.output_dir)
        save_resolved_config(raw, self.out_dir)
        data = run.actor.data
        self.tokenizer = AutoTokenizer.from_pretrained(data.tokenizer_name_or_path)
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.eos_token_id or 0
        self.dataset = PromptDataset(data.data_path)
        self.sampler = ResumableSampler(
            len(self.dataset),
            run.actor.batch.global_batch_size,
            seed=data.seed,
            shuffle=not data.no_shuffle,
            drop_last=True,
        )
        alg = run.rl.algorithm
        self.kl_ctrl = make_kl_controller(
            KLControlConfig(
                type=alg.kl_ctrl_type,
                kl_coef=alg.init_kl_coef,
                target_kl=alg.kl_target,
                horizon=alg.kl_horizon,
            )
        )
        self.total_steps = run.actor.optim.train_iters
        self.start_step = 0
        self.resume_dir: str | None = None
        self.ckpt_dirs = self._checkpoint_dirs()
        self._find_resume_point()
        self.roles: Any = None
        self.logger: Any = None
        self.scorer: Any = None
        self._last_completions: list[dict[str, Any]] = []
        self._rollout_ranks: list[int] | None = None

    # -- checkpoints ------------------------------------------------------------------------
    def _checkpoint_dirs(self) -> Any:
        from mindrl.trainer.run_state import CheckpointDirs

        save = self.run.actor.ckpt.save
        return CheckpointDirs(save) if save else None

    def _find_resume_point(self) -> None:
        """Resume when actor_config.load is a mindrl trainer checkpoint (MindSpeed-RL style
        `load` = `save`), unless `finetune` asks for weights only."""
        from mindrl.trainer.run_state import CheckpointDirs, load_run_state

        ckpt = self.run.actor.ckpt
        if not ckpt.load or ckpt.finetune or not Path(ckpt.load).is_dir():
            return
        dirs = CheckpointDirs(ckpt.load)
        step = dirs.latest()
        if step is None:
            return
        iter_dir = dirs.iteration_dir(step)
        state = load_run_state(iter_dir)
        self.resume_dir = str(iter_dir)
        self.start_step = state.step
        self.sampler.load_state_dict(state.sampler)
        if state.kl_ctrl:
            self.kl_ctrl.load_state_dict(state.kl_ctrl)
        if not ckpt.no_load_rng:
            state.rng.restore()
        logger.info("resuming from %s at step %d", iter_dir, state.step)

    def checkpoint_due(self, step: int) -> bool:
        interval = self.run.actor.ckpt.save_interval
        if self.ckpt_dirs is None:
            return False
        return step == self.total_steps or (interval > 0 and step % interval == 0)

    def save_checkpoint(self, step: int) -> None:
        from mindrl.trainer.run_state import RunState, save_run_state

        pending = self.ckpt_dirs.begin(step)
        try:
            self.roles.actor.execute_all("save_checkpoint", str(pending))
            state = RunState.capture(step, self.sampler.state_dict(), self.kl_ctrl.state_dict())
            save_run_state(pending, state)
        except BaseException:
            self.ckpt_dirs.abort(step)
            raise
        self.ckpt_dirs.commit(step)
        self.ckpt_dirs.prune(self.run.actor.ckpt.keep_last_n_checkpoints)

    def export_final(self) -> None:
        """The final actor as an HF folder beside the checkpoints (or in the output dir)."""
        root = Path(self.run.actor.ckpt.save or self.out_dir)
        target = root / "hf_final"
        assets = self.run.actor.data.tokenizer_name_or_path
        self.roles.actor.execute_all("export_hf", str(target), assets)
        logger.info("final actor exported to %s", target)

    # -- life cycle -------------------------------------------------------------------------
    @contextlib.contextmanager
    def started(self) -> Iterator[TrainContext]:
        """Ray, the role workers with their models, the reward pool and the metrics sinks."""
        from mindrl.accelerator import get_accelerator
        from mindrl.cluster.placement import plan_placement
        from mindrl.cluster.ray_cluster import start_or_connect
        from mindrl.rewards.scorer import RewardScorer
        from mindrl.trainer.metrics import MetricsLogger
        from mindrl.trainer.roles import start_roles

        run = self.run
        acc = get_accelerator(run.runtime.accelerator)
        rw = run.rl.reward
        with contextlib.ExitStack() as stack:
            if rw.rule_reward:
                self.scorer = stack.enter_context(
                    RewardScorer.from_config(rw, run.rl.reward_params)
                )
            cluster = stack.enter_context(start_or_connect(run.runtime, acc))
            resources = cluster.cluster_resources()
            plan = plan_placement(run, acc.ray_resource, resources.max_per_node(acc.ray_resource))
            logger.info("%s", plan.describe())
            self.roles = start_roles(run, plan, cluster.master_addr)
            stack.callback(self.roles.shutdown)
            self.roles.actor.execute_all("init_model", self.resume_dir)
            if self.roles.ref is not None:
                self.roles.ref.execute_all("init_model")
            if self.roles.reward is not None:
                self.roles.reward.execute_all("init_model")
            if self.roles.rollout is not None:
                model_dir = self.roles.actor.execute_rank(0, "engine_model_dir")
                self.roles.rollout.execute_all("init_engine", model_dir)
            self.sync_weights()
            self.logger = stack.enter_context(
                MetricsLogger(
                    self.out_dir,
                    use_tensorboard=run.rl.logging.use_tensorboard,
                    total_steps=self.total_steps,
                    log_completions=run.rl.logging.log_completions,
                    start_step=self.start_step,
                )
            )
            yield self

    def sync_weights(self) -> dict[str, float]:
        """Trained weights -> every rollout engine (in the actor, or in the rollout group)."""
        import time

        roles = self.roles
        if roles.rollout is None:
            return roles.actor.execute_all("sync_weights")[0]
        start = time.perf_counter()
        refs = next(r for r in roles.actor.execute_all("pack_weights") if r)
        moved = roles.rollout.execute_all("load_weight_buckets", refs)[0]
        return {
            "timing/resharding_to_infer": time.perf_counter() - start,
            "resharding/bytes": float(moved),
        }

    @property
    def recomputes_old_log_probs(self) -> bool:
        """Whether the old policy's log-probs need their own forward pass: only when a batch
        gets several optimizer steps (later ones see a moved policy) or the KL-in-reward
        penalty reads them before the update."""
        from mindrl.workers.actor import optimizer_steps_per_rl_step

        alg = self.run.rl.algorithm
        if alg.recompute_old_log_prob == "always" or optimizer_steps_per_rl_step(self.run) > 1:
            return True
        return alg.init_kl_coef > 0 and not alg.use_kl_loss

    def new_timer(self) -> Any:
        from mindrl.trainer.metrics import Timer

        return Timer()

    # -- rollout and scoring ----------------------------------------------------------------
    def sampling(self, step: int, *, validation: bool = False) -> Any:
        from dataclasses import replace

        from mindrl.rollout import RolloutSampling

        cfg = self.run.generate.sampling_config
        n = 1 if validation else self.run.rl.algorithm.n_samples_per_prompt
        sampling = RolloutSampling.from_config(cfg, n)
        base = cfg.seed if cfg.seed is not None else self.run.actor.data.seed
        # a per-step seed: the same step samples the same responses, resumed or not
        sampling = replace(sampling, seed=base * 100_003 + step)
        return replace(sampling, temperature=0.0) if validation else sampling

    def rollout(self, records: list[Any], sampling: Any) -> SampleBatch:
        """n responses per prompt from the actor's engines, one chunk of prompts per DP rank."""
        from mindrl.cluster.worker_group import split_evenly

        gen = self.roles.generator
        prompts = [list(r.prompt_ids) for r in records]
        slices = self.rollout_ranks()
        chunks = split_evenly(prompts, max(slices) + 1)
        gen.execute_all("rollout_mode")
        results_by_rank = gen.dispatch("generate", [chunks[s] for s in slices], sampling)
        gen.execute_all("train_mode")
        per_slice: list[Any] = [None] * len(chunks)
        for s, res in zip(slices, results_by_rank):
            if per_slice[s] is None and res is not None:
                per_slice[s] = res
        rows: list[dict[str, Any]] = []
        offset = 0
        for chunk, results in zip(chunks, per_slice):
            for r in results:
                rows.append({**r, "prompt_index": offset + r["prompt_index"]})
            offset += len(chunk)
        return build_sample_batch(
            [prompts[r["prompt_index"]] for r in rows],
            [r["token_ids"] for r in rows],
            self.pad_id,
            meta={
                "label": [records[r["prompt_index"]].label for r in rows],
                "prompt_text": [records[r["prompt_index"]].prompt_text for r in rows],
                "finish_reason": [r["finish_reason"] for r in rows],
            },
            rollout_log_probs=[r["log_probs"] for r in rows],
        )

    def rollout_ranks(self) -> list[int]:
        """The prompt slice each rank of the generating group works on (asked once)."""
        if self._rollout_ranks is None:
            self._rollout_ranks = self.roles.generator.execute_all("rollout_rank")
        return self._rollout_ranks

    def score(self, batch: SampleBatch) -> tuple[torch.Tensor, dict[str, float]]:
        from mindrl.rewards.types import SampleMeta

        if self.roles.reward is not None:  # rule_reward: false -> the reward model scores
            rm = self.roles.reward
            scores = torch.cat(rm.dispatch("compute_rm_score", batch.chunks(rm.world_size)))
            return scores, {"reward_model/mean": float(scores.mean())}
        texts = self._responses_text(batch)
        max_tokens = self.run.generate.sampling_config.max_tokens
        metas = [
            SampleMeta(response_length=int(n), max_length=max_tokens, finish_reason=f)
            for n, f in zip(batch.response_lengths.tolist(), batch.meta["finish_reason"])
        ]
        result = self.scorer.score(texts, batch.meta["label"], metas)
        self._last_completions = [
            {"prompt": p, "response": t, "label": lab, "score": s}
            for p, t, lab, s in zip(
                batch.meta["prompt_text"], texts, batch.meta["label"], result.scores
            )
        ]
        return torch.tensor(result.scores, dtype=torch.float32), dict(result.metrics)

    def _responses_text(self, batch: SampleBatch) -> list[str]:
        out = []
        for ids, p, n in zip(batch.input_ids, batch.prompt_lengths, batch.response_lengths):
            out.append(
                self.tokenizer.decode(ids[int(p) : int(p) + int(n)], skip_special_tokens=True)
            )
        return out

    def log_probs(self, group: Any, batch: SampleBatch) -> torch.Tensor:
        parts = group.collect_by_dp(
            group.dispatch_by_dp("compute_log_prob", batch.chunks(group.dp_size))
        )
        return torch.cat(parts, dim=0)

    # -- advantages -------------------------------------------------------------------------
    def advantages(
        self,
        batch: SampleBatch,
        scores: torch.Tensor,
        old_lp: torch.Tensor | None,
        ref_lp: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        from mindrl.algorithms import compute_advantages, kl_penalized_rewards, overlong_filter

        alg = self.run.rl.algorithm
        mask = batch.response_mask
        if alg.overlong_filter:
            mask = overlong_filter(mask, batch.meta["finish_reason"])
            batch.response_mask.copy_(mask)
        metrics: dict[str, float] = {}
        rewards = scores
        if alg.init_kl_coef > 0 and not alg.use_kl_loss and ref_lp is not None:
            assert old_lp is not None, "KL-in-reward needs recomputed old log-probs"
            penalized = kl_penalized_rewards(
                scores, old_lp, ref_lp, mask, self.kl_ctrl.value, alg.kl_penalty
            )
            rewards = penalized.seq_rewards
            metrics["actor/reward_kl_penalty"] = penalized.mean_kl
            metrics["actor/reward_kl_penalty_coeff"] = float(self.kl_ctrl.value)
            self.kl_ctrl.update(penalized.mean_kl, batch.size)
        adv = compute_advantages(alg.adv_estimator, rewards, alg.n_samples_per_prompt, mask)
        return adv, metrics

    # -- metrics ----------------------------------------------------------------------------
    def step_metrics(
        self, batch: SampleBatch, scores: torch.Tensor, timer: Any, *parts: dict[str, float]
    ) -> dict[str, float]:
        from mindrl.algorithms import rollout_mismatch_metrics
        from mindrl.trainer.metrics import summarize

        times = timer.metrics()
        resp = batch.response_lengths.float()
        tokens = float(resp.sum() + batch.prompt_lengths.float().sum())
        out: dict[str, float] = {"grpo/score": float(scores.mean())}
        for part in parts:
            out.update(part)
        out.update(times)
        out.update(summarize(resp.tolist(), "response_length"))
        out.update(summarize(batch.prompt_lengths.float().tolist(), "prompt_length"))
        out["response_length/clip_ratio"] = (
            sum(f == "length" for f in batch.meta["finish_reason"]) / batch.size
        )
        if "old_log_probs" in batch.tensors:  # else the update measured it on-policy
            out.update(
                rollout_mismatch_metrics(
                    batch.tensors["old_log_probs"],
                    batch.tensors["rollout_log_probs"],
                    batch.response_mask,
                )
            )
        out["e2e_tps"] = tokens / max(times["timing/step"], 1e-9)
        out["update_tps"] = (
            tokens * self.run.rl.algorithm.epochs / max(times["timing/update"], 1e-9)
        )
        out["vllm_tps"] = float(resp.sum()) / max(times["timing/rollout"], 1e-9)
        return out

    def log_completions(self, step: int) -> None:
        if self.run.rl.logging.log_completions:
            self.logger.log_completions(step, self._last_completions)

    # -- validation -------------------------------------------------------------------------
    def validation_due(self, step: int) -> bool:
        freq = self.run.rl.loop.test_freq
        return freq > 0 and step % freq == 0

    def log_validation(self, step: int) -> None:
        """Greedy responses to the held-out prompts, scored by the same verifiers."""
        from mindrl.data.dataset import PromptDataset

        path = self.run.rl.loop.val_data_path
        if not path:
            logger.warning("validation requested but rl_config.val_data_path is not set")
            return
        val = PromptDataset(path)
        slices = max(self.rollout_ranks()) + 1
        usable = len(val) - len(val) % slices
        batch = self.rollout(val.batch(list(range(usable))), self.sampling(step, validation=True))
        scores, metrics = self.score(batch)
        out = {"val/score": float(scores.mean())}
        out.update({f"val/{k}": v for k, v in metrics.items() if k.endswith("_rewards/mean")})
        self.logger.log(step, out)
