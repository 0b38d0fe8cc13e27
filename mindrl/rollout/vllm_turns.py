"""The agent loop's turns on an in-process vLLM engine, continuously batched.

Why ``LLMEngine.add_request`` / ``step()`` driven here rather than vLLM's ``AsyncLLM``: the hybrid
engine runs vLLM inside the actor's ranks (``external_launcher``), where vLLM has no engine-core
process and no async front end; driving the engine's own step loop works the same there and in a
rollout worker. Every engine call runs on one dedicated thread, in order, so the event loop stays
free for the tools: a turn that arrives while a step runs joins the next step (continuous
batching), and a sample waiting on its tool costs the others nothing.
"""

from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from mindrl.rollout.agent_loop import GeneratedTurn

if TYPE_CHECKING:
    from mindrl.rollout.base import RolloutSampling
    from mindrl.rollout.vllm_engine import VLLMRolloutEngine


class VLLMTurnPolicy:
    """`TurnPolicy` over a `VLLMRolloutEngine`: one request per turn, stepped by one driver."""

    def __init__(self, engine: VLLMRolloutEngine, tokenizer: Any) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self._core = engine.llm.llm_engine
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="vllm-steps")
        self._ids = itertools.count()
        self._waiting: dict[str, asyncio.Future[Any]] = {}
        self._driver: asyncio.Task[None] | None = None
        self.steps = 0  # engine steps taken (the bench reads it)

    async def generate_turn(
        self, context: list[int], sampling: RolloutSampling, max_tokens: int, seed: int
    ) -> GeneratedTurn:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = self.engine.sampling_params(sampling, seed, n=1, max_tokens=max_tokens)
        params.output_kind = RequestOutputKind.FINAL_ONLY
        request_id = f"agent-{next(self._ids)}"
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._waiting[request_id] = done  # before the engine can finish it
        prompt = TokensPrompt(prompt_token_ids=list(context))  # type: ignore[typeddict-item]
        try:
            await loop.run_in_executor(
                self._thread, self._core.add_request, request_id, prompt, params
            )
        except BaseException:
            self._waiting.pop(request_id, None)
            raise
        if self._driver is None or self._driver.done():
            self._driver = loop.create_task(self._drive())
        output = await done
        completion = output.outputs[0]
        flat = completion.logprobs
        tokens = list(completion.token_ids)
        if flat is None or len(flat) != len(tokens):
            raise RuntimeError(f"vLLM returned no per-token log-probs for {request_id}")
        return GeneratedTurn(tokens, list(flat.logprobs), completion.finish_reason == "length")

    async def _drive(self) -> None:
        """Step the engine while any turn waits; finished requests wake their samples."""
        loop = asyncio.get_running_loop()
        try:
            while self._waiting:
                outputs = await loop.run_in_executor(self._thread, self._core.step)
                self.steps += 1
                for output in outputs:
                    if output.finished:
                        waiter = self._waiting.pop(output.request_id, None)
                        if waiter is not None and not waiter.done():
                            waiter.set_result(output)
        except BaseException as exc:  # an engine failure fails every waiting turn
            for waiter in self._waiting.values():
                if not waiter.done():
                    waiter.set_exception(exc)
            self._waiting.clear()
            raise

    def decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=False))

    def close(self) -> None:
        self._thread.shutdown(wait=True)
