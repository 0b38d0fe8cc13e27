"""Adam's moments stored in bf16 on the host (`use_low_precision_moments`): the same update as
torch's fused fp32 Adam whose moments are rounded to bf16 after each step, at any chunking,
for half the moments' bytes; a saved and reloaded state continues bit for bit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import mindrl.models.host_adam as host_adam
from mindrl.models.host_adam import (
    LowPrecisionMomentsAdam,
    fuse_host_adam,
    use_low_precision_moments,
)

SHAPES = [(64, 24), (24,), (300, 5), (5000, 3)]  # the last one spans several small chunks


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]


def _set_grads(params: list[torch.nn.Parameter], step: int) -> None:
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def _narrowed(params, cls=torch.optim.AdamW, moments=("bf16", "bf16"), **options):
    part = SimpleNamespace(optimizer=cls(params, **options))
    assert use_low_precision_moments(part, *moments) == 1
    fuse_host_adam(part)
    return part


OPTIONS = {"lr": 1e-2, "weight_decay": 0.1, "betas": (0.9, 0.99)}


@pytest.mark.parametrize("chunk", [1 << 22, 1024])
@pytest.mark.parametrize("cls", [torch.optim.AdamW, torch.optim.Adam])
@pytest.mark.parametrize("moments", [("bf16", "bf16"), ("bf16", "fp32"), ("fp32", "bf16")])
def test_steps_equal_fp32_adam_with_moments_rounded_after_each_step(
    monkeypatch, chunk, cls, moments
):
    monkeypatch.setattr(host_adam, "CHUNK_ELEMENTS", chunk)
    reference_params, params = _params(), _params()
    reference = cls(reference_params, fused=True, **OPTIONS)
    narrowed = _narrowed(params, cls, moments, **OPTIONS).optimizer
    for step in range(6):
        _set_grads(reference_params, step)
        _set_grads(params, step)
        reference.step()
        narrowed.step()
        for state in reference.state.values():
            for key, dtype in zip(("exp_avg", "exp_avg_sq"), moments):
                if dtype == "bf16":
                    state[key].copy_(state[key].bfloat16())
    for a, b in zip(reference_params, params):
        assert torch.equal(a, b)
    for p, q in zip(reference_params, params):
        mine, theirs = narrowed.state[q], reference.state[p]
        assert mine["step"].item() == theirs["step"].item() == 6
        for key, dtype in zip(("exp_avg", "exp_avg_sq"), moments):
            assert mine[key].dtype == host_adam.MOMENT_DTYPES[dtype]
            assert torch.equal(mine[key].float(), theirs[key])


def test_a_group_mixing_fp32_and_bf16_parameters_steps_each_in_its_own_dtype():
    """A bf16 parameter's bf16 moments go to torch's kernel as they are (torch's own bf16
    Adam), an fp32 parameter's through the workspace, even in one group."""
    wide, narrow = _params()[0], _params()[1].bfloat16()
    mixed = [torch.nn.Parameter(wide.detach().clone()), torch.nn.Parameter(narrow.clone())]
    alone = [torch.nn.Parameter(wide.detach().clone()), torch.nn.Parameter(narrow.clone())]
    narrowed = _narrowed(mixed, **OPTIONS).optimizer
    fp32_alone = _narrowed(alone[:1], **OPTIONS).optimizer
    bf16_alone = torch.optim.AdamW(alone[1:], fused=True, **OPTIONS)
    for step in range(4):
        g = torch.Generator().manual_seed(step)
        grads = [torch.randn(p.shape, generator=g).to(p.dtype) for p in mixed]
        for ps in (mixed, alone):
            for p, grad in zip(ps, grads):
                p.grad = grad.clone()
        for opt in (narrowed, fp32_alone, bf16_alone):
            opt.step()
    assert all(torch.equal(a, b) for a, b in zip(mixed, alone))
    assert narrowed.state[mixed[1]]["exp_avg"].dtype == torch.bfloat16


