"""The hybrid engine's memory choreography on CPU, on a real megatron-core actor with its
real optimizer and the HF rollout engine: the training state really leaves its tensors in
rollout mode and comes back bit for bit, the weights reach the engine before the offload,
the engine sleeps (level 2) and wakes in vLLM's documented order, and none of it needs
megatron-core's optional offload hooks.

Four fresh processes (fp32 / bf16, offload on / off: `_offload_actor.py`), two at a time,
shared by the tests of this module."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.fresh_process import FreshProcess

SCRIPT = Path(__file__).with_name("_offload_actor.py")
TIMEOUT_S = 300.0
PARTS = ("params", "grads", "optimizer")
RUNS = {  # (precision, offload) -> extra overrides
    ("fp32", True): [],
    ("fp32", False): [],
    ("bf16", True): ["actor_config.bf16=true"],
    ("bf16", False): ["actor_config.bf16=true"],
}
UPDATE_KEYS = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "grad_norm", "actor/ppo_kl")

pytestmark = pytest.mark.slow  # ~30-40 s for the four processes


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir) -> dict[tuple[str, bool], dict[str, Any]]:
    import torch

    work = tmp_path_factory.mktemp("offload")
    fresh = FreshProcess(work / "fresh")

    def one(key: tuple[str, bool]) -> dict[str, Any]:
        precision, offload = key
        args = {
            "offload": offload,
            # the offloading runs go without megatron-core's optional hooks
            "drop_hooks": offload,
            "tensors_file": str(work / f"{precision}-{offload}.pt"),
            "overrides": RUNS[key],
        }
        out = fresh(SCRIPT, args, timeout_s=TIMEOUT_S)
        out["tensors"] = torch.load(out["tensors_file"])
        return out

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(RUNS, pool.map(one, RUNS)))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_rollout_mode_moves_the_measured_training_state_and_train_mode_restores_it(runs, precision):
    out = runs[(precision, True)]
    ledgers, expected = out["ledgers"], out["expected"]
    full = {p: expected[p] for p in PARTS}
    assert all(full[p] > 0 for p in PARTS)
    if precision == "bf16":  # the fp32 master copies are in the optimizer part
        assert expected["masters"] == 2 * expected["params"]
    else:
        assert expected["masters"] == 0
    # the ledger (unique storages) agrees with megatron's own objects
    for phase in ("train", "sync", "train_again"):
        assert {p: ledgers[phase][p] for p in PARTS} == full, phase
    # rollout: every part left the device; params and optimizer state wait in host buffers,
    # grads were dropped (they come back zeroed; the update zeroes them first anyway)
    rollout = ledgers["rollout"]
    assert {p: rollout[p] for p in PARTS} == dict.fromkeys(PARTS, 0)
    assert rollout["released"] == sum(full.values())
    assert rollout["offloaded"] == full["params"] + full["optimizer"]
    assert ledgers["train_again"]["released"] == ledgers["train_again"]["offloaded"] == 0
    # the metrics the actor returns with sync_weights say the same, in GiB
    m = out["memory_metrics"]
    assert m["memory/rollout/train_state_resident_gb"] == 0.0
    assert m["memory/train/train_state_resident_gb"] == pytest.approx(sum(full.values()) / 2**30)
    assert "memory/rollout/train_state_resident_gb" in out["sync_metrics"]


def test_without_offload_nothing_moves(runs):
    for precision in ("fp32", "bf16"):
        ledgers = runs[(precision, False)]["ledgers"]
        for phase in ("sync", "rollout", "train_again"):
            assert {p: ledgers[phase][p] for p in PARTS} == {
                p: ledgers["train"][p] for p in PARTS
            }, (precision, phase)
            assert ledgers[phase]["released"] == ledgers[phase]["offloaded"] == 0
        # the engine sleeps either way
        assert ledgers["train_again"]["engine_weights"] == 0
        assert ledgers["rollout"]["engine_weights"] > 0


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_update_after_offload_round_trips_is_bit_identical(runs, precision):
    import torch

    off, plain = runs[(precision, True)], runs[(precision, False)]
    for m_off, m_plain in zip(off["metrics"], plain["metrics"]):
        for key in UPDATE_KEYS:
            assert m_off[key] == m_plain[key], key
    t_off, t_plain = off["tensors"], plain["tensors"]
    assert t_off["rollout_tokens"] == t_plain["rollout_tokens"]
    assert t_off["rollout_log_probs"] == t_plain["rollout_log_probs"]
    for name in ("weights", "masters"):
        assert len(t_off[name]) == len(t_plain[name])
        assert all(torch.equal(a, b) for a, b in zip(t_off[name], t_plain[name])), name
    assert len(t_off["masters"]) == (len(t_off["weights"]) if precision == "bf16" else 0)
    states = list(zip(t_off["optimizer_state"], t_plain["optimizer_state"]))
    assert states and all(a.keys() == b.keys() for a, b in states)
    assert all(torch.equal(a[k], b[k]) for a, b in states for k in a)


def test_weights_are_synced_before_the_offload(runs):
    out = runs[("fp32", True)]
    assert out["moved_by_update"] > 1e-2  # the update changed the policy
    assert out["mismatch"] < 1e-4  # ... and the engine generated with the new weights
    assert out["events"] == [
        "engine.wake_up(weights)",
        "engine.update_weights",  # from the device-resident training parameters
        "offload.to_host",
        "engine.wake_up(kv_cache)",
        "engine.generate",
        "engine.sleep(level=2)",
        "offload.to_device",
    ]
    assert out["sync_metrics"]["resharding/bytes"] > 0
    # the engine's weights: released while training, resident while generating
    ledgers = out["ledgers"]
    assert ledgers["train"]["engine_weights"] == ledgers["train_again"]["engine_weights"] == 0
    assert ledgers["sync"]["engine_weights"] == ledgers["rollout"]["engine_weights"] > 0


def test_offload_does_not_need_megatron_hooks(runs):
    removed = runs[("fp32", True)]["removed_hooks"]
    assert "DistributedDataParallel.offload_grad_buffers" in removed
    assert "MegatronOptimizer.offload_to_cpu" in removed
    assert runs[("bf16", True)]["removed_hooks"] == removed
    assert runs[("fp32", False)]["removed_hooks"] == []
