"""A LoRA actor's adapters as a PEFT adapter folder (`adapter_config.json` +
`adapter_model.safetensors`), loadable with `peft.PeftModel.from_pretrained(base, folder)`.

The adapters reuse the weight mapping: B has the weight's output rows (so a fused QKV / gate-up
B is split into q / k / v or gate / up exactly as the weight is), a row layer's A has the
weight's input columns. A column layer's A is shared by the HF projections it feeds (q, k, v
or gate, up), so each of them gets a copy: PEFT gives every projection its own pair, and
`B_q A + B_k A + ...` stacked is the fused update.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindrl.checkpoint.mapping import BoundRule, Split, bound_rules
from mindrl.config.megatron_features import LoRAConfig
from mindrl.config.model_arch import ModelArchConfig

if TYPE_CHECKING:
    import torch

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."


def _adapter(name: str, factor: str) -> str:
    return name.removesuffix(".weight") + f".{factor}.weight"


def adapter_rules(
    arch: ModelArchConfig, lora: LoRAConfig
) -> tuple[list[BoundRule], dict[str, list[str]]]:
    """Bound rules for every adapter factor (its mcore name, split and HF names / shapes),
    and for each column layer's A the sibling HF names that share it."""
    rules: list[BoundRule] = []
    shared: dict[str, list[str]] = {}
    r = lora.lora_r
    for bound in bound_rules(arch):
        module = bound.mcore.rsplit(".", 2)
        if bound.expert is not None or module[-1] != "weight" or module[-2] not in lora.targets:
            continue
        prefix = bound.mcore.removesuffix("weight")
        row = bound.split is Split.ROW
        a_names = tuple(_adapter(n, "lora_A") for n in bound.hf)
        b_names = tuple(_adapter(n, "lora_B") for n in bound.hf)
        a_shapes = tuple((r, shape[1]) for shape in bound.hf_shapes)
        b_shapes = tuple((shape[0], r) for shape in bound.hf_shapes)
        a_split = Split.ROW if row else Split.REPLICATED
        b_split = Split.REPLICATED if row else bound.split
        a_keep = 1 if a_split is Split.REPLICATED else len(a_names)
        rules.append(
            _derived(bound, prefix + "lora_A", a_split, a_names[:a_keep], a_shapes[:a_keep])
        )
        rules.append(_derived(bound, prefix + "lora_B", b_split, b_names, b_shapes))
        if a_keep < len(a_names):
            shared[a_names[0]] = list(a_names[1:])
    return rules, shared


def _derived(
    bound: BoundRule, mcore: str, split: Split, hf: tuple[str, ...], shapes: tuple[Any, ...]
) -> BoundRule:
    rule = dataclasses.replace(bound.rule, split=split)
    return dataclasses.replace(bound, rule=rule, mcore=mcore, hf=hf, hf_shapes=shapes)


def peft_target_modules(arch: ModelArchConfig, lora: LoRAConfig) -> list[str]:
    """HF module names (q_proj, ..., down_proj) the adapters sit on."""
    rules, _ = adapter_rules(arch, lora)
    names = {n.split(".")[-3] for rule in rules for n in rule.hf}
    return sorted(names)


def export_peft_adapter(
    model_chunks: Sequence[Any],
    out_dir: str | Path,
    *,
    arch: ModelArchConfig,
    lora: LoRAConfig,
    base_model: str | None,
) -> Path | None:
    """Collective over all ranks: write the adapters as a PEFT folder from global rank 0."""
    import torch.distributed as dist
    from safetensors.torch import save_file

    from mindrl.checkpoint.atomic import commit_temp, prepare_temp
    from mindrl.checkpoint.online import iter_hf_tensors

    rules, shared = adapter_rules(arch, lora)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in iter_hf_tensors(model_chunks, arch, rules=rules):
        tensors[_PEFT_PREFIX + name] = tensor.detach().cpu().contiguous()
        for sibling in shared.get(name, []):
            tensors[_PEFT_PREFIX + sibling] = tensors[_PEFT_PREFIX + name].clone()
    if dist.get_rank() != 0:
        return None
    out_dir = Path(out_dir).absolute()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    temp = prepare_temp(out_dir)
    save_file(tensors, str(temp / WEIGHTS_FILE), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": lora.lora_r,
        "lora_alpha": lora.lora_alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "inference_mode": True,
        "target_modules": peft_target_modules(arch, lora),
    }
    (temp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    commit_temp(temp, out_dir, overwrite=True)
    return out_dir
