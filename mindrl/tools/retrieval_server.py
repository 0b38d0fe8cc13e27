"""mindrl's embedded retrieval server: the ``POST /retrieve`` API over a JSONL corpus, BM25, 127.0.0.1.

The API is the one MindSpeed-RL's and verl's search tools call (Search-R1's retrieval server):
request ``{"queries": [...], "topk": k, "return_scores": bool}``, answer ``{"result": [per
query: [{"document": {"id", "contents"}, "score": s}, ...]]}`` (with ``return_scores: false``
the documents themselves). The corpus is JSON lines ``{"id": ..., "contents": "Title\\ntext"}``.

Ranking is Okapi BM25 (k1 = 1.2, b = 0.75, Lucene's idf), written here with the standard
library: no BM25 package is among mindrl's dependencies. Tokens are lower-cased word
characters; ties keep corpus order.
"""

from __future__ import annotations

import heapq
import json
import logging
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mindrl.tools.http_service import EmbeddedService

logger = logging.getLogger(__name__)

_WORD = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class BM25Index:
    """An inverted index with BM25 scores; built once, read by many threads."""

    def __init__(
        self, documents: Sequence[dict[str, Any]], k1: float = 1.2, b: float = 0.75
    ) -> None:
        self.documents = list(documents)
        self.k1, self.b = k1, b
        self._postings: dict[str, list[tuple[int, int]]] = {}
        self._lengths: list[int] = []
        for index, document in enumerate(self.documents):
            counts = Counter(tokenize(str(document.get("contents", ""))))
            self._lengths.append(sum(counts.values()))
            for term, count in counts.items():
                self._postings.setdefault(term, []).append((index, count))
        self._mean_length = sum(self._lengths) / max(len(self._lengths), 1)

    def _idf(self, term: str) -> float:
        n = len(self._postings.get(term, ()))
        return math.log(1.0 + (len(self.documents) - n + 0.5) / (n + 0.5))

    def search(self, query: str, topk: int) -> list[tuple[int, float]]:
        """The ``topk`` best (document index, score), best first; documents scoring 0 left out."""
        scores: dict[int, float] = {}
        for term in set(tokenize(query)):
            idf = self._idf(term)
            for index, count in self._postings.get(term, ()):
                norm = self.k1 * (1 - self.b + self.b * self._lengths[index] / self._mean_length)
                scores[index] = scores.get(index, 0.0) + idf * count * (self.k1 + 1) / (
                    count + norm
                )
        return heapq.nsmallest(
            topk, ((i, s) for i, s in scores.items()), key=lambda x: (-x[1], x[0])
        )


def read_corpus(path: str | Path) -> list[dict[str, Any]]:
    """JSON lines with ``contents`` (and ``id``; the line number when missing)."""
    documents = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from exc
        if not isinstance(row, dict) or not isinstance(row.get("contents"), str):
            raise ValueError(f'{path}:{number}: expected {{"id": ..., "contents": "..."}}')
        documents.append({"id": str(row.get("id", number)), "contents": row["contents"]})
    if not documents:
        raise ValueError(f"{path}: the corpus has no documents")
    return documents


@dataclass
class RetrievalServer(EmbeddedService):
    """The ``/retrieve`` service over one corpus; ``start()`` binds 127.0.0.1."""

    path = "/retrieve"
    what = "retrieval"
    corpus_path: str | Path
    port: int = 0
    max_topk: int = 100
    index: BM25Index = field(init=False)

    def __post_init__(self) -> None:
        self.index = BM25Index(read_corpus(self.corpus_path))

    def start(self) -> RetrievalServer:
        self.serve({"service": "mindrl retrieval", "documents": len(self.index.documents)})
        logger.info(
            "embedded retrieval on 127.0.0.1:%d over %s (%d documents)",
            self.port,
            self.corpus_path,
            len(self.index.documents),
        )
        return self

    def handle(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return self.retrieve(request)

    def retrieve(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        queries = request.get("queries")
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            return 422, {"detail": "queries must be a list of strings"}
        topk = min(int(request.get("topk") or 3), self.max_topk)
        with_scores = bool(request.get("return_scores", False))
        result = []
        for query in queries:
            hits = self.index.search(query, topk)
            documents = [dict(self.index.documents[i]) for i, _ in hits]
            if with_scores:
                result.append([{"document": d, "score": s} for d, (_, s) in zip(documents, hits)])
            else:
                result.append(documents)
        return 200, {"result": result}


def main() -> None:
    """``python -m mindrl.tools.retrieval_server CORPUS.jsonl --port 8000``: serve until interrupted."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("corpus")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    RetrievalServer(args.corpus, port=args.port).start().serve_until_interrupted()


if __name__ == "__main__":
    main()
