"""One rank of a scale-feature run (tests/integration/test_scale_features.py): an ActorWorker
(real megatron-core, no rollout engine) on grpo_tiny_cpu with the test's overrides, trained
for a few steps on one fixed synthetic batch (this DP rank's share of it).

Arguments: {"hf_dir", "overrides": [...], "steps": int, "save": DIR | null (after the
steps), "resume": DIR | null (load before the steps)}. Result per rank: {"metrics": per step,
"optimizer_state_bytes": this rank's optimizer-held bytes (fp32 masters + Adam moments),
"activation_peak_bytes": per step, the high-water mark of tensors autograd saved for
backward, "dp_size"}.
"""

from __future__ import annotations

import gc
from typing import Any

from tests.fresh_process import json_main
from tests.integration._rank_start import SMALL_BATCHES, rank_run_config

PROMPTS, SAMPLES, PROMPT_LEN, RESPONSE_LEN = 4, 4, 12, 20


def synthetic_batch(vocab: int, seed: int = 5, grouped: bool = False) -> Any:
    """Fixed prompts, responses of varied lengths, advantages and reference log-probs.
    `grouped`: GRPO's layout, SAMPLES consecutive rows per prompt (else every row its own)."""
    import torch

    from mindrl.data.batch import build_sample_batch

    gen = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for i in range(PROMPTS * SAMPLES):
        p_len = PROMPT_LEN - ((i // SAMPLES if grouped else i) % 3)
        r_len = RESPONSE_LEN - (i * 7 % 11)
        prompt = torch.randint(3, vocab, (p_len,), generator=gen).tolist()
        prompts.append(prompts[-1] if grouped and i % SAMPLES else prompt)
        responses.append(torch.randint(3, vocab, (r_len,), generator=gen).tolist())
    batch = build_sample_batch(prompts, responses, 0)
    shape = batch.response_mask.shape
    adv = torch.randn(PROMPTS * SAMPLES, generator=gen)[:, None].expand(shape).contiguous()
    ref = -torch.rand(shape, generator=gen) * 3
    return batch.with_tensors(advantages=adv * batch.response_mask, ref_log_probs=ref)


class SavedTensorMeter:
    """High-water mark of the bytes autograd holds for backward (tensors saved in forward,
    released when the graph is freed): what activation recomputation exists to cut."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0

    def pack(self, t: Any) -> Any:
        meter = self

        class Held:
            def __init__(self, tensor: Any) -> None:
                self.tensor = tensor
                self.nbytes = tensor.numel() * tensor.element_size()
                meter.live += self.nbytes
                meter.peak = max(meter.peak, meter.live)

            def __del__(self) -> None:
                meter.live -= self.nbytes

        return Held(t)

    @staticmethod
    def unpack(held: Any) -> Any:
        return held.tensor


def optimizer_state_bytes(worker: Any) -> int:
    """Bytes the optimizer holds beyond the model's own parameters: fp32 master copies and
    Adam's moments (this rank's shard under the distributed optimizer)."""
    import torch

    def storage(t: Any) -> int:
        return t.untyped_storage().data_ptr()

    model_storages = {storage(p) for chunk in worker.model_chunks for p in chunk.parameters()}
    for chunk in worker.model_chunks:  # the distributed optimizer's param / grad buffers
        for buffer in chunk.buffers:
            for t in (buffer.param_data, buffer.grad_data):
                if t is not None:
                    model_storages.add(storage(t))
    optimizer = worker.opt.optimizer
    seen: set[int] = set()
    total = 0

    def count(t: Any) -> None:
        nonlocal total
        if not isinstance(t, torch.Tensor) or storage(t) in model_storages:
            return
        if storage(t) not in seen:
            seen.add(storage(t))
            total += t.untyped_storage().nbytes()

    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = part.optimizer
        for group in inner.param_groups:
            for p in group["params"]:
                count(p)
        for state in inner.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor) and v.numel() > 1:
                    count(v)
    return total


def main(args: dict[str, Any]) -> dict[str, Any]:
    run = rank_run_config(
        "grpo_tiny_cpu",
        [
            f"actor_config.load={args['hf_dir']}",
            *SMALL_BATCHES,
            *args["overrides"],
        ],
    )
    import torch

    from mindrl.workers.actor import ActorWorker

    worker = ActorWorker(run, with_rollout=False)
    worker.init_model(resume_dir=args.get("resume"))
    info = worker.info
    batch = synthetic_batch(run.actor.model.vocab_size)
    share = batch.chunks(info.dp_size)[info.dp_rank]
    metrics, peaks = [], []
    for step in range(args["steps"]):
        meter = SavedTensorMeter()
        with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
            metrics.append(worker.update(share, step))
        gc.collect()
        peaks.append(meter.peak)
    if args.get("save"):
        worker.save_checkpoint(args["save"])
    out = {
        "metrics": [{k: v for k, v in m.items() if not k.startswith("timing/")} for m in metrics],
        "optimizer_state_bytes": optimizer_state_bytes(worker),
        "activation_peak_bytes": peaks,
        "dp_size": info.dp_size,
    }
    worker.shutdown()
    return out


if __name__ == "__main__":
    json_main(main)
