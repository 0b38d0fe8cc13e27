"""One rank of a layer-layout run (tests/integration/test_layer_layout.py): an ActorWorker
(real megatron-core, no rollout engine) on grpo_tiny_cpu with the test's overrides (uneven
pipeline stages, noop layers), trained for a few steps on `_scale_rank`'s fixed synthetic batch.

Arguments: {"hf_dir", "overrides": [...], "steps": int}. Result per rank: {"metrics": per
step, "log_probs": this DP rank's per-token log-probs before and after the steps (nested
lists), "synced": on the rank that receives the weight sync, HF name -> max |difference|
from the HF checkpoint's tensor (before training), "stage_layers": the global layer numbers
this rank built, and which of them are noop layers}.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.fresh_process import json_main
from tests.integration._rank_start import SMALL_BATCHES, rank_run_config
from tests.integration._scale_rank import synthetic_batch


def _synced_differences(worker: Any, hf_dir: str) -> dict[str, float]:
    """The weight sync's HF tensors (what a rollout engine receives) against the checkpoint."""
    from safetensors.torch import load_file

    from mindrl.checkpoint.online import iter_hf_tensors

    source: dict[str, Any] = {}
    for file in sorted(Path(hf_dir).glob("*.safetensors")):
        source.update(load_file(str(file)))
    out = {}
    for name, tensor in iter_hf_tensors(worker.model_chunks, worker.cfg.model):
        want = source.get(name)
        out[name] = float("inf") if want is None else float((tensor - want).abs().max())
    return out


def main(args: dict[str, Any]) -> dict[str, Any]:
    run = rank_run_config(
        "grpo_tiny_cpu", [f"actor_config.load={args['hf_dir']}", *SMALL_BATCHES, *args["overrides"]]
    )
    from mindrl.checkpoint.online import global_layer_numbers
    from mindrl.models.gpt import unwrap_model
    from mindrl.models.noop_layer import NoopTransformerLayer
    from mindrl.workers.actor import ActorWorker

    worker = ActorWorker(run, with_rollout=False)
    worker.init_model()
    info = worker.info
    synced = _synced_differences(worker, args["hf_dir"])
    share = synthetic_batch(run.actor.model.vocab_size).chunks(info.dp_size)[info.dp_rank]
    before = worker.compute_log_prob(share)
    metrics = [worker.update(share, step) for step in range(args["steps"])]
    after = worker.compute_log_prob(share)
    gpt = unwrap_model(worker.model_chunks[0])
    out = {
        "metrics": [{k: v for k, v in m.items() if not k.startswith("timing/")} for m in metrics],
        "log_probs": [before.tolist(), after.tolist()],
        "synced": synced,
        "layers": global_layer_numbers(gpt),
        "noop": [
            layer.layer_number - 1
            for layer in gpt.decoder.layers
            if isinstance(layer, NoopTransformerLayer)
        ],
        "params": sum(p.numel() for p in gpt.parameters()),
    }
    worker.shutdown()
    return out


if __name__ == "__main__":
    json_main(main)
