"""Render the guide's configuration reference from the fate declarations in `mindrl/config`.

Every key mindrl accepts declares its fate where the field is defined (`spec(fate=...)`,
`mindrl.config.fates`): honoured, handed to what honours it on a backend, accepted with a
"no effect" warning, or refused naming what is not built. The page is made from those
declarations, never written by hand, so it cannot drift from what the config builder does.
The MkDocs hook (`tools/docs/mkdocs_hooks.py`) renders it into every build; run this file to
write it somewhere to read it without building the site:

    python tools/docs/config_reference.py --out /tmp/config_reference.md
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import MISSING, dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `mindrl` importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mindrl.config.fates import (  # noqa: E402
    SECTION_FATES,
    Fate,
    Handed,
    Honoured,
    NoEffect,
    Refused,
    default_of,
    fate_of,
    key_fields,
    shown,
)
from mindrl.config.run import RunConfig  # noqa: E402

PAGE_NAME = "config_reference.md"

# The YAML sections whose keys are a role's (RunConfig.KEY_SECTIONS): one table serves all.
ROLE_SECTIONS = ("actor_config", "ref_config", "reward_config", "critic_config")

# A heading for each config group (the dataclass that owns a key), in the reader's words.
GROUP_TITLES: dict[str, str] = {
    "ModelArchConfig": "Model architecture",
    "ParallelConfig": "Parallel layout",
    "BatchConfig": "Batches and sequence length",
    "OptimizerConfig": "Optimizer and learning-rate schedule",
    "PrecisionConfig": "Precision",
    "CheckpointConfig": "Checkpoints",
    "DataConfig": "Data and tokenizer",
    "KernelConfig": "Fused kernels",
    "MemoryConfig": "Memory features (recompute, swap)",
    "MegatronLoopConfig": "megatron's training-loop switches",
    "MoEConfig": "Mixture of experts",
    "LoRAConfig": "LoRA",
    "LayerVariantConfig": "Layer variants",
    "AlgorithmConfig": "Algorithm: advantages, losses, KL",
    "RewardConfig": "Rewards and verifiers",
    "RewardParams": "Verifier parameters",
    "ResourceConfig": "Placement and devices",
    "ResourceSpec": "Devices of one role",
    "LoggingConfig": "Logging and trackers",
    "LoopConfig": "Validation",
    "DapoConfig": "DAPO",
    "RolloutModeConfig": "Rollout modes",
    "MicroBatchingConfig": "Packing and token-budgeted micro-batches",
    "MultimodalConfig": "Multimodal",
    "TransferConfig": "Sample transfer (TransferDock)",
    "GenerateConfig": "Rollout engine",
    "SamplingConfig": "Sampling",
    "RolloutServerConfig": "Rollout on vLLM servers",
    "RuntimeConfig": "Runtime",
    "ProfilerConfig": "Profiler",
}

FATE_WORDS = {
    Honoured: "honoured",
    Handed: "handed over",
    NoEffect: "no effect",
    Refused: "refused",
}


@dataclass(frozen=True)
class KeyRow:
    """One accepted key as the page shows it."""

    section: str  # the YAML section, or "role" for the keys every role section shares
    key: str  # the path inside its section
    group: str  # the owning config class's name
    default: str
    fate: Fate
    help: str


def key_rows() -> list[KeyRow]:
    """Every key RunConfig accepts, the role sections' shared keys once."""
    rows: list[KeyRow] = []
    for path, owner, f in key_fields(RunConfig):
        section, key = _split(path)
        if section in ROLE_SECTIONS:
            if section != ROLE_SECTIONS[0]:
                continue
            section = "role"
        default = default_of(f)
        rows.append(
            KeyRow(
                section=section,
                key=key,
                group=owner.__name__,
                default=_default_text(default),
                fate=fate_of(f),
                help=f.metadata.get("help") or "",
            )
        )
    return rows


def _default_text(default: object) -> str:
    if default is MISSING:
        return "(required)"
    return '""' if default == "" else shown(default)


def _split(path: str) -> tuple[str, str]:
    for section in RunConfig.KEY_SECTIONS.values():
        if path.startswith(section + "."):
            return section, path[len(section) + 1 :]
    raise ValueError(f"{path}: not under a known section")


