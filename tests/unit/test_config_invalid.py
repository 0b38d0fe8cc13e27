"""Invalid configs are rejected while composing/validating (before any worker starts), and
every message names the offending key path."""

from __future__ import annotations

import pytest

from mindrl.config import ConfigError, load_run_config

BASE = "r1_zero_qwen25_7b"  # actor TP2 PP4 on 8 devices, ref TP2 PP2 on 8, gbs 64 x n 8

# (overrides, text the error must contain: the key path and what is wrong)
INVALID: list[tuple[list[str], list[str]]] = [
    (["actor_config.lrr=1e-6"], ["actor_config.lrr: unknown key", "did you mean 'lr'"]),
    (
        ["megatron_training.global_batchsize=8"],
        ["megatron_training.global_batchsize", "global_batch_size"],
    ),
    (["rl_config.actor_resource.num_npu=8"], ["rl_config.actor_resource.num_npu", "num_npus"]),
    (
        ["generate_config.sampling_config.temprature=0.7"],
        ["sampling_config.temprature", "temperature"],
    ),
    (["foo.bar=1"], ["foo: unknown top-level section"]),
    (["rl_config.clip_ratio=1.5"], ["rl_config.clip_ratio", "out of range"]),
    (["rl_config.clip_ratio=0"], ["rl_config.clip_ratio", "out of range"]),
    (["actor_config.lr=-1e-6"], ["actor_config.lr", "out of range"]),
    (["generate_config.sampling_config.temperature=0"], ["sampling_config.temperature", "> 0"]),
    (["generate_config.sampling_config.top_p=1.5"], ["sampling_config.top_p"]),
    (["rl_config.verifier_timeout=-1"], ["rl_config.verifier_timeout"]),
    (["rl_config.actor_resource.num_npus=0"], ["rl_config.actor_resource.num_npus"]),
    (
        ["actor_config.micro_batch_size=abc"],
        ["actor_config.micro_batch_size", "expected an integer"],
    ),
    (["megatron_training.bf16=yes"], ["megatron_training.bf16", "true/false"]),
    (["rl_config.verifier_function=base_acc"], ["rl_config.verifier_function", "expected a list"]),
    (["rl_config.adv_estimator=vtrace"], ["rl_config.adv_estimator", "not one of"]),
    (["rl_config.adv_estimator=gae"], ["rl_config.adv_estimator: gae needs a critic's values"]),
    (["actor_config.lr_decay_style=cos"], ["actor_config.lr_decay_style", "cosine"]),
    (["runtime.accelerator=tpu"], ["runtime.accelerator", "not one of"]),
    (["actor_config.model=qwen25_72b"], ["actor_config.model", "qwen25_72b", "not loaded"]),
    (
        ["actor_config.tensor_model_parallel_size=3"],
        ["actor_config.tensor_model_parallel_size", "does not divide"],
    ),
    (
        ["actor_config.pipeline_model_parallel_size=3"],
        ["actor_config.pipeline_model_parallel_size", "num_layers"],
    ),
    (
        ["rl_config.reference_resource.num_npus=6"],
        ["ref_config.tensor_model_parallel_size", "reference_resource"],
    ),
    (["model.qwen25_7b.num_query_groups=3"], ["tensor_model_parallel_size", "kv heads"]),
    (["rl_config.n_samples_per_prompt=1"], ["rl_config.n_samples_per_prompt", "at least 2"]),
    (["actor_config.micro_batch_size=3"], ["actor_config.micro_batch_size", "not divisible"]),
    (["rl_config.mini_batch_size=100"], ["rl_config.mini_batch_size", "does not divide"]),
    (["ref_config.global_batch_size=32"], ["ref_config.global_batch_size", "differs"]),
    (["rl_config.verifier_weight=[1.0,2.0]"], ["rl_config.verifier_weight", "one weight each"]),
    (
        ["rl_config.verifier_function=[bse_acc]"],
        ["rl_config.verifier_function[0]", "bse_acc", "base_acc"],
    ),
    (
        ["rl_config.verifier_files=[/nonexistent/verifier.py]"],
        ["rl_config.verifier_files[0]", "not found"],
    ),
    (["rl_config.clip_ratio_high=0.1"], ["rl_config.clip_ratio_high", "below clip_ratio"]),
    (["megatron_training.fp16=true"], ["bf16", "fp16"]),
    (["generate_config.max_model_len=1000"], ["generate_config.max_model_len", "max_tokens"]),
    (
        ["generate_config.infer_tensor_parallel_size=3"],
        ["generate_config.infer_tensor_parallel_size"],
    ),
    (["rl_config.rule_reward=false"], ["rl_config.rule_reward", "reward model"]),
    (["~ref_config"], ["reference_resource", "no ref_config"]),
    # without ref_config / reference_resource the config is no longer 1.x by its shape
    (
        ["~ref_config", "~rl_config.reference_resource", "rl_config.use_integrated_worker=false"],
        ["needs a reference model", "KL: loss"],
    ),
    (
        ["rl_config.reward_resource.num_npus=4", "~reward_config"],
        ["rl_config.reward_resource", "no reward_config"],
    ),
    (["~actor_config"], ["actor_config: required section"]),
    (["rl_config.dynamic_sampling=true"], ["rl_config.dynamic_sampling", "filter_groups_enable"]),
]


