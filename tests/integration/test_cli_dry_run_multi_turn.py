"""`cli/train_dapo.py --dry-run` on MindSpeed-RL's multi-turn config (`dapo_qwen25_7b_A2_multi_turn`:
ReTool over SandboxFusion, `retool_reward`), written here with that file's keys and values and
its tool YAML beside it at the relative path the config names: it exits 0, names the tools and
the multi-turn limits, and warns (not fails) about a sandbox it could not reach off loopback."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from tests.fresh_process import REPO as ROOT
from tests.fresh_process import ProcessRun, run_process
from tests.local_ports import OTHER_LOOPBACK, unused_port

TIMEOUT_S = 300.0

# MindSpeed-RL's configs/tools/retool_config.yaml, key for key
RETOOL_YAML = """\
tools:
  - class_name: "mindspeed_rl.tools.retool.ReTool"
    config:
      sandbox_fusion_url: "{url}"
      num_workers: 128
      enable_global_rate_limit: true
      rate_limit: 128
      default_timeout: 30
      default_language: "python"
      memory_limit_mb: 1024
      type: native

    tool_schema:
      type: "function"
      function:
        name: "code_interpreter"
        description: "A tool for executing code."
        parameters:
          type: "object"
          properties:
            code:
              type: "string"
              description: "The code to execute."
          required: ["code"]
"""

# MindSpeed-RL's configs/dapo_qwen25_7b_A2_multi_turn.yaml, key for key (comments dropped)
MULTI_TURN_YAML = """\
defaults:
  - model:
      - qwen25_7b

megatron_training:
  model: qwen25_7b
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
  tokenizer_name_or_path: ./multiturn-sft-qwen-2.5-7b-instruct/global_step_372_huggingface
  global_batch_size: 32
  seq_length: 2048
  save_interval: 100
  train_iters: 1000
  stage: ray_dapo
  attention_dropout: 0.0
  init_method_std: 0.01
  hidden_dropout: 0.0
  distributed_backend: nccl
  no_shared_storage: true
  dataset_additional_keys: ['labels',]
  data_path: ./data
  split: 100,0,0
  no_shuffle: true
  full_shuffle_instruction_dataset: false

actor_config:
  model: qwen25_7b
  micro_batch_size: 1
  tensor_model_parallel_size: 4
  pipeline_model_parallel_size: 1
  lr: 1e-6
  lr_decay_style: constant
  min_lr: 0
  weight_decay: 0.01
  lr_warmup_fraction: 0.0
  clip_grad: 1.0
  adam_beta1: 0.9
  adam_beta2: 0.95
  finetune: true
  load: ./multiturn-sft-qwen-2.5-7b-instruct-tp4pp1
  save: ./ckpt
  no_load_optim: true
  no_load_rng: true
  no_save_optim: false
  no_save_rng: false

rl_config:
  guarantee_order: true
  use_integrated_worker: true
  blocking: true
  actor_forward_micro_batch_size: 1
  ref_forward_micro_batch_size: 1
  gamma: 1.0
  lam: 0.95
  adv_estimator: group_norm
  mini_batch_size: 32
  max_prompt_length: 2048
  epochs: 1
  clip_ratio: 0.2
  entropy_coeff: 0.0
  shuffle_mini_batch: false
  n_samples_per_prompt: 8
  rule_reward: true
  verifier_function: ["retool_reward"]
  verifier_weight: [1.0]
  num_cpus_for_local_task: 1.0
  use_tensorboard: true
  token_level_loss: true
  clip_higher_enable: true
  clip_ratio_low: 0.2
  clip_ratio_high: 0.28
  overlong_buffer_enable: false
  rollout_max_tokens : 2048
  overlong_buffer: 512
  overlong_buffer_penalty_factor: 1.0
  filter_groups_enable: false
  filter_groups_metric: acc_for_dapo
  filter_groups_max_batches: -1
  filter_groups_train_batch_size: 32
  multi_turn_enable: true
  tool_config_path: ./configs/tools/retool_config.yaml
  max_tool_calls: 1
  max_parallel_calls: 1
  max_total_response_length: 2048
  max_tool_response_length: 256
  tool_response_truncate_side: 'middle'
  tool_parser_format: 'hermes'

  async_engine: true

  actor_resource:
    num_npus: 8

generate_config:
  enforce_eager: true
  trust_remote_code: true
  offload_train_optimizer: true
  offload_train_grad: true
  offload_train_param: true
  infer_tensor_parallel_size: 1
  infer_pipeline_parallel_size: 1
  infer_expert_parallel_size: 1
  max_num_seqs: 1024
  max_model_len: 4096
  max_num_batched_tokens: 8192
  dtype: "bfloat16"
  gpu_memory_utilization: 0.4
  sampling_config:
    logprobs: 1
    max_tokens: 2048
    top_p: 1.0
    top_k: -1
    min_p: 0.0
    temperature: 1.0
    detokenize: false
"""


def _dry_run(checkout: Path, url: str) -> ProcessRun:
    """MindSpeed-RL's layout: configs/ with model/ and tools/, run from the checkout."""
    configs = checkout / "configs"
    (configs / "model").mkdir(parents=True)
    (configs / "tools").mkdir()
    shutil.copy(ROOT / "configs" / "model" / "qwen25_7b.yaml", configs / "model")
    (configs / "tools" / "retool_config.yaml").write_text(RETOOL_YAML.format(url=url))
    (configs / "dapo_qwen25_7b_A2_multi_turn.yaml").write_text(MULTI_TURN_YAML)
    return run_process(
        [
            sys.executable,
            ROOT / "cli" / "train_dapo.py",
            "--config-path",
            str(configs),
            "--config-name",
            "dapo_qwen25_7b_A2_multi_turn",
            "--dry-run",
        ],
        timeout_s=TIMEOUT_S,
        cwd=checkout,
    )


def test_mindspeed_rl_multi_turn_config_dry_runs_unchanged(tmp_path: Path) -> None:
    proc = _dry_run(tmp_path, "http://localhost:8080/run_code")
    out = proc.stdout
    assert proc.returncode == 0, out[-2000:] + proc.stderr[-2000:]
    assert "multi-turn, hermes tool calls, at most 1 per response" in out
    assert "tools code_interpreter (mindspeed_rl.tools.retool.ReTool)" in out
    assert str(tmp_path / "configs" / "tools" / "retool_config.yaml") in out
    assert "dry run: config valid" in out


def test_a_remote_sandbox_that_is_down_is_warned_in_the_dry_run(tmp_path: Path) -> None:
    # a host mindrl does not stand in for, on this machine's loopback: nothing leaves it
    where = f"{OTHER_LOOPBACK}:{unused_port(OTHER_LOOPBACK)}"
    proc = _dry_run(tmp_path, f"http://{where}/run_code")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    warned = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert any(where in line and "code_interpreter" in line for line in warned), warned
