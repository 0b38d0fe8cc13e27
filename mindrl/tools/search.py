"""The search tool: asks a retrieval service (``POST /retrieve``) for the model's queries.

Registered under MindSpeed-RL's and verl's ``SearchTool``. The request is theirs
(``{"queries", "topk", "return_scores": true}``) and so is the text returned: JSON
``{"result": "Doc 1 (Title: ...)\\n...\\n---\\n..."}``, one block per query, a document's first
line as its title. ``timeout`` bounds each request; errors come back as a result with ``error``
set. ``retrieval_corpus`` (mindrl's own key) names the JSONL corpus the embedded retrieval
server serves when the URL is on this machine and nothing answers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from mindrl.tools.base import ToolResult, ToolSchema
from mindrl.tools.http_service import ServiceError, post_json
from mindrl.tools.service_tool import SHARED_KEYS, ServiceTool, bounded_text, warn_unknown_keys

KEYS = ("retrieval_service_url", "topk", "timeout", "retrieval_corpus", *SHARED_KEYS)


def passages_text(documents: Sequence[Mapping[str, Any]]) -> str:
    """``Doc i (Title: first line)\\nrest`` per document, as the search tools show results."""
    blocks = []
    for index, item in enumerate(documents, start=1):
        contents = str((item.get("document") or item).get("contents", ""))
        title, _, text = contents.partition("\n")
        blocks.append(f"Doc {index} (Title: {title})\n{text}")
    return "\n\n".join(blocks).strip()


class SearchTool(ServiceTool):
    """``{"query_list": [...]}`` -> the top ``topk`` passages of each query."""

    url_key = "retrieval_service_url"

    @staticmethod
    def corpus_of(config: Mapping[str, Any]) -> str:
        """``retrieval_corpus`` ("" when unset): what an embedded retrieval server would serve."""
        return str(config.get("retrieval_corpus") or "")

    def __init__(self, config: Mapping[str, Any], schema: ToolSchema) -> None:
        super().__init__(config, schema, default_workers=120)
        warn_unknown_keys(schema.name, self.config, KEYS)
        self.topk = int(self.config.get("topk", 3))
        self.timeout = float(self.config.get("timeout", 30))

    async def execute(self, instance_id: str, arguments: Mapping[str, Any]) -> ToolResult:
        queries = arguments.get("query_list")
        if isinstance(queries, str):
            queries = [queries]
        if (
            not isinstance(queries, list)
            or not queries
            or not all(isinstance(q, str) for q in queries)
        ):
            return ToolResult(
                text=json.dumps(
                    {"result": "Error: 'query_list' must be a non-empty list of strings."}
                ),
                error="bad_call",
            )
        payload = {"queries": queries, "topk": self.topk, "return_scores": True}
        try:
            answer = await self.call_blocking(
                lambda: post_json(self.url, payload, timeout=self.timeout)
            )
        except ServiceError as exc:
            return ToolResult(text=json.dumps({"result": f"Search error: {exc}"}), error=exc.kind)
        per_query = answer.get("result")
        if not isinstance(per_query, list):
            return ToolResult(
                text=json.dumps({"result": "Search error: the service answered no result list."}),
                error="server_error",
            )
        if not any(per_query):
            return ToolResult(text=json.dumps({"result": "No search results found."}))
        text = bounded_text("\n---\n".join(passages_text(hits) for hits in per_query))
        return ToolResult(
            text=json.dumps({"result": text}),
            metrics={"queries": float(len(queries)), "results": float(sum(map(len, per_query)))},
        )
