"""Tensor-level memory of one bench rank (tools/bench/memory_plan.py): what a device's caching
allocator reports as `max_memory_allocated`, measured on CPU, where the process's resident
memory also holds what glibc keeps of freed blocks.

* live storages: every torch tensor the garbage collector can reach, one entry per storage
  (data_ptr -> nbytes), split into the model's parameters, its gradient buffers, the
  optimizer's state (fp32 masters, Adam moments) and the rest;
* the allocated peak of a step: the live bytes before it plus the highest running sum of the
  profiler's CPU [memory] events (every allocation and free of torch's CPU allocator,
  `torch.profiler.profile(profile_memory=True)`, read raw from the kineto results);
* the saved-for-backward peak: the high-water mark of the distinct storages autograd holds for
  the backward pass (saved-tensor hooks), the storages live before the step excluded
  (weights saved by the linear layers).
"""

from __future__ import annotations

import gc
import time
import warnings
from typing import Any


def live_storages() -> dict[int, int]:
    """data_ptr -> nbytes of the storage of every tensor the garbage collector reaches."""
    import torch

    gc.collect()
    out: dict[int, int] = {}
    with warnings.catch_warnings():  # isinstance on deprecated module attributes warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if not isinstance(obj, torch.Tensor):
                    continue
                storage = obj.untyped_storage()
                ptr = storage.data_ptr()
                if ptr and obj.device.type == "cpu":
                    out[ptr] = max(out.get(ptr, 0), storage.nbytes())
            except Exception:  # sparse / meta / wrapper tensors: no CPU storage of their own
                continue
    return out


def _ptr(t: Any) -> int:
    return t.untyped_storage().data_ptr()


def state_storages(worker: Any) -> dict[str, set[int]]:
    """The storages of the model's parameters, its gradients and the optimizer's state."""
    import torch

    params: set[int] = set()
    grads: set[int] = set()
    for chunk in worker.model_chunks:
        for p in chunk.parameters():
            params.add(_ptr(p))
            for g in (getattr(p, "main_grad", None), p.grad):
                if isinstance(g, torch.Tensor):
                    grads.add(_ptr(g))
        for buffer in getattr(chunk, "buffers", None) or ():
            if getattr(buffer, "param_data", None) is not None:
                params.add(_ptr(buffer.param_data))
            if getattr(buffer, "grad_data", None) is not None:
                grads.add(_ptr(buffer.grad_data))
    optim: set[int] = set()
    optimizer = worker.opt.optimizer
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(part, "optimizer", part)
        tensors = [p for group in inner.param_groups for p in group["params"]]
        tensors += [v for state in inner.state.values() for v in state.values()]
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                optim.add(_ptr(t))
    optim -= params | grads
    return {"params": params, "grads": grads, "optimizer": optim}


def split_state(live: dict[int, int], groups: dict[str, set[int]]) -> dict[str, int]:
    """Live bytes by part: params, grads, optimizer, other."""
    out = {name: sum(live.get(p, 0) for p in ptrs) for name, ptrs in groups.items()}
    out["other"] = sum(live.values()) - sum(out.values())
    return out


class AllocationTrace:
    """Around a block: the highest and the final running sum of torch's CPU allocations and
    frees (bytes above what was live at entry), from the profiler's allocation events.

    The profiler sees what the profiled (main) thread allocates and frees. A tensor whose last
    reference a gloo worker thread drops (a row-parallel output all-reduced in place, when the
    work object outlives the caller's reference) is freed unseen; its address coming back from
    the allocator proves it free by then, so the sum drops it there (an upper bound: the free
    happened at most that much earlier); `unseen_frees` counts them."""

    def __init__(self) -> None:
        self.peak = 0
        self.net = 0
        self.events = 0
        self.unseen_frees = 0
        self.overhead_s = 0.0

    def __enter__(self) -> AllocationTrace:
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._prof.__exit__(*exc)
        start = time.perf_counter()
        events = []  # (time, ptr, bytes: > 0 allocated, < 0 freed)
        stack = list(self._prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            e = stack.pop()
            stack.extend(e.children)
            f = e.extra_fields
            if type(f).__name__ == "_ExtraFields_Allocation" and f.device.type == "cpu":
                events.append((e.start_time_ns, f.ptr, f.alloc_size))
        del self._prof, stack
        events.sort(key=lambda x: x[0])
        live: dict[int, int] = {}  # blocks allocated in the block, by address
        running = peak = 0
        for _, ptr, nbytes in events:
            if nbytes > 0:
                if ptr in live:  # freed by another thread before the allocator reused it
                    running -= live[ptr]
                    self.unseen_frees += 1
                live[ptr] = nbytes
            else:
                live.pop(ptr, None)
            running += nbytes
            peak = max(peak, running)
        self.peak, self.net, self.events = peak, running, len(events)
        self.overhead_s = time.perf_counter() - start


class SavedBytes:
    """High-water mark of the distinct storages autograd holds for backward (saved in the
    forward pass or by a recomputation, released with the graph); `exclude`: storages not
    counted (those live before the step: parameters saved by the linear layers)."""

    def __init__(self, exclude: set[int]) -> None:
        self.exclude = exclude
        self.count: dict[int, list[int]] = {}  # ptr -> [references, nbytes]
        self.live = 0
        self.peak = 0

    def pack(self, t: Any) -> Any:
        try:
            storage = t.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
        except Exception:
            return t
        if not ptr or ptr in self.exclude or t.device.type != "cpu":
            return t
        entry = self.count.setdefault(ptr, [0, nbytes])
        if entry[0] == 0:
            self.live += entry[1]
            self.peak = max(self.peak, self.live)
        entry[0] += 1
        return _Held(self, t, ptr)

    @staticmethod
    def unpack(held: Any) -> Any:
        return held.tensor if isinstance(held, _Held) else held

    def release(self, ptr: int) -> None:
        entry = self.count[ptr]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self.count[ptr]


class _Held:
    __slots__ = ("meter", "tensor", "ptr")

    def __init__(self, meter: SavedBytes, tensor: Any, ptr: int) -> None:
        self.meter, self.tensor, self.ptr = meter, tensor, ptr

    def __del__(self) -> None:
        self.meter.release(self.ptr)


def measured_step(worker: Any, batch: Any, step: int) -> dict[str, Any]:
    """One update under the allocation trace and the saved-tensor meter: the bytes live
    before it by part, its allocated peak (live before + the trace's peak), what it left
    behind that the garbage collector cannot see ("untracked": tensors held only from C++, or
    freed unseen by another thread with no allocation at their address since)."""
    import torch

    before = live_storages()
    groups = state_storages(worker)
    meter = SavedBytes(set(before))
    start = time.perf_counter()
    with AllocationTrace() as trace:
        with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
            worker.update(batch, step)
    seconds = time.perf_counter() - start
    after = live_storages()
    base = sum(before.values())
    return {
        "before": split_state(before, groups),
        "live_before": base,
        "transient_peak": trace.peak,
        "allocated_peak": base + trace.peak,
        "saved_peak": meter.peak,
        "untracked": base + trace.net - sum(after.values()),
        "after": split_state(after, state_storages(worker)),
        "memory_events": trace.events,
        "unseen_frees": trace.unseen_frees,
        "step_s": seconds,
        "trace_s": trace.overhead_s,
    }
