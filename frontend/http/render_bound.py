"""A chat template's render bounded in time and size.

A chat template is a program (Jinja): one with two nested 99,999-step loops held the
gateway's event loop for minutes, and one that raised on every render (`range(10**9)`,
stopped by Jinja's sandbox) made every chat a 500 with a traceback. So a render runs with
a deadline: past RENDER_S a timer raises RenderTimeout inside the rendering thread (Jinja's
compiled template is Python code, which takes an exception raised from another thread at
its next bytecode), and its text may hold at most MAX_PROMPT_CHARS. Renders run off the
event loop (app.py hands them to the gateway's Offload thread), and a template that fails
a dry render is refused when the gateway starts (chat.py `ChatTemplate.load`).
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

RENDER_S = 2.0                 # a chat's render takes milliseconds; a loaded CI machine's, more
MAX_PROMPT_CHARS = 16 << 20    # past the largest frame a prompt can travel in


class RenderTimeout(Exception):
    """Raised inside a render that ran past its deadline."""


class TemplateRefused(ValueError):
    """The template fails a dry render: the gateway does not start with it."""


def bounded(render: Callable[[], str], seconds: float = RENDER_S) -> str:
    """render(), or RenderTimeout once it has run `seconds`; ValueError for a text past
    MAX_PROMPT_CHARS."""
    target, lock, state = threading.get_ident(), threading.Lock(), {"done": False}

    def interrupt() -> None:
        with lock:   # never after the render returned: `done` is set under the lock
            if not state["done"]:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target),
                                                           ctypes.py_object(RenderTimeout))

    timer = threading.Timer(seconds, interrupt)
    timer.daemon = True
    timer.start()
    try:
        try:
            text = render()
        finally:
            with lock:
                state["done"] = True
            timer.cancel()
    except RenderTimeout:
        raise RenderTimeout(f"the chat template ran past {seconds:g} s") from None
    if len(text) > MAX_PROMPT_CHARS:
        raise ValueError(f"the chat template wrote {len(text)} characters, over "
                         f"{MAX_PROMPT_CHARS}")
    return text
