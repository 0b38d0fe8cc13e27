"""MindSpeed's `use_fused_rmsnorm` / `use_fused_swiglu` off the NPU: mindrl's compiled RMSNorm
and megatron's own fused SwiGLU compute what the unfused layers compute, keep less for the
backward, and the kernel keys act on CPU (not refused, not warned; the fused rotary
embedding's own tests: test_fused_rope.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mindrl.config import load_run_config
from mindrl.config.fates import handoffs, reset_warnings
from mindrl.models import host_fusions
from mindrl.models.host_fusions import fused_rms_norm, rms_norm, use_fused_rms_norm
from mindrl.models.scale import transformer_overrides
from mindrl.planning.shapes import role_shape
from tests.unit._model_files import arch_kwargs

KERNELS = ("actor_config.use_fused_rmsnorm=true", "actor_config.use_fused_swiglu=true")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_written_out_norm_is_torchs_rms_norm_bit_for_bit(dtype):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(37, 2, 96, generator=gen) * 3).to(dtype)
    w = (torch.rand(96, generator=gen) + 0.5).to(dtype)
    assert torch.equal(rms_norm(x, w, 1e-6), F.rms_norm(x, [96], w, 1e-6))


def _saved_bytes(fn, *args):
    kept = [0]

    def pack(t):
        if not isinstance(t, torch.nn.Parameter):
            kept[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, kept[0]


def test_the_compiled_norm_matches_torchs_and_keeps_only_its_input():
    gen = torch.Generator().manual_seed(1)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2.0**-7)):
        # two token counts: the compiled kernel is shape-dynamic
        for tokens in (53, 91):
            x = (torch.randn(tokens, 1, 64, generator=gen) * 2).to(dtype)
            w = (torch.rand(64, generator=gen) + 0.5).to(dtype)
            g = torch.randn(tokens, 1, 64, generator=gen).to(dtype)
            ours, theirs = [t.clone().requires_grad_() for t in (x, x)]
            w_ours, w_theirs = [t.clone().requires_grad_() for t in (w, w)]
            out, kept = _saved_bytes(fused_rms_norm, ours, w_ours, 1e-5)
            ref, kept_eager = _saved_bytes(F.rms_norm, theirs, [64], w_theirs, 1e-5)
            out.backward(g)
            ref.backward(g)
            assert torch.allclose(out.float(), ref.float(), atol=tol, rtol=tol)
            for a, b in ((ours.grad, theirs.grad), (w_ours.grad, w_theirs.grad)):
                scale = float(b.float().abs().max())
                assert float((a.float() - b.float()).abs().max()) <= 2 * tol * max(1.0, scale)
            # the input and one fp32 number per token (the eager norm: fp32 copies as well)
            assert kept <= x.numel() * x.element_size() + 4 * tokens + w.numel() * 4
            assert kept_eager >= 2 * kept


def test_the_compiled_norm_reads_its_weight_at_each_call():
    """Reference and old-policy passes run without gradients after an optimizer step has
    changed the weight in place: the compiled no-grad graph must not have frozen it."""
    norm = torch.nn.RMSNorm(16, eps=1e-6)
    use_fused_rms_norm(norm)
    x = torch.randn(7, 16)
    for _ in range(2):
        with torch.no_grad():
            before = norm(x)
            norm.weight.mul_(2.0)  # an optimizer step, in place
            after = norm(x)
        assert torch.allclose(after, 2.0 * before, rtol=1e-6, atol=1e-6)
        assert torch.allclose(after, F.rms_norm(x, [16], norm.weight, 1e-6), atol=1e-6)


def test_a_compiler_failure_falls_back_to_torchs_norm_once(monkeypatch, caplog):
    def failing(*_args):
        raise torch._dynamo.exc.BackendCompilerFailed(failing, RuntimeError("no c++"), None)

    monkeypatch.setattr(host_fusions, "_compiled_rms_norm", lambda: failing)
    monkeypatch.setattr(host_fusions, "_compiler_failed", [])
    x, w = torch.randn(5, 8), torch.rand(8) + 0.5
    with caplog.at_level(logging.WARNING, logger=host_fusions.__name__):
        for _ in range(2):
            assert torch.equal(fused_rms_norm(x, w, 1e-6), F.rms_norm(x, [8], w, 1e-6))
    assert [r.getMessage() for r in caplog.records if "torch.compile cannot" in r.getMessage()]
    assert len(caplog.records) == 1


def test_the_swap_keeps_parameters_keys_and_attributes():
    model = torch.nn.Sequential(torch.nn.RMSNorm(8, eps=1e-6), torch.nn.LayerNorm(8))
    model[0].weight.sequence_parallel = True
    keys = list(model.state_dict())
    assert use_fused_rms_norm(model) == 1
    assert getattr(model[0], "fused", False) and isinstance(model[0], torch.nn.RMSNorm)
    assert type(model[1]) is torch.nn.LayerNorm  # only RMSNorm has a fused form here
    assert list(model.state_dict()) == keys and model[0].weight.sequence_parallel
    assert use_fused_rms_norm(model) == 0  # already swapped


@pytest.mark.parametrize(
    ("model", "bf16"),
    # tiny_qwen3_moe: per-head q / k norms (Qwen3) and megatron's MoE experts
    [("tiny", False), ("tiny", True), ("tiny_qwen3_moe", True)],
)
def test_a_gpt_model_with_fused_norm_and_swiglu_computes_the_unfused_one(
    fresh_process, model, bf16
):
    script = Path(__file__).with_name("_host_fusions.py")
    arch = arch_kwargs(model)
    res = fresh_process(script, {"arch": arch, "bf16": bf16}, timeout_s=600)
    layers = arch["num_layers"]
    per_layer = 4 if arch.get("qk_layernorm") else 2  # input, pre-MLP (and q, k) norms
    assert res["swapped"] == per_layer * layers + 1  # and the final norm
    # megatron's fused SwiGLU ran in every MLP (in each expert that got tokens)
    assert res["swiglu_calls"] >= layers
    assert res["finite"]
    tol = 2.0**-6 if bf16 else 1e-5
    assert res["output_gap"] <= tol * max(1.0, res["output_scale"])
    assert res["grad_gap"] <= (0.05 if bf16 else 1e-4)  # relative to each gradient's scale
    assert res["kept_fused"] < res["kept_plain"]


def test_the_kernel_keys_act_on_cpu(caplog):
    run, _ = load_run_config(
        "grpo_tiny_cpu", [*KERNELS, "actor_config.use_fused_rotary_pos_emb=true"]
    )
    reset_warnings()
    with caplog.at_level(logging.WARNING, logger="mindrl.config"):
        assert handoffs(run, "cpu").values == {}
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "use_fused_" in m]
    actor = run.actor
    assert transformer_overrides(actor)["bias_activation_fusion"] is True
    assert transformer_overrides(actor)["apply_rope_fusion"] is True
    shape = role_shape(actor, "cpu")
    assert shape.fused_norm and shape.fused_swiglu  # the memory plan counts what runs
    plain, _ = load_run_config("grpo_tiny_cpu", [])
    assert "bias_activation_fusion" not in transformer_overrides(plain.actor)
    assert not role_shape(plain.actor, "cpu").fused_norm
