"""On NPU, MindSpeed's megatron adaptor is imported before megatron in every entry process
(a Ray worker, the driver, the converter), with mindrl's switches and not the process's own
command line on `sys.argv`; without MindSpeed an NPU process refuses to start.

A stand-in `mindspeed` package (written by the test) records, when its adaptor is imported,
which megatron modules were already loaded and what `sys.argv` said, then imports megatron
as the real adaptor does. mindrl's ordering is the thing under test; `MINDRL_ACCELERATOR=npu`
names the machine's kind (nothing here can make torch see an NPU).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ENTRY = Path(__file__).with_name("_mindspeed_entry.py")
CONVERT = Path(__file__).resolve().parents[2] / "cli" / "convert_ckpt.py"
TIMEOUT_S = 240.0
SWITCHES = {"use_fused_rmsnorm": True, "shape_order": "BSH", "swap_optimizer": False}

ADAPTOR = """
import json, os, sys
record = {
    "megatron_before": sorted(m for m in sys.modules if m.split(".")[0] == "megatron"),
    "argv": list(sys.argv),
}
with open(os.environ["MINDSPEED_STANDIN_RECORD"], "a") as fh:
    fh.write(json.dumps(record) + "\\n")
import megatron.core  # the real adaptor patches megatron from here on
"""


def _standin(tmp_path: Path) -> tuple[dict[str, str], Path]:
    pkg = tmp_path / "standin" / "mindspeed"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "megatron_adaptor.py").write_text(ADAPTOR)
    record = tmp_path / "adaptor_imports.jsonl"
    env = {
        "PYTHONPATH": str(pkg.parent),
        "MINDRL_ACCELERATOR": "npu",
        "MINDSPEED_STANDIN_RECORD": str(record),
    }
    return env, record


def _handed_flags() -> list[str]:
    """What grpo_tiny_cpu hands MindSpeed on NPU (its handed keys at their values)."""
    from mindrl.accelerator.mindspeed_args import to_flags
    from mindrl.config import load_run_config
    from mindrl.config.fates import MINDSPEED, handoffs

    run, _ = load_run_config("grpo_tiny_cpu", [], check_paths=False)
    flags = to_flags(handoffs(run, "npu").to(MINDSPEED))
    assert "--shape-order" in flags
    return flags


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_worker_imports_the_adaptor_first_with_the_handed_switches(fresh_process, tmp_path):
    env, record = _standin(tmp_path)
    env["MINDRL_MINDSPEED_ARGS"] = json.dumps(SWITCHES)
    out = fresh_process(ENTRY, {"entry": "worker"}, timeout_s=TIMEOUT_S, env=env)
    (imported,) = _records(record)  # once
    assert imported["megatron_before"] == []
    assert imported["argv"] == ["mindrl", "--use-fused-rmsnorm", "--shape-order", "BSH"]
    assert out["megatron_loaded"]
    assert out["argv_after"] and "--use-fused-rmsnorm" not in out["argv_after"]  # restored


def test_driver_imports_the_adaptor_before_the_run(fresh_process, tmp_path):
    env, record = _standin(tmp_path)
    out = fresh_process(
        ENTRY,
        {"entry": "driver", "output_dir": str(tmp_path / "run")},
        timeout_s=TIMEOUT_S,
        env=env,
    )
    assert out["exit"] == 0 and out["started"]
    (imported,) = _records(record)
    assert imported["megatron_before"] == []
    assert imported["argv"] == ["mindrl", *_handed_flags()]  # not the script's own argv


def test_converter_imports_the_adaptor_first(fresh_process, tmp_path, tiny_model_dir):
    env, record = _standin(tmp_path)
    cmd = [
        "--load-model-type", "hf", "--save-model-type", "mg",
        "--load-dir", str(tiny_model_dir), "--save-dir", str(tmp_path / "mg"),
    ]  # fmt: skip
    run = fresh_process.command([sys.executable, str(CONVERT), *cmd], timeout_s=TIMEOUT_S, env=env)
    # past the adaptor it stops where it asks for the device, which no machine here has
    assert "torch_npu is not installed" in run.stderr, run.stderr
    (imported,) = _records(record)
    assert imported["megatron_before"] == []
    assert imported["argv"] == ["mindrl"]


@pytest.mark.parametrize("entry", ["worker", "converter"])
def test_npu_without_mindspeed_refuses_to_start(fresh_process, tmp_path, tiny_model_dir, entry):
    env = {"MINDRL_ACCELERATOR": "npu"}
    if entry == "worker":
        run = fresh_process.run(ENTRY, {"entry": "worker"}, timeout_s=TIMEOUT_S, env=env)
    else:
        cmd = [
            "--load-model-type", "hf", "--save-model-type", "mg",
            "--load-dir", str(tiny_model_dir), "--save-dir", str(tmp_path / "mg"),
        ]  # fmt: skip
        run = fresh_process.command(
            [sys.executable, str(CONVERT), *cmd], timeout_s=TIMEOUT_S, env=env
        )
    assert run.returncode != 0
    assert "needs MindSpeed's adaptor" in run.stderr and "not on PyPI" in run.stderr
    assert not (tmp_path / "mg").exists()