def describe(fate: Fate) -> tuple[str, str]:
    """(the fate in one word or two, what it means for this key)."""
    word = FATE_WORDS[type(fate)]
    if isinstance(fate, Honoured):
        return word, f"carried into `{fate.via}`" if fate.via else ""
    if isinstance(fate, Handed):
        parts = [fate.describe()]
        if fate.name:
            parts.append(f"as `{fate.name}`")
        if fate.elsewhere:
            parts.append(f"elsewhere: {fate.elsewhere}")
        elif fate.cpu_refusal:
            parts.append(f"refused on cpu: {fate.cpu_refusal}")
        else:
            parts.append("elsewhere a value other than the default is warned as having no effect")
        return word, "; ".join(parts)
    if isinstance(fate, NoEffect):
        return word, fate.reason
    assert isinstance(fate, Refused)
    text = fate.reason
    if fate.allowed is not None:
        text += f" (accepted: {', '.join(shown(v) for v in fate.allowed)})"
    for value, reason in fate.reasons:
        text += f"; `{shown(value)}`: {reason}"
    return word, text


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def _table(rows: Iterable[KeyRow]) -> list[str]:
    lines = ["| key | default | fate | what it does here |", "|---|---|---|---|"]
    for row in rows:
        word, detail = describe(row.fate)
        what = "; ".join(p for p in (row.help, detail) if p)
        default = f"`{_cell(row.default)}`" if row.default != "(required)" else row.default
        lines.append(f"| `{row.key}` | {default} | {word} | {_cell(what)} |")
    return lines


def _section(title: str, intro: str, rows: list[KeyRow]) -> list[str]:
    lines = [f"## {title}", "", intro, ""]
    groups: dict[str, list[KeyRow]] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
    for group, members in groups.items():
        lines += [f"### {GROUP_TITLES.get(group, group)}", "", *_table(members), ""]
    return lines


SECTION_INTROS: dict[str, tuple[str, str]] = {
    "role": (
        "Role sections",
        "`megatron_training` (shared), `actor_config`, `ref_config`, `reward_config` and "
        "`critic_config` hold these keys; each role is the model file's architecture, then "
        "`megatron_training`, then its own section.",
    ),
    "rl_config": ("rl_config", "The algorithm, rewards, placement, logging and rollout modes."),
    "generate_config": ("generate_config", "The rollout engines and their sampling."),
    "runtime": ("runtime", "mindrl's own section: where and how the run executes."),
    "profiler_config.integrated": (
        "profiler_config.integrated",
        "MindSpeed-RL's profiler section (see *Runs, metrics and checkpoints*).",
    ),
}


def render() -> str:
    """The whole page."""
    rows = key_rows()
    counts = {word: 0 for word in FATE_WORDS.values()}
    for row in rows:
        counts[FATE_WORDS[type(row.fate)]] += 1
    lines = [
        "# Configuration reference",
        "",
        "<!-- generated by tools/docs/config_reference.py from mindrl/config; do not edit -->",
        "",
        "Every key mindrl accepts, with its default and its **fate**, as declared beside the "
        "field in `mindrl/config` (`spec(fate=...)`, `mindrl/config/fates.py`):",
        "",
        "- **honoured**: mindrl reads it and it does what MindSpeed-RL documents;",
        "- **handed over**: mindrl passes it to what implements it on that backend "
        "(MindSpeed's megatron adaptor, the HCCL environment, vllm-ascend, torch_npu's "
        "profiler); on other backends mindrl honours it itself, refuses it, or warns that it "
        "has no effect, as the row says;",
        "- **no effect**: accepted so that MindSpeed-RL configs run unchanged; a value other "
        "than the default is warned once, and the run's result does not depend on it;",
        "- **refused**: a value other than the default (or outside the accepted values) is a "
        "config error naming the feature that is not built.",
        "",
        f"{len(rows)} keys: "
        + ", ".join(f"{n} {word}" for word, n in counts.items())
        + ". The role sections' keys are counted once.",
        "",
    ]
    for section, (title, intro) in SECTION_INTROS.items():
        lines += _section(title, intro, [r for r in rows if r.section == section])
    lines += ["## Whole sections", "", "| section | fate | why |", "|---|---|---|"]
    for name, fate in SECTION_FATES.items():
        word, detail = describe(fate)
        lines.append(f"| `{name}` | {word} | {_cell(detail)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="where to write the page")
    args = p.parse_args(argv)
    args.out.write_text(render())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
