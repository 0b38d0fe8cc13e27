"""`rl_config` keys of on-policy distillation (OPD): a teacher scores the student's samples.

Names are slime's (`--use-opd`, `--opd-kl-coef`) and verl's (`use_task_rewards`), with their
meaning: each response token's advantage is `-opd_kl_coef x (log p_student - log p_teacher)`,
the per-token reverse KL of the student against the teacher on the token the student sampled
(Thinking Machines' recipe), plus the verifier reward's advantage when `use_task_rewards`
(slime always adds it). The teacher is a role of its own: `teacher_config` (its model and
checkpoint) on `rl_config.teacher_resource` devices, or the actor's with `colocate_all_models`.
"""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.config.fields import spec


@dataclass(frozen=True)
class DistillationConfig:
    use_opd: bool = spec(
        False,
        help="slime's --use-opd: on-policy distillation from the teacher in teacher_config "
        "(its log-probs of the student's sampled tokens make the advantage)",
    )
    opd_kl_coef: float = spec(
        1.0,
        ge=0.0,
        help="slime's --opd-kl-coef: weight of the per-token reverse KL (log p_student - "
        "log p_teacher) subtracted from each response token's advantage",
    )
    use_task_rewards: bool = spec(
        False,
        help="verl's distillation.use_task_rewards: add the verifier reward's advantage "
        "(adv_estimator over the rule rewards) to the distillation term, as slime always "
        "does; false: the reverse KL alone (Thinking Machines' recipe)",
    )
