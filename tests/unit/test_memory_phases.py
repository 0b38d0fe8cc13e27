"""The memory phases of a hybrid-engine rank: the checked state machine, the HF engine's
real sleep (level 2 releases its weight storages, on CPU too) and wake in vLLM's RL order,
and the training-state offload on plain torch modules and optimizers (unique storages,
the part each belongs to, bit-exact round trips, views kept valid). The same offload on a
real megatron-core actor: tests/integration/test_offload_choreography.py."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from mindrl.config.generate import GenerateConfig
from mindrl.rollout import RolloutSampling
from mindrl.rollout.hf_engine import HFRolloutEngine
from mindrl.workers.memory_phases import (
    IllegalMemoryTransition,
    MemoryPhases,
    Phase,
    memory_metrics,
)
from mindrl.workers.offload import TrainingStateOffload, training_storages

GREEDY = RolloutSampling(temperature=0, max_tokens=10)
PROMPTS = [[1, 5, 9, 33], [1, 200, 7], [1, 17, 18, 19, 20, 21]]


# -- the state machine ------------------------------------------------------------------------
def test_the_documented_order_is_legal_and_every_step_is_recorded():
    phases = MemoryPhases()
    assert phases.phase is Phase.TRAIN
    for name, phase in [
        ("wake_weights", Phase.WEIGHTS_AWAKE),
        ("load_weights", Phase.WEIGHTS_SYNCED),
        ("load_weights", Phase.WEIGHTS_SYNCED),  # buckets / a second sync
        ("enter_rollout", Phase.ROLLOUT),
        ("generate", Phase.ROLLOUT),
        ("generate", Phase.ROLLOUT),
        ("enter_train", Phase.TRAIN),
    ]:
        assert phases.step(name) is phase
    assert phases.history[0] == "wake_weights" and phases.history[-1] == "enter_train"


@pytest.mark.parametrize(
    ("start", "name", "hint"),
    [
        ([], "generate", "engine is asleep"),
        ([], "enter_rollout", "engine is asleep"),
        ([], "load_weights", "engine is asleep"),
        (["wake_weights"], "generate", "not reloaded"),
        (["wake_weights"], "enter_rollout", "not reloaded"),
        (["wake_weights", "load_weights"], "generate", "KV cache"),
        (["wake_weights", "load_weights", "enter_rollout"], "wake_weights", "train_mode()"),
        (["close"], "wake_weights", "closed"),
    ],
)
def test_an_illegal_transition_raises_and_names_the_phase(start, name, hint):
    phases = MemoryPhases()
    for step in start:
        phases.step(step)
    before = phases.phase
    with pytest.raises(IllegalMemoryTransition, match=hint) as err:
        phases.step(name)
    assert repr(name) in str(err.value) and repr(before.value) in str(err.value)
    assert phases.phase is before  # nothing changed
    with pytest.raises(KeyError):
        phases.check("offload_everything")


def test_memory_metrics_are_gib_per_phase():
    m = memory_metrics("rollout", {"params": 2 << 30, "grads": 0}, 1 << 30, 3 << 30, 0)
    assert m == {
        "memory/rollout/params_resident_gb": 2.0,
        "memory/rollout/grads_resident_gb": 0.0,
        "memory/rollout/train_state_resident_gb": 2.0,
        "memory/rollout/offloaded_gb": 1.0,
        "memory/rollout/released_gb": 3.0,
        "memory/rollout/engine_weights_resident_gb": 0.0,
    }
    assert "memory/train/engine_weights_resident_gb" not in memory_metrics("train", {}, 0, 0, None)


# -- the HF engine really sleeps ---------------------------------------------------------------
def test_hf_engine_sleeps_level_2_and_wakes_in_the_rl_order(tiny_model_dir):
    eng = HFRolloutEngine(tiny_model_dir, dtype="float32", seed=0)
    weights = load_file(str(tiny_model_dir / "model.safetensors"))
    full = sum({p.untyped_storage()._cdata: p.nbytes for p in eng.model.parameters()}.values())
    assert eng.resident_weight_bytes() == full > 0
    before = eng.generate(PROMPTS, GREEDY)

    eng.sleep(level=1)  # CPU: the weights are in host memory already (a no-op)
    assert eng.resident_weight_bytes() == full
    assert eng.generate(PROMPTS, GREEDY) == before

    eng.sleep(level=2)
    assert eng.resident_weight_bytes() == 0  # the storages really left their tensors
    assert all(p.untyped_storage().nbytes() == 0 for p in eng.model.parameters())
    with pytest.raises(RuntimeError, match="asleep"):
        eng.generate(PROMPTS, GREEDY)
    with pytest.raises(RuntimeError, match=r"wake_up\(\['weights'\]\)"):
        eng.update_weights(list(weights.items()))
    eng.sleep(level=2)  # again: nothing more to release

    eng.wake_up(["weights"])
    assert eng.resident_weight_bytes() == full
    with pytest.raises(RuntimeError, match="KV cache"):
        eng.generate(PROMPTS, GREEDY)
    names = sorted(weights)
    eng.update_weights([(n, weights[n]) for n in names[:-3]])  # a partial reload
    eng.wake_up(["kv_cache"])
    with pytest.raises(RuntimeError, match="not reloaded") as err:
        eng.generate(PROMPTS, GREEDY)
    assert "3 weight tensors" in str(err.value)
    assert any(repr(n) in str(err.value) for n in names[-3:])  # one of them is named
    eng.update_weights([(n, weights[n]) for n in names[-3:]])
    assert eng.generate(PROMPTS, GREEDY) == before  # the same model again
    eng.close()


def test_hf_engine_sleep_arguments_are_checked(tiny_model_dir):
    eng = HFRolloutEngine(tiny_model_dir, dtype="float32", seed=0)
    with pytest.raises(ValueError, match="sleep level"):
        eng.sleep(level=3)
    with pytest.raises(ValueError, match="unknown wake_up tags"):
        eng.wake_up(["weights", "activations"])
    with pytest.raises(TypeError, match="list of names"):
        eng.wake_up("weights")
    eng.sleep(level=2)
    eng.wake_up()  # all tags: allocated, but undefined until reloaded
    with pytest.raises(RuntimeError, match="not reloaded"):
        eng.generate(PROMPTS, GREEDY)
    eng.close()


# -- the training-state offload on plain torch --------------------------------------------------
class _Fp32Wrapper:
    """megatron's FP32Optimizer shape: the torch optimizer's parameters are the model's."""

    def __init__(self, params):
        self.optimizer = torch.optim.Adam(params, lr=1e-2)


