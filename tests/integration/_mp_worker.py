"""One rank of a multi-process megatron-core test, launched on every rank by the
`fresh_process` fixture (`fresh_process.ranks` / `run_json_ranks`, tests/fresh_process.py).

Arguments: {"tp": int, "pp": int, "ep": int (optional, MoE), "steps": [...]}; steps run in
order:
  {"op": "build", "arch_hf": HF_DIR | "arch_ckpt": MCORE_DIR, "dtype": "fp32"}
  {"op": "load_hf", "dir": HF_DIR}
  {"op": "load_mcore", "dir": MCORE_DIR}
  {"op": "forward", "ids": PT_FILE, "output": "logits"|"log_probs", "out": PT_FILE,
   "mask": PT_FILE (optional), "mbs": int (optional)}
  {"op": "save_mcore", "dir": ROOT, "iteration": int | null, "assets": HF_DIR | null}
  {"op": "export_hf", "dir": OUT_DIR, "assets": HF_DIR | null}
Every rank checks that its result equals rank 0's (the pipeline broadcast); rank 0 saves it.
Result (per rank): {"rank", "world_size", "ops": the ops run, in order}.
"""

from __future__ import annotations

import warnings
from typing import Any

from tests.fresh_process import json_main


def main(spec: dict[str, Any]) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    from mindrl.checkpoint.mcore_io import (
        load_mcore_checkpoint,
        read_checkpoint_info,
        save_mcore_checkpoint,
    )
    from mindrl.checkpoint.online import export_mcore_to_hf, load_hf_into_mcore
    from mindrl.models.forward_pass import forward_only
    from mindrl.models.gpt import build_gpt_model
    from mindrl.models.hf_arch import arch_from_hf_config
    from mindrl.models.parallel import destroy_parallel, init_parallel

    torch.set_num_threads(1)
    info = init_parallel(
        spec["tp"], spec["pp"], expert_parallel_size=spec.get("ep", 1), accelerator="cpu", seed=1
    )
    model = arch = None
    done: list[str] = []
    try:
        for step in spec["steps"]:
            op = step["op"]
            if op == "build":
                if "arch_hf" in step:
                    arch = arch_from_hf_config(step["arch_hf"])
                else:
                    arch = read_checkpoint_info(step["arch_ckpt"]).arch
                model = build_gpt_model(arch, params_dtype=step.get("dtype", "fp32"))
                model.eval()
            elif op == "load_hf":
                load_hf_into_mcore([model], step["dir"])
            elif op == "load_mcore":
                load_mcore_checkpoint([model], step["dir"], arch=arch)
            elif op == "forward":
                ids = torch.load(step["ids"])
                mask = torch.load(step["mask"]) if step.get("mask") else None
                out = forward_only(
                    [model],
                    ids,
                    vocab_size=arch.vocab_size,
                    attention_mask=mask,
                    micro_batch_size=step.get("mbs"),
                    output=step["output"],
                )
                ref = out.clone()
                dist.broadcast(ref, src=0)
                assert torch.equal(out, ref), f"rank {info.rank} result differs from rank 0"
                if info.rank == 0:
                    torch.save(out, step["out"])
            elif op == "save_mcore":
                save_mcore_checkpoint(
                    [model],
                    step["dir"],
                    arch=arch,
                    iteration=step.get("iteration"),
                    hf_assets_dir=step.get("assets"),
                )
            elif op == "export_hf":
                export_mcore_to_hf(
                    [model], step["dir"], arch=arch, hf_assets_dir=step.get("assets")
                )
            else:
                raise ValueError(f"unknown op {op}")
            dist.barrier()
            done.append(op)
        world_size = dist.get_world_size()
    finally:
        destroy_parallel()
    return {"rank": info.rank, "world_size": world_size, "ops": done}


if __name__ == "__main__":
    json_main(main)
