"""`--dry-run` of an Ascend config on this CPU-only machine: it plans for the accelerator the
config targets (NPU bundles, no torch_npu, no Ray), does not hold the plan against this
machine's CPUs, only warns about input paths missing here, and exits 0; a real run refuses the
same problems, and every refusal is one line without a traceback.

The configs are written here with MindSpeed-RL's key set and values (grpo_qwen25_7b_A3: 16
NPUs, TP2 PP2, MindSpeed's fused-kernel switches, relative paths that exist only on the
cluster), in tmp_path.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from mindrl.cluster.resources import declared_accelerator, planning_target, target_hints
from mindrl.trainer.entry import main
from tests.fresh_process import REPO, run_process

TIMEOUT_S = 300.0

MODEL = """\
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
  norm_epsilon: 1e-6
  normalization: RMSNorm
  swiglu: true
  attention_softmax_in_fp32: true
"""

KERNELS = """\
  use_fused_rmsnorm: true
  use_fused_swiglu: true
  use_fused_rotary_pos_emb: true
"""

RUN = """\
defaults:
  - model:
      - qwen25_7b
  - _self_

megatron_training:
  model: qwen25_7b
{kernels}  use_mcore_models: true
  use_flash_attn: true
  no_masked_softmax_fusion: true
  attention_softmax_in_fp32: true
  no_gradient_accumulation_fusion: true
  bf16: true
  tokenizer_type: PretrainedFromHF
  tokenizer_name_or_path: ./Qwen2.5-7B
  global_batch_size: 32
  seq_length: 2048
  save_interval: 100
  train_iters: 500
  stage: ray_grpo
  attention_dropout: 0.0
  init_method_std: 0.01
  hidden_dropout: 0.0
  dataset_additional_keys: ['labels']
  data_path: ./dataset/deepscaler/data
  split: 100,0,0
  seed: 1

actor_config:
  model: qwen25_7b
  micro_batch_size: 4
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 2
  lr: 1e-6
  lr_decay_style: constant
  min_lr: 0
  weight_decay: 0.01
  lr_warmup_fraction: 0.0
  clip_grad: 1.0
  adam_beta1: 0.9
  adam_beta2: 0.95
  finetune: true
  load: ./ckpt
  save: ./ckpt
  no_load_optim: true
  no_load_rng: true

rl_config:
  use_integrated_worker: true
  blocking: true
  adv_estimator: group_norm
  kl_penalty: low_var_kl
  kl_ctrl_type: fixed
  init_kl_coef: 0.001
  mini_batch_size: 32
  max_prompt_length: 2048
  epochs: 1
  clip_ratio: 0.2
  entropy_coeff: 0.0
  n_samples_per_prompt: 8
  rule_reward: true
  verifier_function: ["base_acc"]
  verifier_weight: [1.0]
  num_cpus_for_local_task: 1.0
  actor_resource:
    num_npus: 16

