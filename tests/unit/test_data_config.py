"""Dataset config: MindSpeed-RL key names, overrides, unknown keys named with a hint."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindrl.config.errors import ConfigError
from mindrl.data.compose import load_preprocess_config
from mindrl.data.config import PreprocessConfig

REPO = Path(__file__).resolve().parents[2]
DATASETS = REPO / "configs" / "datasets"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


BASE = "input: a.jsonl\ntokenizer_name_or_path: tok\noutput_prefix: out\n"


@pytest.mark.parametrize("name", ["r1_zero_qwen25_7b", "gsm8k_qwen25_0.5b", "arithmetic_smollm2"])
def test_shipped_configs_load(name):
    config = load_preprocess_config(name, DATASETS)
    assert isinstance(config, PreprocessConfig)
    assert config.seq_length and config.seq_length > 0


def test_r1_zero_config_follows_mindspeed():
    config = load_preprocess_config("r1_zero_qwen25_7b", DATASETS)
    assert config.prompt_type == "qwen_r1"
    assert config.handler_name == "R1AlpacaStyleInstructionHandler"
    # "query": "" and "system": "" mean "no such column"
    assert config.map_keys == {"prompt": "problem", "response": "answer"}


def test_reasoning_gym_config_is_typed():
    config = load_preprocess_config("arithmetic_smollm2", DATASETS, ["reasoning_gym.size=7"])
    assert config.input is None
    assert config.reasoning_gym.dataset == "basic_arithmetic"
    assert config.reasoning_gym.size == 7


def test_overrides_and_values(tmp_path):
    path = _write(tmp_path, BASE + "seq_length: 100\n")
    config = load_preprocess_config(
        str(path), tmp_path, ["seq_length=64", "+on_bad_row=error"], {"input": "b: c.jsonl"}
    )
    assert config.seq_length == 64
    assert config.on_bad_row == "error"
    assert config.input == "b: c.jsonl"  # flag values are taken verbatim


def test_unknown_top_level_key_names_the_nearest(tmp_path):
    path = _write(tmp_path, BASE + "seq_lenght: 5\n")
    with pytest.raises(
        ConfigError, match=r"unknown key 'seq_lenght' \(did you mean 'seq_length'\?\)"
    ):
        load_preprocess_config(str(path), tmp_path)


def test_unknown_override_key(tmp_path):
    path = _write(tmp_path, BASE)
    with pytest.raises(ConfigError, match="did you mean 'on_overlong'"):
        load_preprocess_config(str(path), tmp_path, ["on_overlog=error"])


def test_unknown_nested_key(tmp_path):
    path = _write(tmp_path, BASE + "reasoning_gym: {sise: 3}\n")
    with pytest.raises(ConfigError, match=r"'reasoning_gym.sise' \(did you mean 'size'\?\)"):
        load_preprocess_config(str(path), tmp_path)


def test_map_keys_as_json_string_and_unknown_name(tmp_path):
    path = _write(tmp_path, BASE + 'map_keys: \'{"prompt": "problem", "response": "answer"}\'\n')
    assert load_preprocess_config(str(path), tmp_path).map_keys == {
        "prompt": "problem",
        "response": "answer",
    }
    path = _write(tmp_path, BASE + "map_keys: {promt: problem}\n")
    with pytest.raises(ConfigError, match="did you mean 'prompt'"):
        load_preprocess_config(str(path), tmp_path)


def test_additional_keys_string_form(tmp_path):
    path = _write(tmp_path, BASE + "dataset_additional_keys: labels\n")
    assert load_preprocess_config(str(path), tmp_path).dataset_additional_keys == ("labels",)


@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        ("on_bad_row: drop", "on_bad_row must be one of"),
        ("on_overlong: truncate", "on_overlong must be one of"),
        ("handler_name: R1AlpacaStyleHandler", "did you mean 'R1AlpacaStyleInstructionHandler'"),
        ("seq_length: 0", "seq_length must be > 0"),
        ("tokenizer_type: SentencePiece", "tokenizer_type"),
        ("workers: 0", "workers must be > 0"),
    ],
)
def test_invalid_values(tmp_path, line, pattern):
    path = _write(tmp_path, BASE + line + "\n")
    with pytest.raises(ConfigError, match=pattern):
        load_preprocess_config(str(path), tmp_path)


def test_input_required_except_for_generators(tmp_path):
    path = _write(tmp_path, "tokenizer_name_or_path: tok\noutput_prefix: out\n")
    with pytest.raises(ConfigError, match="input is required"):
        load_preprocess_config(str(path), tmp_path)
    config = load_preprocess_config(str(path), tmp_path, ["handler_name=ReasoningGymHandler"])
    assert config.input is None


def test_missing_config_lists_the_nearest():
    with pytest.raises(ConfigError, match="did you mean 'r1_zero_qwen25_7b'"):
        load_preprocess_config("r1_zero_qwen25_7", DATASETS)


def test_config_is_frozen(tmp_path):
    config = load_preprocess_config(str(_write(tmp_path, BASE)), tmp_path)
    with pytest.raises(AttributeError):
        config.seq_length = 3  # type: ignore[misc]


# ------------------------------------------------------------------ every problem at once
def test_every_problem_is_reported_at_once(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    path = _write(
        tmp_path,
        "input: ./no_such_input.jsonl\ntokenizer_name_or_path: ./no_such_tokenizer\n"
        f"output_prefix: {blocker}/store\nhandler_name: R1AlpacaStyleHandler\n"
        "prompt_type: qwen_r2\nseq_lenght: 5\npack: true\nworkers: four\non_bad_row: drop\n",
    )
    with pytest.raises(ConfigError) as info:
        load_preprocess_config(str(path), tmp_path, check_paths=True)
    problems = info.value.problems
    expected = [
        "unknown key 'seq_lenght' (did you mean 'seq_length'?)",
        "unknown key 'pack': a MindSpeed-RL key mindrl does not use (SFT sequence packing)",
        "workers: expected int, got 'four'",
        "on_bad_row must be one of",
        "unknown handler_name 'R1AlpacaStyleHandler' (did you mean "
        "'R1AlpacaStyleInstructionHandler'?)",
        "unknown prompt_type 'qwen_r2' (did you mean 'qwen_r1'?); available: ",
        "input './no_such_input.jsonl': no such file or folder",
        "tokenizer_name_or_path './no_such_tokenizer': no such folder",
        f"output_prefix: cannot create {blocker}/store: {blocker} is a file, not a folder",
    ]
    for want in expected:
        assert sum(want in p for p in problems) == 1, (want, problems)
    assert len(problems) == len(expected)
    assert str(info.value).startswith(f"invalid config ({len(expected)} problem(s)):")


def test_paths_are_checked_only_when_asked(tmp_path):
    path = _write(tmp_path, BASE)  # a.jsonl, tok, out: none exists
    load_preprocess_config(str(path), tmp_path)  # reading a config needs no files
    with pytest.raises(ConfigError, match="input 'a.jsonl': no such file or folder"):
        load_preprocess_config(str(path), tmp_path, check_paths=True)


def test_unsupported_input_format_and_foreign_output_folder(tmp_path):
    (tmp_path / "rows.csv").write_text("a,b\n")
    (tmp_path / "tok").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("not a store")
    path = _write(
        tmp_path,
        f"input: {tmp_path / 'rows.csv'}\ntokenizer_name_or_path: {tmp_path / 'tok'}\n"
        f"output_prefix: {tmp_path / 'out'}\n",
    )
    with pytest.raises(ConfigError) as info:
        load_preprocess_config(str(path), tmp_path, check_paths=True)
    text = str(info.value)
    assert "unsupported format" in text and "refusing to overwrite it" in text


def test_mindspeed_only_handler_is_named(tmp_path):
    path = _write(tmp_path, BASE + "handler_name: AlpacaStyleProcessRewardHandler\n")
    with pytest.raises(ConfigError, match="MindSpeed-RL handler for process-reward-model data"):
        load_preprocess_config(str(path), tmp_path)


def test_enable_thinking_needs_a_reasoning_template(tmp_path):
    path = _write(tmp_path, BASE + "prompt_type: qwen3\nenable_thinking: true\n")
    assert load_preprocess_config(str(path), tmp_path).enable_thinking is True
    path = _write(tmp_path, BASE + "prompt_type: qwen_r1\nenable_thinking: true\n")
    with pytest.raises(ConfigError, match="enable_thinking applies to reasoning templates"):
        load_preprocess_config(str(path), tmp_path)


def test_mindspeed_dataset_configs_load(tmp_path):
    """MindSpeed-RL's deepscaler.yaml and math_17k.yaml key sets (written out here)."""
    deepscaler = (
        "input: ./dataset/deepscaler.json\ntokenizer_name_or_path: ./model_from_hf/qwen25-7b\n"
        "output_prefix: ./dataset/data\nhandler_name: R1AlpacaStyleInstructionHandler\n"
        "tokenizer_type: HuggingFaceTokenizer\nworkers: 8\nlog_interval: 1000\n"
        "prompt_type: qwen_r1\ndataset_additional_keys: [labels]\n"
        'map_keys: {"prompt":"problem", "query":"", "response": "answer", "system":""}\n'
    )
    config = load_preprocess_config(str(_write(tmp_path, deepscaler)), tmp_path)
    assert config.prompt_type == "qwen_r1" and config.workers == 8
    math17k = deepscaler.replace("R1AlpacaStyle", "Math17kAlpacaStyle").replace(
        "prompt_type: qwen_r1", "prompt_type: empty"
    )
    config = load_preprocess_config(str(_write(tmp_path, math17k)), tmp_path)
    assert config.handler_name == "Math17kAlpacaStyleInstructionHandler"
