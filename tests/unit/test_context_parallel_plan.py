"""Context parallelism in the plan: the rank grid (TP x PP x CP x DP), the memory plan's
activations per rank (the layers run on seq / CP tokens), the sequence chunking, and
MindSpeed-RL's own long-response DAPO configs (20k, 32k; CP 2, ring), written here key for
key, dry-run unchanged."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from mindrl.config import load_run_config
from mindrl.models.cp_layout import CPLayout, chunk_index
from mindrl.planning.activations import forward_activations, stage_activations
from mindrl.planning.shapes import role_shape

REPO = Path(__file__).resolve().parents[2]


def test_chunks_are_megatrons_load_balanced_pairs():
    assert chunk_index(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert chunk_index(8, 2, 1).tolist() == [2, 3, 4, 5]
    ranks = torch.cat([chunk_index(12, 3, r) for r in range(3)])
    assert ranks[CPLayout(3, 1).order(12)].tolist() == list(range(12))
    with pytest.raises(ValueError, match="multiple of 2 x CP = 4"):
        chunk_index(10, 2, 0)


def test_cp_is_in_the_rank_grid_and_halves_the_layers_activations():
    """The long-response CPU config: CP 2 on the actor and the reference."""
    run, _ = load_run_config(
        "grpo_tiny_long_cp2_cpu",
        ["rl_config.actor_resource.num_npus=4", "megatron_training.global_batch_size=4"],
    )
    assert (run.actor.cp, run.actor.dp, run.ref.cp) == (2, 2, 2)
    assert run.actor.parallel.context_parallel_algo == "megatron_cp_algo"
    shape = role_shape(run.actor, "cpu")
    assert "CP2 DP2" in shape.describe()
    whole = dataclasses.replace(shape, cp=1)
    seq = 8192
    for cp2, cp1 in (
        (stage_activations(shape, seq, 0, 1).total, stage_activations(whole, seq, 0, 1).total),
        (forward_activations(shape, seq), forward_activations(whole, seq)),
    ):
        # half the layers' tokens, plus the keys / values gathered from the other rank
        assert 0.5 * cp1 < cp2 < 0.6 * cp1, (cp2, cp1)


def test_cp_must_divide_the_devices_with_tp_and_pp():
    from mindrl.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"x CP \(2\) = 2 does not divide"):
        load_run_config(
            "grpo_tiny_cpu",
            ["rl_config.actor_resource.num_npus=3", "actor_config.context_parallel_size=2"],
        )


def test_shared_prompts_with_cp_are_refused_at_config_time_and_not_suggested():
    from mindrl.config.errors import ConfigError
    from mindrl.config.fast_settings import fast_settings_left_off

    with pytest.raises(ConfigError, match="share_prompt_forward with actor_config's context"):
        load_run_config(
            "grpo_tiny_long_cp2_cpu",
            ["rl_config.share_prompt_forward=true", "rl_config.use_remove_padding=true"],
            local_paths=False,
        )
    run, _ = load_run_config("grpo_tiny_long_cp2_cpu", [], local_paths=False)
    assert not any("share_prompt_forward" in s for s in fast_settings_left_off(run))


# MindSpeed-RL's configs/dapo_qwen25_32b_A2_20k.yaml, key for key (comments dropped); its
# _A3_32k differs only in the lengths and budgets below (LONGER_32K)
DAPO_20K_YAML = """\
defaults:
  - model:
      - qwen25_32b

megatron_training:
  model: qwen25_32b
  use_fused_rmsnorm: true
  use_mcore_models: true
  sequence_parallel: true
  use_flash_attn: true
  no_masked_softmax_fusion: true
  attention_softmax_in_fp32: true
  no_gradient_accumulation_fusion: true
  use_fused_swiglu: true
  use_fused_rotary_pos_emb: true
  bf16: true
  use_distributed_optimizer: true
  tokenizer_type: PretrainedFromHF
  tokenizer_name_or_path: ./Qwen2.5-32B
  global_batch_size: 256
  seq_length: 2048
  save_interval: 50
  train_iters: 200
  stage: ray_dapo
  attention_dropout: 0.0
  hidden_dropout: 0.0
  distributed_backend: nccl
  no_shared_storage: true
  no_pad_to_seq_lengths: true
  dataset_additional_keys: ['labels',]
  data_path: ./data
  split: 100,0,0
  no_shuffle: false
  full_shuffle_instruction_dataset: false
  seed: 1
  reset_attention_mask: true

actor_config:
  model: qwen25_32b
  micro_batch_size: 1
  tensor_model_parallel_size: 8
  pipeline_model_parallel_size: 2
  lr: 1e-6
  lr_decay_style: constant
  min_lr: 0
  weight_decay: 0.1
  lr_warmup_fraction: 0.0
  clip_grad: 1.0
  adam_beta1: 0.9
  adam_beta2: 0.95
  finetune: true
  load: ./Qwen2.5-32B-tp8-pp2
  save: ./ckpt
  no_load_optim: true
  no_load_rng: true
  context_parallel_size: 2
  context_parallel_algo: megatron_cp_algo
  attention_mask_type: causal