generate_config:
  trust_remote_code: true
  infer_tensor_parallel_size: 1
  infer_pipeline_parallel_size: 1
  max_num_seqs: 1024
  max_model_len: 4096
  max_num_batched_tokens: 8192
  dtype: bfloat16
  gpu_memory_utilization: 0.4
  sampling_config:
    logprobs: 1
    max_tokens: 2048
    top_p: 1.0
    top_k: -1
    min_p: 0.0
    temperature: 1.0
{runtime}"""


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    """ms_npu: as MindSpeed-RL ships it (no runtime section). plain_npu: no NPU-only keys but
    `runtime.accelerator: npu`. plain: neither (nothing says which accelerator)."""
    folder = tmp_path / "configs"
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "qwen25_7b.yaml").write_text(MODEL)
    npu_runtime = "\nruntime:\n  accelerator: npu\n"
    (folder / "ms_npu.yaml").write_text(RUN.format(kernels=KERNELS, runtime=""))
    (folder / "plain_npu.yaml").write_text(RUN.format(kernels="", runtime=npu_runtime))
    (folder / "plain.yaml").write_text(RUN.format(kernels="", runtime=""))
    return folder


def _main(capsys, monkeypatch, config_dir: Path, name: str, *extra: str) -> tuple[int, str, str]:
    """main() in this process, with no Ray cluster to find (no RAY_ADDRESS, an empty Ray
    temp folder): a run here would start an embedded one."""
    monkeypatch.delenv("MINDRL_ACCELERATOR", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(config_dir.parent / "no_ray"))
    rc = main(["--config-path", str(config_dir), "--config-name", name, *extra])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return rc, out, err


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: ")]


def test_mindspeed_npu_config_plans_npu_bundles_here(capsys, monkeypatch, config_dir):
    rc, out, err = _main(capsys, monkeypatch, config_dir, "ms_npu", "--dry-run")
    assert rc == 0, err
    assert "accelerator: npu (backend hccl); runtime.accelerator auto, the config's target" in out
    assert "megatron_training.use_fused_rmsnorm" in out
    assert "placement plan (NPU devices; 16 in all):" in out
    assert "group actor+ref: 16 device(s), PACK, bundle {NPU=1, CPU=1}" in out
    assert "actor    devices=16 TP=2 PP=2 DP=4" in out
    assert "not checked against a cluster: no npu on this machine" in out
    assert "the 16 NPU device(s) the config declares" in out
    assert "placement planned for the devices the config declares" in out
    # this machine's 2 CPUs are not what the plan needs
    assert "rl_config.*_resource" not in out + err
    # the cluster's paths are only warnings here
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    for key, path in (
        ("actor_config.tokenizer_name_or_path", "./Qwen2.5-7B"),
        ("actor_config.load", "./ckpt"),
        ("megatron_training.data_path", "./dataset/deepscaler/data"),
    ):
        assert any(line.startswith(f"warning: {key}:") and path in line for line in warnings), err
    assert not _errors(err)


def test_explicit_npu_plans_npu_without_npu_only_keys(capsys, monkeypatch, config_dir):
    rc, out, err = _main(capsys, monkeypatch, config_dir, "plain_npu", "--dry-run")
    assert rc == 0, err
    assert "accelerator: npu (backend hccl); runtime.accelerator: npu" in out
    assert "bundle {NPU=1, CPU=1}" in out


def test_an_undecided_config_is_planned_for_this_machine(capsys, monkeypatch, config_dir):
    # nothing says NPU: auto is this machine (cpu), so the plan must fit here, and does not
    rc, out, err = _main(
        capsys, monkeypatch, config_dir, "plain", "--dry-run", "runtime.ray_num_cpus=2"
    )
    assert rc == 2
    assert (
        "accelerator: cpu (backend gloo); runtime.accelerator auto, detected on this machine" in out
    )
    (line,) = _errors(err)
    assert "the run needs 16 CPU (actor+ref=16) but the cluster has" in line


def test_a_real_run_refuses_missing_paths(capsys, monkeypatch, config_dir):
    rc, out, err = _main(capsys, monkeypatch, config_dir, "ms_npu")
    assert rc == 2
    assert "actor_config.load: path does not exist: ./ckpt" in err
    assert "warning: actor_config.load" not in err
    assert "placement plan" not in out


def test_a_real_run_on_the_wrong_machine_is_one_line(capsys, monkeypatch, config_dir, tmp_path):
    model = tmp_path / "Qwen2.5-7B"
    model.mkdir()
    (tmp_path / "prompts.jsonl").write_text("{}\n")
    paths = [
        f"megatron_training.tokenizer_name_or_path={model}",
        f"actor_config.load={model}",
        f"megatron_training.data_path={tmp_path / 'prompts'}",
        f"actor_config.save={tmp_path / 'ckpt'}",
        f"runtime.output_dir={tmp_path / 'out'}",
        "runtime.ray_num_cpus=2",  # an embedded cluster of 2 CPUs, whatever this machine has
    ]
    rc, out, err = _main(capsys, monkeypatch, config_dir, "plain_npu", *paths)
    assert rc == 2
    (line,) = _errors(err)
    assert line.startswith("error: accelerator 'npu' requested but torch_npu is not installed")
    assert not (tmp_path / "out").exists()
    # auto on a CPU machine: runs for this machine, says the config meant NPU, then the plan
    # (16 devices) does not fit 2 CPUs; MindSpeed's fused norm and SwiGLU are mindrl's own
    # kernels on CPU (models/host_fusions.py), not refused
    rc, out, err = _main(capsys, monkeypatch, config_dir, "ms_npu", *paths)
    assert rc == 2
    assert "warning: runtime.accelerator: auto found cpu on this machine, but the config " in err
    assert "targets npu" in err
    (line,) = _errors(err)
    # the one problem left: the fused kernels' keys are not refused
    assert line.startswith("error: invalid config: ") and "the run needs 16 CPU" in line
    report = err[err.index(line) :]
    assert "use_fused_rmsnorm" not in report and "use_fused_swiglu" not in report


def test_bad_values_stay_errors_in_a_dry_run(capsys, monkeypatch, config_dir):
    rc, _, err = _main(
        capsys,
        monkeypatch,
        config_dir,
        "ms_npu",
        "--dry-run",
        "actor_config.tensor_model_parallel_size=3",
    )
    assert rc == 2
    assert "actor_config.tensor_model_parallel_size: TP (3) x PP (2) = 6 does not divide" in err
    rc, _, err = _main(
        capsys, monkeypatch, config_dir, "ms_npu", "--dry-run", "~megatron_training.data_path"
    )
    assert rc == 2
    (line,) = _errors(err)
    assert "megatron_training.data_path: required" in line
    monkeypatch.setenv("MINDRL_ACCELERATOR", "tpu")
    rc = main(["--config-path", str(config_dir), "--config-name", "plain", "--dry-run"])
    _, err = capsys.readouterr()
    assert rc == 2 and _errors(err) == [
        "error: MINDRL_ACCELERATOR='tpu' is not one of npu, cuda, cpu"
    ]


def test_cli_dry_run_imports_neither_ray_nor_torch_npu(config_dir):
    code = textwrap.dedent(
        f"""
        import sys
        from mindrl.trainer.entry import main
        rc = main(["--config-path", {str(config_dir)!r}, "--config-name", "ms_npu", "--dry-run"])
        print("RC", rc, "RAY", "ray" in sys.modules, "TORCH_NPU", "torch_npu" in sys.modules)
        """
    )
    proc = run_process([sys.executable, "-c", code], timeout_s=TIMEOUT_S, cwd=REPO)
    assert "RC 0 RAY False TORCH_NPU False" in proc.stdout, proc.stdout[-2000:] + proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_process(
        [
            sys.executable,
            REPO / "cli" / "train_grpo.py",
            "--config-path",
            config_dir,
            "--config-name",
            "ms_npu.yaml",
            "--dry-run",
            "runtime.accelerator=npu",
        ],
        timeout_s=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "placement plan (NPU devices; 16 in all):" in proc.stdout


# -- how the target is chosen (no config files) ---------------------------------------------------


def _raw(**rl: object) -> dict:
    return {
        "megatron_training": {"seed": 1},
        "rl_config": {"actor_resource": {"num_npus": 8}, **rl},
    }


def test_target_rules():
    assert declared_accelerator(_raw())[0] is None  # num_npus is every config's device count
    raw = _raw(hccl_buffersize=256)
    assert target_hints(raw)["npu"] == ["rl_config.hccl_buffersize"]
    assert declared_accelerator(raw)[0] == "npu"
    raw = {"generate_config": {"ascend_scheduler_config_enabled": False}}  # named for Ascend
    assert declared_accelerator(raw)[0] == "npu"
    raw = {"actor_config": {"use_fused_rmsnorm": False, "distributed_backend": "hccl"}}
    assert target_hints(raw)["npu"] == ["actor_config.distributed_backend: hccl"]
    gpu = {"rl_config": {"actor_resource": {"num_gpus": 8}}}
    assert declared_accelerator(gpu)[0] == "cuda"
    both = {**gpu, "megatron_training": {"use_fused_swiglu": True}}
    name, why = declared_accelerator(both)
    assert name is None and "disagree" in why
    # runtime.accelerator, then MINDRL_ACCELERATOR, then the config, then this machine
    npu_raw = _raw(hccl_buffersize=256)
    assert planning_target("cpu", npu_raw, {})[0] == "cpu"
    assert planning_target("auto", npu_raw, {"MINDRL_ACCELERATOR": "cuda"})[0] == "cuda"
    assert planning_target("auto", npu_raw, {})[0] == "npu"
    assert planning_target("auto", _raw(), {}) == (
        "cpu",
        "runtime.accelerator auto, detected on this machine",
    )
    # the runtime section never counts as a hint: runtime.accelerator says it outright
    assert declared_accelerator({"runtime": {"npu_thing": True}})[0] is None


def test_the_software_stack_is_checked_where_the_accelerator_is(capsys, monkeypatch, config_dir):
    # this machine's stack as if megatron-core were too old: one line naming it and the range
    import mindrl.accelerator.versions as versions

    real = versions.installed_versions()
    monkeypatch.setattr(
        versions, "installed_versions", lambda *_: {**real, "megatron-core": "0.11.0"}
    )
    rc, _, err = _main(
        capsys, monkeypatch, config_dir, "plain", "--dry-run", "runtime.ray_num_cpus=2"
    )
    assert rc == 2 and "error: invalid config" in err
    assert "megatron-core 0.11.0 is below the supported range >=0.12,<0.17 for cpu" in err, err
    # an NPU config planned on this laptop does not check this laptop's stack
    rc, _, err = _main(capsys, monkeypatch, config_dir, "ms_npu", "--dry-run")
    assert rc == 0 and "megatron-core 0.11.0" not in err