class _MixedPrecisionWrapper:
    """megatron's Float16OptimizerWithFloat16Params shape: fp32 master copies of bf16
    parameters in `fp32_from_float16_groups`, stepped by the inner torch optimizer."""

    def __init__(self, params):
        self.fp32_from_float16_groups = [[p.detach().float().requires_grad_() for p in params]]
        self.optimizer = torch.optim.Adam(self.fp32_from_float16_groups[0], lr=1e-2)


class _Chained:
    def __init__(self, *members):
        self.chained_optimizers = list(members)


def _trained(model, wrapper, params):
    for _ in range(2):
        loss = model(torch.ones(3, 8, dtype=next(model.parameters()).dtype)).float().square().sum()
        loss.backward()
        for p, q in zip(params, wrapper.optimizer.param_groups[0]["params"]):
            if p is not q:
                q.grad = p.grad.float()
        wrapper.optimizer.step()


def _offload(model, opt, **flags) -> TrainingStateOffload:
    gen = GenerateConfig(**{f"offload_train_{k}": v for k, v in flags.items()})
    return TrainingStateOffload([model], opt, gen, "cpu")


def _snapshot(tensors):
    return [t.detach().clone() for t in tensors]


def test_fp32_optimizer_params_are_the_models_and_move_with_params_only():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    params = list(model.parameters())
    wrapper = _Fp32Wrapper(params)
    _trained(model, wrapper, params)
    param_bytes = sum(p.nbytes for p in params)
    state = [v for s in wrapper.optimizer.state.values() for v in s.values()]
    state_bytes = sum(v.nbytes for v in state)

    off = _offload(model, _Chained(wrapper), optimizer=True)
    assert off.parts == ("optimizer",)
    assert off.resident_bytes() == {
        "params": param_bytes,
        "grads": param_bytes,  # .grad of each parameter
        "optimizer": state_bytes,  # the state only: its parameters are the model's
    }
    saved = _snapshot(state)
    moved = off.to_host()
    assert moved["optimizer"] == state_bytes and moved["params"] == 0
    assert off.resident_bytes() == {"params": param_bytes, "grads": param_bytes, "optimizer": 0}
    assert all(v.untyped_storage().nbytes() == 0 for v in state)
    assert off.to_host() == {}  # idempotent
    off.to_device()
    assert all(torch.equal(a, b) for a, b in zip(state, saved))
    assert off.to_device() == {}


