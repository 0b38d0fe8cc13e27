"""`cli/train_grpo.py --config-path DIR --config-name X --dry-run` on MindSpeed-RL run configs
of both generations, unchanged: the seed's shipped files (1.x by their shape) and a 1.x
integrated-worker config written here with that generation's keys. Each exits 0, prints
`read as MindSpeed-RL 1.x`, what that means, and no Hydra `_self_` warning."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.fresh_process import REPO as ROOT
from tests.fresh_process import ProcessRun, run_process

TIMEOUT_S = 300.0

MODEL_YAML = """\
qwen25_7b:
  use_mcore_models: true
  num_layers: 28
  hidden_size: 3584
  ffn_hidden_size: 18944
  num_attention_heads: 28
  rotary_base: 1000000
  max_position_embeddings: 32768
  make_vocab_size_divisible_by: 1
  padded_vocab_size: 152064
  untie_embeddings_and_output_weights: true
  add_qkv_bias: true
  disable_bias_linear: true
  group_query_attention: true
  num_query_groups: 4
  position_embedding_type: rope
  normalization: RMSNorm
  swiglu: true
"""

# 1.x's integrated-worker run config: its keys (experience_count, update_micro_batch_size), its
# mini_batch_size of 256 over a step of 4 prompts x 8 samples; no runtime section, no _self_
ONE_X_INTEGRATED = """\
defaults:
  - model:
      - qwen25_7b

megatron_training:
  model: qwen25_7b
  bf16: true
  tokenizer_type: PretrainedFromHF
  tokenizer_name_or_path: ./Qwen2.5-7B-Instruct
  global_batch_size: 4
  seq_length: 1024
  train_iters: 2
  stage: ray_grpo
  distributed_backend: nccl
  dataset_additional_keys: ['labels',]
  data_path: ./data
  split: 100,0,0

actor_config:
  model: qwen25_7b
  micro_batch_size: 2
  tensor_model_parallel_size: 4
  pipeline_model_parallel_size: 1
  lr: 5e-7
  finetune: true
  load: ./ckpt
  save: ./ckpt

rl_config:
  use_integrated_worker: true
  blocking: true
  update_micro_batch_size: 2
  experience_count: 4
  adv_estimator: group_norm
  kl_penalty: kl
  kl_ctrl_type: fixed
  init_kl_coef: 0.0001
  mini_batch_size: 256
  max_prompt_length: 2048
  epochs: 1
  clip_ratio: 0.2
  entropy_coeff: 0.001
  n_samples_per_prompt: 8
  rule_reward: true
  verifier_function: ["base_acc"]
  verifier_weight: [1.0]
  actor_resource:
    num_npus: 8

generate_config:
  trust_remote_code: true
  infer_tensor_parallel_size: 2
  infer_pipeline_parallel_size: 1
  max_num_seqs: 512
  max_model_len: 4096
  dtype: "bfloat16"
  gpu_memory_utilization: 0.9
  sampling_config:
    logprobs: 1
    max_tokens: 2048
    temperature: 0.8
"""


def _dry_run(config_dir: Path, name: str, *overrides: str) -> ProcessRun:
    return run_process(
        [
            sys.executable,
            ROOT / "cli" / "train_grpo.py",
            "--config-path",
            str(config_dir),
            "--config-name",
            name,
            "--dry-run",
            *overrides,
        ],
        timeout_s=TIMEOUT_S,
    )


def _generation_lines(proc: ProcessRun) -> list[str]:
    return [line for line in proc.stdout.splitlines() if line.startswith("read as MindSpeed-RL")]


@pytest.mark.parametrize("name", ["r1_zero_qwen25_7b", "r1_zero_qwen25_32b", "grpo_qwen25_7b"])
def test_the_seed_configs_dry_run_as_1x(name):
    proc = _dry_run(ROOT / "configs", name)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = _generation_lines(proc)
    assert len(lines) == 1 and lines[0].startswith(
        "read as MindSpeed-RL 1.x (ref_config and rl_config.reference_resource without "
        "use_integrated_worker)"
    ), lines
    assert "reference model: ref_config" in proc.stdout
    assert "KL: loss, coef" in proc.stdout
    steps = {"r1_zero_qwen25_7b": 1, "r1_zero_qwen25_32b": 1, "grpo_qwen25_7b": 2}[name]
    assert f"optimizer steps per RL step: {steps} " in proc.stdout
    assert "_self_" not in proc.stdout + proc.stderr


def test_a_1x_integrated_config_dry_runs_unchanged(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "qwen25_7b.yaml").write_text(MODEL_YAML)
    (tmp_path / "r1_zero_qwen25_7b_integrated.yaml").write_text(ONE_X_INTEGRATED)
    # the file unchanged; the devices it was written for named on the command line (on this
    # CPU machine `auto` would plan a 7B model on host RAM)
    proc = _dry_run(tmp_path, "r1_zero_qwen25_7b_integrated", "runtime.accelerator=npu")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = _generation_lines(proc)
    assert len(lines) == 1 and "experience_count, update_micro_batch_size" in lines[0]
    out = proc.stdout
    assert "optimizer steps per RL step: 1 (32 samples per step, the whole batch" in out
    assert "reference model: built from actor_config (integrated worker)" in out
    assert "KL: loss, coef 0.0001, estimator k3" in out
    assert "_self_" not in out + proc.stderr