def test_bf16_moments_take_half_the_bytes_and_move_the_weights_like_fp32_adam():
    fp32_params, params = _params(), _params()
    fp32 = torch.optim.AdamW(fp32_params, fused=True, **OPTIONS)
    narrowed = _narrowed(params, **OPTIONS).optimizer
    for step in range(20):
        for ps, opt in ((fp32_params, fp32), (params, narrowed)):
            _set_grads(ps, step)
            opt.step()

    def moment_bytes(opt):
        return sum(s[k].nbytes for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq"))

    assert moment_bytes(narrowed) * 2 == moment_bytes(fp32)
    start = _params()
    for a, b, p0 in zip(fp32_params, params, start):
        moved = (a - p0).abs().max()
        assert moved > 0.05  # 20 steps at lr 1e-2
        assert (a - b).abs().max() < 0.05 * moved  # bf16 moments: rounding, not another path


def test_a_saved_state_continues_bit_for_bit_after_loading():
    """torch's load_state_dict casts the loaded moments to the parameters' fp32; the fused
    switch after loading (as the trainer calls it) narrows them back, losing nothing."""
    straight_params = _params()
    straight = _narrowed(straight_params, **OPTIONS).optimizer
    first_params = _params()
    first = _narrowed(first_params, **OPTIONS).optimizer
    for step in range(3):
        for ps, opt in ((straight_params, straight), (first_params, first)):
            _set_grads(ps, step)
            opt.step()
    saved = first.state_dict()
    resumed_params = [torch.nn.Parameter(p.detach().clone()) for p in first_params]
    part = _narrowed(resumed_params, **OPTIONS)
    part.optimizer.load_state_dict(saved)
    assert part.optimizer.state[resumed_params[0]]["exp_avg"].dtype == torch.float32
    fuse_host_adam(part)
    assert part.optimizer.state[resumed_params[0]]["exp_avg"].dtype == torch.bfloat16
    for step in range(3, 6):
        for ps, opt in ((straight_params, straight), (resumed_params, part.optimizer)):
            _set_grads(ps, step)
            opt.step()
    for a, b in zip(straight_params, resumed_params):
        assert torch.equal(a, b)


def test_the_optimizer_object_stays_with_torchs_step_hooks():
    """megatron's wrappers hold the inner optimizer (the distributed one set its groups of
    shard views directly): it is switched in place, and torch's step hooks still run."""
    params = _params()
    inner = torch.optim.AdamW(params, **OPTIONS)
    part = SimpleNamespace(optimizer=inner)
    assert use_low_precision_moments(part, "bf16", "bf16") == 1
    assert part.optimizer is inner and isinstance(inner, LowPrecisionMomentsAdam)
    calls = []
    inner.register_step_post_hook(lambda opt, args, kwargs: calls.append(opt))
    _set_grads(params, 0)
    inner.step()
    assert calls == [inner]


def test_what_is_left_alone():
    fp32 = SimpleNamespace(optimizer=torch.optim.AdamW(_params(), lr=1e-3))
    assert use_low_precision_moments(fp32, "fp32", "fp32") == 0
    assert type(fp32.optimizer) is torch.optim.AdamW
    stepped = SimpleNamespace(optimizer=torch.optim.AdamW(_params(), lr=1e-3))
    _set_grads(stepped.optimizer.param_groups[0]["params"], 0)
    stepped.optimizer.step()  # has state: replacing it would drop the moments
    meta = SimpleNamespace(
        optimizer=torch.optim.AdamW([torch.nn.Parameter(torch.ones(3, device="meta"))], lr=1e-3)
    )
    chained = SimpleNamespace(chained_optimizers=[stepped, meta])
    assert use_low_precision_moments(chained, "bf16", "bf16") == 0
    amsgrad = SimpleNamespace(optimizer=torch.optim.AdamW(_params(), lr=1e-3, amsgrad=True))
    with pytest.raises(ValueError, match="amsgrad"):
        use_low_precision_moments(amsgrad, "bf16", "bf16")
