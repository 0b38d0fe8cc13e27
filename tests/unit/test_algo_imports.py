"""mindrl.algorithms stays pure torch: importing it pulls in no Ray, megatron or vLLM."""

from __future__ import annotations

import subprocess
import sys


def test_algorithms_import_is_torch_only() -> None:
    code = (
        "import sys, mindrl.algorithms as a; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('ray', 'megatron', 'vllm')]; "
        "print(len(a.__all__), bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    count, bad = out.stdout.strip().split(" ", 1)
    assert bad == "[]", bad
    assert int(count) > 20
