"""Waiting in tests: poll a condition until a deadline, never sleep for a guessed time.

`wait_until` raises naming what it waited for; `poll` returns None instead, for a test
that asserts something does not happen within a time. `until` is `wait_until` on a loop.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable, TypeVar

T = TypeVar("T")
POLL_S = 0.02


def poll(pred: Callable[[], T], timeout: float, every: float = POLL_S) -> T | None:
    """pred()'s first truthy value, asked every `every` s for `timeout` s (at least once);
    None if it never came."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(every)


def wait_until(pred: Callable[[], T], timeout: float = 10.0, what: str = "the condition",
               every: float = POLL_S) -> T:
    """pred()'s first truthy value; AssertionError naming `what` after `timeout` s."""
    value = poll(pred, timeout, every)
    if not value:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")
    return value


async def until(pred: Callable[[], T], timeout: float = 10.0, what: str = "the condition",
                every: float = POLL_S) -> T:
    """wait_until for a coroutine: the loop runs on between the polls."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (value := pred()):
        if asyncio.get_running_loop().time() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(every)
    return value
