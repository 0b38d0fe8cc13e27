"""On-policy distillation without workers: the reverse-KL advantage math, the step's
advantage with and without the task reward, the teacher role's config (placement, memory
plan, refusals) and the tokenizer check that refuses a teacher reading other ids."""

from __future__ import annotations

import logging

import pytest
import torch

from mindrl.algorithms import compute_advantages, distillation_advantages
from mindrl.algorithms.kl import FixedKLController
from mindrl.cluster.placement import plan_placement
from mindrl.config import ConfigError, load_run_config
from mindrl.data.batch import build_sample_batch
from mindrl.planning import plan_memory
from mindrl.trainer.advantage_step import compute_step_advantages

# the random tiny Qwen3 stands in for the trained teacher (no asset build in unit tests)
TEACHER = (
    "teacher_config.load=${asset:tiny_qwen3}",
    "teacher_config.tokenizer_name_or_path=${asset:tiny_qwen3}",
)


def _opd(*overrides: str):
    run, _ = load_run_config("opd_tiny_cpu", [*TEACHER, *overrides], check_paths=False)
    return run


def test_advantage_is_minus_coef_times_reverse_kl_on_the_response():
    gen = torch.Generator().manual_seed(0)
    student, teacher = -torch.rand(4, 6, generator=gen), -torch.rand(4, 6, generator=gen)
    mask = torch.tensor([[0, 0, 1, 1, 1, 0]] * 4)
    out = distillation_advantages(student, teacher, mask, kl_coef=0.5)
    valid = mask.bool()
    assert torch.equal(out.values[valid], -0.5 * (student - teacher)[valid])
    assert torch.count_nonzero(out.values[~valid]) == 0
    assert out.metrics["opd/reverse_kl"] == pytest.approx(float((student - teacher)[valid].mean()))
    assert out.metrics["opd/teacher_log_prob"] == pytest.approx(float(teacher[valid].mean()))
    assert "opd/distill_share" not in out.metrics
    task = torch.full((4, 6), 0.25) * mask
    mixed = distillation_advantages(student, teacher, mask, kl_coef=0.5, task_advantages=task)
    assert torch.allclose(mixed.values[valid], (0.25 - 0.5 * (student - teacher))[valid])
    assert 0.0 < mixed.metrics["opd/distill_share"] < 1.0
    with pytest.raises(ValueError, match="differ"):
        distillation_advantages(student, teacher[:, :5], mask)


def test_step_advantage_reads_the_teacher_and_mixes_the_task_reward_when_asked():
    batch = build_sample_batch([[5, 6]] * 4, [[7, 8, 9], [7, 8], [7], [7, 8, 9]], 0)
    mask = batch.response_mask
    student = -0.5 * mask
    teacher = -0.2 * mask
    scores = torch.tensor([1.0, 0.0, 0.5, 0.25])
    run = _opd()
    alg, cfg = run.rl.algorithm, run.rl.distillation
    adv = compute_step_advantages(
        batch, scores, alg, FixedKLController(0.0), student, teacher=teacher, distillation=cfg
    )
    assert torch.allclose(adv.values, 0.3 * mask)
    mixed_run = _opd("rl_config.use_task_rewards=true")
    mixed = compute_step_advantages(
        batch,
        scores,
        mixed_run.rl.algorithm,
        FixedKLController(0.0),
        student,
        teacher=teacher,
        distillation=mixed_run.rl.distillation,
    )
    task = compute_advantages("group_norm", scores, 4, mask)
    assert torch.allclose(mixed.values, task + 0.3 * mask)
    with pytest.raises(ValueError, match="teacher's log-probs"):
        compute_step_advantages(
            batch, scores, alg, FixedKLController(0.0), student, distillation=cfg
        )


def test_teacher_role_is_placed_planned_and_described():
    run = _opd()
    assert run.teacher is not None and run.teacher.role == "teacher"
    assert run.teacher.model.name == "tiny_qwen3" and run.actor.model.name == "tiny"
    assert [r.role for r in run.roles] == ["actor", "teacher"]
    plan = plan_placement(run, "CPU")
    assert [g.name for g in plan.groups] == ["actor+teacher"]
    assert "teacher TP1 PP1 DP1" in plan_memory(run, "cpu").describe()
    own = _opd("rl_config.colocate_all_models=false", "+rl_config.teacher_resource.num_npus=2")
    assert [g.name for g in plan_placement(own, "CPU").groups] == ["actor", "teacher"]
    assert own.teacher is not None and own.teacher.num_devices == 2


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        (["~teacher_config"], "rl_config.use_opd: on-policy distillation needs a teacher_config"),
        (["rl_config.colocate_all_models=false"], "rl_config.teacher_resource: required"),
        (["rl_config.adv_estimator=gae"], "on-policy distillation with a critic"),
        (
            ["rl_config.use_task_rewards=true", "rl_config.rule_reward=false"],
            "use_task_rewards: true, but there is no reward",
        ),
    ],
)
def test_distillation_rules_are_config_errors(extra, text):
    with pytest.raises(ConfigError) as err:
        _opd(*extra)
    assert text in str(err.value)


def test_teacher_without_use_opd_is_warned(caplog):
    with caplog.at_level(logging.WARNING):
        run = _opd("rl_config.use_opd=false")
    assert run.teacher is None
    assert "teacher_config / rl_config.teacher_resource: no effect" in caplog.text


def test_a_teacher_with_another_tokenizer_is_refused():
    from transformers import AutoTokenizer

    from mindrl.assets.models import tiny_model_dir, tiny_qwen3_dir
    from mindrl.data.tokenizer_match import teacher_tokenizer_problem, tokenizer_mismatch

    student = str(tiny_model_dir())
    assert teacher_tokenizer_problem(student, str(tiny_qwen3_dir())) is None  # one tokenizer
    extended = AutoTokenizer.from_pretrained(student)
    extended.add_special_tokens({"additional_special_tokens": ["<teacher_only>"]})
    why = tokenizer_mismatch(AutoTokenizer.from_pretrained(student), extended)
    assert why is not None and "1 vocabulary entries differ" in why
    assert "special tokens differ" in why and "<teacher_only>" in why
