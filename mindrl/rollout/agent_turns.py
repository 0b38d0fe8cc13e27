"""Token bookkeeping of a multi-turn rollout: what the model generated, what was inserted.

Token in, token out: a trajectory only ever appends. Model turns append the engine's own ids and
log-probs (loss mask 1); tool turns append ids rendered from the new turn alone (loss mask 0).
Earlier turns are never decoded and re-encoded, so the ids the actor trains on are exactly the
ids the engine saw, and a BPE merge across a turn boundary cannot shift them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

TRUNCATE_SIDES = ("left", "middle", "right")
TRUNCATED = "...(truncated)"

# why a sample's loop ended (the per-step metrics count each)
STOP_MODEL = "model_stop"  # the model ended a turn without a tool call
STOP_LENGTH = "turn_length"  # a model turn hit sampling max_tokens
STOP_TOTAL = "max_total_response_length"
STOP_CALLS = "max_tool_calls"
STOP_CAUSES = (STOP_MODEL, STOP_LENGTH, STOP_TOTAL, STOP_CALLS)


def truncate_tool_text(text: str, limit: int, side: str | None) -> str:
    """Cut a tool's answer to ``limit`` characters as MindSpeed-RL does (``limit`` <= 0: no cut).

    ``left`` keeps the start, ``right`` keeps the end, ``middle`` (and unset) keeps both ends;
    the marker tells the model text is missing.
    """
    if limit <= 0 or len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + TRUNCATED
    if side == "right":
        return "(truncated)..." + text[-limit:]
    half = limit // 2
    return text[:half] + TRUNCATED + "..." + text[len(text) - half :]


class ToolTurnRenderer:
    """The ids of one tool turn, rendered by the tokenizer's own chat template.

    The template is applied to a fixed conversation with and without the new tool messages;
    the difference is the new turn's text (ending with the next assistant turn's header). What
    the template writes after an assistant turn's end-of-turn token (ChatML: a newline) is put
    first, because the engine stopped *at* that token.
    """

    _BASE: tuple[dict[str, str], ...] = (
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
    )

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "multi-turn rollout renders tool turns with the tokenizer's chat template, and "
                "this tokenizer has none"
            )
        self.tokenizer = tokenizer
        base = self._render(list(self._BASE), generation_prompt=False)
        end_token = tokenizer.eos_token or ""
        cut = base.rfind(end_token) if end_token else -1
        self._after_turn_end = base[cut + len(end_token) :] if cut >= 0 else ""
        self._base = base

    def _render(self, messages: list[dict[str, str]], *, generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )
        return str(text)

    def text(self, responses: Sequence[str], *, after_turn_end: bool = True) -> str:
        """The new turn's text: one tool message per response, then the assistant header."""
        messages = [*self._BASE, *({"role": "tool", "content": r} for r in responses)]
        full = self._render(messages, generation_prompt=True)
        if not full.startswith(self._base):
            raise ValueError(
                "the chat template renders earlier turns differently once a tool turn follows; "
                "tool turns cannot be rendered on their own with it"
            )
        head = self._after_turn_end if after_turn_end else ""
        return head + full[len(self._base) :]

    def ids(self, responses: Sequence[str], *, after_turn_end: bool = True) -> list[int]:
        ids = self.tokenizer.encode(
            self.text(responses, after_turn_end=after_turn_end), add_special_tokens=False
        )
        return [int(i) for i in ids]


@dataclass(frozen=True)
class AgentStats:
    """What one sample's loop did (summed into the step's metrics)."""

    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    bad_calls: int = 0
    tool_seconds: float = 0.0
    model_tokens: int = 0
    tool_tokens: int = 0
    stop: str = STOP_MODEL


@dataclass
class Trajectory:
    """One sample's response as it grows: ids, the loss mask over them, model log-probs."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    bad_calls: int = 0
    tool_seconds: float = 0.0
    last_turn_cut: bool = False  # the last model turn ended at max_tokens
    stop: str = STOP_MODEL

    @property
    def context(self) -> list[int]:
        """What the engine is given for the next turn: the prompt and every id so far."""
        return self.prompt_ids + self.response_ids

    def add_model_turn(self, ids: Sequence[int], log_probs: Sequence[float], cut: bool) -> None:
        if len(ids) != len(log_probs):
            raise ValueError(f"{len(ids)} generated ids but {len(log_probs)} log-probs")
        self.response_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.log_probs.extend(log_probs)
        self.turns += 1
        self.last_turn_cut = cut

    def add_tool_turn(self, ids: Sequence[int]) -> None:
        self.response_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.log_probs.extend([0.0] * len(ids))

    @property
    def finish_reason(self) -> str:
        """``length`` when the last model turn was cut, as for a single-turn response."""
        return "length" if self.last_turn_cut else "stop"

    def stats(self) -> AgentStats:
        model_tokens = sum(self.loss_mask)
        return AgentStats(
            turns=self.turns,
            tool_calls=self.tool_calls,
            tool_errors=self.tool_errors,
            tool_timeouts=self.tool_timeouts,
            bad_calls=self.bad_calls,
            tool_seconds=self.tool_seconds,
            model_tokens=model_tokens,
            tool_tokens=len(self.loss_mask) - model_tokens,
            stop=self.stop,
        )


def agent_step_metrics(stats: Sequence[AgentStats]) -> dict[str, float]:
    """The step's multi-turn metrics: per-sample means, totals, and samples stopped per limit."""
    if not stats:
        return {}
    n = len(stats)
    out = {
        "agent/turns_per_sample": sum(s.turns for s in stats) / n,
        "agent/tool_calls_per_sample": sum(s.tool_calls for s in stats) / n,
        "agent/tool_use_rate": sum(s.tool_calls > 0 for s in stats) / n,
        "agent/tool_errors": float(sum(s.tool_errors for s in stats)),
        "agent/tool_timeouts": float(sum(s.tool_timeouts for s in stats)),
        "agent/bad_calls": float(sum(s.bad_calls for s in stats)),
        "agent/tool_seconds": sum(s.tool_seconds for s in stats),
        "agent/model_tokens": float(sum(s.model_tokens for s in stats)),
        "agent/tool_tokens": float(sum(s.tool_tokens for s in stats)),
    }
    for cause in STOP_CAUSES:
        out[f"agent/stopped/{cause}"] = float(sum(s.stop == cause for s in stats))
    return out
