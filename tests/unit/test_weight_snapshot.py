"""The reference held as a weight snapshot in the actor (rl_config.reference_in_actor): the
swap in and out of a model's parameters, and the config rules around it."""

from __future__ import annotations

import pytest
import torch

from mindrl.config import load_run_config
from mindrl.config.errors import ConfigError
from mindrl.models.weight_snapshot import WeightSnapshot


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    # as megatron's DDP does: every parameter a view into one contiguous buffer
    buffer = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    offset = 0
    for p in model.parameters():
        p.data = buffer[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    model.buffer = buffer  # type: ignore[assignment]
    return model


def test_the_snapshot_stands_in_for_the_weights_and_the_live_ones_come_back():
    model = _model()
    x = torch.randn(3, 4)
    reference_out = model(x).detach()
    snapshot = WeightSnapshot([model])
    assert snapshot.nbytes == sum(p.numel() * 4 for p in model.parameters())
    with torch.no_grad():  # training moves the live weights (in their buffer)
        model.buffer.add_(0.5)
    trained_out = model(x).detach()
    assert not torch.allclose(trained_out, reference_out)

    with torch.no_grad(), snapshot.swapped_in():
        assert torch.equal(model(x), reference_out)
    assert torch.equal(model(x).detach(), trained_out)
    # the live parameters are views of their buffer again (an optimizer step reaches them)
    with torch.no_grad():
        model.buffer.zero_()
    assert all(torch.count_nonzero(p) == 0 for p in model.parameters())
    with torch.no_grad(), snapshot.swapped_in():
        assert torch.equal(model(x), reference_out)  # the snapshot kept its own copy


def test_the_live_weights_come_back_when_the_pass_fails():
    model = _model()
    snapshot = WeightSnapshot([model])
    live = [p.data for p in model.parameters()]
    with pytest.raises(RuntimeError, match="boom"), snapshot.swapped_in():
        raise RuntimeError("boom")
    assert [p.data_ptr() for p in model.parameters()] == [d.data_ptr() for d in live]


def _run(*overrides: str, config: str = "grpo_smollm2_cpu"):
    """grpo_smollm2_cpu ships the integrated reference as a snapshot in the actor."""
    return load_run_config(config, list(overrides), check_paths=False)[0]


def test_the_reference_has_no_processes_of_its_own():
    run = _run()
    assert run.reference_snapshot and run.reference_in_actor
    assert [r.role for r in run.roles] == ["actor"]
    separate = _run("rl_config.reference_in_actor=false")
    assert not separate.reference_in_actor and [r.role for r in separate.roles] == ["actor", "ref"]


def test_reference_in_actor_needs_the_integrated_reference():
    with pytest.raises(ConfigError, match="reference_in_actor.*use_integrated_worker: true"):
        _run("rl_config.reference_in_actor=true", config="grpo_tiny_cpu")  # its ref_config


def test_without_a_reference_it_says_no_effect(caplog):
    with caplog.at_level("WARNING"):
        run = _run("rl_config.kl_loss_coef=0")
    assert run.ref is None and not run.reference_snapshot
    assert "reference_in_actor: no effect here (there is no reference model)" in caplog.text
