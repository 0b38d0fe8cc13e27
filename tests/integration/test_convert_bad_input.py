"""Bad input: a ConversionError naming the tensor / file / flag, and nothing left behind."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mindrl.checkpoint.errors import ConversionError
from mindrl.checkpoint.offline import convert_hf_to_mcore, convert_mcore_to_hf

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def hf_copy(tiny_model_dir, tmp_path) -> Path:
    """A writable copy of the tiny Qwen2 HF folder."""
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "src"))


def _edit_weights(folder: Path, edit) -> None:
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _expect_error(tmp_path: Path, needle: str, **kw) -> None:
    src = kw.pop("src")
    save = tmp_path / "out"
    with pytest.raises(ConversionError) as info:
        convert_hf_to_mcore(src, save, **kw)
    assert needle in str(info.value), str(info.value)
    assert not save.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_missing_tensor(hf_copy, tmp_path):
    _edit_weights(hf_copy, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    _expect_error(tmp_path, "model.layers.1.mlp.up_proj.weight", src=hf_copy)


def test_wrong_shape(hf_copy, tmp_path):
    def edit(t):
        t["model.layers.0.self_attn.v_proj.weight"] = torch.zeros(32, 128)

    _edit_weights(hf_copy, edit)
    _expect_error(
        tmp_path, "model.layers.0.self_attn.v_proj.weight has shape [32, 128]", src=hf_copy
    )


def test_unmapped_tensor(hf_copy, tmp_path):
    _edit_weights(
        hf_copy, lambda t: t.update({"model.layers.0.self_attn.o_proj.bias": torch.zeros(128)})
    )
    _expect_error(tmp_path, "model.layers.0.self_attn.o_proj.bias is not covered", src=hf_copy)


def test_truncated_weights(hf_copy, tmp_path):
    data = (hf_copy / "model.safetensors").read_bytes()
    (hf_copy / "model.safetensors").write_bytes(data[: len(data) - 1000])
    _expect_error(tmp_path, "model.safetensors", src=hf_copy)


def test_missing_weights_and_config(hf_copy, tmp_path):
    (hf_copy / "model.safetensors").unlink()
    _expect_error(tmp_path, "no *.safetensors weights", src=hf_copy)
    (hf_copy / "config.json").unlink()
    _expect_error(tmp_path, "config.json does not exist", src=hf_copy)


def test_unknown_architecture(hf_copy, tmp_path):
    config = json.loads((hf_copy / "config.json").read_text())
    config["model_type"] = "gpt_neox"
    (hf_copy / "config.json").write_text(json.dumps(config))
    _expect_error(tmp_path, "unknown architecture: HF model_type='gpt_neox'", src=hf_copy)


def test_tp_must_divide_heads_and_kv_heads(tiny_model_dir, tmp_path):
    # 4 heads, 2 kv heads: TP 3 divides neither, TP 4 divides the heads but not the kv heads
    _expect_error(
        tmp_path,
        "--target-tensor-parallel-size 3 does not divide num_attention_heads=4",
        src=tiny_model_dir,
        target_tensor_parallel_size=3,
    )
    _expect_error(
        tmp_path,
        "--target-tensor-parallel-size 4 does not divide num_query_groups (kv heads)=2",
        src=tiny_model_dir,
        target_tensor_parallel_size=4,
    )
    _expect_error(
        tmp_path,
        "--target-pipeline-parallel-size 3 does not divide num_layers=2",
        src=tiny_model_dir,
        target_pipeline_parallel_size=3,
    )


def test_qkv_bias_flag_on_llama(tiny_llama_dir, tmp_path):
    _expect_error(tmp_path, "--add-qkv-bias", src=tiny_llama_dir, add_qkv_bias=True)


def test_model_type_hf_must_fit_the_checkpoint(tiny_llama_dir, tmp_path):
    _expect_error(tmp_path, "--model-type-hf qwen25", src=tiny_llama_dir, model_type_hf="qwen25")


def test_save_dir_exists(tiny_model_dir, tmp_path):
    save = tmp_path / "out"
    save.mkdir()
    (save / "keep.txt").write_text("mine")
    with pytest.raises(ConversionError, match="--save-dir .* already exists"):
        convert_hf_to_mcore(tiny_model_dir, save)
    assert [p.name for p in save.iterdir()] == ["keep.txt"]


def test_corrupt_megatron_checkpoint(tiny_model_dir, tmp_path):
    mg = tmp_path / "mg"
    convert_hf_to_mcore(tiny_model_dir, mg)
    shard = sorted((mg / "release").glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:100])  # truncated mid-file
    with pytest.raises(ConversionError, match="megatron checkpoint"):
        convert_mcore_to_hf(mg, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".hf")]
    (mg / "latest_checkpointed_iteration.txt").unlink()
    (mg / "release" / "mindrl_checkpoint.json").rename(mg / "moved.json")
    with pytest.raises(ConversionError, match="latest_checkpointed_iteration.txt is missing"):
        convert_mcore_to_hf(mg, tmp_path / "hf")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "cli" / "convert_ckpt.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_prints_one_line_and_exits_nonzero(tiny_model_dir, tmp_path):
    proc = _cli(
        "--load-model-type", "hf", "--save-model-type", "mg",
        "--load-dir", str(tiny_model_dir), "--save-dir", str(tmp_path / "out"),
        "--target-tensor-parallel-size", "3",
    )  # fmt: skip
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("convert_ckpt: error: --target-tensor-parallel-size 3")
    assert not (tmp_path / "out").exists()

    proc = _cli(
        "--load-model-type", "hf", "--save-model-type", "mg",
        "--load-dir", str(tmp_path / "nowhere"), "--save-dir", str(tmp_path / "out"),
    )  # fmt: skip
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        == f"convert_ckpt: error: --load-dir {tmp_path / 'nowhere'} does not exist"
    )


def test_cli_debug_shows_traceback(tmp_path):
    proc = _cli(
        "--load-model-type", "mg", "--save-model-type", "hf", "--debug",
        "--load-dir", str(tmp_path), "--save-dir", str(tmp_path / "out"),
    )  # fmt: skip
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "latest_checkpointed_iteration.txt" in proc.stderr
