"""One rank of a PPO critic run (tests/integration/test_critic.py): a CriticWorker (real
megatron-core) on ppo_tiny_cpu with the test's overrides, loaded from an HF folder that
carries a reward model's `score.weight`, scoring one fixed synthetic batch and then trained
for a few steps on fixed returns (this DP rank's share).

Arguments: {"hf_dir", "overrides": [...], "steps": int}. Result per rank: {"values": [B, S-1]
as lists (every rank of the role returns the whole batch's), "metrics": per step}.
"""

from __future__ import annotations

from typing import Any

from tests.fresh_process import json_main
from tests.integration._rank_start import rank_run_config
from tests.integration._scale_rank import synthetic_batch


def main(args: dict[str, Any]) -> dict[str, Any]:
    run = rank_run_config(
        "ppo_tiny_cpu",
        [
            f"actor_config.load={args['hf_dir']}",
            f"critic_config.load={args['hf_dir']}",
            "critic_config.micro_batch_size=2",
            "rl_config.mini_batch_size=2",
            *args["overrides"],
        ],
    )
    import torch

    from mindrl.workers.critic import CriticWorker

    worker = CriticWorker(run)
    worker.init_model()
    info = worker.info
    batch = synthetic_batch(run.actor.model.vocab_size)
    values = worker.compute_values(batch)
    gen = torch.Generator().manual_seed(11)
    returns = torch.rand(values.shape, generator=gen) * batch.response_mask
    train = batch.with_tensors(values=values, returns=returns)
    share = train.chunks(info.dp_size)[info.dp_rank]
    metrics = []
    for step in range(args["steps"]):
        m = worker.update(share, step)
        metrics.append({k: v for k, v in m.items() if not k.startswith("timing/")})
    after = worker.compute_values(batch)
    worker.shutdown()
    return {"values": values.tolist(), "values_after": after.tolist(), "metrics": metrics}


if __name__ == "__main__":
    json_main(main)
