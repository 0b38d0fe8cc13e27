"""cli/preprocess_data.py with MindSpeed-RL's AlpacaStylePairwiseHandler (its orca_rlhf dataset
config's keys: map_keys with an empty query, prompt_type qwen3, enable_thinking) into a pairwise
store: ids and answer masks of each side, and bad rows reported by row number."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from mindrl.data.pairs import pair_batch, read_pairs
from mindrl.data.store import StoreError, read_meta

# The shape of MindSpeed-RL's configs/datasets/orca_rlhf.yaml, paths pointed at the test's files.
DATASET_YAML = """\
input: {input}
tokenizer_name_or_path: {tokenizer}
output_prefix: {output}
handler_name: AlpacaStylePairwiseHandler
tokenizer_type: HuggingFaceTokenizer
workers: 1
log_interval: 1000
prompt_type: qwen3
seq_length: {seq_length}
map_keys: {{"prompt":"question", "query":"", "system":"system"}}
enable_thinking: true
"""

GOOD = [
    {"system": "", "question": "What is 2 + 3?", "chosen": "5", "rejected": "6"},
    {"system": "Be brief.", "question": "Name a colour.", "chosen": "blue", "rejected": "seven"},
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    from mindrl.assets.tokenizer import build_tiny_tokenizer

    return build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


def _run(tmp_path: Path, tokenizer_dir: Path, rows: list, seq_length: int = 512) -> tuple:
    from cli import preprocess_data

    data = tmp_path / "orca.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "dpo_store"
    config = tmp_path / "orca_rlhf.yaml"
    config.write_text(
        DATASET_YAML.format(input=data, tokenizer=tokenizer_dir, output=out, seq_length=seq_length)
    )
    return preprocess_data.main(["--config-name", str(config)]), out


def test_pairs_share_the_prompt_and_end_in_eos(tmp_path, tokenizer_dir):
    from transformers import AutoTokenizer

    rc, out = _run(tmp_path, tokenizer_dir, GOOD)
    assert rc == 0
    assert read_meta(out)["kind"] == "pairwise"
    pairs = read_pairs(out)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    first = pairs[0]
    prompt = tok.decode(list(first.prompt_ids))
    # qwen3 with enable_thinking: no empty think block; no system turn for an empty system
    assert prompt == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    assert first.chosen_ids[-1] == tok.eos_token_id == first.rejected_ids[-1]
    assert tok.decode(list(first.chosen_ids[:-1])) == "5"
    assert tok.decode(list(first.rejected_ids[:-1])) == "6"
    assert tok.decode(list(pairs[1].prompt_ids)).startswith("<|im_start|>system\nBe brief.")


def test_pair_batch_scores_answers_only(tmp_path, tokenizer_dir):
    rc, out = _run(tmp_path, tokenizer_dir, GOOD)
    assert rc == 0
    pairs = read_pairs(out)
    batch = pair_batch(pairs, pad_id=0)
    assert batch.size == 4  # chosen, rejected, chosen, rejected
    for i in range(batch.size):
        pair = pairs[i // 2]
        answer = pair.chosen_ids if i % 2 == 0 else pair.rejected_ids
        # column t predicts token t + 1: the scored targets are exactly the answer's tokens
        scored = [int(batch.input_ids[i, t + 1]) for t in batch.response_mask[i].nonzero()]
        assert scored == list(answer)
        assert batch.input_ids[i, : len(pair.prompt_ids)].tolist() == list(pair.prompt_ids)


def test_bad_rows_reported_by_row_number(tmp_path, tokenizer_dir, caplog):
    rows = [
        GOOD[0],
        {"system": "", "question": "Q?", "chosen": "", "rejected": "no"},  # row 1: empty side
        {"system": "", "question": "Q?", "chosen": "same", "rejected": "same"},  # row 2
        {"system": "", "question": "Q? " * 200, "chosen": "a", "rejected": "b"},  # row 3: long
        GOOD[1],
    ]
    with caplog.at_level(logging.INFO):
        rc, out = _run(tmp_path, tokenizer_dir, rows, seq_length=64)
    assert rc == 0
    assert [p.row for p in read_pairs(out)] == [0, 4]
    meta = read_meta(out)["report"]
    assert meta["skipped"] == {"empty_response": 1, "identical_pair": 1}
    assert meta["overlong"] == 1
    issues = {i["row"]: i["reason"] for i in meta["bad_rows"] + meta["overlong_rows"]}
    assert issues == {1: "empty_response", 2: "identical_pair", 3: "overlong"}
    assert "row 1 [empty_response]" in caplog.text and "row 3 [overlong]" in caplog.text


def test_prompt_store_is_refused_as_pairs(tmp_path, tokenizer_dir):
    from mindrl.assets.prompts import tiny_prompts_dir

    with pytest.raises(StoreError, match="AlpacaStylePairwiseHandler"):
        read_pairs(tiny_prompts_dir())
