"""Run by test_megatron_cpu_shims.py through the `fresh_process` fixture: three megatron-core
training steps of a small GPTModel on CPU (world of one over gloo on 127.0.0.1).

Arguments: {"port": int, "apply_shims": bool}. Result: {"losses", "grad_norms": per step,
"ok": the optimizer's last success flag, "grads_finite"}. Without the shims it is expected to
fail (exit non-zero) on megatron's CUDA calls.
"""

import os
from typing import Any

import torch

from tests.fresh_process import json_main


def main(args: dict[str, Any]) -> dict[str, Any]:
    port, apply_shims = int(args["port"]), bool(args["apply_shims"])
    from mindrl.accelerator import get_accelerator

    acc = get_accelerator("cpu")
    if apply_shims:
        acc.apply_megatron_shims()
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.distributed.init_process_group(acc.dist_backend, rank=0, world_size=1)
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(1, 1)
    acc.seed(7)
    cfg = TransformerConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=128,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
    )
    model = GPTModel(
        cfg,
        get_gpt_layer_local_spec(),
        vocab_size=128,
        max_sequence_length=64,
        position_embedding_type="rope",
    )
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(), model)
    opt = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-2, clip_grad=0.5, params_dtype=torch.float32), [ddp]
    )
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 128, (2, 16), generator=gen)
    labels = torch.randint(0, 128, (2, 16), generator=gen)
    pos = torch.arange(16).expand(2, 16)
    mask = torch.triu(torch.ones(1, 1, 16, 16, dtype=torch.bool), 1)
    losses, norms = [], []
    for _ in range(3):
        ddp.zero_grad_buffer()
        opt.zero_grad()
        loss = ddp(tokens, pos, mask, labels=labels).float().mean()
        loss.backward()
        ddp.finish_grad_sync()
        grads_finite = all(torch.isfinite(p.main_grad).all() for p in model.parameters())
        ok, grad_norm, _ = opt.step()
        losses.append(loss.item())
        norms.append(float(grad_norm))
    torch.distributed.destroy_process_group()
    return {"losses": losses, "grad_norms": norms, "ok": bool(ok), "grads_finite": grads_finite}


if __name__ == "__main__":
    json_main(main)
