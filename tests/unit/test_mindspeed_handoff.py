"""MindSpeed's switches in a MindSpeed-RL config reach the adaptor on NPU: the driver hands
them to each worker's environment, and the worker puts them on sys.argv (where MindSpeed
reads them) only while the adaptor is imported. On CPU they are warned, not passed."""

from __future__ import annotations

import json
import sys

import pytest

from mindrl.accelerator.mindspeed_args import (
    ENV,
    MindSpeedError,
    argv_for_mindspeed,
    flags_from_env,
    prepare_megatron,
    to_flags,
    worker_env,
)
from mindrl.config import load_run_config
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
    # off NPU mindrl builds the two fused kernels itself (models/host_fusions.py)
    assert handoffs(run, "cpu").values == {}


def test_the_driver_and_the_workers_get_the_same_handed_env():
    """`handed_env` is the one place the handed keys become env vars: the driver takes it
    before importing megatron (trainer/entry.py), every worker inside `worker_env`."""
    from mindrl.trainer.worker_env import handed_env, worker_env

    run, _ = load_run_config("grpo_tiny_cpu", ["actor_config.use_fused_rmsnorm=true"])
    env = handed_env(handoffs(run, "npu"))
    assert json.loads(env[ENV])["use_fused_rmsnorm"] is True
    workers = worker_env(run, threads=3)  # the run's own accelerator: cpu, nothing handed
    assert workers["OMP_NUM_THREADS"] == workers["MINDRL_NUM_THREADS"] == "3"
    assert ENV not in workers and handed_env(handoffs(run, "cpu")) == {}


def test_argv_holds_only_the_handed_flags_while_the_adaptor_imports(monkeypatch):
    monkeypatch.setenv(ENV, json.dumps({"use_fused_rmsnorm": True, "swap_optimizer": False}))
    monkeypatch.setattr(sys, "argv", ["default_worker.py", "--node-ip-address=127.0.0.1"])
    with argv_for_mindspeed(flags_from_env()) as argv:
        assert sys.argv == argv == ["mindrl", "--use-fused-rmsnorm"]
    assert sys.argv == ["default_worker.py", "--node-ip-address=127.0.0.1"]


def test_npu_refuses_megatron_imported_before_the_adaptor():
    import megatron.core  # noqa: F401  (as a process that imported it first would have)

    assert prepare_megatron("cpu") is False  # nothing to do off NPU
    with pytest.raises(MindSpeedError, match=r"megatron-core \(megatron.*\) was imported before"):
        prepare_megatron("npu")
