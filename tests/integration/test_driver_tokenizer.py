"""The driver's tokenizer: the class `AutoTokenizer` picks, loaded without transformers' model
stack in the driver (mindrl/data/tokenizer.py), decoding exactly as `AutoTokenizer`'s does."""

from __future__ import annotations

from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("_driver_tokenizer.py")
TIMEOUT_S = 300.0


@pytest.mark.parametrize("model", ["tiny", "smollm2"])
def test_driver_tokenizer_is_autotokenizers_without_the_model_stack(fresh_process, request, model):
    path = request.getfixturevalue("tiny_model_dir" if model == "tiny" else "smollm2_dir")
    out = fresh_process(SCRIPT, {"path": str(path)}, timeout_s=TIMEOUT_S)
    assert not out["stack_loaded"]
    assert out["light_class"] == out["auto_class"]
    assert out["pads"][0] == out["pads"][1]
    assert out["decodings_that_differ"] == []
    assert out["encodings_equal"]


def test_a_missing_tokenizer_fails_with_transformers_own_error(tmp_path):
    from mindrl.data.tokenizer import DriverTokenizer

    source = DriverTokenizer(str(tmp_path / "no_such_tokenizer"), use_fast=True)
    with pytest.raises((OSError, ValueError)):
        source.get()


def test_closing_before_use_ends_the_child_and_loads_in_the_driver(tiny_model_dir):
    from transformers import AutoTokenizer

    from mindrl.data.tokenizer import DriverTokenizer

    source = DriverTokenizer(str(tiny_model_dir), use_fast=True)
    child = source._child
    source.close()
    assert child is not None and child.poll() is not None
    auto = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    assert type(source.get()) is type(auto)
    assert source.get().decode([5, 6, 7]) == auto.decode([5, 6, 7])
