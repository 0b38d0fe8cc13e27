"""The memory phases of a hybrid-engine rank, as an explicit state machine.

One rank holds a training state (parameters, gradients, optimizer state) and a rollout
engine (weights, KV cache) on the same device. The order in which they hand memory to each
other follows vLLM's documented RL recipe (sleep level 2: weights are re-streamed every step,
so keeping a stale copy on the host, as level 1 does, is wasted work):

    TRAIN ──wake_weights──> WEIGHTS_AWAKE ──load_weights──> WEIGHTS_SYNCED
      ^                                                         │
      │                                                   enter_rollout
      │                                     (offload training state, wake the KV cache)
      │                                                         v
      └──────────────── enter_train ─────────────────────── ROLLOUT ──generate──┐
        (engine sleep(level=2), restore training state)          ^──────────────┘

Weights are streamed from the device-resident training parameters, *before* the training
state leaves the device: gathering over TP/PP groups (NCCL/HCCL) needs the parameters on
the device. Every transition is named and checked; an illegal one raises
`IllegalMemoryTransition` naming the phase and what would have been legal.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

GIB = float(1 << 30)


class Phase(enum.Enum):
    TRAIN = "train"  # training state on the device; engine asleep (weights + KV released)
    WEIGHTS_AWAKE = "weights_awake"  # engine weights allocated, contents stale; KV asleep
    WEIGHTS_SYNCED = "weights_synced"  # engine holds the trained weights; KV asleep
    ROLLOUT = "rollout"  # training state offloaded (as configured); engine fully awake
    CLOSED = "closed"


_ANY_OPEN = frozenset(p for p in Phase if p is not Phase.CLOSED)

# transition name -> (phases it may start from, phase it ends in)
TRANSITIONS: dict[str, tuple[frozenset[Phase], Phase]] = {
    "wake_weights": (frozenset({Phase.TRAIN}), Phase.WEIGHTS_AWAKE),
    "load_weights": (frozenset({Phase.WEIGHTS_AWAKE, Phase.WEIGHTS_SYNCED}), Phase.WEIGHTS_SYNCED),
    "enter_rollout": (frozenset({Phase.WEIGHTS_SYNCED}), Phase.ROLLOUT),
    "generate": (frozenset({Phase.ROLLOUT}), Phase.ROLLOUT),
    "enter_train": (
        frozenset({Phase.WEIGHTS_AWAKE, Phase.WEIGHTS_SYNCED, Phase.ROLLOUT}),
        Phase.TRAIN,
    ),
    "close": (_ANY_OPEN, Phase.CLOSED),
}

_HINTS = {
    Phase.TRAIN: "the engine is asleep and its weights were released (sleep level 2): "
    "call rollout_mode() or sync_weights() first",
    Phase.WEIGHTS_AWAKE: "the engine's weights are allocated but not reloaded yet",
    Phase.WEIGHTS_SYNCED: "the engine's KV cache is still asleep",
    Phase.ROLLOUT: "the training state may be offloaded: call train_mode() first",
    Phase.CLOSED: "the hybrid engine is closed",
}


class IllegalMemoryTransition(RuntimeError):
    """A memory transition asked for in a phase it cannot start from."""


@dataclass
class MemoryPhases:
    """The current phase and the checked transitions between phases."""

    phase: Phase = Phase.TRAIN
    history: list[str] = field(default_factory=list)  # transition names, oldest first
    max_history: int = 256

    def can(self, name: str) -> bool:
        return self.phase in TRANSITIONS[name][0]

    def check(self, name: str) -> None:
        """Raise unless `name` may start from the current phase."""
        if name not in TRANSITIONS:
            raise KeyError(f"unknown memory transition {name!r}")
        sources, _ = TRANSITIONS[name]
        if self.phase not in sources:
            legal = sorted(n for n, (src, _) in TRANSITIONS.items() if self.phase in src)
            raise IllegalMemoryTransition(
                f"memory transition {name!r} is illegal in phase {self.phase.value!r} "
                f"({_HINTS[self.phase]}); legal from here: {legal}"
            )

    def step(self, name: str) -> Phase:
        """Check and take transition `name`; the new phase."""
        self.check(name)
        self.phase = TRANSITIONS[name][1]
        self.history.append(name)
        del self.history[: -self.max_history]
        return self.phase


def memory_metrics(
    phase: str,
    resident: Mapping[str, int],
    offloaded: int,
    released: int,
    engine_resident: int | None,
) -> dict[str, float]:
    """One snapshot of the rank's memory ledger as step metrics (GiB), keyed by the phase
    it was taken in: `memory/<phase>/train_state_resident_gb`, per part
    `memory/<phase>/<part>_resident_gb`, `memory/<phase>/offloaded_gb` (held in host
    buffers), `memory/<phase>/released_gb` (left the device, whether kept or dropped) and
    `memory/<phase>/engine_weights_resident_gb` when the engine can tell."""
    prefix = f"memory/{phase}"
    out = {f"{prefix}/{part}_resident_gb": n / GIB for part, n in resident.items()}
    out[f"{prefix}/train_state_resident_gb"] = sum(resident.values()) / GIB
    out[f"{prefix}/offloaded_gb"] = offloaded / GIB
    out[f"{prefix}/released_gb"] = released / GIB
    if engine_resident is not None:
        out[f"{prefix}/engine_weights_resident_gb"] = engine_resident / GIB
    return out
