"""MindSpeed's layer layout keys on CPU over gloo (several processes, real megatron-core, 3
fp32 optimizer steps of the tiny model): uneven pipeline stages (`num_layer_list`) and noop
layers (`noop_layers`) train exactly as the plain model does (losses, grad norms, log-probs
within 1e-5), the weight sync hands the rollout engine the HF checkpoint's tensors under their
HF names, and the converter takes both keys and comes back to HF bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_convert_roundtrip import assert_bit_exact

SCRIPT = Path(__file__).with_name("_layer_layout_rank.py")
REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300.0
TOL = 1e-5
FOUR_LAYERS = "model.tiny.num_layers=4"
PP2 = ["actor_config.pipeline_model_parallel_size=2", "rl_config.actor_resource.num_npus=2"]


@pytest.fixture(scope="module")
def four_layer_model() -> str:
    from mindrl.assets import models

    return str(models.tiny_model_dir(num_layers=4))


def _train(fresh_process, hf_dir: str, world: int, overrides: list[str]) -> list[dict]:
    args = {"hf_dir": hf_dir, "overrides": overrides, "steps": 3}
    return fresh_process.ranks(SCRIPT, args, world_size=world, timeout_s=TIMEOUT_S)


def _close(a: Any, b: Any, where: str) -> None:
    if isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]")
        return
    assert abs(a - b) <= TOL * max(1.0, abs(a)), (where, a, b)


def _assert_same_training(run: list[dict], plain: list[dict]) -> None:
    """Every rank's losses, grad norms and log-probs (before and after the steps) equal the
    plain run's; the sync sends each HF tensor unchanged."""
    for rank in run:
        for step, (x, y) in enumerate(zip(rank["metrics"], plain[0]["metrics"], strict=True)):
            for key in ("actor/pg_loss", "grad_norm"):
                _close(x[key], y[key], f"step {step} {key}")
            assert x.keys() == y.keys()
            for key in x:
                if not key.startswith("perf/"):
                    _close(x[key], y[key], f"step {step} {key}")
        _close(rank["log_probs"], plain[0]["log_probs"], "log_probs")
    synced = run[0]["synced"]
    assert synced and synced.keys() == plain[0]["synced"].keys()
    assert max(synced.values()) == 0.0, synced
    assert len({round(m["grad_norm"], 6) for m in plain[0]["metrics"]}) > 1  # weights moved


def test_uneven_stages_train_as_one_stage(fresh_process, four_layer_model):
    """PP 2 with stages of 3 and 1 layers (megatron's pipeline layout) against PP 1."""
    plain = _train(fresh_process, four_layer_model, 1, [FOUR_LAYERS])
    uneven = _train(
        fresh_process,
        four_layer_model,
        2,
        [FOUR_LAYERS, *PP2, "++actor_config.num_layer_list='3,1'"],
    )
    assert [r["layers"] for r in uneven] == [[0, 1, 2], [3]]
    _assert_same_training(uneven, plain)


def test_noop_layers_compute_what_the_model_without_them_does(fresh_process, four_layer_model):
    """The 4-layer HF model as MindSpeed pads it: num_layers 6 with noop layers 1 and 5 (PP 1),
    and over uneven stages 3 + 3 at PP 2; the noop layers hold no weights."""
    plain = _train(fresh_process, four_layer_model, 1, [FOUR_LAYERS])
    noop = ["model.tiny.num_layers=6", "++actor_config.noop_layers='1,5'"]
    padded = _train(fresh_process, four_layer_model, 1, noop)
    assert padded[0]["noop"] == [1, 5] and padded[0]["layers"] == list(range(6))
    assert padded[0]["params"] == plain[0]["params"]
    _assert_same_training(padded, plain)
    staged = _train(
        fresh_process, four_layer_model, 2, [*noop, *PP2, "++actor_config.num_layer_list='2,4'"]
    )
    assert [r["noop"] for r in staged] == [[1], [5]]
    _assert_same_training(staged, plain)


def _convert(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "cli" / "convert_ckpt.py"), *flags],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=REPO,
    )


def test_uneven_and_noop_checkpoints_convert_back_bit_exact(four_layer_model, tmp_path):
    """hf -> mg with --num-layer-list / --noop-layers as MindSpeed-LLM's converter takes them;
    mg -> hf reads the layout from the checkpoint and gives the HF model back bit for bit."""
    from mindrl.checkpoint.mcore_io import read_checkpoint_info

    tiny_model_dir = Path(four_layer_model)
    layers = json.loads((tiny_model_dir / "config.json").read_text())["num_hidden_layers"]
    cases = {
        "uneven": ["--num-layer-list", f"{layers - 1},1"],
        "noop": ["--noop-layers", f"0,{layers + 1}", "--num-layer-list", f"1,{layers + 1}"],
    }
    for name, flags in cases.items():
        mg, hf = tmp_path / f"{name}_mg", tmp_path / f"{name}_hf"
        common = ["--target-pipeline-parallel-size", "2", "--no-progress"]
        done = _convert(
            "--load-model-type", "hf", "--save-model-type", "mg",
            "--load-dir", str(tiny_model_dir), "--save-dir", str(mg), *common, *flags,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        info = read_checkpoint_info(mg)
        assert info.num_layer_list == tuple(int(n) for n in flags[-1].split(","))
        back = _convert(
            "--load-model-type", "mg", "--save-model-type", "hf",
            "--load-dir", str(mg), "--save-dir", str(hf), "--no-progress",
        )  # fmt: skip
        assert back.returncode == 0, back.stderr
        assert_bit_exact(tiny_model_dir, hf)
    noop = read_checkpoint_info(tmp_path / "noop_mg").arch
    assert noop.noop_layer_indices == (0, layers + 1) and noop.num_layers == layers + 2


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--num-layer-list", "1,2"],
            "--num-layer-list: 1,2 adds up to 3 layers but num_layers is 4",
        ),
        (
            ["--num-layer-list", "4"],
            "--num-layer-list: 4 has 1 stages but pipeline_model_parallel_size is 2",
        ),
        (["--noop-layers", "1,9"], "--noop-layers: 9 outside the layers 0..5"),
    ],
)
def test_converter_refuses_a_contradicting_layout(four_layer_model, tmp_path, flags, message):
    done = _convert(
        "--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", four_layer_model,
        "--save-dir", str(tmp_path / "mg"), "--target-pipeline-parallel-size", "2", *flags,
    )  # fmt: skip
    assert done.returncode == 1
    assert message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "mg").exists()
