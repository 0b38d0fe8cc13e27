"""One entry process of mindrl on an "NPU" machine (tests/integration/test_mindspeed_first.py):
the real entry code up to the point where it would use the device, with a stand-in
`mindspeed` package on the path that records what was imported before its adaptor.

Arguments: {"entry": "worker" | "driver", "output_dir": the driver's run folder}. `MINDRL_ACCELERATOR=npu` names the machine's kind
(the stand-in cannot make torch see an NPU, so the driver's cluster start is replaced by a
recorder after the real `main` has done everything before it). Result: {"argv_after":
sys.argv after the entry, "megatron_loaded": whether megatron is imported at the end,
"started": whether the driver reached its run}.
"""

from __future__ import annotations

import sys
from typing import Any

from tests.fresh_process import json_main


def worker() -> dict[str, Any]:
    from mindrl.config import load_run_config
    from mindrl.workers.actor import ActorWorker

    run, _ = load_run_config("grpo_tiny_cpu", [], check_paths=False)
    ActorWorker(run, with_rollout=False)  # what a Ray actor's constructor does first
    import megatron.core  # noqa: F401  (the worker's model build comes next)

    return {}


def driver(output_dir: str) -> dict[str, Any]:
    import mindrl.trainer
    from mindrl.accelerator import Accelerator
    from mindrl.trainer import entry

    started: list[bool] = []
    real_plan_for = entry.plan_for

    def plan_for_npu(run: Any, raw: Any, *, dry_run: bool = False) -> Any:
        check = real_plan_for(run, raw, dry_run=True)  # the config's 2 CPU bundles, unchecked
        return entry.PlanCheck(Accelerator("npu"), "test: npu", check.plan, None, "-", None)

    def run_grpo(run: Any, raw: Any) -> int:
        import megatron.core  # noqa: F401  (the driver's run would import it from here on)

        started.append(True)
        return 0

    entry.plan_for = plan_for_npu
    mindrl.trainer.run_grpo = run_grpo
    code = entry.main(["--config-name", "grpo_tiny_cpu", f"runtime.output_dir={output_dir}"])
    return {"exit": code, "started": bool(started)}


def main(args: dict[str, Any]) -> dict[str, Any]:
    out = worker() if args["entry"] == "worker" else driver(args["output_dir"])
    out["argv_after"] = list(sys.argv)
    out["megatron_loaded"] = "megatron.core" in sys.modules
    return out


if __name__ == "__main__":
    json_main(main)
