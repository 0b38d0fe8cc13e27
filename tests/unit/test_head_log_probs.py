"""The output layer and log-softmax in chunks of tokens (`mindrl.models.head_log_probs`): the
same log-probs, entropies and gradients as the plain path, on plain tensors (fp32 and bf16,
padded vocabulary, temperature, entropy bonus) and inside a real megatron GPTModel (tied and
untied output layer)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mindrl.models.head_log_probs as chunked
from mindrl.models.head_log_probs import head_log_probs
from mindrl.models.logprobs import log_probs_and_entropy, vocab_parallel_log_probs
from tests.unit._model_files import arch_kwargs

TOKENS, HIDDEN, VOCAB, REAL_VOCAB = 300, 32, 500, 490


def _inputs(dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, HIDDEN, generator=gen).to(dtype).requires_grad_()
    weight = (0.3 * torch.randn(VOCAB, HIDDEN, generator=gen)).to(dtype).requires_grad_()
    labels = torch.randint(0, REAL_VOCAB, (TOKENS,), generator=gen)
    return (
        hidden,
        weight,
        labels,
        torch.randn(TOKENS, generator=gen),
        torch.randn(TOKENS, generator=gen),
    )


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch):
    monkeypatch.setattr(chunked, "CHUNK_BYTES", 4 * VOCAB * 64)  # 64 tokens: 5 chunks


# the fp32 logits GEMM in one piece and in blocks of 128 vocabulary rows (the last one short)
@pytest.mark.parametrize("vocab_block_rows", [0, 128])
@pytest.mark.parametrize("kept_probs_bytes", [256 << 20, 0])  # kept / recomputed logits
@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, None)])
def test_chunked_head_equals_the_plain_log_softmax(
    dtype, tol, entropy_grad, kept_probs_bytes, vocab_block_rows, monkeypatch
):
    monkeypatch.setattr(chunked, "KEPT_PROBS_BYTES", kept_probs_bytes)
    monkeypatch.setattr(chunked, "VOCAB_BLOCK_ROWS", vocab_block_rows)
    hidden, weight, labels, g_picked, g_entropy = _inputs(dtype)
    picked, entropy = log_probs_and_entropy(
        hidden @ weight.t(), labels, vocab_size=REAL_VOCAB, entropy_grad=entropy_grad
    )
    ((picked * g_picked).sum() + (entropy * g_entropy).sum() * entropy_grad).backward()
    plain = (picked.detach(), entropy.detach(), hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None
    picked, entropy = head_log_probs(
        hidden, weight, labels, vocab_size=REAL_VOCAB, entropy=True, entropy_grad=entropy_grad
    )
    ((picked * g_picked).sum() + (entropy * g_entropy).sum() * entropy_grad).backward()
    fused = (picked.detach(), entropy.detach(), hidden.grad, weight.grad)
    assert not entropy.requires_grad or entropy_grad
    assert float(weight.grad[REAL_VOCAB:].abs().max()) == 0.0  # padding rows learn nothing
    for name, a, b in zip(("log-probs", "entropy", "hidden grad", "weight grad"), plain, fused):
        assert torch.isfinite(b).all(), name
        gap = float((a.float() - b.float()).abs().max())
        # bf16: both round the same products; 2 ulps of the largest value
        bound = tol if tol is not None else 2 * 2.0**-7 * max(1.0, float(a.float().abs().max()))
        assert gap <= bound, f"{name}: {gap}"


@pytest.mark.parametrize("vocab_block_rows", [0, 128])
def test_chunked_head_at_a_temperature_without_and_with_gradients(vocab_block_rows, monkeypatch):
    monkeypatch.setattr(chunked, "VOCAB_BLOCK_ROWS", vocab_block_rows)
    hidden, weight, labels, g_picked, _ = _inputs(torch.float32, seed=1)
    picked = vocab_parallel_log_probs(
        hidden @ weight.t(), labels, vocab_size=REAL_VOCAB, temperature=0.7
    )
    (picked * g_picked).sum().backward()
    plain = (picked.detach(), hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None
    fused, entropy = head_log_probs(hidden, weight, labels, vocab_size=REAL_VOCAB, temperature=0.7)
    assert entropy is None
    (fused * g_picked).sum().backward()
    for a, b in zip(plain, (fused.detach(), hidden.grad, weight.grad)):
        assert float((a - b).abs().max()) <= 1e-5
    with torch.no_grad():
        again, _ = head_log_probs(hidden, weight, labels, vocab_size=REAL_VOCAB, temperature=0.7)
    assert torch.equal(again, fused.detach())
    with pytest.raises(ValueError, match="temperature 1"):
        head_log_probs(hidden, weight, labels, temperature=0.7, entropy=True)


@pytest.mark.parametrize(
    ("arch", "entropy_grad", "bf16"),
    [
        # tied output layer, vocabulary padded to a multiple of 128 (448 -> 512 rows)
        (arch_kwargs(make_vocab_size_divisible_by=128), True, False),
        (arch_kwargs(untie_embeddings_and_output_weights=True), False, False),
        # bf16 weights and compute, fp32 gradient buffers: megatron's mixed precision
        (arch_kwargs(make_vocab_size_divisible_by=128), False, True),
        (arch_kwargs(untie_embeddings_and_output_weights=True), False, True),
    ],
)
def test_hidden_only_gpt_model_gives_the_plain_gradients(fresh_process, arch, entropy_grad, bf16):
    script = Path(__file__).with_name("_head_log_probs.py")
    args = {"arch": arch, "entropy_grad": entropy_grad, "chunk_bytes": 4 * 512 * 16, "bf16": bf16}
    res = fresh_process(script, args, timeout_s=300)
    assert res["fused_used_head"] and not res["plain_used_head"]
    assert res["finite"]
    # bf16: both paths round the same bf16 products, in a different order
    tol = 2 * 2.0**-7 if bf16 else 1e-5
    assert res["log_prob_gap"] <= tol * max(1.0, res["log_prob_scale"])
    assert res["entropy_gap"] <= tol * max(1.0, res["log_prob_scale"])
    assert res["grad_gap"] <= tol * max(1.0, res["grad_scale"])
    # in megatron's DDP the head adds its weight gradient into main_grad itself (with and
    # without overlapped reduction; tied: the embedding's gradient still arrives)
    assert res["ddp_grad_gap"] <= tol * max(1.0, res["grad_scale"])
    # ... and the word embedding's gradient reached DDP as the looked-up rows only
    # (`row_grad_embedding`); a tensor hook sees the summed gradient where the head is tied
    assert "torch.sparse_coo" in res["ddp_embedding_grad_layouts"]


def test_bf16_added_into_fp32_a_block_of_rows_at_a_time(monkeypatch):
    monkeypatch.setattr(chunked, "MIXED_ADD_ROWS", 3)  # 10 rows: blocks of 3, 3, 3, 1
    gen = torch.Generator().manual_seed(1)
    dst = torch.randn(10, 4, generator=gen)
    src = torch.randn(10, 4, generator=gen).bfloat16()
    expected = dst + src.float()
    chunked.add_mixed_(dst, src)
    assert torch.equal(dst, expected)
