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

from mindrl.checkpoint.errors import ConversionError, CorruptCheckpointError
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


def test_model_type_hf_must_name_a_family(tiny_llama_dir, tmp_path):
    # flags that disagree with config.json only get a notice (test_convert_family_flags.py)
    _expect_error(
        tmp_path, "--model-type-hf gpt5 is not a model family", src=tiny_llama_dir,
        model_type_hf="gpt5",
    )  # fmt: skip


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
    with pytest.raises(CorruptCheckpointError, match=rf"{shard.name}: truncated: 100 bytes"):
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
    (tmp_path / "empty").mkdir()
    proc = _cli(
        "--load-model-type", "mg", "--save-model-type", "hf", "--debug",
        "--load-dir", str(tmp_path / "empty"), "--save-dir", str(tmp_path / "out"),
    )  # fmt: skip
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "latest_checkpointed_iteration.txt" in proc.stderr


# ---------------------------------------------------------------- the CLI, one case at a time


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _cli_refuses(
    tmp_path: Path, load: Path, save: Path, needle: str, *flags: str, mg: bool = False
) -> None:
    """The converter exits non-zero with one stderr line holding `needle`, no traceback, and
    neither leaves anything new in tmp_path (save dir, temp siblings) nor changes load."""
    before = _listing(tmp_path)
    kinds = ("mg", "hf") if mg else ("hf", "mg")
    proc = _cli(
        "--load-model-type", kinds[0], "--save-model-type", kinds[1],
        "--load-dir", str(load), "--save-dir", str(save), *flags,
    )  # fmt: skip
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("convert_ckpt: error: ") and needle in lines[0], lines[0]
    assert _listing(tmp_path) == before


def test_cli_truncated_safetensors(hf_copy, tmp_path):
    weights = hf_copy / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    _cli_refuses(
        tmp_path,
        hf_copy,
        tmp_path / "out",
        f"{weights}: truncated: {len(data) // 2} bytes, but its header needs {len(data)}",
    )


def test_cli_wrong_tensor_shape(hf_copy, tmp_path):
    def edit(t):
        t["model.layers.1.mlp.down_proj.weight"] = torch.zeros(128, 7)

    _edit_weights(hf_copy, edit)
    _cli_refuses(tmp_path, hf_copy, tmp_path / "out", "model.layers.1.mlp.down_proj.weight")


def test_cli_missing_config_json(hf_copy, tmp_path):
    (hf_copy / "config.json").unlink()
    _cli_refuses(tmp_path, hf_copy, tmp_path / "out", "config.json does not exist")


def test_cli_save_dir_inside_load_dir(hf_copy, tmp_path):
    _cli_refuses(tmp_path, hf_copy, hf_copy / "mg", "is inside --load-dir")
    _cli_refuses(tmp_path, hf_copy, hf_copy / "a" / "b", "is inside --load-dir")


def test_cli_load_dir_inside_save_dir(hf_copy, tmp_path):
    _cli_refuses(tmp_path, hf_copy, tmp_path, "is inside --save-dir")


def test_cli_save_dir_is_load_dir(hf_copy, tmp_path):
    _cli_refuses(tmp_path, hf_copy, hf_copy, "is the --load-dir itself")
    # the same folder spelt differently (trailing "/.", a symlink) is still the same folder
    link = tmp_path / "link"
    link.symlink_to(hf_copy)
    _cli_refuses(tmp_path, hf_copy, link, "is the --load-dir itself")
    _cli_refuses(tmp_path, Path(f"{hf_copy}/."), hf_copy, "is the --load-dir itself")


def test_cli_save_dir_under_a_file(hf_copy, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    _cli_refuses(tmp_path, hf_copy, blocker / "out", f"{blocker} is a file, not a folder")


@pytest.fixture(scope="module")
def mg_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model as a megatron checkpoint (converted once; tests damage copies)."""
    mg = tmp_path_factory.mktemp("mg_src") / "mg"
    convert_hf_to_mcore(tiny_model_dir, mg)
    return mg


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda it: _truncate(sorted(it.glob("*.distcp"))[-1], 5000), "distcp: truncated: 5000"),
        (lambda it: (it / "metadata.json").write_text('{"sharded_'), "metadata.json: not valid"),
        (lambda it: _truncate(it / ".metadata", 64), ".metadata: refused: pickle data was"),
        (lambda it: (it / "common.pt").unlink(), "common.pt: missing"),
        (lambda it: _truncate(it / "mindrl_checkpoint.json", 30), "mindrl_checkpoint.json"),
    ],
    ids=["truncated_shard", "bad_metadata_json", "truncated_index", "no_common_pt", "bad_record"],
)
def test_cli_corrupt_megatron_checkpoint(mg_dir, tmp_path, damage, needle):
    mg = Path(shutil.copytree(mg_dir, tmp_path / "mg"))
    damage(mg / "release")
    _cli_refuses(tmp_path, mg, tmp_path / "hf", needle, mg=True)
