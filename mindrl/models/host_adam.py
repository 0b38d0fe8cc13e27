"""Adam over host parameters: torch's fused CPU kernel, and Adam's moments stored in bf16.

megatron's precision-aware optimizer (`use_precision_aware_optimizer`, `exp_avg_dtype`,
`exp_avg_sq_dtype`) keeps Adam's two moments in a narrower dtype and computes the update in
fp32; on a GPU, transformer-engine's FusedAdam does it. Without TE (every CPU run) megatron
steps with torch's Adam, whose fused CPU kernel wants moments in the parameters' dtype.
`LowPrecisionMomentsAdam` stores them in bf16 and widens a bounded chunk at a time into an
fp32 workspace for torch's fused kernel, then rounds them back (round to nearest, as TE
does): the same update as fp32 Adam whose moments are rounded to bf16 after each step, for
half the moments' memory (4 bytes per parameter instead of 8).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch.optim import Adam

# elements widened at once: 2 x 16 MiB of fp32 workspace, whatever the model's size
CHUNK_ELEMENTS = 1 << 22
MOMENT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _inner_adams(optimizer: Any) -> list[tuple[Any, Adam]]:
    """(megatron part, its torch Adam / AdamW) for each part of a megatron optimizer."""
    parts = getattr(optimizer, "chained_optimizers", [optimizer])
    return [(p, p.optimizer) for p in parts if isinstance(getattr(p, "optimizer", None), Adam)]


def _on_host(group: dict[str, Any]) -> bool:
    params = group["params"]
    return bool(params) and all(p.device.type == "cpu" and p.is_floating_point() for p in params)


def fuse_host_adam(optimizer: Any) -> int:
    """Switch torch's Adam / AdamW over host parameters to its fused CPU kernel; returns how
    many parameter groups were switched.

    Without apex / TE (every CPU run) megatron steps with `torch.optim.AdamW` at its defaults,
    which on CPU is the per-tensor loop: ~10 passes over every parameter-sized tensor. The fused
    kernel makes one (the two differ by rounding only). A group on another device keeps what
    megatron chose. Called after a checkpoint's optimizer state is loaded too: torch restores
    the saved group options (and casts loaded moments to the parameters' dtype, which
    `LowPrecisionMomentsAdam` undoes)."""
    switched = 0
    for _, inner in _inner_adams(optimizer):
        for group in inner.param_groups:
            if not _on_host(group) or group.get("differentiable") or group.get("fused"):
                continue
            group["fused"], group["foreach"] = True, False
            switched += 1
        if isinstance(inner, LowPrecisionMomentsAdam):
            inner.narrow_moments()
    return switched


def use_low_precision_moments(optimizer: Any, exp_avg: str, exp_avg_sq: str) -> int:
    """Give each torch Adam of `optimizer` whose groups are all on the host moments stored in
    `exp_avg` / `exp_avg_sq` ("fp32" / "bf16"); returns how many were switched. Call it
    before the first step. The optimizer object stays (its class becomes
    `LowPrecisionMomentsAdam`): megatron's distributed optimizer set its parameter groups
    directly (shard views torch's constructor would refuse) and keeps referring to it."""
    dtypes = (MOMENT_DTYPES[exp_avg], MOMENT_DTYPES[exp_avg_sq])
    if dtypes == (torch.float32, torch.float32):
        return 0
    switched = 0
    for _, inner in _inner_adams(optimizer):
        if inner.state or not all(_on_host(g) for g in inner.param_groups):
            continue
        if any(g.get("amsgrad") for g in inner.param_groups):
            raise ValueError("low-precision Adam moments: amsgrad is not supported")
        inner.__class__ = LowPrecisionMomentsAdam
        cast(LowPrecisionMomentsAdam, inner).moment_dtypes = dtypes  # its class from now on
        switched += 1
    return switched


class LowPrecisionMomentsAdam(Adam):
    """torch's Adam / AdamW (`decoupled_weight_decay`) with `exp_avg` / `exp_avg_sq` stored in
    `moment_dtypes` and each step computed by torch's fused kernel in the parameters' dtype.
    Made by `use_low_precision_moments` from an Adam that already exists."""

    moment_dtypes: tuple[torch.dtype, torch.dtype]

    def _state_of(self, param: torch.Tensor) -> dict[str, Any]:
        state = self.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            for key, dtype in zip(("exp_avg", "exp_avg_sq"), self.moment_dtypes):
                state[key] = torch.zeros_like(param, dtype=dtype)
        return state

    def narrow_moments(self) -> None:
        """Moments held in another dtype (torch's `load_state_dict` casts loaded state to the
        parameters' dtype; megatron's loader creates fp32 ones) go back to `moment_dtypes`;
        a moment saved from this optimizer is bf16-exact, so nothing is lost."""
        for state in self.state.values():
            for key, dtype in zip(("exp_avg", "exp_avg_sq"), self.moment_dtypes):
                if key in state and state[key].dtype != dtype:
                    state[key] = state[key].to(dtype)

    @torch.no_grad()
    def _step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.narrow_moments()
        workspaces: dict[torch.dtype, torch.Tensor] = {}  # one per step, shared by the groups
        for group in self.param_groups:
            batch = _ChunkBatch(group, workspaces)
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self._state_of(param)
                if not param.is_contiguous():
                    raise ValueError("low-precision Adam moments need contiguous parameters")
                tensors = (param, param.grad, state["exp_avg"], state["exp_avg_sq"])
                flat = [t.reshape(-1) for t in tensors]
                for start in range(0, param.numel(), CHUNK_ELEMENTS):
                    end = min(start + CHUNK_ELEMENTS, param.numel())
                    batch.add([t[start:end] for t in flat], state["step"])
                state["step"] += 1
            batch.flush()
        return loss

    # with torch's step hooks and profiler label, as torch wraps each optimizer class's step
    step = Adam.profile_hook_step(_step)
    step.hooked = True  # type: ignore[attr-defined]


class _ChunkBatch:
    """Chunks of one parameter group stepped together by one fused call: each moment chunk
    not already in the parameters' dtype is widened into a workspace and rounded back after."""

    def __init__(self, group: dict[str, Any], workspaces: dict[torch.dtype, torch.Tensor]) -> None:
        self.group = group
        self.workspaces = workspaces  # by the parameters' dtype
        self.items: list[tuple[list[torch.Tensor], torch.Tensor]] = []
        self.size = 0

    def add(self, chunk: list[torch.Tensor], step: torch.Tensor) -> None:
        full = self.size + chunk[0].numel() > CHUNK_ELEMENTS
        if full or (self.items and self.items[0][0][0].dtype != chunk[0].dtype):
            self.flush()
        self.items.append((chunk, step.clone()))  # its own count: the kernel advances it
        self.size += chunk[0].numel()

    def flush(self) -> None:
        if not self.items:
            return
        dtype = self.items[0][0][0].dtype
        if dtype not in self.workspaces:
            self.workspaces[dtype] = torch.empty(2 * CHUNK_ELEMENTS, dtype=dtype)
        workspace = self.workspaces[dtype]
        lists: list[list[torch.Tensor]] = [[], [], [], []]
        offset = 0
        for chunk, _ in self.items:
            n = chunk[0].numel()
            lists[0].append(chunk[0])
            lists[1].append(chunk[1])
            for i, moment in ((2, chunk[2]), (3, chunk[3])):
                if moment.dtype == dtype:
                    lists[i].append(moment)
                else:
                    start = offset + (i - 2) * CHUNK_ELEMENTS
                    lists[i].append(workspace[start : start + n].copy_(moment))
            offset += n
        steps = [step for _, step in self.items]
        from torch.optim.adam import adam

        g = self.group
        params, grads, exp_avgs, exp_avg_sqs = lists
        adam(
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            [],
            steps,
            fused=True,
            decoupled_weight_decay=g["decoupled_weight_decay"],
            amsgrad=False,
            beta1=g["betas"][0],
            beta2=g["betas"][1],
            lr=g["lr"],
            weight_decay=g["weight_decay"],
            eps=g["eps"],
            maximize=g["maximize"],
        )
        for (chunk, _), widened_m, widened_v in zip(self.items, lists[2], lists[3]):
            for moment, widened in ((chunk[2], widened_m), (chunk[3], widened_v)):
                if widened is not moment:
                    moment.copy_(widened)
        self.items, self.size = [], 0
