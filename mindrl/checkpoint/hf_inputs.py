"""An HF checkpoint handed to the converter: its architecture with the converter's flags
reconciled (the checkpoint's config.json decides the family), and every tensor covered by
the family's mapping table.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mindrl.checkpoint.errors import ConversionError
from mindrl.checkpoint.hf_io import HFCheckpointReader
from mindrl.checkpoint.mapping import IGNORED_HF_SUFFIXES
from mindrl.config.model_arch import ModelArchConfig
from mindrl.models.hf_arch import arch_from_hf_config


def check_hf_coverage(reader: HFCheckpointReader, arch: ModelArchConfig) -> None:
    """Every HF tensor is used by the mapping, and every mapped HF tensor is present."""
    from mindrl.checkpoint.mapping import expected_hf_tensors

    expected = expected_hf_tensors(arch)
    names = set(reader.names())
    for name in expected:
        if name not in names:
            raise ConversionError(f"tensor {name} is missing from the HF checkpoint {reader.dir}")
    for name in sorted(names - set(expected)):
        if name.endswith(IGNORED_HF_SUFFIXES):
            continue
        if name == "lm_head.weight" and arch.tie_word_embeddings:
            continue  # a tied checkpoint that also stored the (identical) output layer
        raise ConversionError(
            f"HF tensor {name} is not covered by the {arch.family} mapping "
            f"(model_type_hf={arch.model_type_hf}, add_qkv_bias={arch.add_qkv_bias})"
        )


def reconcile_hf_flags(
    hf_dir: str | Path, *, model_type_hf: str | None = None, add_qkv_bias: bool | None = None
) -> tuple[ModelArchConfig, tuple[str, ...]]:
    """The HF checkpoint's arch, and one notice per converter flag it overrides.

    The checkpoint's config.json decides the family (the weights are what they are): a
    `--model-type-hf` of another family or an `--add-qkv-bias` that disagrees is overridden
    with a notice, not an error; the tensor coverage check still verifies every weight.
    MindSpeed-RL's spelling for Qwen2.5, `--model-type-hf llama2 --add-qkv-bias`, gets one.
    """
    from mindrl.families import registry

    arch = arch_from_hf_config(hf_dir)
    notices = []
    says = f"the checkpoint's config.json says {arch.family}"
    if model_type_hf is not None:
        family = registry.family_of_variant(model_type_hf)
        if family is None and registry.alias_family(model_type_hf) is None:
            known = registry.known_spellings()
            raise ConversionError(
                f"--model-type-hf {model_type_hf} is not a model family ({', '.join(known)})"
            )
        if family == arch.family:
            arch = dataclasses.replace(arch, model_type_hf=model_type_hf)
        else:
            notices.append(f"--model-type-hf {model_type_hf}: {says}; converting as {arch.family}")
    if add_qkv_bias is not None and add_qkv_bias != arch.add_qkv_bias:
        flag = "--add-qkv-bias" if add_qkv_bias else "add_qkv_bias=False"
        kind = "with" if arch.add_qkv_bias else "without"
        notices.append(f"{flag}: {says}; converting {kind} q/k/v biases")
    return arch, tuple(notices)
