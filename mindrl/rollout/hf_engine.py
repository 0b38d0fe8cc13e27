"""HF transformers rollout backend: the fallback when vLLM is absent or not wanted.

A hand-written decode loop over a transformers causal LM rather than ``model.generate``:
``generate`` would have to keep every step's full-vocabulary logits to report raw log-probs
(``output_logits``), which is gigabytes for a GRPO batch; here each step's log-prob of the
sampled token is gathered and the logits dropped. Prompts are left-padded so every row's
next token sits in the last column.

Checkpoints (and mindrl's weight stream) name each MoE expert's projections apart
(`mlp.experts.{e}.gate_proj.weight`, `up_proj`, `down_proj`); transformers >= 5 holds them
fused per layer (`mlp.experts.gate_up_proj` [E, 2 x ffn, hidden] with gate rows first, and
`mlp.experts.down_proj` [E, hidden, ffn]): a streamed expert tensor is written into its slice
of the fused one (`fused_expert_slot`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindrl.models.dtypes import torch_dtype
from mindrl.rollout.base import (
    RolloutEngine,
    RolloutResult,
    RolloutSampling,
    check_sleep_level,
    wake_tags,
)
from mindrl.rollout.host_release import ReleasedStorages
from mindrl.rollout.sampling_ops import raw_token_logprobs, sample_tokens

if TYPE_CHECKING:
    import torch

    from mindrl.config.generate import GenerateConfig

logger = logging.getLogger(__name__)


_EXPERT = re.compile(
    r"^(?P<prefix>.+\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$"
)


def fused_expert_slot(name: str, state: Mapping[str, Any]) -> tuple[Any, torch.Tensor] | None:
    """(the fused parameter, the view of it) that the per-expert HF tensor `name` fills, or
    None when `name` is not a per-expert name of a fused model."""
    m = _EXPERT.match(name)
    if m is None:
        return None
    prefix, expert, proj = m.group("prefix"), int(m.group("e")), m.group("proj")
    fused = state.get(f"{prefix}.{'down_proj' if proj == 'down' else 'gate_up_proj'}")
    if fused is None or fused.dim() != 3 or expert >= fused.shape[0]:
        return None
    view = fused.data[expert]
    if proj != "down":
        half = view.shape[0] // 2
        view = view[:half] if proj == "gate" else view[half:]
    return fused, view


def _eos_ids(model) -> tuple[int, ...]:
    """EOS ids from the generation config and the model config (either may hold a list)."""
    ids: list[int] = []
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is None:
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if int(item) not in ids:
                ids.append(int(item))
    return tuple(ids)


class HFRolloutEngine(RolloutEngine):
    """Batched sampling with a transformers model; same knobs and log-prob convention as vLLM.

    ``max_num_seqs`` bounds how many sequences decode together (rows are chunked).
    """

    backend = "hf"

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: str = "float32",
        max_num_seqs: int = 256,
        seed: int = 0,
        device: str | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from mindrl.accelerator import get_accelerator

        load_dtype = "auto" if dtype == "auto" else torch_dtype(dtype)
        self.device = torch.device(device) if device else get_accelerator().device()
        self.model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=load_dtype, trust_remote_code=trust_remote_code
        ).to(self.device)  # type: ignore[arg-type]  # transformers' wrapped `to` types `self`
        self.model.eval()
        self.max_num_seqs = max_num_seqs
        self.eos_token_ids = _eos_ids(self.model)
        pad = self.model.config.pad_token_id
        self.pad_token_id = int(pad if pad is not None else (self.eos_token_ids or (0,))[0])
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        # memory (see `sleep`): where the weights are, whether the (per-call) KV cache may
        # be built, which weights a level-2 sleep left undefined until reloaded
        self._weights = "resident"  # | "host" (level 1 off CPU) | "released" (level 2)
        self._kv_asleep = False
        self._released = ReleasedStorages()
        self._released_on_host = False
        self._stale: set[int] = set()
        self._noop_logged = False
        self._own_weight_storages()

    @classmethod
    def from_config(
        cls, model_dir: str | Path, cfg: GenerateConfig, *, seed: int = 0
    ) -> HFRolloutEngine:
        return cls(
            model_dir,
            dtype=cfg.dtype,
            max_num_seqs=cfg.max_num_seqs,
            seed=seed,
            trust_remote_code=cfg.trust_remote_code,
        )

    # -- generation ---------------------------------------------------------------------------
    def generate(
        self, prompt_token_ids: list[list[int]], sampling: RolloutSampling
    ) -> list[RolloutResult]:
        import torch

        self._check_awake()
        for i, ids in enumerate(prompt_token_ids):
            if not ids:
                raise ValueError(f"prompt {i} is empty")
        rows = [(p, s) for p in range(len(prompt_token_ids)) for s in range(sampling.n)]
        generator = self._generator
        if sampling.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        results: list[RolloutResult] = []
        for start in range(0, len(rows), self.max_num_seqs):
            chunk = rows[start : start + self.max_num_seqs]
            prompts = [prompt_token_ids[p] for p, _ in chunk]
            for (p, s), (tokens, logprobs, reason) in zip(
                chunk, self._decode(prompts, sampling, generator)
            ):
                results.append(RolloutResult(p, s, tokens, logprobs, reason))
        return results

    @staticmethod
    def _left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple:
        import torch

        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        return ids.to(device), mask.to(device)

    @staticmethod
    def _stop_set(sampling: RolloutSampling, eos_ids: tuple[int, ...]) -> list[int]:
        stops = list(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            stops += [e for e in eos_ids if e not in stops]
        return stops

    def _decode(
        self,
        prompts: list[list[int]],
        sampling: RolloutSampling,
        generator: torch.Generator,
    ) -> list[tuple[tuple[int, ...], tuple[float, ...], str]]:
        """One left-padded batch through prefill + decode with the KV cache."""
        import torch

        ids, mask = self._left_pad(prompts, self.pad_token_id, self.device)
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        stops = torch.tensor(self._stop_set(sampling, self.eos_token_ids), dtype=torch.long)
        stops = stops.to(self.device)
        batch = len(prompts)
        finished = torch.zeros(batch, dtype=torch.bool, device=self.device)
        lengths = torch.zeros(batch, dtype=torch.long, device=self.device)
        stopped = torch.zeros(batch, dtype=torch.bool, device=self.device)
        tokens_out: list[torch.Tensor] = []
        logprobs_out: list[torch.Tensor] = []
        past = None
        step_ids, step_pos = ids, positions
        with torch.inference_mode():
            for _ in range(sampling.max_tokens):
                out = self.model(
                    input_ids=step_ids,
                    attention_mask=mask,
                    position_ids=step_pos,
                    past_key_values=past,
                    use_cache=True,
                    logits_to_keep=1,
                )
                past = out.past_key_values
                logits = out.logits[:, -1, :]
                token = sample_tokens(logits, sampling, generator)
                token = torch.where(finished, self.pad_token_id, token)
                tokens_out.append(token)
                logprobs_out.append(raw_token_logprobs(logits, token))
                lengths += (~finished).long()
                hit_stop = torch.isin(token, stops) & ~finished
                stopped |= hit_stop
                finished |= hit_stop
                if bool(finished.all()):
                    break
                step_ids = token[:, None]
                step_pos = step_pos[:, -1:] + 1
                mask = torch.cat([mask, mask.new_ones((batch, 1))], dim=-1)
        all_tokens = torch.stack(tokens_out, dim=1).tolist()
        all_logprobs = torch.stack(logprobs_out, dim=1).tolist()
        results = []
        for row in range(batch):
            n = int(lengths[row])
            reason = "stop" if bool(stopped[row]) else "length"
            results.append((tuple(all_tokens[row][:n]), tuple(all_logprobs[row][:n]), reason))
        return results

    # -- weights ------------------------------------------------------------------------------
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into the model; every name and shape is checked first.

        A subset is fine (callers stream buckets). An unknown name or a shape mismatch
        raises before anything is copied, naming the tensor.
        """
        import torch

        if self._weights == "released":
            raise RuntimeError(
                "HF rollout engine is asleep with its weights released (sleep(level=2)): "
                "call wake_up(['weights']) before update_weights()"
            )
        state = self.model.state_dict(keep_vars=True)
        targets = []  # (parameter, the tensor its data is copied into, the new value)
        for name, tensor in named_tensors:
            slot = (state[name], state[name].data) if name in state else None
            slot = slot or fused_expert_slot(name, state)  # an expert of a fused MoE layer
            if slot is None:
                raise KeyError(f"update_weights: model has no tensor named {name!r}")
            if tuple(tensor.shape) != tuple(slot[1].shape):
                raise ValueError(
                    f"update_weights: {name!r} has shape {tuple(tensor.shape)}, "
                    f"model expects {tuple(slot[1].shape)}"
                )
            targets.append((*slot, tensor))
        with torch.no_grad():
            for param, data, tensor in targets:
                data.copy_(tensor.to(data.device))
                self._stale.discard(id(param))

    # -- memory -------------------------------------------------------------------------------
    def _unique_params(self) -> list[torch.nn.Parameter]:
        return list(self.model.parameters())  # tied weights once

    def _own_weight_storages(self) -> None:
        """Give every weight a storage of its own that `sleep(level=2)` can release:
        weights read from safetensors on CPU may be views of the file's memory map, which
        cannot be resized."""
        import torch

        with torch.no_grad():
            for p in self._unique_params():
                if not p.untyped_storage().resizable():
                    p.data = p.data.clone()

    def resident_weight_bytes(self) -> int:
        """Bytes of the weights' storages on the engine's device (0 after sleep(level=2))."""
        seen: dict[int, int] = {}
        for p in self._unique_params():
            storage = p.untyped_storage()
            if storage.device.type == self.device.type:
                seen[storage._cdata] = storage.nbytes()
        return sum(seen.values())

    def _log_noop(self, call: str) -> None:
        if not self._noop_logged:
            logger.debug(
                "HF rollout engine on CPU: %s is a no-op (weights are in host memory)", call
            )
            self._noop_logged = True

    def sleep(self, level: int = 1) -> None:
        """Level 1: the weights to host memory (a no-op on CPU, where they already are).
        Level 2: the weights' storages are released (``resize_(0)``, on any device, CPU
        included) and come back undefined with `wake_up(["weights"])`: `generate` refuses
        to run until `update_weights` has reloaded every one of them. The KV cache is built
        per `generate` call, so its tag only orders the calls."""
        import torch

        check_sleep_level(level)
        if level == 1 and self.device.type == "cpu":
            self._log_noop("sleep(level=1)")
            return
        self._kv_asleep = True
        if level == 1:
            if self._weights == "resident":
                self.model.to("cpu")
                self._weights = "host"
            return
        if self._weights == "released":
            return
        with torch.no_grad():
            self._released.shrink(self._unique_params())
        self._released_on_host = self._weights == "host"
        self._weights = "released"
        empty_cache = getattr(getattr(torch, self.device.type, None), "empty_cache", None)
        if self.device.type != "cpu" and empty_cache is not None:
            empty_cache()

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Re-allocate the weights (``"weights"``; undefined after a level-2 sleep until
        reloaded) and / or allow generation again (``"kv_cache"``); both when None."""
        wanted = wake_tags(tags)
        if "weights" in wanted:
            if self._weights == "released":
                self._released.restore()
                if self._released_on_host:
                    self.model.to(self.device)
                self._stale = {id(p) for p in self._unique_params()}
                self._weights = "resident"
            elif self._weights == "host":
                self.model.to(self.device)
                self._weights = "resident"
        if "kv_cache" in wanted:
            self._kv_asleep = False

    def _check_awake(self) -> None:
        if self._weights != "resident":
            raise RuntimeError(
                f"HF rollout engine is asleep (weights {self._weights}): call "
                "wake_up(['weights']), reload the weights, then wake_up(['kv_cache']) "
                "before generate()"
            )
        if self._kv_asleep:
            raise RuntimeError(
                "HF rollout engine is asleep (KV cache): call wake_up(['kv_cache']) before "
                "generate()"
            )
        if self._stale:
            names = [n for n, p in self.model.named_parameters() if id(p) in self._stale]
            raise RuntimeError(
                f"HF rollout engine: {len(names)} weight tensors were released by "
                f"sleep(level=2) and not reloaded since (e.g. {names[0]!r}): call "
                "update_weights with every weight before generate()"
            )

    def close(self) -> None:
        self.model = None
