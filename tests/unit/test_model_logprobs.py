"""Log-prob helpers at TP=1: padded vocab masking, gradients, masks and positions."""

from __future__ import annotations

import math

import torch

from mindrl.models.logprobs import (
    causal_attention_mask,
    position_ids_from_mask,
    vocab_parallel_log_probs,
)


def test_padded_vocab_rows_get_no_probability():
    gen = torch.Generator().manual_seed(0)
    real, padded = 7, 10
    logits = torch.randn(2, 3, padded, generator=gen)
    logits[..., real:] = 50.0  # a leak would dominate the softmax
    labels = torch.randint(0, real, (2, 3), generator=gen)
    before = logits.clone()
    got = vocab_parallel_log_probs(logits, labels, vocab_size=real)
    for b in range(2):
        for t in range(3):
            row = logits[b, t, :real].tolist()
            lse = math.log(sum(math.exp(x) for x in row))
            assert abs(got[b, t].item() - (row[labels[b, t]] - lse)) < 1e-5
    assert torch.equal(logits, before)  # the caller's logits are untouched


def test_temperature_divides_logits():
    logits = torch.tensor([[[1.0, 2.0, 3.0]]])
    got = vocab_parallel_log_probs(logits, torch.tensor([[2]]), vocab_size=3, temperature=2.0)
    want = 1.5 - math.log(math.exp(0.5) + math.exp(1.0) + math.exp(1.5))
    assert abs(got.item() - want) < 1e-6


def test_gradient_is_onehot_minus_softmax_and_zero_on_padding():
    logits = torch.tensor([[[0.5, -1.0, 2.0, 9.0]]], requires_grad=True)  # last row: padding
    lp = vocab_parallel_log_probs(logits, torch.tensor([[1]]), vocab_size=3)
    lp.sum().backward()
    exp = [math.exp(x) for x in (0.5, -1.0, 2.0)]
    soft = [e / sum(exp) for e in exp]
    want = [-soft[0], 1 - soft[1], -soft[2], 0.0]
    assert torch.allclose(logits.grad[0, 0], torch.tensor(want), atol=1e-6)


def test_causal_mask_with_left_padding():
    mask = causal_attention_mask(3, torch.tensor([[0, 1, 1]]))
    # True = masked: future keys, and the padded key 0 for every query
    want = torch.tensor([[True, True, True], [True, False, True], [True, False, False]])
    assert mask.shape == (1, 1, 3, 3) and torch.equal(mask[0, 0], want)
    assert torch.equal(
        causal_attention_mask(2)[0, 0], torch.tensor([[False, True], [False, False]])
    )


def test_positions_count_real_tokens():
    got = position_ids_from_mask(torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]]))
    assert got.tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]]
