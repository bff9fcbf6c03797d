"""The grammar of `response_format: json_object` (docs/structured.md, "The fields"): any JSON
object, compact, within bounds, so that every sentence is finite and a model cannot count
inside an array, nest, or write one string until max_tokens: the object closes, then only
EOS may follow.

The bounds (a reply past them is not what json_object is for):
nesting MAX_DEPTH objects/arrays deep, MAX_MEMBERS members in an object or items in an
array, strings MAX_STRING characters (keys MAX_KEY), numbers at most 16 digits before and
after the point and a 3-digit exponent.
"""
from __future__ import annotations

MAX_DEPTH = 6
MAX_MEMBERS = 32
MAX_STRING = 1024
MAX_KEY = 64

# a string's character; `/` escaped, as a Lark regex ends at a bare one
_CHAR = r'([^"\\\x00-\x1f]|\\["\\\/bfnrt]|\\u[0-9a-fA-F]{4})'
_TERMINALS = f"""\
STRING: /"{_CHAR}{{0,{MAX_STRING}}}"/
KEY: /"{_CHAR}{{0,{MAX_KEY}}}"/
NUMBER: /-?(0|[1-9][0-9]{{0,15}})(\\.[0-9]{{1,16}})?([eE][+-]?[0-9]{{1,3}})?/
"""


def object_grammar(depth: int = MAX_DEPTH, members: int = MAX_MEMBERS) -> str:
    """Lark text: a JSON object at most `depth` containers deep, each at most `members`
    long. One rule set per level, so the depth is counted by the grammar itself."""
    more = f"{{0,{members - 1}}}"
    lines = ["start: object1"]
    for d in range(1, depth + 1):
        inner = f"value{d + 1}" if d < depth else "scalar"
        lines += [f'object{d}: "{{" (KEY ":" {inner} ("," KEY ":" {inner}){more})? "}}"',
                  f'array{d}: "[" ({inner} ("," {inner}){more})? "]"']
        if d < depth:
            lines.append(f"value{d + 1}: scalar | object{d + 1} | array{d + 1}")
    lines.append('scalar: STRING | NUMBER | "true" | "false" | "null"')
    return "\n".join(lines) + "\n" + _TERMINALS


OBJECT_GRAMMAR = object_grammar()
