"""litellm's completion flows against the gateway, run in its tool venv: one flow a run.

`python litellm_flows.py BASE_URL FLOW` prints one JSON object: the reply's text, tool calls
(arguments as litellm hands them, a JSON string), finish reason, and the schemas sent, for
tests/clients/ to check. The gateway is an "openai/" model to litellm, as its docs say to
reach an OpenAI-compatible server; it imports nothing of the project (toolenv.py).
"""
from __future__ import annotations

import asyncio
import json
import sys

import litellm

litellm.suppress_debug_info = True   # its "Provider List" notes on an unpriced model
MODEL = "openai/smollm2"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER_ASK = [{"role": "user", "content": "What's the weather in Paris?"}]
DOCS = ["The capital of France is Paris.", "Cats sleep most of the day.",
        "The capital of France is Paris."]   # the first and last the same text
PERSON_ASK = [{"role": "user", "content": "Alice is 30 years old. Reply with a JSON object "
                                          "with her name and age."}]
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"]}
TIMER = {"type": "object", "properties": {"minutes": {"type": "integer"}},
         "required": ["minutes"]}
SCHEMAS = {"get_weather": WEATHER, "set_timer": TIMER}
TOOLS = [{"type": "function", "function": {"name": name, "description": name.replace("_", " "),
                                           "parameters": schema}}
         for name, schema in SCHEMAS.items()]
PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def ask(base_url: str, messages: list, max_tokens: int = 256, **extra):
    return litellm.completion(model=MODEL, api_base=base_url, api_key="unused",
                              messages=messages, max_tokens=max_tokens, temperature=0,
                              num_retries=0, timeout=300, **extra)


def choice(reply) -> dict:
    c = reply.choices[0]
    calls = c.message.tool_calls or []
    return {"content": c.message.content, "finish_reason": c.finish_reason,
            "tool_calls": [{"name": t.function.name, "arguments": t.function.arguments}
                           for t in calls],
            "usage": reply.usage.model_dump() if getattr(reply, "usage", None) else None}


def streamed(messages: list, chunks) -> dict:
    """The chunks rebuilt into one reply by litellm's own stream_chunk_builder."""
    chunks = list(chunks)
    return {**choice(litellm.stream_chunk_builder(chunks, messages=messages)),
            "chunks": len(chunks)}


def with_tools(tool_choice, stream: bool = False):
    def flow(base_url: str) -> dict:
        reply = ask(base_url, WEATHER_ASK, 512, tools=TOOLS, tool_choice=tool_choice,
                    stream=stream)
        out = streamed(WEATHER_ASK, reply) if stream else choice(reply)
        return {**out, "schemas": SCHEMAS}
    return flow


def json_schema(base_url: str) -> dict:
    fmt = {"type": "json_schema",
           "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    return {**choice(ask(base_url, PERSON_ASK, response_format=fmt)), "schema": PERSON}


def stream(base_url: str) -> dict:
    return streamed(ASK, ask(base_url, ASK, 24, stream=True,
                             stream_options={"include_usage": True}))


def acompletion(base_url: str) -> dict:
    async def both():
        """Two at once on one event loop, as an async app sends them."""
        return await asyncio.gather(*(litellm.acompletion(
            model=MODEL, api_base=base_url, api_key="unused", messages=ASK, max_tokens=24,
            temperature=0, num_retries=0, timeout=300) for _ in range(2)))
    return {"replies": [choice(r) for r in asyncio.run(both())]}


def embedding(base_url: str) -> dict:
    """litellm.embedding on a list and on one string: the vectors in input order."""
    def vectors(text) -> list:
        reply = litellm.embedding(model=MODEL, api_base=base_url, api_key="unused", input=text,
                                  timeout=300)
        return [d["embedding"] for d in reply.data]
    return {"documents": vectors(DOCS), "query": vectors(DOCS[0])[0]}


FLOWS = {
    "tools_named": with_tools({"type": "function", "function": {"name": "get_weather"}}),
    "tools_required": with_tools("required"),
    "tools_required_stream": with_tools("required", True),
    "json_schema": json_schema, "stream": stream, "acompletion": acompletion,
    "embedding": embedding,
}

if __name__ == "__main__":
    print(json.dumps(FLOWS[sys.argv[2]](sys.argv[1]), default=str))
