"""PPO's critic on megatron-core over gloo (several processes, fp32): loaded from an HF
folder with a reward model's `score` head, its per-token values equal transformers'
sequence-classification model's scores at every position (TP 1), the same values and value
updates come out at PP 2 and at TP 2 with sequence parallelism (whose gradient through the
replicated head must not be counted once per TP rank), and the updates pull the values
towards the returns."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("_critic_rank.py")
TIMEOUT_S = 300.0
TOL = 1e-5
LAYERS = "model.tiny.num_layers=4"
TP2 = "critic_config.tensor_model_parallel_size=2"
PP2 = "critic_config.pipeline_model_parallel_size=2"
SP = "megatron_training.sequence_parallel=true"


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory) -> str:
    """The 4-layer tiny model plus a random one-label `score` head: a reward-model folder."""
    import torch
    from safetensors.torch import load_file, save_file

    from mindrl.assets import models

    src = models.tiny_model_dir(num_layers=4)
    out = tmp_path_factory.mktemp("rm") / "tiny_rm"
    shutil.copytree(src, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["num_labels"] = 1
    (out / "config.json").write_text(json.dumps(cfg))
    gen = torch.Generator().manual_seed(3)
    score = torch.randn(1, cfg["hidden_size"], generator=gen) * 0.1
    (weights,) = out.glob("*.safetensors")  # one file, no index: add the head to it
    tensors = load_file(str(weights))
    tensors["score.weight"] = score
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return str(out)


def _run(fresh_process, hf_dir: str, world: int, overrides: list[str]) -> dict:
    args = {"hf_dir": hf_dir, "overrides": [LAYERS, *overrides], "steps": 3}
    results = fresh_process.ranks(SCRIPT, args, world_size=world, timeout_s=TIMEOUT_S)
    for other in results[1:]:  # values broadcast over the pipeline, metrics over the role
        assert other["metrics"] == results[0]["metrics"]
        assert other["values"] == results[0]["values"]
    return results[0]


def _close(a, b, what: object = None, tol: float = TOL) -> None:
    import torch

    a, b = torch.tensor(a), torch.tensor(b)
    diff = (a - b).abs().max().item()
    assert diff <= tol * max(1.0, b.abs().max().item()), (what, diff)


def test_critic_values_match_hf_and_every_layout(fresh_process, reward_model_dir):
    import torch
    from transformers import AutoModelForSequenceClassification

    from tests.integration._scale_rank import synthetic_batch

    base = _run(fresh_process, reward_model_dir, 1, [])
    # transformers' reward model scores every position with the same head
    hf = AutoModelForSequenceClassification.from_pretrained(reward_model_dir, dtype=torch.float32)
    batch = synthetic_batch(hf.config.vocab_size)
    with torch.no_grad():
        am = batch.attention_mask
        pos = (am.long().cumsum(-1) - 1).clamp(min=0)
        hidden = hf.base_model(input_ids=batch.input_ids, attention_mask=am, position_ids=pos)[0]
        expected = hf.score(hidden)[:, :-1, 0] * batch.response_mask
    _close(base["values"], expected.tolist())
    assert torch.tensor(base["values"]).abs().max() > 0.05  # the score head was loaded

    # training moves the values towards the returns, and each layout trains the same way
    assert base["metrics"][-1]["critic/vf_loss"] < base["metrics"][0]["critic/vf_loss"]
    for overrides in ([TP2, SP], [PP2]):  # TP 2 with SP covers TP 2's own path too
        other = _run(fresh_process, reward_model_dir, 2, overrides)
        _close(other["values"], base["values"], overrides)
        # after 3 Adam steps (whose first step sends near-zero gradients to +-lr) float noise
        # between layouts grows to ~1e-5 relative
        _close(other["values_after"], base["values_after"], overrides, tol=1e-4)
        for x, y in zip(base["metrics"], other["metrics"]):
            for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm"):
                assert abs(x[key] - y[key]) <= TOL * max(1.0, abs(x[key])), (overrides, key)
