"""Planning a run before it starts: the memory plan (per role and device, checked against
the device's memory). Pure arithmetic over the typed config: no torch, megatron, Ray or vLLM
import, so a laptop can plan an NPU cluster's run."""

from mindrl.planning.memory_plan import MemoryPlan, plan_memory

__all__ = ["MemoryPlan", "plan_memory"]
