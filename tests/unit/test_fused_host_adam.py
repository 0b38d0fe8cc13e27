"""torch's Adam over host parameters steps with its fused kernel (`fuse_host_adam`): groups on
the host switch, others keep their options, and the fused steps match the per-tensor loop to
rounding."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from mindrl.models.host_adam import fuse_host_adam


def _params(seed: int, device: str = "cpu") -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(64, 24), (24,), (300, 5)]
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(device)) for s in shapes]


def _train(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], steps: int) -> None:
    for step in range(steps):
        g = torch.Generator().manual_seed(100 + step)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


def test_host_groups_switch_and_other_devices_keep_their_options():
    host = torch.optim.AdamW(_params(0), lr=1e-3)
    meta = torch.optim.AdamW(_params(0, device="meta"), lr=1e-3)
    plain = torch.optim.SGD(_params(0), lr=1e-3)
    chained = SimpleNamespace(
        chained_optimizers=[SimpleNamespace(optimizer=o) for o in (host, meta, plain)]
    )
    assert fuse_host_adam(chained) == 1
    assert host.param_groups[0]["fused"] is True and host.param_groups[0]["foreach"] is False
    assert not meta.param_groups[0]["fused"]
    assert "fused" not in plain.param_groups[0] or not plain.param_groups[0]["fused"]
    assert fuse_host_adam(SimpleNamespace(optimizer=host)) == 0  # already fused


def test_fused_steps_match_the_per_tensor_loop_to_rounding():
    loop_params, fused_params = _params(1), _params(1)
    loop = torch.optim.AdamW(loop_params, lr=1e-2, weight_decay=0.01, betas=(0.9, 0.95))
    fused = torch.optim.AdamW(fused_params, lr=1e-2, weight_decay=0.01, betas=(0.9, 0.95))
    assert fuse_host_adam(SimpleNamespace(optimizer=fused)) == 1
    _train(loop, loop_params, 20)
    _train(fused, fused_params, 20)
    for a, b in zip(loop_params, fused_params):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert fused.state[fused_params[0]]["step"].item() == 20
