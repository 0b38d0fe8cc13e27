"""Run by test_opd_teacher.py through the `fresh_process` fixture: two on-policy distillation
steps of the real loop (`grpo_step`) on opd_tiny_cpu, with a real ActorWorker (the student:
megatron-core over gloo, world of one, HF rollout engine) and a real TeacherWorker (the tiny
Qwen3 from its own checkpoint) in this process, behind in-process facades of the role groups.

Arguments: {"teacher_dir", "tensors_file"}. Result: each step's metrics; the tensors each step
trained on (advantages, the student's and the teacher's log-probs, the mask, the batch's
tokens) go to `tensors_file` (torch.save).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from tests.fresh_process import json_main


@dataclass
class Pending:
    value: Any

    def result(self) -> Any:
        return self.value


@dataclass
class LocalActor:
    """The actor facade's calls, on the worker in this process (one rank)."""

    worker: Any
    trained: list[Any] = field(default_factory=list)

    def rollout_ranks(self) -> list[int]:
        return [self.worker.rollout_rank()]

    def generate_in_rollout_mode(
        self, prompts_per_rank: Any, sampling: Any, tools_kwargs_per_rank: Any = None
    ) -> Any:
        return [self.worker.generate_in_rollout_mode(prompts_per_rank[0], sampling)]

    def log_probs(self, batch: Any) -> Any:
        return self.worker.compute_log_prob(batch)

    def update(self, batch: Any, step: int) -> dict[str, float]:
        self.trained.append(batch)
        return self.worker.update(batch, step)

    def sync_weights(self) -> dict[str, float]:
        return self.worker.sync_weights()


@dataclass
class LocalTeacher:
    worker: Any
    scored: list[Any] = field(default_factory=list)

    def start_log_probs(self, batch: Any) -> Pending:
        self.scored.append(self.worker.compute_log_prob(batch))
        return Pending(self.scored[-1])


def main(args: dict[str, Any]) -> dict[str, Any]:
    import torch

    from mindrl.config import load_run_config
    from mindrl.rewards.scorer import RewardScorer
    from mindrl.trainer.grpo import grpo_step
    from mindrl.trainer.roles import Roles
    from mindrl.trainer.setup import Trainer, kl_controller, load_prompts
    from mindrl.workers.actor import ActorWorker
    from mindrl.workers.megatron_worker import TeacherWorker

    teacher_dir = args["teacher_dir"]
    run, _ = load_run_config(
        "opd_tiny_cpu",
        [
            "generate_config.rollout_backend=hf",
            f"teacher_config.load={teacher_dir}",
            f"teacher_config.tokenizer_name_or_path={teacher_dir}",
            "megatron_training.global_batch_size=4",
            "generate_config.sampling_config.max_tokens=8",
        ],
    )
    actor = ActorWorker(run)
    actor.init_model()
    teacher = TeacherWorker(run)  # the same world of one: parallel state is reused
    teacher.init_model()
    actor.sync_weights()
    local_actor, local_teacher = LocalActor(actor), LocalTeacher(teacher)
    roles = Roles(
        actor=local_actor,  # type: ignore[arg-type]
        ref=None,
        reward=None,
        rollout=None,
        groups=[],
        placement_groups={},
        teacher=local_teacher,  # type: ignore[arg-type]
    )
    metrics = []
    with contextlib.ExitStack() as stack:
        scorer = stack.enter_context(RewardScorer.from_config(run.rl.reward, run.rl.reward_params))
        trainer = Trainer(
            run=run,
            prompts=load_prompts(run),
            roles=roles,
            scorer=scorer,
            kl_ctrl=kl_controller(run),
            metrics=None,  # type: ignore[arg-type]
            checkpoints=None,  # type: ignore[arg-type]
            start_step=0,
        )
        for step in range(2):
            out, _ = grpo_step(trainer, step)
            metrics.append({k: float(v) for k, v in out.items() if not k.startswith("timing/")})
    steps = [
        {
            "advantages": batch.tensors["advantages"],
            "student": batch.tensors["old_log_probs"],
            "teacher": scored,
            "mask": batch.response_mask,
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
        }
        for batch, scored in zip(local_actor.trained, local_teacher.scored)
    ]
    torch.save(steps, args["tensors_file"])
    actor.shutdown()
    return {"metrics": metrics, "tensors_file": args["tensors_file"]}


if __name__ == "__main__":
    json_main(main)
