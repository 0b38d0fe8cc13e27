"""The one interface every rollout backend implements, and the value types it speaks.

Log-prob convention (all backends): the log-prob of each sampled token under the *raw*
model distribution, ``log_softmax(logits)`` at temperature 1 with no top-k/top-p/min-p
filtering. This is what vLLM returns by default (``logprobs_mode="raw_logprobs"``), and it is
what a trainer recomputes from a plain forward pass, so rollout and training log-probs are
comparable token for token.

EOS convention: a sequence that stops on EOS (or on one of ``stop_token_ids``) keeps that
token as its last response token, with its log-prob, and finishes with reason ``"stop"``; a
sequence cut at ``max_tokens`` finishes with ``"length"``. Keeping EOS lets the policy learn
when to stop.

A generating worker sends its results back to the driver as `RolloutRow`s (plain lists, cheap
to pickle through Ray); the driver reassembles them into a `SampleBatch`. Both sides import
this module, so the contract sits below the trainer and the workers.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mindrl.rollout.agent_turns import AgentStats

if TYPE_CHECKING:
    import torch

    from mindrl.config.generate import SamplingConfig

FINISH_REASONS = ("stop", "length")
SLEEP_LEVELS = (1, 2)
SLEEP_TAGS = ("weights", "kv_cache")  # what `RolloutEngine.wake_up` can re-allocate


def check_sleep_level(level: int) -> int:
    if level not in SLEEP_LEVELS:
        raise ValueError(f"sleep level must be one of {SLEEP_LEVELS}, got {level!r}")
    return level


def wake_tags(tags: Sequence[str] | None) -> tuple[str, ...]:
    """The tags a `wake_up(tags)` call names (all of `SLEEP_TAGS` for None), checked."""
    if tags is None:
        return SLEEP_TAGS
    if isinstance(tags, str):
        raise TypeError(f"wake_up tags must be a list of names, got the string {tags!r}")
    unknown = [t for t in tags if t not in SLEEP_TAGS]
    if unknown:
        raise ValueError(f"unknown wake_up tags {unknown}: known are {list(SLEEP_TAGS)}")
    return tuple(dict.fromkeys(tags))


@dataclass(frozen=True)
class RolloutSampling:
    """Sampling knobs of one `generate` call; ``temperature=0`` means greedy.

    ``seed=None`` draws from the engine's own RNG (seeded once when the engine is built), so
    two engines built with the same seed and given the same sequence of calls produce the
    same samples. A set ``seed`` makes the call reproducible on its own: the same prompts and
    sampling give the same samples on the same backend, whatever ran before. Samples never
    match across backends (different RNG streams); greedy output does.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_tokens: int = 256
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def from_config(cls, cfg: SamplingConfig, n_samples_per_prompt: int = 1) -> RolloutSampling:
        """Build from ``generate_config.sampling_config`` and ``rl_config.n_samples_per_prompt``.

        ``logprobs`` and ``detokenize`` are not sampling knobs here: log-probs of the sampled
        tokens are always returned, and engines return token ids only.
        """
        return cls(
            n=n_samples_per_prompt,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            min_p=cfg.min_p,
            max_tokens=cfg.max_tokens,
            seed=cfg.seed,
            stop_token_ids=tuple(cfg.stop_token_ids),
            ignore_eos=cfg.ignore_eos,
        )


@dataclass(frozen=True)
class RolloutResult:
    """One sampled response. Results come back ordered by (prompt_index, sample_index)."""

    prompt_index: int
    sample_index: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # one per token in token_ids
    finish_reason: str  # "stop" | "length"

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"{len(self.token_ids)} tokens but {len(self.logprobs)} log-probs "
                f"(prompt {self.prompt_index}, sample {self.sample_index})"
            )
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}")


@dataclass(frozen=True, slots=True)
class RolloutRow:
    """One response; `prompt_index` counts within the prompts the worker was given.

    A multi-turn response also carries its loss mask (1 on the model's tokens, 0 on inserted
    tool and template tokens; None: all the model's) and what its agent loop did.
    """

    prompt_index: int
    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str
    loss_mask: list[int] | None = None
    agent: AgentStats | None = None

    def shifted(self, offset: int) -> RolloutRow:
        """The same row with its prompt index counted in a larger list of prompts."""
        return RolloutRow(
            self.prompt_index + offset,
            self.token_ids,
            self.log_probs,
            self.finish_reason,
            self.loss_mask,
            self.agent,
        )


def rollout_rows(results: Iterable[RolloutResult]) -> list[RolloutRow]:
    return [
        RolloutRow(r.prompt_index, list(r.token_ids), list(r.logprobs), r.finish_reason)
        for r in results
    ]


class RolloutEngine(abc.ABC):
    """Generates responses and takes new weights; backends: vLLM (any device) and HF."""

    backend: str = "?"

    @abc.abstractmethod
    def generate(
        self, prompt_token_ids: list[list[int]], sampling: RolloutSampling
    ) -> list[RolloutResult]:
        """``sampling.n`` responses per prompt, ordered by (prompt_index, sample_index)."""

    @abc.abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named full tensors (any subset of the model; may be called per bucket)."""

    @abc.abstractmethod
    def sleep(self, level: int = 1) -> None:
        """Release the device memory held for rollout, as vLLM's sleep levels do.

        Level 1: weights to host memory, KV cache dropped (`wake_up()` restores them).
        Level 2: weights and KV cache dropped; after `wake_up(["weights"])` the weights are
        allocated but undefined until `update_weights` reloads them (the RL order: weights
        are re-streamed every step, so a host copy would be stale anyway). A logged no-op
        where the platform cannot sleep (vLLM on CPU)."""

    @abc.abstractmethod
    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Re-allocate what `sleep` released: ``tags`` from `SLEEP_TAGS` (``["weights"]``
        before a weight reload, then ``["kv_cache"]`` before generating), all when None."""

    def resident_weight_bytes(self) -> int | None:
        """Bytes of the engine's weights resident on its device, measured from its tensors;
        None when the engine cannot tell (vLLM)."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Free the engine; the object is unusable afterwards."""

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tensor_nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def iter_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group a stream of named tensors into lists of at most ``bucket_bytes`` in total.

    Order is kept. A tensor larger than the bound is a bucket of its own, so the bound
    caps the memory held in flight except for single tensors that cannot be split here.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor_nbytes(tensor)
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
