"""Where MoE experts live under expert parallelism, for the online load and export.

megatron-core gives each expert-parallel rank E / EP consecutive experts, named by their local
index (`mlp.experts.local_experts.{i}`), while checkpoints and the mapping tables use the
global index: rank r holds global experts r x E / EP + i.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mindrl.config.model_arch import ModelArchConfig

_LOCAL_EXPERT = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.")


@dataclass(frozen=True)
class ExpertLayout:
    """This rank's share of each MoE layer's experts."""

    ep_rank: int = 0
    ep_size: int = 1
    num_local: int = 0

    def owner(self, expert: int) -> int:
        """The expert-parallel rank holding global expert `expert`."""
        return expert // self.num_local

    def is_local(self, expert: int) -> bool:
        return self.owner(expert) == self.ep_rank

    def local_name(self, name: str, expert: int) -> str:
        """`name` (global expert index) as this rank's model names it (local index)."""
        local = expert - self.ep_rank * self.num_local
        return _LOCAL_EXPERT.sub(f".mlp.experts.local_experts.{local}.", name, count=1)

    def global_name(self, name: str) -> str:
        """A parameter name of this rank's model with its expert index made global."""
        m = _LOCAL_EXPERT.search(name)
        if m is None:
            return name
        expert = self.ep_rank * self.num_local + int(m.group(1))
        return _LOCAL_EXPERT.sub(f".mlp.experts.local_experts.{expert}.", name, count=1)


def expert_layout(arch: ModelArchConfig) -> ExpertLayout:
    """The current rank's layout (megatron's parallel_state; EP=1 when it is not initialised)."""
    if not arch.is_moe:
        return ExpertLayout()
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return ExpertLayout(0, 1, arch.num_experts or 0)
    size = ps.get_expert_model_parallel_world_size()
    return ExpertLayout(ps.get_expert_model_parallel_rank(), size, (arch.num_experts or 0) // size)
