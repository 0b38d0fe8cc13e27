"""The calculator task of `grpo_tool_tiny_cpu` and its warm-up policy, built offline on first use.

The task: multiply two three-digit numbers (every product has six digits). The tiny model cannot
compute a product; with the calculator tool it only has to copy digits, into the call and out of
the tool's answer. The prompt store asks "What is A*B?" and keeps the product as the label.

The warm-up (`${asset:tiny_tool_warmup}`) is the tiny Qwen2 fine-tuned briefly on demonstrations
rendered with its chat template. Most demonstrations answer at once with a guessed six-digit
number; a few (WARMUP_TOOL_SHARE) call the calculator and copy its answer. So the warm-up
knows the call format and the copying, but calls the tool in few responses and is almost never
right without it: it starts near zero on both reward and tool-use rate, and RL has to learn that
calling the tool is what pays. Same inputs, same bytes: the seed fixes data, order and weights.
"""

from __future__ import annotations

import json
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindrl.assets.cache import assets_root, build_atomically
from mindrl.assets.models import tiny_model_dir
from mindrl.assets.supervised import save_beside_base, supervised_step
from mindrl.assets.tokenizer import tiny_token_ids

TOOL_TASK_VERSION = 1
TOOL_PROMPTS_SIZE = 256
FACTOR_RANGE = (317, 999)  # 317 * 317 > 10**5: every product has six digits
WARMUP_DEMOS = 256
WARMUP_TOOL_SHARE = 0.0625  # of the second phase's demonstrations; the rest guess
WARMUP_TOOL_STEPS = 200  # first phase: tool demonstrations only (the format, the copying)
WARMUP_MIXED_STEPS = 150  # second phase: first tokens mostly guess; calls still copied
WARMUP_BATCH = 16
WARMUP_LR = 3e-3
WARMUP_SEED = 0
TOOL_NAME = "calculator"


@dataclass(frozen=True)
class Product:
    """One problem: the question and its answer."""

    a: int
    b: int

    @property
    def question(self) -> str:
        return f"What is {self.a}*{self.b}?"

    @property
    def answer(self) -> str:
        return str(self.a * self.b)

    @property
    def tool_call(self) -> str:
        """The hermes call the tool demonstrations make."""
        call = {"name": TOOL_NAME, "arguments": {"expression": f"{self.a}*{self.b}"}}
        return f"<tool_call>{json.dumps(call)}</tool_call>"


def products(size: int, seed: int) -> list[Product]:
    rng = random.Random(seed)
    return [Product(rng.randint(*FACTOR_RANGE), rng.randint(*FACTOR_RANGE)) for _ in range(size)]


def demonstration(problem: Product, use_tool: bool, rng: random.Random) -> list[dict[str, str]]:
    """Chat messages of one demonstration: the tool call, its answer and the copied product,
    or a guessed product straight away."""
    user = {"role": "user", "content": problem.question}
    if not use_tool:
        guess = str(rng.randint(10**5, 10**6 - 1))
        return [user, {"role": "assistant", "content": guess}]
    return [
        user,
        {"role": "assistant", "content": problem.tool_call},
        {"role": "tool", "content": problem.answer},
        {"role": "assistant", "content": problem.answer},
    ]


def demonstrations(
    tool_share: float, size: int = WARMUP_DEMOS, seed: int = WARMUP_SEED
) -> list[list[dict[str, str]]]:
    """`size` demonstrations on problems of their own seed (not the prompt store's), a
    `tool_share` of them calling the tool."""
    rng = random.Random(seed)
    tool_count = round(size * tool_share)
    uses = [k < tool_count for k in range(size)]
    rng.shuffle(uses)
    return [demonstration(p, u, rng) for p, u in zip(products(size, seed + 1000), uses)]