@pytest.mark.parametrize(("overrides", "expected"), INVALID, ids=[" ".join(o) for o, _ in INVALID])
def test_invalid_config_is_rejected_naming_the_key(overrides, expected):
    with pytest.raises(ConfigError) as info:
        load_run_config(BASE, overrides, check_paths=False)
    message = str(info.value)
    for text in expected:
        assert text in message, f"{text!r} not in:\n{message}"


def test_there_are_at_least_25_distinct_invalid_configs():
    assert len({tuple(o) for o, _ in INVALID}) >= 25


def test_the_base_config_itself_is_valid():
    load_run_config(BASE, check_paths=False)


def test_all_problems_reported_together():
    with pytest.raises(ConfigError) as info:
        load_run_config(
            BASE,
            ["actor_config.lrr=1", "rl_config.clip_ratio=2", "runtime.accelerator=x"],
            check_paths=False,
        )
    assert len(info.value.problems) == 3


def test_missing_paths_are_named(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_run_config(BASE, [f"megatron_training.tokenizer_name_or_path={tmp_path}/nope"])
    message = str(info.value)
    assert "actor_config.tokenizer_name_or_path: path does not exist" in message
    assert "ref_config.load: path does not exist: ./ckpt" in message
    assert "megatron_training.data_path" in message


def test_custom_verifier_file_registers_a_name(tmp_path):
    path = tmp_path / "my_verifier.py"
    path.write_text(
        "from mindrl.rewards.registry import register_verifier\n"
        "@register_verifier('always_one_for_test')\n"
        "def always_one(response, label, meta=None):\n    return 1.0\n"
    )
    run, _ = load_run_config(
        BASE,
        [f"rl_config.verifier_files=[{path}]", "rl_config.verifier_function=[always_one_for_test]"],
        check_paths=False,
    )
    assert run.rl.reward.verifier_function == ("always_one_for_test",)


def test_reward_params_are_rl_config_keys():
    run, _ = load_run_config(
        BASE,
        ["rl_config.cosine_max_len=512", "rl_config.strict_format_require_boxed=false"],
        check_paths=False,
    )
    assert run.rl.reward_params.cosine_max_len == 512
    assert run.rl.reward_params.strict_format_require_boxed is False
    with pytest.raises(ConfigError, match="soft_cache_length"):
        load_run_config(
            BASE,
            ["rl_config.soft_max_length=100", "rl_config.soft_cache_length=200"],
            check_paths=False,
        )
