"""Offline conversion HF -> megatron (TP=2, PP=2) -> HF reproduces every tensor bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from mindrl.checkpoint.mcore_io import read_checkpoint_info
from mindrl.checkpoint.offline import (
    convert_hf_to_mcore,
    convert_mcore_to_hf,
    convert_mcore_to_mcore,
)

REPO = Path(__file__).resolve().parents[2]


def hf_tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as fh:
            for name in fh.keys():
                out[name] = fh.get_tensor(name)
    return out


def assert_bit_exact(src: Path, dst: Path) -> None:
    a, b = hf_tensors(src), hf_tensors(dst)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert torch.equal(a[name], b[name]), name


def roundtrip(src: Path, tmp: Path, tp: int = 2, pp: int = 2) -> tuple[Path, Path]:
    mg, hf = tmp / "mg", tmp / "hf"
    convert_hf_to_mcore(src, mg, target_tensor_parallel_size=tp, target_pipeline_parallel_size=pp)
    convert_mcore_to_hf(mg, hf)
    return mg, hf


@pytest.mark.parametrize("asset", ["tiny_model_dir", "tiny_qwen2_odd_vocab_dir", "tiny_llama_dir"])
def test_roundtrip_is_bit_exact(asset, request, tmp_path):
    src: Path = request.getfixturevalue(asset)
    mg, hf = roundtrip(src, tmp_path)
    assert_bit_exact(src, hf)
    # config, generation config and tokenizer files come back too
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (hf / name).read_bytes() == (src / name).read_bytes(), name
    assert json.loads((hf / "config.json").read_text()) == json.loads(
        (src / "config.json").read_text()
    )
    info = read_checkpoint_info(mg)
    assert (info.tensor_parallel_size, info.pipeline_parallel_size) == (2, 2)
    assert info.params_dtype == "fp32" and info.iteration is None
    assert (mg / "latest_checkpointed_iteration.txt").read_text().strip() == "release"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp leftovers


@pytest.mark.slow
def test_smollm2_roundtrip_is_bit_exact(smollm2_dir, tmp_path):
    """SmolLM2 has 9 heads / 3 kv heads: TP=2 cannot split it (megatron neither), TP=3 can."""
    from mindrl.checkpoint.errors import ConversionError

    with pytest.raises(ConversionError, match="--target-tensor-parallel-size 2"):
        convert_hf_to_mcore(smollm2_dir, tmp_path / "bad", target_tensor_parallel_size=2)
    assert not (tmp_path / "bad").exists()
    mg, hf = roundtrip(smollm2_dir, tmp_path, tp=3, pp=2)
    assert_bit_exact(smollm2_dir, hf)
    assert read_checkpoint_info(mg).arch.tie_word_embeddings


@pytest.mark.slow
def test_smollm2_tp3_split_and_merge_is_bit_exact(smollm2_dir):
    """The TP=3 shards of every SmolLM2 tensor (what each rank loads online) merge back."""
    from mindrl.checkpoint.hf_io import HFCheckpointReader
    from mindrl.checkpoint.mapping import bound_rules
    from mindrl.checkpoint.transforms import hf_to_mcore, mcore_to_hf
    from mindrl.models.hf_arch import arch_from_hf_config

    arch = arch_from_hf_config(smollm2_dir)
    reader = HFCheckpointReader(smollm2_dir)
    for bound in bound_rules(arch):
        shards = [hf_to_mcore(bound, reader, arch, r, 3) for r in range(3)]
        for name, tensor in mcore_to_hf(bound, shards, arch).items():
            assert torch.equal(tensor, reader.read(name)), name


def test_bf16_via_mg_to_mg_and_sharded_hf_output(tiny_model_dir, tmp_path):
    """mg -> mg changes the dtype; mg -> HF honours a small max shard size with an index."""
    convert_hf_to_mcore(tiny_model_dir, tmp_path / "mg")
    convert_mcore_to_mcore(
        tmp_path / "mg",
        tmp_path / "mg_bf16",
        target_tensor_parallel_size=2,
        target_pipeline_parallel_size=1,
        params_dtype="bf16",
    )
    assert read_checkpoint_info(tmp_path / "mg_bf16").params_dtype == "bf16"
    convert_mcore_to_hf(tmp_path / "mg_bf16", tmp_path / "hf", max_shard_size=300_000)
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((tmp_path / "hf" / s).is_file() for s in shards)
    src, out = hf_tensors(tiny_model_dir), hf_tensors(tmp_path / "hf")
    for name, tensor in src.items():
        assert torch.equal(out[name], tensor.to(torch.bfloat16)), name  # one rounding only
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.bfloat16)
    assert torch.equal(model.model.embed_tokens.weight, src["model.embed_tokens.weight"].bfloat16())


def test_cli_roundtrip_with_seed_flags(tiny_model_dir, tmp_path):
    """The seed's command line verbatim (it spells Qwen2.5 as llama2 + --add-qkv-bias)."""
    mg, hf = tmp_path / "mcore_tp2_pp2", tmp_path / "hf"
    cmd = [sys.executable, str(REPO / "cli" / "convert_ckpt.py")]
    to_mg = cmd + [
        "--use-mcore-models", "--model-type", "GPT",
        "--load-model-type", "hf", "--save-model-type", "mg",
        "--target-tensor-parallel-size", "2", "--target-pipeline-parallel-size", "2",
        "--add-qkv-bias", "--load-dir", str(tiny_model_dir), "--save-dir", str(mg),
        "--tokenizer-model", str(tiny_model_dir / "tokenizer.json"),
        "--model-type-hf", "llama2", "--params-dtype", "fp32", "--no-progress",
    ]  # fmt: skip
    proc = subprocess.run(to_mg, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "converted hf -> mg" in proc.stdout
    to_hf = cmd + [
        "--load-model-type", "mg", "--save-model-type", "hf",
        "--load-dir", str(mg), "--save-dir", str(hf), "--no-progress",
    ]  # fmt: skip
    proc = subprocess.run(to_hf, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert_bit_exact(tiny_model_dir, hf)
    assert read_checkpoint_info(mg).arch.family == "qwen2"
