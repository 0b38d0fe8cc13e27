"""One rank of the doctor's megatron-core check: a tiny GPT model at the config's TP, one
forward and one backward on the device, over the accelerator's backend. Runs in a Ray task."""

from __future__ import annotations

import time
from typing import Any


def run_megatron_rank(
    rank: int, world: int, master: str, port: int, accelerator: str
) -> dict[str, Any]:
    """Build the model split `world` ways (TP = world), run a step's forward and backward,
    and say whether the loss and every gradient are finite."""
    import torch
    import torch.distributed as dist

    from mindrl.accelerator import get_accelerator

    acc = get_accelerator(accelerator)
    acc.apply_megatron_shims()
    acc.set_device(0)
    dist.init_process_group(
        acc.dist_backend, init_method=f"tcp://{master}:{port}", rank=rank, world_size=world
    )
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    try:
        parallel_state.initialize_model_parallel(world, 1)
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
            tensor_model_parallel_size=world,
            use_cpu_initialization=True,
            params_dtype=torch.float32,
        )
        device = acc.device(0)
        model = GPTModel(
            cfg,
            get_gpt_layer_local_spec(),
            vocab_size=128,
            max_sequence_length=64,
            position_embedding_type="rope",
        ).to(device)
        gen = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, 128, (2, 16), generator=gen).to(device)
        labels = torch.randint(0, 128, (2, 16), generator=gen).to(device)
        pos = torch.arange(16, device=device).expand(2, 16)
        mask = torch.triu(torch.ones(1, 1, 16, 16, dtype=torch.bool, device=device), 1)
        start = time.perf_counter()
        loss = model(tokens, pos, mask, labels=labels).float().mean()
        loss.backward()
        acc.synchronize()
        seconds = time.perf_counter() - start
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        return {
            "rank": rank,
            "tp": world,
            "loss": float(loss.item()),
            "loss_finite": bool(torch.isfinite(loss).item()),
            "grads": len(grads),
            "grads_finite": all(bool(torch.isfinite(g).all().item()) for g in grads),
            "seconds": seconds,
        }
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