def test_round_trip_is_bit_exact_keeps_views_and_moves_each_storage_once():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)).bfloat16()
    params = list(model.parameters())
    wrapper = _MixedPrecisionWrapper(params)
    _trained(model, wrapper, params)
    view = params[0][2:5]  # a view made before the offload, like param.main_grad
    masters = wrapper.fp32_from_float16_groups[0]
    groups = training_storages([model], wrapper, "cpu")
    keys = [s._cdata for part in groups.values() for s in part]
    assert len(keys) == len(set(keys))  # no storage in two parts
    assert {s._cdata for s in groups["optimizer"]} >= {m.untyped_storage()._cdata for m in masters}

    off = _offload(model, wrapper, param=True, grad=True, optimizer=True)
    state = [v for s in wrapper.optimizer.state.values() for v in s.values()]
    saved = _snapshot([*params, *masters, *state])
    full = off.resident_bytes()
    assert full["optimizer"] == sum(m.nbytes for m in masters) + sum(v.nbytes for v in state)
    off.to_host()
    assert off.resident_bytes() == {"params": 0, "grads": 0, "optimizer": 0}
    assert off.released_bytes() == full
    assert off.offloaded_bytes() == full["params"] + full["optimizer"]  # grads are dropped
    off.to_device()
    assert off.resident_bytes() == full
    assert all(torch.equal(a, b) for a, b in zip([*params, *masters, *state], saved))
    assert torch.equal(view, params[0][2:5])  # the old view sees the restored bytes
    assert all(torch.count_nonzero(p.grad) == 0 for p in params)  # grads come back zeroed


# -- the vLLM engine's pass-through (sleep mode needs CUDA: vLLM's LLM is stood in for) --------
class _LLM:
    """What `VLLMRolloutEngine` calls on ``vllm.LLM`` for sleep / wake, recorded."""

    def __init__(self):
        self.calls: list[tuple] = []

    def sleep(self, level: int = 1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None):
        self.calls.append(("wake_up", tags))


class _OldLLM(_LLM):
    def wake_up(self):  # vLLM before wake_up(tags=...)
        self.calls.append(("wake_up", None))


def _vllm_engine(llm, supported: bool):
    from mindrl.rollout.vllm_engine import VLLMRolloutEngine

    eng = object.__new__(VLLMRolloutEngine)  # no vLLM start-up: only the memory calls run
    eng.llm, eng.sleep_supported, eng.accelerator = llm, supported, "cuda"
    eng._asleep_tags, eng._noop_logged, eng._pending = set(), False, {}
    return eng


def test_vllm_engine_passes_level_and_tags_through_in_the_rl_order():
    llm = _LLM()
    eng = _vllm_engine(llm, supported=True)
    eng.sleep(level=2)
    eng.sleep(level=2)  # already asleep: not passed on again
    with pytest.raises(RuntimeError, match="asleep"):
        eng.generate([[1, 2]], GREEDY)
    with pytest.raises(RuntimeError, match=r"wake_up\(\['weights'\]\)"):
        eng.update_weights([])
    eng.wake_up(["weights"])
    eng.update_weights([])  # allowed now (nothing to load)
    with pytest.raises(RuntimeError, match="kv_cache"):
        eng.generate([[1, 2]], GREEDY)
    eng.wake_up(["kv_cache"])
    eng.wake_up(["kv_cache"])  # awake: not passed on
    assert llm.calls == [("sleep", 2), ("wake_up", ["weights"]), ("wake_up", ["kv_cache"])]
    with pytest.raises(ValueError, match="sleep level"):
        eng.sleep(level=0)


def test_vllm_engine_without_wake_tags_wakes_whole():
    llm = _OldLLM()
    eng = _vllm_engine(llm, supported=True)
    eng.sleep(level=2)
    eng.wake_up(["weights"])
    eng.wake_up(["kv_cache"])  # already awake with the weights
    assert llm.calls == [("sleep", 2), ("wake_up", None)]


def test_vllm_engine_without_sleep_mode_is_a_quiet_noop(caplog):
    llm = _LLM()
    eng = _vllm_engine(llm, supported=False)
    with caplog.at_level("DEBUG", logger="mindrl.rollout.vllm_engine"):
        for _ in range(3):
            eng.sleep(level=2)
            eng.wake_up(["weights"])
            eng.wake_up(["kv_cache"])
    assert llm.calls == []
    assert len(caplog.records) == 1 and caplog.records[0].levelname == "DEBUG"
    with pytest.raises(ValueError, match="unknown wake_up tags"):
        eng.wake_up(["weight"])
