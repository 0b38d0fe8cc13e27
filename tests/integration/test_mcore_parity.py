"""megatron-core GPTModel vs the HF model: logits and per-token log-probs at TP=1, TP=2, PP=2
(gloo, 2 processes) and TP=2 x PP=2 (4 processes); checkpoints cross layouts exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mindrl.checkpoint.mcore_io import load_mcore_checkpoint, read_checkpoint_info
from mindrl.checkpoint.offline import convert_hf_to_mcore, convert_mcore_to_hf
from mindrl.checkpoint.online import load_hf_into_mcore
from mindrl.models.forward_pass import forward_only
from mindrl.models.gpt import build_gpt_model
from mindrl.models.hf_arch import arch_from_hf_config
from mindrl.models.parallel import destroy_parallel, init_parallel
from tests.fresh_process import run_json_ranks

LOGITS_TOL = 1e-4
LOGPROB_TOL = 1e-5
WORKER = Path(__file__).with_name("_mp_worker.py")
TIMEOUT_S = 240.0  # one 2-rank launch; the 4-rank one gets TIMEOUT_4_S
TIMEOUT_4_S = 400.0
RANK_ENV = {"MINDRL_ACCELERATOR": "cpu"}


def _ops(steps: list[dict]) -> list[str]:
    return [s["op"] for s in steps]


def hf_reference(hf_dir: Path, ids: torch.Tensor, mask: torch.Tensor | None = None):
    """HF logits and log p(next token) = log_softmax(logits)[t, ids[t+1]]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    kwargs = {}
    if mask is not None:
        kwargs = {"attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    with torch.no_grad():
        logits = model(ids, **kwargs).logits.float()
    logp = torch.log_softmax(logits, dim=-1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    return logits, logp


def token_ids(vocab: int, batch: int = 3, seq: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def megatron_tp1():
    init_parallel(1, 1, accelerator="cpu", seed=0)
    yield
    destroy_parallel()


@pytest.fixture(scope="module")
def work(tmp_path_factory, tiny_qwen2_odd_vocab_dir) -> dict:
    """The odd-vocab Qwen2 (509 rows: padded to 510 at TP=2) converted once, token ids saved."""
    root = tmp_path_factory.mktemp("parity")
    convert_hf_to_mcore(tiny_qwen2_odd_vocab_dir, root / "mg", target_tensor_parallel_size=2)
    ids = token_ids(509)
    torch.save(ids, root / "ids.pt")
    return {"root": root, "hf": tiny_qwen2_odd_vocab_dir, "mg": root / "mg", "ids": ids}


@pytest.mark.parametrize("source", ["checkpoint", "online"])
def test_tp1_matches_hf(source, work, tiny_llama_dir, megatron_tp1):
    hf_dir = work["hf"] if source == "checkpoint" else tiny_llama_dir
    arch = arch_from_hf_config(hf_dir)
    model = build_gpt_model(arch).eval()
    if source == "checkpoint":
        load_mcore_checkpoint([model], work["mg"], arch=arch)
    else:
        load_hf_into_mcore([model], hf_dir)
    ids = token_ids(arch.vocab_size)
    ref_logits, ref_logp = hf_reference(hf_dir, ids)
    logits = forward_only([model], ids, vocab_size=arch.vocab_size, output="logits")
    assert logits.shape == ref_logits.shape
    assert (logits - ref_logits).abs().max() <= LOGITS_TOL
    logp = forward_only([model], ids, vocab_size=arch.vocab_size)
    assert (logp - ref_logp).abs().max() <= LOGPROB_TOL

    # left-padded rows: positions restart at the first real token, as in HF with a mask
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    mask[2, :2] = 0
    _, ref_masked = hf_reference(hf_dir, ids, mask)
    got = forward_only([model], ids, vocab_size=arch.vocab_size, attention_mask=mask)
    valid = mask[:, :-1].bool() & mask[:, 1:].bool()
    assert (got - ref_masked)[valid].abs().max() <= LOGPROB_TOL


def test_bf16_model_loads_and_stays_close(work, megatron_tp1):
    arch = read_checkpoint_info(work["mg"]).arch
    model = build_gpt_model(arch, params_dtype="bf16").eval()
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    load_mcore_checkpoint([model], work["mg"], arch=arch)  # fp32 checkpoint into bf16 params
    ref_logits, _ = hf_reference(work["hf"], work["ids"])
    logits = forward_only([model], work["ids"], vocab_size=arch.vocab_size, output="logits")
    assert torch.isfinite(logits).all()
    assert (logits - ref_logits).abs().max() < 0.25  # bf16 rounding, not a mapping error


@pytest.fixture(scope="module")
def tp2_run(work) -> dict:
    root = work["root"]
    steps = [
        {"op": "build", "arch_ckpt": str(work["mg"])},
        {"op": "load_mcore", "dir": str(work["mg"])},
        {"op": "forward", "ids": str(root / "ids.pt"), "output": "logits", "out": str(root / "tp2_logits.pt")},
        {"op": "forward", "ids": str(root / "ids.pt"), "output": "log_probs", "out": str(root / "tp2_logp.pt")},
        {"op": "save_mcore", "dir": str(root / "saved_tp2"), "iteration": 3, "assets": str(work["hf"])},
        {"op": "export_hf", "dir": str(root / "export_tp2"), "assets": str(work["hf"])},
    ]  # fmt: skip
    spec = {"tp": 2, "pp": 1, "steps": steps}
    ranks = run_json_ranks(
        WORKER, spec, world_size=2, timeout_s=TIMEOUT_S, workdir=root, env=RANK_ENV
    )
    assert [(r["rank"], r["world_size"], r["ops"]) for r in ranks] == [
        (rank, 2, _ops(steps)) for rank in range(2)
    ]
    return {
        "logits": torch.load(root / "tp2_logits.pt"),
        "logp": torch.load(root / "tp2_logp.pt"),
        "saved": root / "saved_tp2",
        "export": root / "export_tp2",
    }


def test_tp2_logits_and_vocab_parallel_log_probs_match_hf(work, tp2_run):
    ref_logits, ref_logp = hf_reference(work["hf"], work["ids"])
    assert tp2_run["logits"].shape == ref_logits.shape  # padded row 510 dropped
    assert (tp2_run["logits"] - ref_logits).abs().max() <= LOGITS_TOL
    assert (tp2_run["logp"] - ref_logp).abs().max() <= LOGPROB_TOL


def test_tp2_export_and_checkpoint(work, tp2_run, tmp_path):
    src = load_file(work["hf"] / "model.safetensors")
    out = load_file(tp2_run["export"] / "model.safetensors")
    assert sorted(src) == sorted(out)
    assert all(torch.equal(src[n], out[n]) for n in src)
    # the trainer-style checkpoint (embedding padded to 510 rows) converts offline too
    convert_mcore_to_hf(tp2_run["saved"], tmp_path / "hf")
    out = load_file(tmp_path / "hf" / "model.safetensors")
    assert sorted(src) == sorted(out)
    assert all(torch.equal(src[n], out[n]) for n in src)
    info = read_checkpoint_info(tp2_run["saved"])
    assert (info.iteration, info.tensor_parallel_size, info.pipeline_parallel_size) == (3, 2, 1)
    assert (tp2_run["saved"] / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    assert (tp2_run["saved"] / "iter_0000003" / "hf_assets" / "tokenizer.json").is_file()


def test_tp2_checkpoint_loads_at_pp2_and_tp1_identically(
    work, tp2_run, megatron_tp1, fresh_process
):
    root, saved = work["root"], tp2_run["saved"]
    steps = [
        {"op": "build", "arch_ckpt": str(saved)},
        {"op": "load_mcore", "dir": str(saved)},
        {"op": "forward", "ids": str(root / "ids.pt"), "output": "logits", "out": str(root / "pp2_logits.pt"), "mbs": 1},
    ]  # fmt: skip
    ranks = fresh_process.ranks(
        WORKER, {"tp": 1, "pp": 2, "steps": steps}, world_size=2, timeout_s=TIMEOUT_S, env=RANK_ENV
    )
    assert [r["ops"] for r in ranks] == [_ops(steps)] * 2
    pp2 = torch.load(root / "pp2_logits.pt")

    arch = read_checkpoint_info(saved).arch
    model = build_gpt_model(arch).eval()
    load_mcore_checkpoint([model], saved, arch=arch)
    tp1 = forward_only([model], work["ids"], vocab_size=arch.vocab_size, output="logits")
    assert torch.equal(tp1, pp2)  # same weights, same math, same order
    ref_logits, _ = hf_reference(work["hf"], work["ids"])
    assert (tp1 - ref_logits).abs().max() <= LOGITS_TOL


def test_tp2_pp2_online_load_matches_hf_and_exports_exactly(
    tiny_model_dir, tmp_path, fresh_process
):
    arch = arch_from_hf_config(tiny_model_dir)
    ids = token_ids(arch.vocab_size, batch=2)
    torch.save(ids, tmp_path / "ids.pt")
    steps = [
        {"op": "build", "arch_hf": str(tiny_model_dir)},
        {"op": "load_hf", "dir": str(tiny_model_dir)},
        {"op": "forward", "ids": str(tmp_path / "ids.pt"), "output": "logits", "out": str(tmp_path / "logits.pt"), "mbs": 1},
        {"op": "export_hf", "dir": str(tmp_path / "export"), "assets": str(tiny_model_dir)},
    ]  # fmt: skip
    ranks = fresh_process.ranks(
        WORKER,
        {"tp": 2, "pp": 2, "steps": steps},
        world_size=4,
        timeout_s=TIMEOUT_4_S,
        env=RANK_ENV,
    )
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    ref_logits, _ = hf_reference(tiny_model_dir, ids)
    assert (torch.load(tmp_path / "logits.pt") - ref_logits).abs().max() <= LOGITS_TOL
    src = load_file(tiny_model_dir / "model.safetensors")
    out = load_file(tmp_path / "export" / "model.safetensors")
    assert sorted(src) == sorted(out)
    assert all(torch.equal(src[n], out[n]) for n in src)
    assert (tmp_path / "export" / "tokenizer.json").read_bytes() == (
        tiny_model_dir / "tokenizer.json"
    ).read_bytes()
