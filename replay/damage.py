"""Typed reading of a step log's values: each reader returns the value when it has the
type it must have, and raises DamagedLog naming where it was and what was wrong."""
from __future__ import annotations

import json
import math
from operator import itemgetter

from core.logrecords import MAX_CLOCK


class DamagedLog(Exception):
    """A file that cannot be read as a step log, or one whose contents are damaged; str()
    is one line saying which file, where and why (scripts/replay exits 2 with it)."""


def _show(v) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def integer(v, where: str, minimum: int | None = None, maximum: int | None = None) -> int:
    if type(v) is not int:
        raise DamagedLog(f"{where} is {_show(v)}, not an integer")
    if minimum is not None and v < minimum:
        raise DamagedLog(f"{where} is {v}, less than {minimum}")
    if maximum is not None and v > maximum:
        raise DamagedLog(f"{where} is {_show(v)}, more than {maximum}")
    return v


def number(v, where: str) -> float:
    """A finite number: the engine logs no inf or NaN (clocks, bounded sampling values)."""
    if type(v) not in (int, float) or (type(v) is float and not math.isfinite(v)):
        raise DamagedLog(f"{where} is {_show(v)}, not a finite number")
    return v


def clock(v, where: str) -> float:
    """A clock column's value (core/logrecords.py)."""
    if not 0 <= number(v, where) < MAX_CLOCK:
        raise DamagedLog(f"{where} is {_show(v)}, outside [0, 2**32)")
    return v


def text(v, where: str) -> str:
    if type(v) is not str:
        raise DamagedLog(f"{where} is {_show(v)}, not text")
    return v


def boolean(v, where: str) -> bool:
    if type(v) is not bool:
        raise DamagedLog(f"{where} is {_show(v)}, not true or false")
    return v


def one_of(v, where: str, choices) -> str:
    """One of a set of names."""
    if type(v) is not str or v not in choices:
        raise DamagedLog(f"{where} is {_show(v)}, not one of {', '.join(sorted(choices))}")
    return v


def optional(read, v, where: str, *args):
    return None if v is None else read(v, where, *args)


def parsed(v, where: str):
    """The value of a JSON column."""
    if type(v) is not str:
        raise DamagedLog(f"{where} is {_show(v)}, not JSON text")
    try:
        return json.loads(v)
    except ValueError as e:
        raise DamagedLog(f"{where} is not JSON ({e})") from None
    except RecursionError:  # no column the engine writes nests more than three deep
        raise DamagedLog(f"{where} is JSON nested too deeply") from None


def mapping(v, where: str, required=()) -> dict:
    if type(v) is not dict:
        raise DamagedLog(f"{where} is {_show(v)}, not an object")
    for key in required:
        if key not in v:
            raise DamagedLog(f"{where} has no {key!r}")
    return v


def int_list(v, where: str, minimum: int | None = None,
             maximum: int | None = None) -> list[int]:
    if type(v) is not list:
        raise DamagedLog(f"{where} is {_show(v)}, not a list")
    if not set(map(type, v)) <= {int}:  # the usual case checked at C speed
        for x in v:
            integer(x, f"{where} item")
    if v and ((minimum is not None and min(v) < minimum)
              or (maximum is not None and max(v) > maximum)):
        for x in v:
            integer(x, f"{where} item", minimum, maximum)
    return v


def rows(v, where: str, kinds: tuple) -> list[list]:
    """A list of fixed-length rows, e.g. [[id, token, stop], ...] with kinds (int, int, bool)."""
    if type(v) is not list:
        raise DamagedLog(f"{where} is {_show(v)}, not a list")
    # Column by column: a few allocations per call, not one per row (they wake the GC).
    if not v or (set(map(type, v)) == {list} and set(map(len, v)) == {len(kinds)} and all(
            set(map(type, col)) == {k} for col, k in zip(zip(*v), kinds))):
        return v
    bad = next(row for row in v if type(row) is not list or tuple(map(type, row)) != kinds)
    names = ", ".join(k.__name__ for k in kinds)
    raise DamagedLog(f"{where} holds {_show(bad)}, not [{names}]")


def within(v: list[list], where: str, column: int, name: str, lo: int, hi: int) -> None:
    """Every row's value in `column` (named `name`) in [lo, hi]; the rows' types are
    rows()'s to check first."""
    if v:
        col = list(map(itemgetter(column), v))
        if min(col) < lo or max(col) > hi:
            bad = next(row for row in v if not lo <= row[column] <= hi)
            raise DamagedLog(f"{where} holds {_show(bad)}, its {name} outside [{lo}, {hi}]")
