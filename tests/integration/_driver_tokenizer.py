"""Run by test_driver_tokenizer.py through the `fresh_process` fixture: the driver's tokenizer
(class named by a child process) against `AutoTokenizer` in the same process.

Arguments: {"path": tokenizer folder}. Result: whether the light load left transformers' model
stack (torch._dynamo) unimported, both classes, pad ids and the decodings that differ."""

import sys
from typing import Any

from tests.fresh_process import json_main


def main(args: dict[str, Any]) -> dict[str, Any]:
    from mindrl.data.tokenizer import DriverTokenizer, pad_id_of

    source = DriverTokenizer(args["path"], use_fast=True)
    light = source.get()
    stack_loaded = "torch._dynamo" in sys.modules or "transformers.masking_utils" in sys.modules
    light_pad = pad_id_of(light)

    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(args["path"])
    ids = list(range(0, len(auto), max(1, len(auto) // 700)))  # across the whole vocabulary
    rows = [ids[i : i + 7] for i in range(0, len(ids), 7)] + [list(auto.all_special_ids) * 2]
    differ = [
        (row, skip)
        for row in rows
        for skip in (True, False)
        if light.decode(row, skip_special_tokens=skip) != auto.decode(row, skip_special_tokens=skip)
    ]
    text = "The answer is 42.\n<|im_start|>user"
    return {
        "stack_loaded": stack_loaded,
        "light_class": type(light).__qualname__,
        "auto_class": type(auto).__qualname__,
        # the reference written out, not through pad_id_of: pad token, else end-of-sequence
        "pads": [
            light_pad,
            auto.pad_token_id if auto.pad_token_id is not None else auto.eos_token_id,
        ],
        "decodings_that_differ": differ[:5],
        "encodings_equal": light.encode(text) == auto.encode(text),
    }


if __name__ == "__main__":
    json_main(main)
