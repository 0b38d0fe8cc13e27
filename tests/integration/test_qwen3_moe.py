"""Qwen3-MoE (8 experts, top-2, renormalised probabilities) end to end on real megatron-core's
MoE layer and real HF Qwen3MoeForCausalLM: the converter CLI takes the family from config.json
and `--target-expert-parallel-size`; HF -> mcore -> HF is bit-exact; mcore logits equal HF's to
1e-4 in fp32 at TP=1, TP=2, PP=2 and EP=2 (gloo, 2 processes, alltoall token dispatch); the
online export gathers every expert bit-exactly from each layout; a checkpoint saved at EP=2
loads at EP=1 with the same logits as the HF weights loaded directly."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mindrl.assets import models
from mindrl.checkpoint.mcore_io import load_mcore_checkpoint, read_checkpoint_info
from mindrl.checkpoint.online import load_hf_into_mcore
from mindrl.models.forward_pass import forward_only
from mindrl.models.gpt import build_gpt_model
from mindrl.models.hf_arch import arch_from_hf_config
from mindrl.models.parallel import destroy_parallel, init_parallel
from tests.fresh_process import run_json_ranks
from tests.integration.test_convert_roundtrip import assert_bit_exact, hf_tensors
from tests.integration.test_mcore_parity import (
    LOGITS_TOL,
    RANK_ENV,
    TIMEOUT_S,
    WORKER,
    hf_reference,
)

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, str(REPO / "cli" / "convert_ckpt.py"), "--no-progress"]
SEQ = 48
LAYOUTS = {"tp2": (2, 1, 1), "pp2": (1, 2, 1), "ep2": (1, 1, 2)}


def _convert(*flags: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *map(str, flags)], capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> dict:
    """The tiny Qwen3-MoE HF folder, converted by the CLI to megatron at TP=2 x PP=2 x EP=2
    (no family flag: config.json says qwen3_moe), and token ids."""
    src = models.tiny_qwen3_moe_dir()
    root = tmp_path_factory.mktemp("qwen3_moe")
    proc = _convert(
        "--load-model-type", "hf", "--save-model-type", "mg",
        "--target-tensor-parallel-size", "2", "--target-pipeline-parallel-size", "2",
        "--target-expert-parallel-size", "2", "--load-dir", src, "--save-dir", root / "mg",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "convert_ckpt: note:" not in proc.stderr
    arch = arch_from_hf_config(src)
    ids = torch.randint(0, arch.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(3))
    torch.save(ids, root / "ids.pt")
    return {"src": src, "root": root, "mg": root / "mg", "ids": ids, "arch": arch}


def test_arch_is_read_from_config_json(moe):
    arch = moe["arch"]
    assert (arch.family, arch.num_experts, arch.moe_router_topk) == ("qwen3_moe", 8, 2)
    assert arch.norm_topk_prob and arch.qk_layernorm and arch.moe_ffn_hidden_size == 64
    info = read_checkpoint_info(moe["mg"])
    layout = (info.tensor_parallel_size, info.pipeline_parallel_size, info.expert_parallel_size)
    assert layout == (2, 2, 2)
    assert info.arch == arch


def test_hf_mcore_hf_is_bit_exact(moe, tmp_path):
    """The CLI's mg -> hf needs no flags; every expert's gate / up / down comes back."""
    proc = _convert(
        "--load-model-type", "mg", "--save-model-type", "hf",
        "--load-dir", moe["mg"], "--save-dir", tmp_path / "hf",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert_bit_exact(moe["src"], tmp_path / "hf")
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in hf_tensors(tmp_path / "hf")


def test_an_expert_parallel_size_that_does_not_divide_the_experts_is_refused(moe, tmp_path):
    proc = _convert(
        "--load-model-type", "hf", "--save-model-type", "mg", "--target-expert-parallel-size",
        "3", "--load-dir", moe["src"], "--save-dir", tmp_path / "mg",
    )  # fmt: skip
    assert proc.returncode == 1
    assert "--target-expert-parallel-size 3 does not divide num_experts=8" in proc.stderr


@pytest.fixture
def megatron_tp1():
    init_parallel(1, 1, accelerator="cpu", seed=0)
    yield
    destroy_parallel()


def _tp1_logits(moe: dict, load) -> torch.Tensor:
    model = build_gpt_model(moe["arch"]).eval()
    load(model)
    return forward_only([model], moe["ids"], vocab_size=moe["arch"].vocab_size, output="logits")


def test_tp1_logits_match_hf_online_and_from_the_checkpoint(moe, megatron_tp1):
    ref, _ = hf_reference(moe["src"], moe["ids"])
    online = _tp1_logits(moe, lambda m: load_hf_into_mcore([m], moe["src"]))
    saved = _tp1_logits(moe, lambda m: load_mcore_checkpoint([m], moe["mg"], arch=moe["arch"]))
    diff = (online - ref).abs().max().item()
    print(f"qwen3_moe TP=1: max |logit diff| = {diff:.2e}")
    assert diff <= LOGITS_TOL
    assert torch.equal(online, saved)
    # the check can fail: megatron's other routing (top-k of the full softmax, no
    # renormalisation) on the same weights gives other logits
    flipped = dict(moe, arch=dataclasses.replace(moe["arch"], norm_topk_prob=False))
    other = _tp1_logits(flipped, lambda m: load_hf_into_mcore([m], moe["src"]))
    assert (other - ref).abs().max() > 100 * LOGITS_TOL


@pytest.fixture(scope="module")
def layouts(moe) -> Path:
    """One 2-process launch per layout: TP=2 loads the converted checkpoint through
    dist_checkpointing, PP=2 and EP=2 load the HF folder online; each forwards the ids and
    exports an HF folder; EP=2 also saves a megatron checkpoint."""
    root, src, mg = moe["root"], moe["src"], moe["mg"]
    for name, (tp, pp, ep) in LAYOUTS.items():
        if name == "tp2":
            load = [{"op": "build", "arch_ckpt": str(mg)}, {"op": "load_mcore", "dir": str(mg)}]
        else:
            load = [{"op": "build", "arch_hf": str(src)}, {"op": "load_hf", "dir": str(src)}]
        steps = [
            *load,
            {"op": "forward", "ids": str(root / "ids.pt"), "output": "logits", "out": str(root / f"{name}.pt"), "mbs": 1},
            {"op": "export_hf", "dir": str(root / f"{name}_export"), "assets": str(src)},
        ]  # fmt: skip
        if name == "ep2":
            steps.append({"op": "save_mcore", "dir": str(root / "ep2_saved"), "assets": str(src)})
        spec = {"tp": tp, "pp": pp, "ep": ep, "steps": steps}
        ranks = run_json_ranks(
            WORKER, spec, world_size=2, timeout_s=TIMEOUT_S, workdir=root, env=RANK_ENV
        )
        assert [r["ops"] for r in ranks] == [[s["op"] for s in steps]] * 2
    return root


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_parallel_logits_match_hf_and_export_bit_exact(moe, layouts, layout):
    ref, _ = hf_reference(moe["src"], moe["ids"])
    diff = (torch.load(layouts / f"{layout}.pt") - ref).abs().max().item()
    print(f"qwen3_moe {layout.upper()}: max |logit diff| = {diff:.2e}")
    assert diff <= LOGITS_TOL, diff
    assert_bit_exact(moe["src"], layouts / f"{layout}_export")  # what weight sync sends, too


def test_a_checkpoint_saved_at_ep2_loads_at_ep1_with_identical_logits(moe, layouts, megatron_tp1):
    saved = layouts / "ep2_saved"
    info = read_checkpoint_info(saved)
    assert info.expert_parallel_size == 2
    from_ep2 = _tp1_logits(moe, lambda m: load_mcore_checkpoint([m], saved, arch=moe["arch"]))
    from_hf = _tp1_logits(moe, lambda m: load_hf_into_mcore([m], moe["src"]))
    assert torch.equal(from_ep2, from_hf)
