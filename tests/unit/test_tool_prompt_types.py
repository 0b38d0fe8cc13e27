"""MindSpeed-RL's qwen_retool / qwen_search_tool prompt types show the schemas of its tool YAMLs.

The default system prompt of each template equals the hermes tools block rendered from the
schema of MindSpeed-RL's configs/tools YAML (written out here as it ships), and the dataset
configs shipped for them preprocess rows into prompts that carry it in the system turn.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.preprocess_data import main as preprocess
from mindrl.data.dataset import PromptDataset
from mindrl.data.templates import get_template
from mindrl.tools.prompts import tools_system_prompt
from mindrl.tools.registry import read_tool_config

REPO = Path(__file__).resolve().parents[2]

RETOOL_YAML = """tools:
  - class_name: "mindspeed_rl.tools.retool.ReTool"
    config:
      sandbox_fusion_url: "http://localhost:8080/run_code"
    tool_schema:
      type: "function"
      function:
        name: "code_interpreter"
        description: "A tool for executing code."
        parameters:
          type: "object"
          properties:
            code:
              type: "string"
              description: "The code to execute."
          required: ["code"]
"""

SEARCH_YAML = """tools:
  - class_name: "mindspeed_rl.tools.search_tool.SearchTool"
    config:
      retrieval_service_url: "http://localhost:8080/retrieve"
    tool_schema:
      type: "function"
      function:
        name: "search"
        description: "Searches the web for relevant information based on the given query."
        parameters:
          type: "object"
          properties:
            query_list:
              type: "array"
              item:
                type: "string"
              description: "A list of fully-formed semantic queries. The tool will return search results for each query."
          required: ["query_list"]
"""

CASES = [
    ("qwen_retool", RETOOL_YAML, "retool_qwen25_7b"),
    ("qwen_search_tool", SEARCH_YAML, "search_tool_qwen25_7b"),
]


@pytest.fixture(scope="module")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mindrl.assets.tokenizer import build_tiny_tokenizer

    return build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.mark.parametrize(("prompt_type", "tool_yaml", "dataset"), CASES, ids=[c[0] for c in CASES])
def test_the_template_system_turn_is_the_tool_yamls_schemas(
    tmp_path: Path, prompt_type: str, tool_yaml: str, dataset: str
) -> None:
    (tmp_path / "tools.yaml").write_text(tool_yaml)
    schemas = [entry.schema for entry in read_tool_config(tmp_path / "tools.yaml")]
    template = get_template(prompt_type, REPO / "configs" / "model" / "templates.json")
    assert template.default_system == tools_system_prompt(schemas)


@pytest.mark.parametrize(("prompt_type", "tool_yaml", "dataset"), CASES, ids=[c[0] for c in CASES])
def test_the_shipped_dataset_config_stores_prompts_with_the_tools(
    tmp_path: Path, tiny_tokenizer_dir: Path, prompt_type: str, tool_yaml: str, dataset: str
) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"problem": "What is 123 * 456?", "answer": "56088"}) + "\n")
    status = preprocess(
        [
            "--config-name",
            dataset,
            "--input",
            str(rows),
            "--tokenizer-name-or-path",
            str(tiny_tokenizer_dir),
            "--output-prefix",
            str(tmp_path / "store"),
            "workers=1",
        ]
    )
    assert status == 0
    (tmp_path / "tools.yaml").write_text(tool_yaml)
    schemas = [entry.schema for entry in read_tool_config(tmp_path / "tools.yaml")]
    first = PromptDataset(tmp_path / "store")[0]
    assert first.prompt_text.startswith(
        f"<|im_start|>system\n{tools_system_prompt(schemas)}<|im_end|>\n"
        "<|im_start|>user\nWhat is 123 * 456?<|im_end|>\n"
    )
    assert first.label == "56088"
