"""langchain-openai's ChatOpenAI flows against the gateway, run in its tool venv: one flow a run.

`python langchain_flows.py BASE_URL FLOW` prints one JSON object: what the flow got back
(text, parsed objects, tool calls with the tool schemas sent), for tests/clients/ to check. It
imports nothing of the project: it runs in the tool venv as an app would (toolenv.py).
"""
from __future__ import annotations

import json
import sys
from typing import Literal

from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_openai import ChatOpenAI, OpenAIEmbeddings
from pydantic import BaseModel, Field

MODEL = "smollm2"
ASK = "What is the capital of France?"
WEATHER_ASK = "What's the weather in Paris?"
DOCS = ["The capital of France is Paris.", "Cats sleep most of the day.",
        "The capital of France is Paris."]   # the first and last the same text
PERSON_ASK = ("Alice is 30 years old. Reply with a JSON object with her name (key \"name\") "
              "and age (key \"age\").")


class Person(BaseModel):
    """A person's name and age."""
    name: str = Field(description="the person's name")
    age: int = Field(description="the person's age in years")


@tool
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """Get the current weather in a city."""
    return f"sunny in {city}"


@tool
def set_timer(minutes: int) -> str:
    """Set a timer for a number of minutes."""
    return f"timer set for {minutes} minutes"


TOOLS = [get_weather, set_timer]


def chat(base_url: str, max_tokens: int = 256, **extra) -> ChatOpenAI:
    return ChatOpenAI(model=MODEL, base_url=base_url, api_key="unused", temperature=0,
                      max_tokens=max_tokens, max_retries=0, timeout=300, stream_usage=True,
                      **extra)


def message(m: AIMessage) -> dict:
    """What a reply holds: its text, its parsed calls and those langchain could not parse."""
    return {"content": m.text, "tool_calls": [{"name": c["name"], "args": c["args"]}
                                              for c in m.tool_calls],
            "invalid_tool_calls": m.invalid_tool_calls,
            "finish_reason": m.response_metadata.get("finish_reason"),
            "status": m.response_metadata.get("status"), "usage": m.usage_metadata}


def streamed(chunks) -> dict:
    """The chunks summed as langchain sums them, and how many came."""
    chunks = list(chunks)
    whole = chunks[0]
    for c in chunks[1:]:
        whole += c
    return {**message(whole), "chunks": len(chunks)}


def invoke(base_url: str) -> dict:
    return message(chat(base_url, 24).invoke(ASK))


def stream(base_url: str) -> dict:
    return streamed(chat(base_url, 24).stream(ASK))


def structured(method: str):
    def flow(base_url: str) -> dict:
        llm = chat(base_url).with_structured_output(Person, method=method, include_raw=True)
        out = llm.invoke(PERSON_ASK)
        parsed = out["parsed"]
        return {"parsed": parsed.model_dump() if parsed is not None else None,
                "parsing_error": repr(out["parsing_error"]) if out["parsing_error"] else None,
                "raw": message(out["raw"]), "schema": Person.model_json_schema()}
    return flow


def with_tools(tool_choice, stream_it: bool = False):
    def flow(base_url: str) -> dict:
        # auto mostly answers in text on this question: 160 tokens hold a call, not a ramble
        llm = chat(base_url, 512 if tool_choice else 160).bind_tools(TOOLS,
                                                                    tool_choice=tool_choice)
        out = streamed(llm.stream(WEATHER_ASK)) if stream_it else message(llm.invoke(WEATHER_ASK))
        schemas = {t.name: convert_to_openai_tool(t)["function"]["parameters"] for t in TOOLS}
        return {**out, "schemas": schemas}
    return flow


def responses_invoke(base_url: str) -> dict:
    return message(chat(base_url, 24, use_responses_api=True).invoke(ASK))


def responses_stream(base_url: str) -> dict:
    return streamed(chat(base_url, 24, use_responses_api=True).stream(ASK))


def embeddings(base_url: str) -> dict:
    """OpenAIEmbeddings as RAG stacks make it for a server other than OpenAI's: text sent as
    text (no tiktoken ids); the SDK under it asks for base64 and decodes it."""
    emb = OpenAIEmbeddings(model=MODEL, base_url=base_url, api_key="unused", max_retries=0,
                           check_embedding_ctx_length=False, timeout=300)
    return {"documents": emb.embed_documents(DOCS), "query": emb.embed_query(DOCS[0])}


FLOWS = {
    "invoke": invoke, "stream": stream,
    **{f"structured_{m}": structured(m) for m in ("json_schema", "function_calling", "json_mode")},
    "tools_named": with_tools("get_weather"), "tools_any": with_tools("any"),
    "tools_required": with_tools("required"), "tools_auto": with_tools(None),
    "tools_named_stream": with_tools("get_weather", True),
    "tools_required_stream": with_tools("required", True),
    "tools_auto_stream": with_tools(None, True),
    "responses_invoke": responses_invoke, "responses_stream": responses_stream,
    "embeddings": embeddings,
}

if __name__ == "__main__":
    print(json.dumps(FLOWS[sys.argv[2]](sys.argv[1]), default=str))
