"""The one place that knows npu / cuda / cpu.

Everything else asks `get_accelerator()` for the torch device, the torch.distributed backend,
the Ray resource name, the visible-devices variable, seeding, memory stats and synchronize.
"""

from mindrl.accelerator.device import (
    ACCELERATOR_NAMES,
    Accelerator,
    AcceleratorError,
    detect_accelerator_name,
    get_accelerator,
)

__all__ = [
    "ACCELERATOR_NAMES",
    "Accelerator",
    "AcceleratorError",
    "detect_accelerator_name",
    "get_accelerator",
]
