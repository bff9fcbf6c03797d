"""frontend/plain_json.py: a nested field is plain JSON within the depth bound, or a 400
naming it."""
from __future__ import annotations

import math

import pytest

from frontend.plain_json import check_plain
from frontend.validate import InvalidField


def nested(depth: int):
    out = None
    for i in range(depth):
        out = {"a": out} if i % 2 else [out]
    return out


@pytest.mark.parametrize("value", [None, 1, 2.5, "s", True, [], {}, {"a": [1, {"b": None}]},
                                   nested(64)])
def test_json_within_the_bound_passes(value):
    check_plain(value, "f")


@pytest.mark.parametrize("value,words", [
    (b"x", "bytes value"), ({"a": [b"x"]}, "bytes value"), ({b"k": 1, "k": 2}, "key"),
    ({1: 2}, "key"), (nested(65), "deeper than 64"), (nested(100_000), "deeper than 64"),
    ({"x": math.nan}, "not a JSON number"), ([math.inf], "not a JSON number"),
    ({"s": {1, 2}}, "set value"),
])
def test_what_json_cannot_hold_is_refused_naming_the_field(value, words):
    with pytest.raises(InvalidField) as e:
        check_plain(value, "response_format")
    assert e.value.field == "response_format" and words in str(e.value)
