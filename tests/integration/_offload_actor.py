"""Run by test_offload_choreography.py through the `fresh_process` fixture: an ActorWorker
(world of one, real megatron-core, real optimizer, HF rollout engine) on grpo_tiny_cpu goes
through two RL steps' memory switches, with or without the training-state offload, and
with or without megatron-core's optional offload hooks.

Arguments: {"offload": bool, "drop_hooks": bool, "tensors_file": PT_FILE, "overrides": [..]}.
Result: the memory ledger after every switch, the bytes each part should hold (computed
here from the tensors, independently of mindrl's ledger), the update metrics, the
engine/training log-prob mismatch after a sync, the hybrid engine's event log and phase
history; the updated weights and optimizer state go to `tensors_file` (torch.save)."""

from typing import Any

import torch

from tests.fresh_process import json_main


def drop_megatron_offload_hooks() -> list[str]:
    """Delete megatron-core's optional RL offload hooks (absent before 0.14/0.16): whatever
    mindrl does must not need them."""
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBuffer
    from megatron.core.optimizer.optimizer import MegatronOptimizer

    def subclasses(cls: type) -> list[type]:
        return [cls, *(s for sub in cls.__subclasses__() for s in subclasses(sub))]

    targets = [
        ([DistributedDataParallel], ("offload_grad_buffers", "restore_grad_buffers")),
        ([_ParamAndGradBuffer], ("offload_to_cpu", "reload_from_cpu")),
        (subclasses(MegatronOptimizer), ("offload_to_cpu", "restore_from_cpu")),
    ]
    removed = []
    for classes, names in targets:
        for cls in classes:
            for name in names:
                if name in vars(cls):
                    delattr(cls, name)
                    removed.append(f"{cls.__name__}.{name}")
    for classes, names in targets:
        for cls in classes:
            assert not any(hasattr(cls, n) for n in names), cls
    return removed


def expected_bytes(worker: Any) -> dict[str, int]:
    """What each part holds, read straight from megatron's objects: the parameters, DDP's
    grad buffers, Adam's state plus, under bf16, the fp32 master copies of the mixed-precision
    optimizer (under fp32 the optimizer's parameters are the model's)."""
    from megatron.core.optimizer import ChainedOptimizer

    chunks = worker.model_chunks
    params = sum(p.numel() * p.element_size() for c in chunks for p in c.parameters())
    grads = sum(
        b.grad_data.numel() * b.grad_data.element_size()
        for c in chunks
        for b in [*c.buffers, *c.expert_parallel_buffers]
    )
    opt = worker.opt.optimizer
    members = opt.chained_optimizers if isinstance(opt, ChainedOptimizer) else [opt]
    state = sum(
        v.numel() * v.element_size()
        for m in members
        for s in m.optimizer.state.values()
        for v in s.values()
        if torch.is_tensor(v)
    )
    masters = sum(
        p.numel() * p.element_size()
        for m in members
        for group in getattr(m, "fp32_from_float16_groups", [])
        for p in group
    )
    return {"params": params, "grads": grads, "optimizer": state + masters, "masters": masters}


def _batch(rows: list[Any], prompts: list[list[int]]) -> Any:
    from mindrl.data.batch import build_sample_batch

    return build_sample_batch(
        [prompts[r.prompt_index] for r in rows],
        [r.token_ids for r in rows],
        0,
        rollout_log_probs=[r.log_probs for r in rows],
    )


def _with_advantages(batch: Any, old: torch.Tensor, seed: int) -> Any:
    from mindrl.algorithms import compute_advantages

    scores = torch.rand(batch.size, generator=torch.Generator().manual_seed(seed))
    adv = compute_advantages("group_norm", scores, 8, batch.response_mask)
    return batch.with_tensors(advantages=adv, ref_log_probs=old - 0.05, old_log_probs=old)


def main(args: dict[str, Any]) -> dict[str, Any]:
    from _actor_setup import actor_and_sampled_batch

    from mindrl.data.dataset import PromptDataset
    from mindrl.rollout import RolloutSampling
    from mindrl.workers.offload import torch_optimizers

    removed = drop_megatron_offload_hooks() if args["drop_hooks"] else []
    flag = "true" if args["offload"] else "false"
    overrides = [
        "rl_config.mini_batch_size=8",  # one optimizer step per update
        *(
            f"generate_config.offload_train_{part}={flag}"
            for part in ("param", "grad", "optimizer")
        ),
        *args.get("overrides", []),
    ]
    # init_model -> sync_weights -> generate (8 prompts x 8 samples)
    run, worker, batch = actor_and_sampled_batch(overrides)
    hy = worker.hybrid
    ledgers = {"rollout_before_update": hy.ledger()}
    worker.train_mode()
    ledgers["train_before_update"] = hy.ledger()
    old = worker.compute_log_prob(batch)
    m0 = worker.update(_with_advantages(batch, old, seed=0), 0)
    ledgers["train"] = hy.ledger()  # Adam's state exists now
    expected = expected_bytes(worker)
    after_update = worker.compute_log_prob(batch)
    moved_by_update = float(((after_update - old).abs() * batch.response_mask).max())

    # step 2: sync -> rollout -> generate -> train -> update
    events_from = len(hy.events)
    sync_metrics = worker.sync_weights()
    ledgers["sync"] = hy.ledger()
    worker.rollout_mode()
    worker.rollout_mode()  # idempotent
    ledgers["rollout"] = hy.ledger()
    ds = PromptDataset(run.actor.data.data_path)
    prompts = [list(ds[i].prompt_ids) for i in range(8, 16)]
    rows = worker.generate(prompts, RolloutSampling(n=8, max_tokens=8, seed=5))
    worker.train_mode()
    worker.train_mode()  # idempotent
    ledgers["train_again"] = hy.ledger()
    batch2 = _batch(rows, prompts)
    lp2 = worker.compute_log_prob(batch2)
    mismatch = float(
        ((lp2 - batch2.tensors["rollout_log_probs"]).abs() * batch2.response_mask).max()
    )
    m1 = worker.update(_with_advantages(batch2, lp2, seed=1), 1)
    events = hy.events[events_from:]
    history = list(hy.phases.history)

    opt = worker.opt.optimizer
    torch.save(
        {
            "weights": [p.detach().clone() for c in worker.model_chunks for p in c.parameters()],
            "optimizer_state": [
                {k: v.clone() for k, v in s.items() if torch.is_tensor(v)}
                for _, inner in torch_optimizers(opt)
                for s in inner.state.values()
            ],
            "masters": [
                p.detach().clone()
                for wrapper, _ in torch_optimizers(opt)
                for group in getattr(wrapper, "fp32_from_float16_groups", [])
                for p in group
            ],
            "rollout_tokens": [list(r.token_ids) for r in rows],
            "rollout_log_probs": [list(r.log_probs) for r in rows],
        },
        args["tensors_file"],
    )
    worker.shutdown()
    return {
        "removed_hooks": removed,
        "ledgers": ledgers,
        "expected": expected,
        "metrics": [{k: float(v) for k, v in m.items()} for m in (m0, m1)],
        "sync_metrics": {k: float(v) for k, v in sync_metrics.items()},
        "memory_metrics": hy.memory_metrics(),
        "mismatch": mismatch,
        "moved_by_update": moved_by_update,
        "events": events,
        "history": history,
        "tensors_file": args["tensors_file"],
    }


if __name__ == "__main__":
    json_main(main)
