"""MindSpeed's switches in a MindSpeed-RL config reach the adaptor on NPU: the driver hands
them to each worker's environment, and the worker puts them on sys.argv (where MindSpeed
reads them) just before importing the adaptor. On CPU they are warned, not passed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mindrl.accelerator.mindspeed_args import ENV, to_flags, worker_env
from mindrl.config import load_run_config
from mindrl.config.errors import ConfigError
from mindrl.config.fates import MINDSPEED, handoffs


def test_flags_follow_megatron_spelling():
    assert to_flags({"use_fused_rmsnorm": True, "swap_optimizer": False, "shape_order": "BSH"}) == [
        "--use-fused-rmsnorm",
        "--shape-order",
        "BSH",
    ]


def test_npu_run_hands_the_switches_to_the_worker_env():
    run, _ = load_run_config(
        "grpo_tiny_cpu",
        ["actor_config.use_fused_rmsnorm=true", "actor_config.use_fused_swiglu=true"],
        check_paths=False,
    )
    handed = handoffs(run, "npu").to(MINDSPEED)
    assert handed.get("use_fused_rmsnorm") is True and handed.get("use_fused_swiglu") is True
    env = worker_env(handed)
    assert json.loads(env[ENV])["use_fused_rmsnorm"] is True
    with pytest.raises(ConfigError, match="use_fused_rmsnorm: true is refused on cpu"):
        handoffs(run, "cpu")  # MindSpeed's fused kernels: nothing on CPU does what they promise


def test_worker_puts_them_on_argv_before_the_adaptor_import():
    code = (
        "import sys; from mindrl.accelerator.mindspeed_args import extend_argv_from_env; "
        "extend_argv_from_env(); extend_argv_from_env(); print(sys.argv[1:])"
    )
    env = {ENV: json.dumps({"use_fused_rmsnorm": True, "swap_optimizer": False})}
    import os

    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['--use-fused-rmsnorm']"
