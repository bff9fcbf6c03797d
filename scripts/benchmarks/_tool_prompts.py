"""The tool-call benchmark's pure parts (scripts/benchmarks/tool_calls.py): 64 tool prompts
(eight functions, eight questions each), the chat body each tool_choice mode sends, and the
scoring of a reply: a usable call is one whose arguments parse and are valid under the
function's schema as the request gave it.

Half the functions' schemas say nothing of `additionalProperties` (the shape that ran on to
max_tokens in issue 52); some have optional properties, enums, integers with bounds and a
nested object, as tools in the wild do.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import jsonschema

MODES = ("auto", "required", "named")
OFFERED = 3                 # functions offered per prompt: its own and two others
OPEN, CLOSE = "<tool_call>", "</tool_call>"   # Hermes' call tags (frontend/tool_parsers.py)


def _fn(name: str, description: str, properties: dict, required: list[str],
        closed: bool) -> dict:
    params = {"type": "object", "properties": properties, "required": required}
    if closed:
        params["additionalProperties"] = False
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": params}}


_S, _I = {"type": "string"}, {"type": "integer"}
FUNCTIONS = (
    _fn("get_weather", "Get the current weather in a city",
        {"city": _S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        ["city"], closed=False),
    _fn("search_web", "Search the web for a query", {"query": _S, "max_results":
        {"type": "integer", "minimum": 1, "maximum": 10}}, ["query"], closed=True),
    _fn("send_email", "Send an email", {"to": _S, "subject": _S, "body": _S},
        ["to", "subject", "body"], closed=False),
    _fn("convert_currency", "Convert an amount of money from one currency to another",
        {"amount": {"type": "number"}, "from_currency": _S, "to_currency": _S},
        ["amount", "from_currency", "to_currency"], closed=True),
    _fn("set_timer", "Set a timer", {"minutes": {"type": "integer", "minimum": 0},
                                     "label": _S}, ["minutes"], closed=False),
    _fn("get_stock_price", "Get the latest price of a stock", {"symbol": _S},
        ["symbol"], closed=True),
    _fn("translate_text", "Translate text into another language",
        {"text": _S, "target_language": _S}, ["text", "target_language"], closed=False),
    _fn("create_event", "Create a calendar event",
        {"title": _S, "date": _S, "location": {"type": "object", "properties": {
            "city": _S, "room": _S}, "required": ["city"]}}, ["title", "date"], closed=True),
)
QUESTIONS = {
    "get_weather": ["What's the weather in Paris?", "Is it raining in London right now?",
                    "How hot is it in Cairo today, in fahrenheit?", "Weather for Tokyo please.",
                    "Do I need a coat in Oslo today?", "What is the temperature in Madrid?",
                    "Tell me the weather in New York in celsius.", "How windy is it in Chicago?"],
    "search_web": ["Search the web for the tallest building in the world.",
                   "Find recent news about electric cars.", "Look up the recipe for pancakes.",
                   "Who won the last football world cup? Search for it.",
                   "Search for three articles on sleep and health.",
                   "Find the opening hours of the Louvre.", "Search: best hiking trails in Spain",
                   "Look up how tall a giraffe is."],
    "send_email": ["Email bob@example.com that the meeting moved to 3pm.",
                   "Send an email to alice@example.org saying thank you for the gift.",
                   "Write to team@example.com: the release is delayed to Friday.",
                   "Email my landlord at owner@example.net that the heater is broken.",
                   "Send mom@example.com a note that I will arrive on Sunday.",
                   "Tell hr@example.com by email that I am sick today.",
                   "Email sales@example.com asking for a price list.",
                   "Send an email to joe@example.com with subject Lunch, asking if he is free."],
    "convert_currency": ["Convert 100 US dollars to euros.", "How much is 50 GBP in JPY?",
                         "Change 20 euros into Swiss francs.", "What are 1000 yen in dollars?",
                         "Convert 75.5 CAD to USD.", "How many pounds is 300 euros?",
                         "Turn 12 dollars into Mexican pesos.", "Convert 5000 INR to EUR."],
    "set_timer": ["Set a timer for 10 minutes.", "Remind me in 25 minutes to check the oven.",
                  "Start a 5 minute timer for tea.", "Timer for one hour, label it workout.",
                  "Set a 3 minute timer for the eggs.", "Put a timer on for 45 minutes.",
                  "Wake me in 20 minutes.", "Set a timer of 90 minutes called movie."],
    "get_stock_price": ["What is Apple's stock price?", "Price of MSFT right now?",
                        "How is Tesla stock doing today?", "Get me the quote for AMZN.",
                        "What does one share of Google cost?", "Stock price of NVDA please.",
                        "Check the price of IBM shares.", "How much is Netflix stock?"],
    "translate_text": ["Translate 'good morning' into Spanish.", "How do you say thank you "
                       "in Japanese?", "Translate 'where is the station' to German.",
                       "Say 'I love books' in French.", "Translate 'cheers' into Italian.",
                       "What is 'happy birthday' in Portuguese?",
                       "Translate 'see you tomorrow' to Dutch.",
                       "Put 'the cat is sleeping' into Swedish."],
    "create_event": ["Create an event: dentist on 2025-03-04.",
                     "Add a meeting called Budget review on May 2 in Berlin, room 4.",
                     "Put my sister's wedding on June 14 in my calendar.",
                     "Schedule a team lunch on Friday in Rome.",
                     "Create a calendar entry for the conference on 2025-09-10 in Lisbon.",
                     "Add 'call the bank' to my calendar for tomorrow.",
                     "Make an event for the piano recital on December 1st.",
                     "Book a calendar event: yoga class on Monday in Paris, room B."],
}


@dataclass(frozen=True)
class Case:
    question: str
    tool: str            # the function the question asks for
    tools: tuple         # the functions offered (the body's `tools`)


def cases(n: int = 64) -> list[Case]:
    """The first `n` prompts: question k of function k % 8, offered with two others, the
    order rotated so that the asked-for function is not always first."""
    by_name = {f["function"]["name"]: f for f in FUNCTIONS}
    names = list(by_name)
    out = []
    for k in range(n):
        i = k % len(names)
        picks = [names[(i + d) % len(names)] for d in (0, 1, 3)[:OFFERED]]
        picks = picks[k % OFFERED:] + picks[:k % OFFERED]
        q = QUESTIONS[names[i]][(k // len(names)) % len(QUESTIONS[names[i]])]
        out.append(Case(q, names[i], tuple(by_name[p] for p in picks)))
    return out


def body(case: Case, mode: str, max_tokens: int) -> dict:
    """The chat body of `case` under tool_choice `mode` (parallel_tool_calls left to its
    default, on, as a client that does not set it sends)."""
    choice = ({"type": "function", "function": {"name": case.tool}} if mode == "named"
              else mode)
    return {"model": "bench", "messages": [{"role": "user", "content": case.question}],
            "tools": list(case.tools), "tool_choice": choice, "max_tokens": max_tokens,
            "temperature": 0}


def score(case: Case, status: int, reply) -> dict:
    """One reply's marks: ok (finish_reason tool_calls and every call usable), usable,
    tool_calls_finish, right_tool (a call names the asked-for function), leaked (half a call
    in content: a `<tool_call>` not closed after it), the finish reason and the number of
    calls."""
    if status != 200 or not isinstance(reply, dict):
        return {"error": True, "ok": False, "usable": False, "tool_calls_finish": False,
                "right_tool": False, "leaked": False, "finish_reason": None, "calls": 0}
    choice = reply["choices"][0]
    message = choice["message"]
    calls = message.get("tool_calls") or []
    schemas = {t["function"]["name"]: t["function"].get("parameters") for t in case.tools}
    usable = bool(calls) and all(_usable(c, schemas) for c in calls)
    finish = choice["finish_reason"]
    return {"error": False, "ok": usable and finish == "tool_calls", "usable": usable,
            "tool_calls_finish": finish == "tool_calls",
            "right_tool": any(c["function"]["name"] == case.tool for c in calls),
            "leaked": _half_call(message.get("content") or ""), "finish_reason": finish,
            "calls": len(calls)}


def _half_call(content: str) -> bool:
    """A call's opening tag with no closing one after it (a closed block that is not a
    call is the model's text, as the parser leaves it)."""
    return content.rfind(OPEN) > content.rfind(CLOSE)


def _usable(call: dict, schemas: dict) -> bool:
    name = call["function"]["name"]
    if name not in schemas:
        return False
    try:
        args = json.loads(call["function"]["arguments"])
    except ValueError:
        return False
    schema = schemas[name] or {"type": "object", "properties": {},
                               "additionalProperties": False}
    return isinstance(args, dict) and jsonschema.Draft202012Validator(schema).is_valid(args)


def summarize(marks: list[dict]) -> dict:
    """A mode's shares over its replies (0 replies: shares None)."""
    n = len(marks)

    def share(key: str) -> float | None:
        return sum(m[key] for m in marks) / n if n else None
    return {"requests": n, "ok_share": share("ok"), "usable_share": share("usable"),
            "tool_calls_finish_share": share("tool_calls_finish"),
            "right_tool_share": share("right_tool"), "leaked": sum(m["leaked"] for m in marks),
            "errors": sum(m["error"] for m in marks),
            "calls_per_reply": sum(m["calls"] for m in marks) / n if n else None,
            "finish_reasons": dict(Counter(str(m["finish_reason"]) for m in marks))}
