"""On-policy distillation: a teacher's log-probs of the student's own samples as advantages.

The student samples a response; the teacher scores each sampled token. The per-token reverse
KL estimate `log p_student(y_t) - log p_teacher(y_t)` (the k1 estimator of KL(student ||
teacher), unbiased because y_t was drawn from the student) is a cost: its negative, scaled by
`kl_coef`, is the token's advantage, so the policy-gradient loss raises the probability of
tokens the teacher likes more than the student does and lowers the others. Mixed with a
verifier reward, the task's advantage (any estimator) is added on top, as slime does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mindrl.algorithms.aggregation import masked_mean


@dataclass(frozen=True)
class DistillationAdvantages:
    values: torch.Tensor  # [B, T] token advantages, 0 off the response
    reverse_kl: torch.Tensor  # [B, T] log p_student - log p_teacher, 0 off the response
    metrics: dict[str, float]


def reverse_kl_tokens(
    student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Per-token reverse KL estimate log p_student - log p_teacher on the sampled tokens,
    in fp32, 0 where `mask` is unset."""
    if student_log_probs.shape != teacher_log_probs.shape or student_log_probs.shape != mask.shape:
        raise ValueError(
            f"student {tuple(student_log_probs.shape)}, teacher "
            f"{tuple(teacher_log_probs.shape)} and mask {tuple(mask.shape)} log-probs differ"
        )
    diff = student_log_probs.float() - teacher_log_probs.float()
    return torch.where(mask.bool(), diff, diff.new_zeros(()))


def distillation_advantages(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float = 1.0,
    task_advantages: torch.Tensor | None = None,
) -> DistillationAdvantages:
    """Token advantages `task_advantages - kl_coef x (log p_student - log p_teacher)` (the
    task term only when given: the verifier reward mixed in) and the distillation metrics:
    the reverse KL per response token, the teacher's and student's mean log-prob, and the
    share of the advantage's magnitude the distillation term makes up."""
    valid = mask.bool()
    reverse_kl = reverse_kl_tokens(student_log_probs, teacher_log_probs, valid)
    distill = -kl_coef * reverse_kl
    values = distill if task_advantages is None else distill + task_advantages.float()
    values = torch.where(valid, values, values.new_zeros(()))
    metrics = {
        "opd/reverse_kl": float(masked_mean(reverse_kl, valid)),
        "opd/teacher_log_prob": float(masked_mean(teacher_log_probs.float(), valid)),
        "opd/student_log_prob": float(masked_mean(student_log_probs.float(), valid)),
        "opd/kl_coef": float(kl_coef),
    }
    if task_advantages is not None:
        distill_size = float(masked_mean(distill.abs(), valid))
        task_size = float(masked_mean(task_advantages.float().abs(), valid))
        metrics["opd/distill_share"] = distill_size / max(distill_size + task_size, 1e-12)
    return DistillationAdvantages(values, reverse_kl, metrics)
