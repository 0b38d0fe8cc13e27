"""The built-in tools' YAML keys: each honoured, warned as "no effect here", or refused; BM25 order."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest

from mindrl.tools.base import ToolSchema
from mindrl.tools.code_interpreter import CodeInterpreterTool, ReToolInterpreter
from mindrl.tools.registry import registered_class_names, tool_class
from mindrl.tools.retrieval_server import BM25Index
from mindrl.tools.search import SearchTool

SCHEMA = ToolSchema(name="code_interpreter")
URL = "http://localhost:8080/run_code"


def test_mindspeed_and_verl_class_names_map_to_mindrls_tools() -> None:
    assert tool_class("mindspeed_rl.tools.retool.ReTool", ".") is ReToolInterpreter
    for name in (
        "mindspeed_rl.tools.sandbox_fusion_tool.SandboxFusionTool",
        "verl.tools.sandbox_fusion_tools.SandboxFusionTool",
    ):
        assert tool_class(name, ".") is CodeInterpreterTool
    for name in ("mindspeed_rl.tools.search_tool.SearchTool", "verl.tools.search_tool.SearchTool"):
        assert tool_class(name, ".") is SearchTool
    assert "mindspeed_rl.tools.retool.ReTool" in registered_class_names()


def test_code_interpreter_reads_mindspeeds_keys() -> None:
    config: dict[str, Any] = {
        "sandbox_fusion_url": URL,
        "num_workers": 3,
        "enable_global_rate_limit": True,
        "rate_limit": 3,
        "default_timeout": 7,
        "default_language": "python",
        "memory_limit_mb": 256,
        "type": "native",
    }
    tool = CodeInterpreterTool(config, SCHEMA)
    assert (tool.url, tool.num_workers, tool.default_timeout, tool.memory_limit_mb) == (
        URL,
        3,
        7.0,
        256,
    )


def test_unknown_keys_and_an_unused_rate_limit_are_warned(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        CodeInterpreterTool(
            {
                "sandbox_fusion_url": URL,
                "retries": 3,
                "enable_global_rate_limit": False,
                "rate_limit": 5,
            },
            SCHEMA,
        )
    text = caplog.text
    assert "'retries' has no effect here" in text
    assert "rate_limit has no effect here with enable_global_rate_limit: false" in text


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "sandbox_fusion_url is not set"),
        ({"sandbox_fusion_url": URL, "type": "mcp"}, "type 'mcp' is not supported"),
        ({"sandbox_fusion_url": URL, "num_workers": 0}, "num_workers must be >= 1"),
        ({"sandbox_fusion_url": "localhost:8080/run_code"}, "must be an http\\(s\\) URL"),
    ],
)
def test_bad_code_tool_config_is_refused(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CodeInterpreterTool(config, SCHEMA)


def test_search_tool_needs_a_url() -> None:
    with pytest.raises(ValueError, match="retrieval_service_url is not set"):
        SearchTool({"topk": 3}, ToolSchema(name="search"))


def bm25_by_hand(docs: list[str], query: str, k1: float = 1.2, b: float = 0.75) -> list[float]:
    """Okapi BM25 straight from its formula, one document at a time (no index)."""
    words = [doc.lower().split() for doc in docs]
    mean = sum(map(len, words)) / len(words)
    scores = []
    for doc in words:
        total = 0.0
        for term in set(query.lower().split()):
            df = sum(term in other for other in words)
            idf = math.log(1 + (len(words) - df + 0.5) / (df + 0.5))
            tf = doc.count(term)
            total += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(doc) / mean))
        scores.append(total)
    return scores


def test_bm25_ranks_as_the_formula_does() -> None:
    docs = ["apple banana", "apple apple apple cherry", "cherry " * 30, "durian"]
    index = BM25Index([{"id": str(i), "contents": text} for i, text in enumerate(docs)])
    expected = bm25_by_hand(docs, "apple cherry")
    hits = index.search("apple cherry", topk=3)
    assert [i for i, _ in hits] == sorted(range(4), key=lambda i: -expected[i])[:3]
    assert [score for _, score in hits] == pytest.approx(sorted(expected, reverse=True)[:3])
    assert index.search("nothing matches", topk=3) == []


def test_the_global_rate_limit_is_one_limiter_for_all_tools() -> None:
    first = CodeInterpreterTool({"sandbox_fusion_url": URL, "rate_limit": 8}, SCHEMA)
    second = SearchTool({"retrieval_service_url": URL, "rate_limit": 8}, ToolSchema(name="search"))
    alone = CodeInterpreterTool(
        {"sandbox_fusion_url": URL, "enable_global_rate_limit": False}, SCHEMA
    )
    assert first._limit is not None and first._limit is second._limit
    assert alone._limit is None
