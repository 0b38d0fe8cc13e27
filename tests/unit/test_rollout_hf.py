"""HF rollout backend on the tiny model: KV-cache decode vs full forward, sampling, stops,
seeds and strict weight updates. Expected values come from plain full-sequence forwards."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from mindrl.rollout import RolloutSampling
from mindrl.rollout.hf_engine import HFRolloutEngine

EOS = 2  # tiny tokenizer's <|im_end|>, the model's eos_token_id


def _random_prompts(count: int, seed: int, vocab: int = 432) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 12, (count,), generator=gen).tolist()
    return [[1] + torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = HFRolloutEngine(tiny_model_dir, dtype="float32", max_num_seqs=5, seed=0)
    yield eng
    eng.close()


def _full_forward_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log_softmax of a single unpadded forward over prompt+response, at the response."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logp = logits.log_softmax(-1)[len(prompt) - 1 : -1]
    return logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_left_padded_decode_matches_full_forward(engine):
    prompts = _random_prompts(7, seed=1)  # 7 rows, chunks of 5 and 2, mixed lengths
    sampling = RolloutSampling(n=2, temperature=1.0, top_k=50, max_tokens=12, seed=4)
    results = engine.generate(prompts, sampling)
    assert [(r.prompt_index, r.sample_index) for r in results] == [
        (p, s) for p in range(7) for s in range(2)
    ]
    for r in results:
        assert len(r.token_ids) == len(r.logprobs) >= 1
        expected = _full_forward_logprobs(engine.model, prompts[r.prompt_index], list(r.token_ids))
        torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=1e-5, rtol=0)


def test_greedy_is_argmax_of_full_forward(engine):
    prompt = _random_prompts(1, seed=2)[0]
    (r,) = engine.generate([prompt], RolloutSampling(temperature=0, max_tokens=10, ignore_eos=True))
    ids = torch.tensor([prompt + list(r.token_ids)])
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0]
    argmax = logits[len(prompt) - 1 : -1].argmax(-1).tolist()
    assert list(r.token_ids) == argmax
    assert r.finish_reason == "length" and len(r.token_ids) == 10


def test_eos_stops_with_eos_kept_and_ignore_eos_runs_on(engine):
    # ChatML-shaped prompts (<|im_start|> text <|im_end|> <|im_start|>): the random tiny
    # model then emits <|im_end|> on some of them within 32 tokens.
    prompts = [p + [EOS, 1] for p in _random_prompts(24, seed=3)]
    greedy = RolloutSampling(temperature=0, max_tokens=32)
    results = engine.generate(prompts, greedy)
    stopped = [r for r in results if r.finish_reason == "stop"]
    assert stopped, "no tiny-model prompt reached EOS in 32 greedy tokens"
    for r in results:
        if r.finish_reason == "stop":
            assert r.token_ids[-1] == EOS and EOS not in r.token_ids[:-1]
        else:
            assert len(r.token_ids) == 32 and EOS not in r.token_ids
    r = stopped[0]
    (longer,) = engine.generate(
        [prompts[r.prompt_index]], RolloutSampling(temperature=0, max_tokens=32, ignore_eos=True)
    )
    assert longer.finish_reason == "length" and len(longer.token_ids) == 32
    assert longer.token_ids[: len(r.token_ids)] == r.token_ids


def test_stop_token_ids_stop_at_first_occurrence(engine):
    prompt = _random_prompts(1, seed=5)[0]
    free = engine.generate([prompt], RolloutSampling(temperature=0, max_tokens=16, ignore_eos=True))
    stop_tok = free[0].token_ids[6]
    first = free[0].token_ids.index(stop_tok)
    (r,) = engine.generate(
        [prompt],
        RolloutSampling(temperature=0, max_tokens=16, ignore_eos=True, stop_token_ids=(stop_tok,)),
    )
    assert r.finish_reason == "stop"
    assert r.token_ids == free[0].token_ids[: first + 1]
    assert r.logprobs == free[0].logprobs[: first + 1]


def test_seeds(tiny_model_dir, engine):
    prompts = _random_prompts(3, seed=6)
    seeded = RolloutSampling(n=4, temperature=1.0, max_tokens=8, seed=11)
    a = engine.generate(prompts, seeded)
    b = engine.generate(prompts, seeded)
    assert a == b
    assert len({r.token_ids for r in a if r.prompt_index == 0}) > 1  # n samples differ
    unseeded = RolloutSampling(n=4, temperature=1.0, max_tokens=8)
    e1 = HFRolloutEngine(tiny_model_dir, seed=21)
    e2 = HFRolloutEngine(tiny_model_dir, seed=21)
    e3 = HFRolloutEngine(tiny_model_dir, seed=22)
    first = e1.generate(prompts, unseeded)
    assert first == e2.generate(prompts, unseeded)
    assert first != e3.generate(prompts, unseeded)
    assert first != e1.generate(prompts, unseeded)  # the engine stream moves on


def test_update_weights_strict_and_exact(tiny_model_dir):
    from mindrl.assets.models import tiny_model_dir as build

    other_dir = build(seed=1)
    eng = HFRolloutEngine(tiny_model_dir)
    ref = HFRolloutEngine(other_dir)
    prompts = _random_prompts(4, seed=7)
    greedy = RolloutSampling(temperature=0, max_tokens=12)
    before = eng.generate(prompts, greedy)
    new = load_file(str(other_dir / "model.safetensors"))
    with pytest.raises(KeyError, match="model.layers.9.mlp.up_proj.weight"):
        eng.update_weights([("model.layers.9.mlp.up_proj.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="model.norm.weight"):
        eng.update_weights([("model.norm.weight", torch.zeros(3))])
    assert eng.generate(prompts, greedy) == before  # failed updates changed nothing
    names = sorted(new)
    for i in range(0, len(names), 4):  # stream in buckets of 4 tensors
        eng.update_weights([(n, new[n]) for n in names[i : i + 4]])
    after = eng.generate(prompts, greedy)
    assert after == ref.generate(prompts, greedy)
    assert after != before
    eng.sleep()  # CPU: logged no-op
    eng.wake_up()
    assert eng.generate(prompts, greedy) == after


def test_build_rollout_engine_picks_backend(tiny_model_dir):
    from mindrl.config.generate import GenerateConfig
    from mindrl.rollout import build_rollout_engine, resolve_rollout_backend, vllm_usable

    assert resolve_rollout_backend("hf", "cpu") == "hf"
    usable, why = vllm_usable("cpu")
    assert resolve_rollout_backend("auto", "cpu") == ("vllm" if usable else "hf")
    assert usable or why
    with pytest.raises(ValueError):
        resolve_rollout_backend("sglang", "cpu")
    cfg = GenerateConfig(rollout_backend="hf", dtype="float32", max_num_seqs=3)
    engine = build_rollout_engine(tiny_model_dir, cfg, seed=5, accelerator="cpu")
    try:
        assert isinstance(engine, HFRolloutEngine) and engine.max_num_seqs == 3
        assert next(engine.model.parameters()).dtype == torch.float32
    finally:
        engine.close()