def render_demonstration(
    tokenizer: Any, messages: list[dict[str, str]], train_decision: bool = True
) -> tuple[list[int], list[int]]:
    """(ids, labels) of one demonstration by the chat template: labels are the ids of the
    assistant turns' contents and end-of-turn tokens, -100 elsewhere (prompt, tool turns and
    headers are not trained on, as RL's loss mask leaves them out). `train_decision` False:
    the response's first token (call the tool or answer) is not labelled either."""
    ids: list[int] = []
    labels: list[int] = []
    for k in range(len(messages)):
        text = tokenizer.apply_chat_template(
            messages[: k + 1], tokenize=False, add_generation_prompt=False
        )
        before = (
            tokenizer.apply_chat_template(
                messages[:k],
                tokenize=False,
                add_generation_prompt=messages[k]["role"] == "assistant",
            )
            if k
            else ""
        )
        if messages[k]["role"] == "assistant":
            head = tokenizer.encode(before, add_special_tokens=False)[len(ids) :]
            ids += head
            labels += [-100] * len(head)
            body = tokenizer.encode(messages[k]["content"], add_special_tokens=False)
            body.append(tiny_token_ids()["im_end"])
            ids += body
            first_turn = not any(label != -100 for label in labels)
            labels += [-100, *body[1:]] if first_turn and not train_decision else body
        else:
            rest = tokenizer.encode(text, add_special_tokens=False)[len(ids) :]
            ids += rest
            labels += [-100] * len(rest)
    return ids, labels


def train_tool_warmup(
    out_dir: Path, tool_steps: int = WARMUP_TOOL_STEPS, mixed_steps: int = WARMUP_MIXED_STEPS
) -> None:
    """Fine-tune the tiny Qwen2 on tool demonstrations for `tool_steps` steps, then on mostly
    guesses for `mixed_steps` (one torch thread); save it, tokenizer included, as an HF
    folder in `out_dir`."""

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = tiny_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    tool_rows = [render_demonstration(tokenizer, m) for m in demonstrations(1.0)]
    mixed_rows = [render_demonstration(tokenizer, m) for m in demonstrations(WARMUP_TOOL_SHARE)]
    # the call and the copying stay trained while the first token learns to guess
    copy_rows = [
        render_demonstration(tokenizer, m, train_decision=False) for m in demonstrations(1.0)
    ]
    phases = [(tool_rows, tool_steps), (mixed_rows + copy_rows, mixed_steps)]
    rng = random.Random(WARMUP_SEED)
    torch.manual_seed(WARMUP_SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARMUP_LR, weight_decay=0.0)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small: more threads only contend
    try:
        for rows, steps in phases:
            for _ in range(steps):
                supervised_step(
                    model, optimizer, rng.sample(rows, WARMUP_BATCH), tiny_token_ids()["pad"]
                )
    finally:
        torch.set_num_threads(threads)
    save_beside_base(model, out_dir, Path(base))


def tiny_tool_warmup_dir() -> Path:
    """Cached warm-up policy folder: `${asset:tiny_tool_warmup}`."""
    target = assets_root() / f"tiny-tool-warmup-v{TOOL_TASK_VERSION}"
    return build_atomically(target, train_tool_warmup)


def tool_prompts_dir() -> Path:
    """Cached prompt store of TOOL_PROMPTS_SIZE products in the tiny chat template, the
    product as label: `${asset:tiny_tool_prompts}`."""
    from mindrl.data.config import PreprocessConfig
    from mindrl.data.preprocess import run_preprocess
    from mindrl.data.store import is_store

    target = assets_root() / f"tiny-tool-prompts-v{TOOL_TASK_VERSION}"
    if is_store(target):
        return target
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "products.jsonl"
        rows = [
            {"question": p.question, "answer": p.answer} for p in products(TOOL_PROMPTS_SIZE, 0)
        ]
        source.write_text("".join(json.dumps(r) + "\n" for r in rows))
        config = PreprocessConfig(
            output_prefix=str(target),
            tokenizer_name_or_path=str(tiny_model_dir()),
            input=str(source),
            handler_name="R1AlpacaStyleInstructionHandler",
            prompt_type="chat",
            map_keys={"prompt": "question", "response": "answer"},
            label_format="raw",
            seq_length=64,
            log_interval=10_000,
        )
        run_preprocess(config, log=lambda _msg: None)
    return target
