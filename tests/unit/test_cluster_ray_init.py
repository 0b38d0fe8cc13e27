"""What mindrl asks Ray for, checked without starting Ray; DP splitting; error messages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mindrl.accelerator import Accelerator
from mindrl.cluster.calls import split_evenly
from mindrl.cluster.errors import WorkerFailure, WorkerTimeout
from mindrl.cluster.placement import DeviceGroup, RoleLayout
from mindrl.cluster.placement_groups import bundle_indices, cpus_per_worker, devices_per_worker
from mindrl.cluster.ray_cluster import ray_init_kwargs, repo_root, worker_env_vars
from mindrl.cluster.worker import Worker
from mindrl.config.run import RuntimeConfig

CPU = Accelerator("cpu")


def test_embedded_init_has_no_public_dashboard():
    kw = ray_init_kwargs(RuntimeConfig(), CPU, environ={})
    assert kw["include_dashboard"] is False
    assert "dashboard_host" not in kw
    assert kw["num_cpus"] == os.cpu_count()
    assert kw["namespace"] == "mindrl" and kw["log_to_driver"] is True
    assert "address" not in kw
    # no idle task workers started ahead: mindrl's workers are actors; a step's batch (~110 KB
    # for the tiny run) travels inside its call, not through the object store
    assert kw["_system_config"] == {
        "enable_worker_prestart": False,
        "prestart_worker_first_driver": False,
        "max_direct_call_object_size": 1 << 20,
    }


def test_dashboard_when_asked_binds_loopback_by_default():
    kw = ray_init_kwargs(RuntimeConfig(ray_dashboard=True, ray_num_cpus=3), CPU, environ={})
    assert kw["include_dashboard"] is True
    assert kw["dashboard_host"] == "127.0.0.1"
    assert kw["num_cpus"] == 3
    kw = ray_init_kwargs(
        RuntimeConfig(ray_dashboard=True, ray_dashboard_host="0.0.0.0"), CPU, environ={}
    )
    assert kw["dashboard_host"] == "0.0.0.0"  # only when the user says so


def test_connect_passes_address_only():
    kw = ray_init_kwargs(RuntimeConfig(ray_address="auto", ray_num_cpus=8), CPU, environ={})
    assert kw["address"] == "auto"
    for key in (
        "num_cpus",
        "include_dashboard",
        "dashboard_host",
        "resources",
        "num_gpus",
        "_system_config",  # Ray refuses it when joining a running cluster
    ):
        assert key not in kw


def test_worker_env_propagates_settings_not_secrets():
    environ = {
        "MINDRL_ASSETS_DIR": "/data/assets",
        "HF_HUB_OFFLINE": "1",
        "HF_TOKEN": "hf_secret",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "AWS_SECRET_ACCESS_KEY": "x",
        "HOME": "/root",
        "PYTHONPATH": "/opt/a" + os.pathsep + "/opt/b",
    }
    env = worker_env_vars(CPU, environ)
    assert env["MINDRL_ASSETS_DIR"] == "/data/assets"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["TOKENIZERS_PARALLELISM"] == "false"
    assert env["MINDRL_ACCELERATOR"] == "cpu"
    for name in ("HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "HOME"):
        assert name not in env
    assert env["PYTHONPATH"].split(os.pathsep) == [str(repo_root()), "/opt/a", "/opt/b"]
    assert (Path(repo_root()) / "mindrl" / "__init__.py").is_file()
    # a user's explicit choice wins over the default
    assert worker_env_vars(CPU, {"TOKENIZERS_PARALLELISM": "true"})["TOKENIZERS_PARALLELISM"] == (
        "true"
    )


def test_split_evenly():
    assert split_evenly(list(range(6)), 3) == [[0, 1], [2, 3], [4, 5]]
    assert split_evenly((1, 2), 1) == [(1, 2)]
    with pytest.raises(ValueError, match="cannot split 5 items evenly over 2"):
        split_evenly(list(range(5)), 2)


def test_bundle_sharing_helpers():
    roles = (RoleLayout("actor", 4, 2, 2, 1), RoleLayout("ref", 2, 2, 1, 1))
    group = DeviceGroup("actor+ref", roles, 4, {"NPU": 1.0, "CPU": 3.0}, "STRICT_PACK")
    assert bundle_indices(group, "actor") == [0, 1, 2, 3]
    assert bundle_indices(group, "ref") == [0, 1]
    assert cpus_per_worker(group) == 3.0 / 2
    assert devices_per_worker(group, "NPU") == 1.0 / 2
    assert devices_per_worker(group, "CPU") == 0.0
    with pytest.raises(KeyError, match="reward"):
        bundle_indices(group, "reward")


def test_error_messages_name_role_rank_method():
    e = WorkerFailure("actor", 1, "killed", "update")
    assert str(e) == "actor worker rank 1 died during update(): killed"
    t = WorkerTimeout("ref", 0, "compute_log_prob", 5.0, (0, 3))
    assert "ref worker rank 0: compute_log_prob() did not finish within 5 s" in str(t)
    assert "ranks still pending: 0, 3" in str(t)


def test_worker_reads_its_place_from_env(monkeypatch):
    for name, value in {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "29511",
        "MINDRL_ROLE": "ref",
    }.items():
        monkeypatch.setenv(name, value)
    w = Worker()
    assert (w.role, w.rank, w.world_size, w.local_rank) == ("ref", 3, 4, 1)
    assert (w.master_addr, w.master_port) == ("10.0.0.7", 29511)
    assert w.ping() == 3 and w.pid() == os.getpid()
    assert w.dp_rank() == 3  # pure DP until told otherwise
    w.set_dp_rank(1)
    assert w.dp_rank() == 1
    w.set_master("127.0.0.1", 29600)
    assert os.environ["MASTER_ADDR"] == "127.0.0.1" and os.environ["MASTER_PORT"] == "29600"
