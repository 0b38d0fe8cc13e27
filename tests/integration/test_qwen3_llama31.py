"""Qwen3 dense (q/k norm, explicit head_dim, tied embeddings) and Llama-3.1-style (llama3 rope
scaling, untied) end to end on real megatron-core and real HF models: HF -> mcore(TP=2, PP=2)
-> HF is bit-exact, mcore logits equal HF's to 1e-4 in fp32 at TP=1, TP=2 and PP=2 (gloo, 2
processes), online load and export agree, and the converter CLI reads the family from
config.json (mg -> hf needs no flags)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mindrl.assets import models
from mindrl.checkpoint.errors import ConversionError
from mindrl.checkpoint.mcore_io import load_mcore_checkpoint, read_checkpoint_info
from mindrl.checkpoint.offline import convert_hf_to_mcore, convert_mcore_to_hf
from mindrl.checkpoint.online import load_hf_into_mcore
from mindrl.models.forward_pass import forward_only
from mindrl.models.gpt import build_gpt_model
from mindrl.models.hf_arch import arch_from_hf_config
from mindrl.models.parallel import destroy_parallel, init_parallel
from tests.fresh_process import run_json_ranks
from tests.integration.test_convert_roundtrip import assert_bit_exact
from tests.integration.test_mcore_parity import (
    LOGITS_TOL,
    RANK_ENV,
    TIMEOUT_S,
    WORKER,
    hf_reference,
)

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, str(REPO / "cli" / "convert_ckpt.py"), "--no-progress"]
BUILDERS = {"qwen3": models.tiny_qwen3_dir, "llama31": models.tiny_llama31_dir}
SEQ = 160  # past the tiny Llama-3.1's original_max_position_embeddings (128)


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def family(request, tmp_path_factory) -> dict:
    """The family's tiny HF folder, converted once to megatron at TP=2 x PP=2, and token ids."""
    src = BUILDERS[request.param]()
    root = tmp_path_factory.mktemp(request.param)
    convert_hf_to_mcore(
        src, root / "mg", target_tensor_parallel_size=2, target_pipeline_parallel_size=2
    )
    arch = arch_from_hf_config(src)
    ids = torch.randint(0, arch.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(3))
    torch.save(ids, root / "ids.pt")
    return {"name": request.param, "src": src, "root": root, "mg": root / "mg", "ids": ids}


@pytest.fixture
def megatron_tp1():
    init_parallel(1, 1, accelerator="cpu", seed=0)
    yield
    destroy_parallel()