rl_config:
  zmq_communication: false
  blocking: true
  use_remove_padding: true
  actor_max_packing_token_size: 45056
  update_max_packing_token_size: 22528
  use_dynamic_bsz: true
  use_dp_batch_balance: true
  actor_forward_micro_batch_size: 1
  use_integrated_worker: true
  gamma: 1.0
  lam: 0.95
  adv_estimator: group_norm
  mini_batch_size: 32
  max_prompt_length: 2048
  epochs: 1
  clip_ratio: 0.2
  entropy_coeff: 0.0
  shuffle_mini_batch: false
  n_samples_per_prompt: 16
  rule_reward: true
  verifier_function: ["acc_for_dapo"]
  verifier_weight: [1.0]
  num_cpus_for_local_task: 1.0
  use_tensorboard: true

  token_level_loss: true

  clip_higher_enable: true
  clip_ratio_low: 0.2
  clip_ratio_high: 0.28

  overlong_buffer_enable: true
  rollout_max_tokens : 20480
  overlong_buffer: 4096
  overlong_buffer_penalty_factor: 1.0

  filter_groups_enable: false
  filter_groups_metric: acc_for_dapo
  filter_groups_max_batches: -1
  filter_groups_train_batch_size: 32

  actor_resource:
    num_npus: 64

generate_config:
  enforce_eager: true
  trust_remote_code: true
  offload_train_optimizer: true
  offload_train_grad: true
  offload_train_param: true

  infer_tensor_parallel_size: 4
  infer_pipeline_parallel_size: 1
  infer_expert_parallel_size: 1

  max_num_seqs: 1024
  max_model_len: 22528
  max_num_batched_tokens: 22528
  dtype: "bfloat16"
  gpu_memory_utilization: 0.85

  sampling_config:
    seed: 1
    logprobs: 1
    max_tokens: 20480
    top_p: 1.0
    top_k: -1
    min_p: 0.0
    temperature: 1.0
    detokenize: false

"""
LONGER_32K = {
    "actor_max_packing_token_size: 45056": "actor_max_packing_token_size: 65536",
    "update_max_packing_token_size: 22528": "update_max_packing_token_size: 32768",
    "rollout_max_tokens : 20480": "rollout_max_tokens : 30720",
    "max_model_len: 22528": "max_model_len: 32768",
    "max_num_batched_tokens: 22528": "max_num_batched_tokens: 32768",
    "gpu_memory_utilization: 0.85": "gpu_memory_utilization: 0.8",
    "max_tokens: 20480": "max_tokens: 30720",
}


def _mindspeed_configs(folder: Path, name: str) -> None:
    (folder / "model").mkdir(parents=True)
    shutil.copy(REPO / "configs" / "model" / "qwen25_32b.yaml", folder / "model")
    text = DAPO_20K_YAML
    if name.endswith("_32k"):
        for old, new in LONGER_32K.items():
            assert old in text, old
            text = text.replace(old, new)
    (folder / f"{name}.yaml").write_text(text)


@pytest.mark.parametrize("name", ["dapo_qwen25_32b_A2_20k", "dapo_qwen25_32b_A3_32k"])
def test_mindspeed_long_response_dapo_configs_dry_run_unchanged(
    name, tmp_path, capsys, monkeypatch
):
    from mindrl.trainer.entry import main

    folder = tmp_path / "configs"
    _mindspeed_configs(folder, name)
    monkeypatch.delenv("MINDRL_ACCELERATOR", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "no_ray"))
    rc = main(["--config-path", str(folder), "--config-name", name, "--dry-run"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "TP=8 PP=2 CP=2 DP=" in out, out
    assert "actor TP8 PP2 CP2 DP" in out  # the memory plan per rank, at CP 2
    assert not [line for line in err.splitlines() if line.startswith("error: ")], err


def test_hybrid_layout_nests_ulysses_inside_the_ring():
    """hybrid_cp_algo, CP 4 = ring 2 x Ulysses 2: ring rank r's load-balanced pair of chunks,
    split in consecutive halves over its two Ulysses ranks."""
    layout = CPLayout.of("hybrid_cp_algo", 4, 2)
    assert (layout.ring, layout.ulysses) == (2, 2)
    assert layout.local_index(16, 0).tolist() == [0, 1, 2, 3]
    assert layout.local_index(16, 1).tolist() == [12, 13, 14, 15]
    assert layout.local_index(16, 2).tolist() == [4, 5, 6, 7]
    ranks = torch.cat([layout.local_index(16, r) for r in range(4)])
    assert ranks[layout.order(16)].tolist() == list(range(16))
    assert CPLayout.of("ulysses_cp_algo", 2).local_index(8, 1).tolist() == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="leave a ring of 2"):
        CPLayout.of("hybrid_cp_algo", 4, 4)


def test_hybrid_config_needs_a_degree_that_leaves_a_ring():
    from mindrl.config.errors import ConfigError

    cp4 = [
        "rl_config.share_prompt_forward=false",
        "rl_config.actor_resource.num_npus=4",
        "actor_config.context_parallel_size=4",
        "actor_config.context_parallel_algo=hybrid_cp_algo",
    ]
    run, _ = load_run_config("grpo_tiny_cpu", [*cp4, "actor_config.ulysses_degree_in_cp=2"])
    assert (run.actor.cp, run.actor.parallel.ulysses_degree_in_cp) == (4, 2)
    with pytest.raises(ConfigError, match="leave a ring of 2 or more"):
        load_run_config("grpo_tiny_cpu", [*cp4, "actor_config.ulysses_degree_in_cp=4"])
    with pytest.raises(ConfigError, match="read only with context_parallel_algo hybrid"):
        load_run_config("grpo_tiny_cpu", [*cp4[:2], "actor_config.ulysses_degree_in_cp=2"])
