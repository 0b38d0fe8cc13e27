"""tools/bench/agent_loop.py's turn-synchronous baseline: no turn is sent before every live
response has asked for its next one, and responses that end leave the barrier."""

from __future__ import annotations

import asyncio

from mindrl.rollout.agent_loop import GeneratedTurn
from mindrl.rollout.base import RolloutSampling
from tools.bench.agent_loop import BarrierPolicy


class RecordingPolicy:
    def __init__(self) -> None:
        self.sent: list[int] = []

    async def generate_turn(
        self, context: list[int], sampling: RolloutSampling, max_tokens: int, seed: int
    ) -> GeneratedTurn:
        self.sent.append(context[0])
        return GeneratedTurn([context[0]], [0.0], False)

    def decode(self, token_ids: list[int]) -> str:
        return ""


def test_the_barrier_sends_a_round_only_when_every_live_response_waits() -> None:
    async def scenario() -> list[list[int]]:
        inner = RecordingPolicy()
        barrier = BarrierPolicy(inner, live=3)
        sampling = RolloutSampling()
        rounds = []
        first = [asyncio.ensure_future(barrier.generate_turn([k], sampling, 4, 0)) for k in (1, 2)]
        await asyncio.sleep(0.01)
        rounds.append(list(inner.sent))  # two of three waiting: nothing sent
        third = asyncio.ensure_future(barrier.generate_turn([3], sampling, 4, 0))
        await asyncio.gather(*first, third)
        rounds.append(sorted(inner.sent))
        again = asyncio.ensure_future(barrier.generate_turn([4], sampling, 4, 0))
        await asyncio.sleep(0.01)
        rounds.append(sorted(inner.sent))  # still waiting for the other two
        barrier.leave()
        barrier.leave()  # they ended: the waiting one goes
        await again
        rounds.append(sorted(inner.sent))
        return rounds

    assert asyncio.run(scenario()) == [[], [1, 2, 3], [1, 2, 3], [1, 2, 3, 4]]
