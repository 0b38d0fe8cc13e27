"""The tiny byte-level BPE tokenizer (Qwen-style specials and chat template), trained in code
on :mod:`mindrl.assets.corpus` so it is the same bytes on every machine."""

from __future__ import annotations

import os
from pathlib import Path

from mindrl.assets.cache import write_json

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


def _train_tiny_tokenizer():
    """Train the byte-level BPE on the built-in corpus; returns a ``tokenizers.Tokenizer``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from mindrl.assets.corpus import tiny_corpus

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
    write_json(out / "tokenizer_config.json", config)
    write_json(
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
