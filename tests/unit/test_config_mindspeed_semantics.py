"""MindSpeed-RL keys mean what they mean in MindSpeed-RL: configs written here with its key
sets and values (its 2.x run configs and the seed-era 1.x generation), built and validated
the way the CLI does, then checked for the optimizer-step count, where KL goes and how the
reference model is made."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mindrl.config.build import build_run_config
from mindrl.config.errors import ConfigError
from mindrl.config.meaning import meaning_lines
from mindrl.config.validate import validate

QWEN25_7B = {  # a MindSpeed-RL model yaml: no model_type_hf, Qwen2 told by add_qkv_bias
    "use_mcore_models": True,
    "num_layers": 28,
    "hidden_size": 3584,
    "ffn_hidden_size": 18944,
    "num_attention_heads": 28,
    "rotary_base": 1000000,
    "max_position_embeddings": 32768,
    "make_vocab_size_divisible_by": 1,
    "padded_vocab_size": 152064,
    "untie_embeddings_and_output_weights": True,
    "add_qkv_bias": True,
    "disable_bias_linear": True,
    "group_query_attention": True,
    "num_query_groups": 4,
    "position_embedding_type": "rope",
    "normalization": "RMSNorm",
    "swiglu": True,
    "norm_epsilon": 1e-6,
}

# the shape of MindSpeed-RL 2.x's grpo_qwen25_7b_A3: integrated worker, no ref_config
GRPO_2X: dict[str, Any] = {
    "model": {"qwen25_7b": QWEN25_7B},
    "megatron_training": {
        "model": "qwen25_7b",
        "use_fused_rmsnorm": True,
        "global_batch_size": 32,
        "seq_length": 2048,
        "train_iters": 1000,
        "seed": 1234,
        "stage": "ray_grpo",
    },
    "actor_config": {
        "model": "qwen25_7b",
        "micro_batch_size": 1,
        "tensor_model_parallel_size": 4,
        "pipeline_model_parallel_size": 1,
        "lr": 1e-6,
        "lr_decay_style": "constant",
        "weight_decay": 0.0,
        "clip_grad": 1.0,
        "finetune": True,
    },
    "rl_config": {
        "use_integrated_worker": True,
        "blocking": True,
        "gamma": 1.0,
        "lam": 0.95,
        "adv_estimator": "group_norm",
        "kl_penalty": "low_var_kl",
        "kl_ctrl_type": "fixed",
        "init_kl_coef": 0.001,
        "mini_batch_size": 32,
        "max_prompt_length": 2048,
        "epochs": 1,
        "clip_ratio": 0.2,
        "entropy_coeff": 0.0,
        "n_samples_per_prompt": 8,
        "rule_reward": True,
        "verifier_function": ["base_acc"],
        "verifier_weight": [1.0],
        "actor_resource": {"num_npus": 16},
    },
    "generate_config": {
        "infer_tensor_parallel_size": 2,
        "max_num_seqs": 64,
        "max_model_len": 4096,
        "sampling_config": {"max_tokens": 2048, "temperature": 0.8, "top_p": 1.0},
    },
    "runtime": {"accelerator": "npu"},
}


def _seed_generation() -> dict[str, Any]:
    """The seed's r1_zero_qwen25_7b shape (MindSpeed-RL 1.x): a ref_config and its own
    devices, mini_batch_size in samples (gbs 64 x n 8 = 512: one optimizer step)."""
    raw = copy.deepcopy(GRPO_2X)
    raw["megatron_training"]["global_batch_size"] = 64
    rl = raw["rl_config"]
    del rl["use_integrated_worker"]
    rl.update(mini_batch_size=512, init_kl_coef=0.0001, reference_resource={"num_npus": 16})
    raw["ref_config"] = {
        "model": "qwen25_7b",
        "tensor_model_parallel_size": 4,
        "micro_batch_size": 1,
    }
    return raw


def _build(raw: dict[str, Any], **rl: Any):
    raw = copy.deepcopy(raw)
    raw["rl_config"].update(rl)
    run = build_run_config(raw, "test")
    validate(run, check_paths=False)
    return run


def test_2x_mini_batch_counts_prompts_one_optimizer_step():
    run = _build(GRPO_2X)  # gbs 32 prompts, mini 32 prompts, n 8
    assert run.optimizer_steps_per_rl_step == 1
    assert run.rl.algorithm.mini_batch_samples == 256
    assert meaning_lines(run)[0].startswith("optimizer steps per RL step: 1 ")
    four = _build(GRPO_2X, mini_batch_size=8)
    assert four.optimizer_steps_per_rl_step == 4


def test_a_value_valid_only_as_samples_is_read_as_samples_and_said():
    # use_integrated_worker: false is valid in both generations: the 2.x reading, whose
    # prompts cannot hold 512 of a 64-prompt batch; as samples it is one step
    run = _build(_seed_generation(), use_integrated_worker=False)
    assert run.rl.algorithm.mini_batch_size_unit == "samples"
    assert run.optimizer_steps_per_rl_step == 1
    assert any(line.startswith("mini_batch_size 512 read as samples") for line in run.notes)


def test_an_explicit_unit_keeps_the_refusal_naming_both_readings():
    with pytest.raises(ConfigError) as err:
        _build(_seed_generation(), use_integrated_worker=False, mini_batch_size_unit="prompts")
    text = str(err.value)
    assert "mini_batch_size: 512 read as prompts" in text
    assert "read as samples" in text and "1 optimizer step(s) per RL step" in text


def test_seed_generation_with_its_unit_gives_its_step_count():
    run = _build(_seed_generation(), use_integrated_worker=False, mini_batch_size_unit="samples")
    assert run.optimizer_steps_per_rl_step == 1
    two = _build(
        _seed_generation(),
        use_integrated_worker=False,
        mini_batch_size_unit="samples",
        mini_batch_size=256,
    )
    assert two.optimizer_steps_per_rl_step == 2


def test_a_value_valid_both_ways_is_read_as_prompts_and_the_other_reading_is_said():
    run = _build(GRPO_2X, mini_batch_size=16)  # 16 prompts (2 steps) or 16 samples (16 steps)
    assert run.optimizer_steps_per_rl_step == 2
    notice = [line for line in meaning_lines(run) if line.startswith("note:")]
    assert notice and "16 optimizer step(s)" in notice[0]


def test_init_kl_coef_is_the_kl_loss_coefficient_in_grpo():
    run = _build(GRPO_2X)
    kl = run.rl.algorithm.kl
    assert (kl.where, kl.coef, kl.estimator) == ("loss", 0.001, "low_var_kl")
    loss = run.rl.algorithm.loss_config()
    assert loss.use_kl_loss and loss.kl_loss_coef == 0.001 and loss.kl_penalty == "low_var_kl"
    assert "KL: loss, coef 0.001, estimator low_var_kl" in meaning_lines(run)


def test_unset_init_kl_coef_takes_mindspeed_rl_default():
    raw = copy.deepcopy(GRPO_2X)
    del raw["rl_config"]["init_kl_coef"]
    assert _build(raw).rl.algorithm.kl.coef == 0.01


def test_use_kl_in_reward_moves_kl_into_the_reward():
    from mindrl.trainer.advantage_step import uses_kl_in_reward
    from mindrl.trainer.grpo import recomputes_old_log_probs

    run = _build(GRPO_2X, use_kl_in_reward=True, init_kl_coef=0.05)
    assert run.rl.algorithm.kl.where == "reward"
    assert uses_kl_in_reward(run.rl.algorithm) and recomputes_old_log_probs(run)
    assert not run.rl.algorithm.loss_config().use_kl_loss


def test_kl_off_and_verl_keys():
    assert _build(GRPO_2X, init_kl_coef=0.0).rl.algorithm.kl.where == "off"
    raw = copy.deepcopy(GRPO_2X)
    del raw["rl_config"]["init_kl_coef"]
    verl = _build(raw, use_kl_loss=True, kl_loss_coef=0.002).rl.algorithm.kl
    assert (verl.where, verl.coef) == ("loss", 0.002)
    with pytest.raises(ConfigError, match="both set the KL-loss weight"):
        _build(GRPO_2X, use_kl_loss=True, kl_loss_coef=0.002)


def test_integrated_worker_builds_the_reference_from_the_actor():
    run = _build(GRPO_2X)
    assert run.ref is not None and run.ref.role == "ref"
    assert (run.ref.tp, run.ref.pp, run.ref.num_devices) == (4, 1, 16)
    assert run.ref.model == run.actor.model
    from mindrl.cluster.placement import plan_placement

    plan = plan_placement(run, "NPU", 16)
    assert [g.name for g in plan.groups] == ["actor+ref"]  # shares the actor's devices


def test_integrated_worker_refuses_a_separate_reference_like_mindspeed_rl():
    raw = _seed_generation()
    with pytest.raises(ConfigError) as err:
        _build(raw, use_integrated_worker=True, mini_batch_size_unit="samples")
    text = str(err.value)
    assert "ref_config: not allowed" in text and "reference_resource: not allowed" in text


def test_without_integrated_worker_kl_needs_a_ref_config():
    raw = copy.deepcopy(GRPO_2X)
    raw["rl_config"]["use_integrated_worker"] = False
    with pytest.raises(ConfigError, match="needs a reference model"):
        _build(raw)


# -- both generations, told by their shape (issue 59) --------------------------------------------


def _one_x_r1_zero() -> dict[str, Any]:
    """MindSpeed-RL 1.x's r1_zero_qwen25_7b key set: ref_config and reference_resource, no
    use_integrated_worker, its 1.x-only experience_count, kl_penalty kl, entropy_coeff set."""
    raw = _seed_generation()
    raw["rl_config"].update(experience_count=64, kl_penalty="kl", entropy_coeff=0.001)
    return raw


def _one_x_integrated() -> dict[str, Any]:
    """1.x's r1_zero_qwen25_7b_integrated key set: integrated worker, gbs 4 x n 8, TP4 on 8
    devices (DP 2), mini_batch_size 256, update_micro_batch_size and experience_count."""
    raw = copy.deepcopy(GRPO_2X)
    raw["megatron_training"]["global_batch_size"] = 4
    raw["actor_config"]["micro_batch_size"] = 2
    raw["rl_config"].update(
        use_integrated_worker=True,
        update_micro_batch_size=2,
        experience_count=4,
        kl_penalty="kl",
        init_kl_coef=0.0001,
        mini_batch_size=256,
        entropy_coeff=0.001,
        actor_resource={"num_npus": 8},
    )
    return raw


def test_a_1x_config_is_read_as_1x_with_one_line_saying_what_changes():
    run = _build(_one_x_r1_zero())
    lines = [line for line in meaning_lines(run) if line.startswith("read as MindSpeed-RL 1.x")]
    assert len(lines) == 1
    assert "ref_config and rl_config.reference_resource without use_integrated_worker" in lines[0]
    assert "experience_count" in lines[0] and "mini_batch_size counts samples" in lines[0]
    # where the reference comes from: 1.x's use_integrated_worker defaults to false
    assert not run.rl.resources.use_integrated_worker
    assert run.ref is not None and (run.ref.tp, run.ref.num_devices) == (4, 16)
    assert "reference model: ref_config" in meaning_lines(run)
    # optimizer steps: 512 samples of 64 x 8 = one step, as 1.x's actor splits them
    assert run.optimizer_steps_per_rl_step == 1
    # KL: in the loss, init_kl_coef, 1.x's loss's k3 whatever kl_penalty says; no entropy
    kl = run.rl.algorithm.kl
    assert (kl.where, kl.coef, kl.estimator) == ("loss", 0.0001, "k3")
    assert run.rl.algorithm.loss_config().entropy_coeff == 0.0
    assert "kl_penalty: kl" in lines[0] and "entropy_coeff: 0.001" in lines[0]


def test_1x_samples_count_steps_as_its_trainer_did():
    assert _build(_one_x_r1_zero(), mini_batch_size=256).optimizer_steps_per_rl_step == 2
    assert _build(_one_x_r1_zero(), mini_batch_size=64, epochs=2).optimizer_steps_per_rl_step == 16


def test_1x_integrated_mini_batch_above_the_batch_is_one_step_on_the_whole_batch():
    run = _build(_one_x_integrated())  # 256 samples > the 32 of a step: torch.split -> 1 chunk
    assert run.rl.resources.use_integrated_worker
    assert run.ref is not None and run.ref.num_devices == 8  # built from actor_config
    assert run.optimizer_steps_per_rl_step == 1
    assert run.rl.algorithm.mini_batch_samples == 0  # the whole batch
    lines = meaning_lines(run)
    assert any(
        line.startswith("read as MindSpeed-RL 1.x (rl_config.experience_count") for line in lines
    )
    assert any("256 samples is more than the 32 samples" for line in lines)
    assert run.rl.algorithm.kl.where == "loss"


def test_the_same_value_without_1x_keys_is_valid_under_neither_reading_and_refused():
    raw = copy.deepcopy(GRPO_2X)
    raw["megatron_training"]["global_batch_size"] = 4
    with pytest.raises(ConfigError, match="mini_batch_size"):
        _build(raw, mini_batch_size=256)


def test_a_2x_config_has_no_generation_line_and_keeps_its_reading():
    run = _build(GRPO_2X)
    assert not [line for line in meaning_lines(run) if line.startswith("read as")]
    assert run.rl.algorithm.kl.estimator == "low_var_kl" and run.rl.resources.use_integrated_worker
