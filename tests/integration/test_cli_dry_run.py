"""`cli/train_grpo.py --dry-run`, the CLI's own job: exit codes, printing the resolved config
and a placement plan, starting nothing; a bad config fails before Ray is even imported. What
the plan contains is tests/unit/test_placement_plan.py."""

from __future__ import annotations

import sys

from tests.fresh_process import REPO as ROOT
from tests.fresh_process import ProcessRun, run_process

TIMEOUT_S = 300.0


def _cli(*args: str) -> ProcessRun:
    return run_process([sys.executable, ROOT / "cli" / "train_grpo.py", *args], timeout_s=TIMEOUT_S)


def test_dry_run_prints_config_and_plan_and_starts_nothing(tiny_model_dir):
    proc = _cli("--config-name", "grpo_tiny_cpu", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "# resolved config: grpo_tiny_cpu" in out
    assert "accelerator: cpu (backend gloo)" in out
    assert "placement plan (CPU devices; 1 in all):" in out
    assert "dry run: config valid, placement fits; nothing started" in out


def test_a_plan_that_does_not_fit_exits_2(tiny_model_dir):
    proc = _cli(
        "--config-name",
        "grpo_tiny_cpu",
        "--dry-run",
        "rl_config.actor_resource.num_npus=2",
        "runtime.ray_num_cpus=1",
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "rl_config.*_resource" in proc.stderr
    assert "nothing started" not in proc.stdout


def test_bad_config_fails_before_ray_is_imported():
    code = (
        "import sys; sys.argv=['x','--config-name','r1_zero_qwen25_7b','--dry-run','actor_config.lrr=1'];"
        "from mindrl.trainer.entry import main; rc = main();"
        "print('RC', rc, 'RAY', 'ray' in sys.modules, 'VLLM', 'vllm' in sys.modules)"
    )
    proc = run_process([sys.executable, "-c", code], timeout_s=120)
    assert "RC 2 RAY False VLLM False" in proc.stdout, proc.stdout + proc.stderr
    assert "actor_config.lrr: unknown key (did you mean 'lr'?)" in proc.stderr


def test_unknown_flag_and_missing_config_name():
    proc = _cli("--config-name", "grpo_tiny_cpu", "--dryrun")
    assert proc.returncode == 2 and "--dryrun" in proc.stderr
    proc = _cli("--dry-run")
    assert proc.returncode == 2 and "--config-name" in proc.stderr