def test_hf_mcore_hf_is_bit_exact_at_tp2_pp2(family, tmp_path):
    convert_mcore_to_hf(family["mg"], tmp_path / "hf")  # no layout or family flags
    assert_bit_exact(family["src"], tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config == json.loads((family["src"] / "config.json").read_text())
    info = read_checkpoint_info(family["mg"])
    assert (info.tensor_parallel_size, info.pipeline_parallel_size) == (2, 2)
    if family["name"] == "qwen3":
        assert info.arch.qk_layernorm and info.arch.head_dim == 64
        assert "model.layers.1.self_attn.k_norm.weight" in _names(tmp_path / "hf")
    else:
        assert config["rope_parameters"]["rope_type"] == "llama3"
        assert info.arch.rope_scaling_hf()["original_max_position_embeddings"] == 128


def _names(folder: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as fh:
        return set(fh.keys())


def test_tp1_logits_match_hf_online_and_from_the_tp2_pp2_checkpoint(family, megatron_tp1):
    arch = arch_from_hf_config(family["src"])
    ref, _ = hf_reference(family["src"], family["ids"])
    for source in ("online", "checkpoint"):
        model = build_gpt_model(arch).eval()
        if source == "online":
            load_hf_into_mcore([model], family["src"])
        else:
            load_mcore_checkpoint([model], family["mg"], arch=arch)
        logits = forward_only([model], family["ids"], vocab_size=arch.vocab_size, output="logits")
        diff = (logits - ref).abs().max().item()
        print(f"{family['name']} TP=1 {source}: max |logit diff| = {diff:.2e}")
        assert diff <= LOGITS_TOL, (source, diff)
    if family["name"] == "llama31":
        # the check can fail: without the scaling (or with megatron's Llama 3.1 defaults for
        # low/high factor and context) the same weights give other logits
        for changed in (
            dict(rope_scaling_type=None, rope_scaling_factor=1.0, low_freq_factor=None,
                 high_freq_factor=None, original_max_position_embeddings=None),
            dict(high_freq_factor=4.0, original_max_position_embeddings=8192),
        ):  # fmt: skip
            other = build_gpt_model(dataclasses.replace(arch, **changed)).eval()
            other.load_state_dict(model.state_dict())
            out = forward_only([other], family["ids"], vocab_size=arch.vocab_size, output="logits")
            assert (out - ref).abs().max() > 100 * LOGITS_TOL, changed


def test_a_model_file_without_the_checkpoints_rope_scaling_is_refused(megatron_tp1):
    src = models.tiny_llama31_dir()
    plain = dataclasses.replace(
        arch_from_hf_config(src), rope_scaling_type=None, rope_scaling_factor=1.0,
        low_freq_factor=None, high_freq_factor=None, original_max_position_embeddings=None,
    )  # fmt: skip
    with pytest.raises(
        ConversionError, match="has RoPE scaling .*'llama3'.* but the model file None"
    ):
        load_hf_into_mcore([build_gpt_model(plain)], src, arch=plain)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> Path:
    """One 2-process launch at TP=2 and one at PP=2, each running both families in turn: TP=2
    loads the converted TP=2 x PP=2 checkpoint through dist_checkpointing, PP=2 loads the HF
    folder online into each stage; each forwards the ids and exports an HF folder."""
    root = tmp_path_factory.mktemp("layouts")
    steps: dict[str, list[dict]] = {"tp2": [], "pp2": []}
    for name, build in sorted(BUILDERS.items()):
        src = build()
        mg = root / f"{name}_mg"
        convert_hf_to_mcore(src, mg, target_tensor_parallel_size=2, target_pipeline_parallel_size=2)
        ids = torch.randint(0, 448, (2, SEQ), generator=torch.Generator().manual_seed(3))
        torch.save(ids, root / f"{name}_ids.pt")
        loads = {
            "tp2": [{"op": "build", "arch_ckpt": str(mg)}, {"op": "load_mcore", "dir": str(mg)}],
            "pp2": [{"op": "build", "arch_hf": str(src)}, {"op": "load_hf", "dir": str(src)}],
        }
        for layout, load in loads.items():
            steps[layout] += [
                *load,
                {"op": "forward", "ids": str(root / f"{name}_ids.pt"), "output": "logits", "out": str(root / f"{name}_{layout}.pt"), "mbs": 1},
                {"op": "export_hf", "dir": str(root / f"{name}_{layout}_export"), "assets": str(src)},
            ]  # fmt: skip
    for layout, (tp, pp) in {"tp2": (2, 1), "pp2": (1, 2)}.items():
        spec = {"tp": tp, "pp": pp, "steps": steps[layout]}
        ranks = run_json_ranks(
            WORKER, spec, world_size=2, timeout_s=TIMEOUT_S, workdir=root, env=RANK_ENV
        )
        assert [r["ops"] for r in ranks] == [[s["op"] for s in steps[layout]]] * 2
    return root


@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_tp2_and_pp2_logits_match_hf_and_export_bit_exact(family, layouts, layout):
    name, src = family["name"], family["src"]
    ids = torch.load(layouts / f"{name}_ids.pt")
    ref, _ = hf_reference(src, ids)
    diff = (torch.load(layouts / f"{name}_{layout}.pt") - ref).abs().max().item()
    print(f"{name} {layout.upper()}: max |logit diff| = {diff:.2e}")
    assert diff <= LOGITS_TOL, diff
    assert_bit_exact(src, layouts / f"{name}_{layout}_export")  # what weight sync sends, too


def _convert(*flags: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *map(str, flags)], capture_output=True, text=True, timeout=300, check=False
    )


def test_converter_cli_takes_qwen3_from_config_json(tmp_path):
    """hf -> mg with MindSpeed-RL's flag spelled as qwen3 (accepted, nothing overridden; the
    in-process conversions above pass no flag at all), mg -> hf with no flags."""
    src = models.tiny_qwen3_dir()
    proc = _convert(
        "--load-model-type", "hf", "--save-model-type", "mg", "--model-type-hf", "qwen3",
        "--target-tensor-parallel-size", "2", "--target-pipeline-parallel-size", "2",
        "--load-dir", src, "--save-dir", tmp_path / "mg",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "convert_ckpt: note:" not in proc.stderr  # nothing overridden
    info = read_checkpoint_info(tmp_path / "mg")
    assert (info.arch.family, info.arch.model_type_hf, info.arch.qk_layernorm) == (
        "qwen3",
        "qwen3",
        True,
    )
    proc = _convert(
        "--load-model-type", "mg", "--save-model-type", "hf",
        "--load-dir", tmp_path / "mg", "--save-dir", tmp_path / "hf",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert_bit_exact(src, tmp_path / "hf")
