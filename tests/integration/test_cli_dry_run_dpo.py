"""`cli/train_dpo.py --dry-run` on MindSpeed-RL's DPO config (`dpo_qwen3_30b_a3b_A3.yaml`: one
`megatron_training` section, stage dpo, TP 2 x PP 8, Qwen3-30B-A3B), written here with that
file's keys and values, unchanged: it exits 0, says what DPO will do (loss, reference, devices)
and plans memory for pair micro-batches; `cli/train_grpo.py` refuses it by name."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.fresh_process import REPO as ROOT
from tests.fresh_process import ProcessRun, run_process

TIMEOUT_S = 300.0

MODEL_YAML = """\
qwen3_30b_a3b:
  use_mcore_models: true
  num_layers: 48
  hidden_size: 2048
  ffn_hidden_size: 8192
  num_attention_heads: 32
  rotary_base: 1000000
  max_position_embeddings: 40960
  make_vocab_size_divisible_by: 1
  padded_vocab_size: 151936
  untie_embeddings_and_output_weights: true
  disable_bias_linear: true
  group_query_attention: true
  num_query_groups: 4
  position_embedding_type: rope
  normalization: RMSNorm
  swiglu: true
  attention_softmax_in_fp32: true
  attention_bias: false
  qk_layernorm: true

  num_experts: 128
  moe_router_topk: 8
  moe_router_load_balancing_type: aux_loss
  moe_ffn_hidden_size: 768
  moe_grouped_gemm: true
  moe_permutation_async_comm: true
  moe_token_dispatcher_type: alltoall_seq
  moe_aux_loss_coeff: 0.001

  kv_channels: 128
  norm_topk_prob: true
  no_gradient_accumulation_fusion: true
"""

# MindSpeed-RL's configs/dpo_qwen3_30b_a3b_A3.yaml, key for key
DPO_YAML = """\
defaults:
  - model:
      - qwen3_30b_a3b

megatron_training:
  # tune_args:
  finetune: true
  stage: dpo
  is_pairwise_dataset: true
  no_pad_to_seq_lengths: true
  tokenizer_not_use_fast: true
  dpo_loss_type: sigmoid
  # gpt_args:
  moe_grouped_gemm: true
  moe_permutation_async_comm: false
  norm_epsilon: 1e-6
  micro_batch_size: 1
  global_batch_size: 64
  tokenizer_type: PretrainedFromHF
  tokenizer_name_or_path: ./model_from_hf/Qwen3-30B-A3B
  train_iters: 1000
  lr: 5e-8
  min-lr: 0
  lr_decay_style: constant
  weight_decay: 0.0
  clip_grad: 1.0
  initial_loss_scale: 4096
  use_distributed_optimizer: true
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 8
  sequence_parallel: true
  use_mcore_models: true
  use_flash_attn: true
  no_masked_softmax_fusion: true
  no_gradient_accumulation_fusion: true
  bf16: true
  seq_length: 4096
  adam_beta1: 0.9
  adam_beta2: 0.999
  attention_dropout: 0.0
  attention_softmax_in_fp32: true
  init_method_std: 0.02
  hidden_dropout: 0.0
  qk_layernorm: true
  overlap_grad_reduce: true
  reuse_fp32_param: true
  use_fused_rotary_pos_emb: true
  use_rotary_position_embeddings: true
  use_fused_swiglu: true
  use_fused_rmsnorm: true
  swap_attention: false
  no_shuffle: true
  attention_mask_type: general

  # data_args:
  data_path: ./dataset/dpo
  split: 100,0,0
  seed: 42

  # ckpt_args:
  no_load_optim: true
  no_load_rng: true
  no_save_optim: true
  no_save_rng: true
  load: ./model_weights/Qwen3-30B-TP2-PP8-EP1/
  save: ./ckpt
  model: qwen3_30b_a3b
  ref_model: ./model_weights/Qwen3-30B-TP2-PP8-EP1/
  refer_model_iter: 1

  # output_args:
  log_interval: 1
  save_interval: 5000
  eval_interval: 5000
  eval_iters: 0
"""


def _dry_run(config_dir: Path, script: str) -> ProcessRun:
    return run_process(
        [
            sys.executable,
            ROOT / "cli" / script,
            "--config-path",
            str(config_dir),
            "--config-name",
            "dpo_qwen3_30b_a3b_A3",
            "--dry-run",
        ],
        timeout_s=TIMEOUT_S,
    )


def _config_dir(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "qwen3_30b_a3b.yaml").write_text(MODEL_YAML)
    (tmp_path / "dpo_qwen3_30b_a3b_A3.yaml").write_text(DPO_YAML)
    return tmp_path


def test_mindspeed_rl_dpo_config_dry_runs_unchanged(tmp_path):
    proc = _dry_run(_config_dir(tmp_path), "train_dpo.py")
    out = proc.stdout
    assert proc.returncode == 0, out[-2000:] + proc.stderr[-2000:]
    assert "offline DPO: 1000 steps of 64 pairs" in out
    assert "micro-batches of 1 pair(s)" in out
    assert "DPO loss sigmoid, beta 0.1" in out
    assert "reference model: ./model_weights/Qwen3-30B-TP2-PP8-EP1/" in out
    assert "actor    devices=16 TP=2 PP=8 DP=1" in out
    assert "pair sequences up to 4096 tokens (seq_length)" in out
    assert "8 micro-batch(es) of 2 in flight" in out  # one pair = chosen + rejected rows
    assert "rollout: none" in out
    assert "dry run: config valid" in out


def test_train_grpo_sends_a_dpo_config_to_train_dpo(tmp_path):
    proc = _dry_run(_config_dir(tmp_path), "train_grpo.py")
    assert proc.returncode == 2
    assert "megatron_training.stage: dpo runs with cli/train_dpo.py" in proc.stderr
