"""Accelerator selection on this CPU-only machine."""

from __future__ import annotations

import sys

import pytest
import torch

from mindrl.accelerator import AcceleratorError, detect_accelerator_name, get_accelerator


def test_auto_detects_cpu_here(monkeypatch):
    monkeypatch.delenv("MINDRL_ACCELERATOR", raising=False)
    assert detect_accelerator_name() == "cpu"
    acc = get_accelerator("auto")
    assert acc.name == "cpu"
    assert acc.dist_backend == "gloo"
    assert acc.ray_resource == "CPU"
    assert acc.visible_devices_env is None
    assert acc.device(3) == torch.device("cpu")


def test_env_variable_selects(monkeypatch):
    monkeypatch.setenv("MINDRL_ACCELERATOR", "cpu")
    assert get_accelerator().name == "cpu"
    monkeypatch.setenv("MINDRL_ACCELERATOR", "tpu")
    with pytest.raises(AcceleratorError, match="tpu"):
        get_accelerator()


@pytest.mark.parametrize("name", ["cuda", "npu"])
def test_unavailable_accelerator_is_a_clear_error(name):
    with pytest.raises(AcceleratorError, match=f"'{name}' requested"):
        get_accelerator(name)


def test_unknown_name():
    with pytest.raises(AcceleratorError, match="unknown accelerator"):
        get_accelerator("gpu")


def test_cpu_path_never_imports_torch_npu():
    get_accelerator("cpu").seed(0)
    assert "torch_npu" not in sys.modules


def test_static_facts_of_each_kind():
    from mindrl.accelerator import Accelerator

    npu, cuda = Accelerator("npu"), Accelerator("cuda")
    assert (npu.dist_backend, npu.ray_resource, npu.visible_devices_env) == (
        "hccl",
        "NPU",
        "ASCEND_RT_VISIBLE_DEVICES",
    )
    assert (cuda.dist_backend, cuda.ray_resource, cuda.visible_devices_env) == (
        "nccl",
        "GPU",
        "CUDA_VISIBLE_DEVICES",
    )


def test_seed_makes_torch_reproducible():
    acc = get_accelerator("cpu")
    acc.seed(123)
    a = torch.randn(4)
    acc.seed(123)
    assert torch.equal(a, torch.randn(4))


def test_memory_stats_and_synchronize():
    acc = get_accelerator("cpu")
    acc.synchronize()
    stats = acc.memory_stats()
    assert 0 < stats["allocated_gib"] <= stats["peak_gib"] < 64


def test_cpu_workers_keep_freed_memory_and_user_values_win(monkeypatch):
    from mindrl.accelerator import Accelerator

    monkeypatch.delenv("MALLOC_MMAP_MAX_", raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "12345")
    env = Accelerator("cpu").worker_env()
    assert env["MALLOC_MMAP_MAX_"] == "0"
    assert env["THP_MEM_ALLOC_ENABLE"] == "1"
    assert env["MALLOC_TRIM_THRESHOLD_"] == "12345"  # the user's setting is kept
    assert Accelerator("npu").worker_env() == {} and Accelerator("cuda").worker_env() == {}
