"""The served tokenizer as the gateway uses it: token strings for logprobs, the prompt text
for echo, and the /tokenize, /detokenize and /tokenizer_info bodies (vLLM's shapes).

Tokenizing is what the engine does to a completion prompt: `tokenizer(text)` with the
request's add_special_tokens (frontend/tokenizer.py). A text of more than max_model_len
tokens is refused as vLLM refuses it, and one whose bound (frontend/token_bound.py) already
says so is refused before it is tokenized. The gateway runs these off its loop (offload.py).
"""
from __future__ import annotations

from frontend.http import fields
from frontend.http.allowed import check_known
from frontend.http.chat_options import FIELDS as CHAT_OPTIONS, chat_options
from frontend.http.chat_special import ChatPrompt
from frontend.http.errors import ApiError
from frontend.http.fields import BOOL, IDS, STR, get
from frontend.token_bound import TokenBound

TOKENIZE = frozenset({"model", "prompt", "messages", "add_special_tokens",
                      "return_token_strs", *CHAT_OPTIONS})
DETOKENIZE = frozenset({"model", "tokens"})


class Tokens:
    def __init__(self, hf):
        self._hf = hf
        self._pieces: dict[int, str] = {}
        self.bound = TokenBound.of(hf)

    def piece(self, token_id: int) -> str:
        """The token decoded alone (a part of a multi-byte character decodes to U+FFFD)."""
        s = self._pieces.get(token_id)
        if s is None:
            s = self._pieces[token_id] = self._hf.decode([token_id], skip_special_tokens=False)
        return s

    def decode(self, ids: list[int], param: str = "tokens") -> str:
        """`param`: the body field the ids came from, named by the 400 for a bad id."""
        bad = next((t for t in ids if not 0 <= t < len(self._hf)), None)
        if bad is not None:
            raise ApiError(400, f"token {bad} is outside the vocabulary [0, {len(self._hf)})",
                           param)
        return self._hf.decode(ids, skip_special_tokens=False)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self._hf(text, add_special_tokens=add_special_tokens).input_ids)

    def token_strs(self, ids: list[int]) -> list[str]:
        return list(self._hf.convert_ids_to_tokens(ids))


def tokenizer_info(hf, chat_template: str) -> dict:
    """vLLM's /tokenizer_info: the tokenizer's configuration (its init_kwargs, as
    tokenizer_config.json holds them, without file paths), its class, and the chat template
    the gateway renders chats with. lm-eval's remote tokenizer reads eos_token, bos_token,
    pad_token and chat_template from it."""
    config = {k: v for k, v in (getattr(hf, "init_kwargs", None) or {}).items()
              if k not in ("vocab_file", "merges_file")}
    for name in ("eos_token", "bos_token", "pad_token", "unk_token"):
        config.setdefault(name, getattr(hf, name, None))
    config = _plain(config)
    config["tokenizer_class"] = type(hf).__name__
    config["chat_template"] = chat_template
    return config


def _plain(obj):
    """JSON's types: a special token (AddedToken) as its text, other objects as str."""
    if hasattr(obj, "content"):
        return obj.content
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


def tokenize(tokens: Tokens, body: dict, chat, max_model_len: int) -> dict:
    """`chat`: the ChatTemplate; messages are tokenized as a chat's prompt is (a user
    string's special tokens as text, chat_special.py)."""
    check_known(body, TOKENIZE)
    get(body, "model", STR)
    if ("prompt" in body) == ("messages" in body):
        raise ApiError(400, "give exactly one of prompt and messages", "prompt")
    if "prompt" in body:
        prompt, special = ChatPrompt(get(body, "prompt", STR, "")), True
    else:
        messages = fields.messages(body["messages"])
        prompt = chat.prompt(messages, chat_options(body, messages))
        special = False  # the template holds the special tokens
    param = "prompt" if "prompt" in body else "messages"
    _fits(tokens.bound.at_least(prompt.text), "at least ", max_model_len, param)
    add = get(body, "add_special_tokens", BOOL, special)
    ids = chat.ids(prompt, add) if prompt.forged else tokens.encode(prompt.text, add)
    _fits(len(ids), "", max_model_len, param)
    strs = tokens.token_strs(ids) if get(body, "return_token_strs", BOOL, False) else None
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids,
            "token_strs": strs}


def _fits(count: int, how: str, max_model_len: int, param: str) -> None:
    if count > max_model_len:
        raise ApiError(400, f"{param} is {how}{count} tokens, more than max_model_len "
                            f"{max_model_len}", param)


def detokenize(tokens: Tokens, body: dict) -> dict:
    check_known(body, DETOKENIZE)
    get(body, "model", STR)
    return {"prompt": tokens.decode(get(body, "tokens", IDS, []))}
