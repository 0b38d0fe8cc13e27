"""The converter's family flags are reconciled with the checkpoint, not trusted over it.

The checkpoint's config.json (or a megatron checkpoint's record) decides the family; a
`--model-type-hf` / `--add-qkv-bias` that disagrees gets one `convert_ckpt: note:` line and the
conversion goes on. Families mindrl cannot build are refused by name, in one line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from safetensors import safe_open

from mindrl.checkpoint.mcore_io import read_checkpoint_info
from mindrl.checkpoint.offline import convert_hf_to_mcore

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, str(REPO / "cli" / "convert_ckpt.py")]
HF_TO_MG = ("--load-model-type", "hf", "--save-model-type", "mg", "--no-progress")


def _convert(*flags: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *map(str, flags)], capture_output=True, text=True, timeout=300, check=False
    )


def _notes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("convert_ckpt: note: ")]


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as fh:
            out.update({name: fh.get_tensor(name) for name in fh.keys()})
    return out


def test_seed_command_converts_a_qwen2_checkpoint(tiny_model_dir, tmp_path):
    """The seed's command as written (llama2 + --add-qkv-bias on Qwen2, TP2 PP2, bf16)."""
    out = tmp_path / "OUT"
    proc = _convert(
        "--use-mcore-models", "--model-type", "GPT",
        "--load-model-type", "hf", "--save-model-type", "mg",
        "--target-tensor-parallel-size", "2", "--target-pipeline-parallel-size", "2",
        "--add-qkv-bias", "--load-dir", tiny_model_dir, "--save-dir", out,
        "--model-type-hf", "llama2", "--params-dtype", "bf16",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _notes(proc.stderr) == [
        "convert_ckpt: note: --model-type-hf llama2: the checkpoint's config.json says qwen2; "
        "converting as qwen2"
    ]
    info = read_checkpoint_info(out)
    assert (info.arch.family, info.arch.add_qkv_bias, info.params_dtype) == ("qwen2", True, "bf16")
    assert (info.tensor_parallel_size, info.pipeline_parallel_size) == (2, 2)


def test_llama2_without_qkv_bias_flag_and_no_flags_both_convert_qwen2(tiny_model_dir, tmp_path):
    base = (*HF_TO_MG, "--load-dir", tiny_model_dir, "--save-dir")
    proc = _convert(*base, tmp_path / "a", "--model-type-hf", "llama2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(_notes(proc.stderr)) == 1 and "converting as qwen2" in proc.stderr
    proc = _convert(*base, tmp_path / "b")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _notes(proc.stderr) == []
    for name in ("a", "b"):
        arch = read_checkpoint_info(tmp_path / name).arch
        assert (arch.family, arch.model_type_hf, arch.add_qkv_bias) == ("qwen2", "qwen2", True)


def test_llama_checkpoint_with_qwen_flags_round_trips(tiny_llama_dir, tmp_path):
    mg, hf = tmp_path / "mg", tmp_path / "hf"
    proc = _convert(
        "--load-model-type", "hf", "--save-model-type", "mg", "--no-progress",
        "--load-dir", tiny_llama_dir, "--save-dir", mg,
        "--model-type-hf", "qwen25", "--add-qkv-bias",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _notes(proc.stderr) == [
        "convert_ckpt: note: --model-type-hf qwen25: the checkpoint's config.json says llama; "
        "converting as llama",
        "convert_ckpt: note: --add-qkv-bias: the checkpoint's config.json says llama; "
        "converting without q/k/v biases",
    ]
    proc = _convert(
        "--load-model-type", "mg", "--save-model-type", "hf", "--no-progress",
        "--load-dir", mg, "--save-dir", hf, "--model-type-hf", "qwen2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _notes(proc.stderr) == [
        "convert_ckpt: note: --model-type-hf qwen2: the checkpoint records llama; "
        "converting as llama"
    ]
    src, back = _tensors(tiny_llama_dir), _tensors(hf)
    assert sorted(src) == sorted(back)
    assert all(torch.equal(src[n], back[n]) for n in src)


def test_python_api_reports_notices(tiny_llama_dir, tmp_path):
    notes: list[str] = []
    convert_hf_to_mcore(tiny_llama_dir, tmp_path / "mg", add_qkv_bias=True, notify=notes.append)
    says = "the checkpoint's config.json says llama"
    assert notes == [f"--add-qkv-bias: {says}; converting without q/k/v biases"]
    assert not read_checkpoint_info(tmp_path / "mg").arch.add_qkv_bias


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("convert_ckpt: error: "), proc.stderr
    return lines[0]


def test_unbuilt_family_is_refused_by_name(tiny_model_dir, tmp_path):
    src = Path(shutil.copytree(tiny_model_dir, tmp_path / "mixtral"))
    config = json.loads((src / "config.json").read_text())
    config.update(model_type="mixtral", architectures=["MixtralForCausalLM"])
    (src / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    flags = ("--load-dir", src, "--save-dir", out, "--model-type-hf", "llama2")
    line = _one_error_line(_convert(*HF_TO_MG, *flags))
    assert "model family mixtral (mixture of experts) is not supported" in line
    assert not out.exists()


def test_unknown_model_type_hf_is_an_error(tiny_model_dir, tmp_path):
    flags = ("--load-dir", tiny_model_dir, "--save-dir", tmp_path / "o", "--model-type-hf", "gpt5")
    line = _one_error_line(_convert(*HF_TO_MG, *flags))
    assert "--model-type-hf gpt5 is not a model family" in line
