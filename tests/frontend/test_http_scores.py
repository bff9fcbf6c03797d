"""POST /v1/score and /v1/rerank (frontend/http/scores.py) against a real group on `tiny`
(the flags of test_http_extras.py, so the modules share a group): each score equals the dot
product of /v1/embeddings' vectors for the same texts in the 1:1, 1:N and N:N shapes, rerank
sorts and cuts at top_n, and every bad input is a 400 naming its field while the engine
serves on."""
from __future__ import annotations

import pytest

from frontend.http.embeddings import MAX_INPUTS
from tests.frontend.test_http import http
from tests.frontend.test_http_extras import GROUP_ARGS, NAME  # noqa: F401  (one group)

DOCS = ["the sea is deep and blue", "a recipe for bread", "waves on the ocean", "tax forms"]


def post(group, route: str, body: dict):
    status, _, reply = http("POST", group.http + route, {"model": NAME, **body})
    return status, reply


@pytest.fixture(scope="module")
def vectors(group) -> dict[str, list[float]]:
    """/v1/embeddings' vector of every text these tests score."""
    texts = ["what is the ocean like?", "hello world", "hi there", *DOCS]
    status, reply = post(group, "/v1/embeddings", {"input": texts})
    assert status == 200, reply
    return {t: d["embedding"] for t, d in zip(texts, reply["data"])}


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


@pytest.mark.parametrize("text_1, text_2", [
    ("hello world", "hi there"),                                    # 1:1
    ("what is the ocean like?", DOCS),                              # 1:N
    (["what is the ocean like?"], DOCS[:2]),                        # 1:N, text_1 a list of one
    (["hello world", "hi there", DOCS[0]], DOCS[1:]),               # N:N
])
def test_a_score_is_the_dot_product_of_the_embeddings(group, vectors, text_1, text_2):
    status, reply = post(group, "/v1/score", {"text_1": text_1, "text_2": text_2})
    assert status == 200, reply
    left = [text_1] if isinstance(text_1, str) else text_1
    right = [text_2] if isinstance(text_2, str) else text_2
    wanted = list(zip(left * len(right) if len(left) == 1 else left, right))
    assert reply["object"] == "list" and reply["model"] == NAME
    assert reply["id"].startswith("score-") and isinstance(reply["created"], int)
    assert [d["index"] for d in reply["data"]] == list(range(len(wanted)))
    assert {d["object"] for d in reply["data"]} == {"score"}
    for d, (a, b) in zip(reply["data"], wanted):
        assert d["score"] == pytest.approx(dot(vectors[a], vectors[b]), abs=1e-6)
    usage = reply["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] >= len(set(left + right))


def test_rerank_sorts_by_relevance_and_keeps_top_n(group, vectors):
    query = "what is the ocean like?"
    want = sorted(range(len(DOCS)), key=lambda i: -dot(vectors[query], vectors[DOCS[i]]))
    status, reply = post(group, "/v1/rerank", {"query": query, "documents": DOCS})
    assert status == 200, reply
    assert reply["id"].startswith("rerank-") and reply["model"] == NAME
    assert reply["usage"]["total_tokens"] > len(DOCS)
    got = reply["results"]
    assert [r["index"] for r in got] == want
    scores = [r["relevance_score"] for r in got]
    assert scores == sorted(scores, reverse=True)
    for r in got:
        assert r["document"] == {"text": DOCS[r["index"]]}
        assert r["relevance_score"] == pytest.approx(
            dot(vectors[query], vectors[DOCS[r["index"]]]), abs=1e-6)
    status, top = post(group, "/v1/rerank", {"query": query, "documents": DOCS, "top_n": 2})
    assert status == 200 and [r["index"] for r in top["results"]] == want[:2]
    status, more = post(group, "/v1/rerank", {"query": query, "documents": DOCS, "top_n": 99})
    assert status == 200 and len(more["results"]) == len(DOCS)


TOO_MANY = ["d"] * (MAX_INPUTS + 1)


@pytest.mark.parametrize("route, body, field", [
    ("/v1/score", {"text_2": "a"}, "text_1"),
    ("/v1/score", {"text_1": "a"}, "text_2"),
    ("/v1/score", {"text_1": "", "text_2": "a"}, "text_1"),
    ("/v1/score", {"text_1": "a", "text_2": []}, "text_2"),
    ("/v1/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_2"),
    ("/v1/score", {"text_1": ["a", "b"], "text_2": "c"}, "text_2"),
    ("/v1/score", {"text_1": "a", "text_2": ["b", 5]}, "text_2"),
    ("/v1/score", {"text_1": [["a"]], "text_2": "b"}, "text_1"),
    ("/v1/score", {"text_1": "a", "text_2": TOO_MANY}, "text_2"),
    ("/v1/score", {"text_1": "a", "text_2": ["b", "word " * 5000]}, "text_2"),
    ("/v1/score", {"text_1": "word " * 5000, "text_2": "b"}, "text_1"),
    ("/v1/rerank", {"query": "word " * 5000, "documents": ["a"]}, "query"),
    ("/v1/rerank", {"documents": ["a"]}, "query"),
    ("/v1/rerank", {"query": ["a"], "documents": ["a"]}, "query"),
    ("/v1/rerank", {"query": "q"}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": "a"}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": ["a", None]}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": ["a", ""]}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": TOO_MANY}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 1.5}, "top_n"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": True}, "top_n"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "user": 3}, "user"),
])
def test_bad_input_is_a_400_naming_the_field_and_the_engine_serves_on(group, route, body, field):
    status, reply = post(group, route, body)
    assert status == 400, reply
    assert reply["error"]["param"] == field
    status, reply = post(group, "/v1/rerank", {"query": "still", "documents": ["here"]})
    assert status == 200 and len(reply["results"]) == 1
