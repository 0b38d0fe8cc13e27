"""Fixtures of the integration tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cluster():
    """One embedded Ray cluster (4 logical CPUs) for a test module, started through
    `start_or_connect` and shut down at its end."""
    ray = pytest.importorskip("ray")
    from mindrl.accelerator import get_accelerator
    from mindrl.cluster.ray_cluster import start_or_connect
    from mindrl.config.run import RuntimeConfig

    if ray.is_initialized():
        pytest.skip("Ray already initialised in this process")
    with start_or_connect(RuntimeConfig(ray_num_cpus=4), get_accelerator("cpu")) as c:
        yield c
    assert not ray.is_initialized()
