"""The fixed token heuristic of reference §0 (``ctx.tokenMeter``'s pricing).

Lengths are UTF-16 code units, as in JavaScript, so a string prices the same here as
in the TypeScript original: a character outside the BMP counts 2. Every price is
``ceil(len/4)`` plus a fixed overhead of 4 per priced unit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import orjson

from harness.session import FrozenDict, FrozenList, JsonValue, raw_of

_OVERHEAD = 4


def raw(value: object) -> Any:
    """The raw tree behind a frozen view, or ``value`` itself (read it, never mutate it)."""
    return raw_of(cast("JsonValue", value))


def utf16_len(text: str) -> int:
    """The JavaScript ``length`` of ``text`` (UTF-16 code units)."""
    if text.isascii():
        return len(text)  # the common case, without an encode
    # surrogatepass: a lone surrogate is one code unit in JS; never raise on one.
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _quarter(text: str) -> int:
    return (utf16_len(text) + 3) // 4  # ceil(len / 4) in integers


def _json_default(value: object) -> Any:
    # Frozen views may sit inside plain containers a caller built.
    if type(value) is FrozenDict or type(value) is FrozenList:
        return raw_of(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def _js_numbers(value: Any) -> Any:
    """``value`` with every integral float below 1e21 as an ``int`` (a copy only where
    one is found): ``JSON.stringify`` writes ``1.0`` as ``1`` and ``1e16`` in full,
    orjson writes ``1.0`` and ``1e+16``. Depth is bounded by the session's storable
    depth, so the recursion is too."""
    value = raw(value)
    t = type(value)
    if t is float:
        return int(value) if value.is_integer() and abs(value) < 1e21 else value
    if t is dict:
        items = {k: _js_numbers(v) for k, v in value.items()}
        return value if all(items[k] is v for k, v in value.items()) else items
    if t is list or t is tuple:
        out = [_js_numbers(v) for v in value]
        return value if all(a is b for a, b in zip(out, value, strict=True)) else out
    return value


def json_text(value: object) -> str:
    """Compact JSON with keys in insertion order, like ``JSON.stringify`` (numbers
    included: an integral float is written as an integer, as JavaScript does)."""
    tree = raw(value)
    text = orjson.dumps(tree, default=_json_default)
    # orjson writes an integral float as "X.0" (or "-0.0") or, from 1e16, "Xe+N": only
    # then can a number differ from JavaScript's; anything else needs no walk.
    if b".0" in text or b"e+" in text:
        text = orjson.dumps(_js_numbers(tree), default=_json_default)
    return text.decode()


def _unknown(block: object) -> int:
    return _OVERHEAD + _quarter(json_text(block))


def estimate_blocks(blocks: object) -> int:
    """The summed price of a list of content blocks (0 for a non-list).

    Iterative: a tool-result's nested content is pushed on a stack rather than
    recursed into, so hostile nesting cannot exhaust the Python stack.
    """
    total = 0
    stack: list[Any] = [raw(blocks)]
    while stack:
        items = stack.pop()
        if type(items) is not list and type(items) is not tuple:
            continue
        for item in items:
            block = raw(item)
            if type(block) is not dict:
                total += _unknown(block)
                continue
            kind = block.get("type")
            if kind == "text" or kind == "reasoning":
                text = block.get("text")
                if type(text) is str:
                    total += _quarter(text) + _OVERHEAD
                    continue
            elif kind == "tool-call":
                name, args = block.get("name"), block.get("arguments")
                if type(name) is str and type(args) is str:
                    total += _quarter(name) + _quarter(args) + _OVERHEAD
                    continue
            elif kind == "tool-result":
                total += _OVERHEAD
                stack.append(raw(block.get("content")))
                continue
            # An unknown type, or a known type whose fields are not the expected
            # strings, is priced by its JSON (the reference's unknown-block rule).
            total += _unknown(block)
    return total


def estimate_message(message: object) -> int:
    """One message: the sum of its content blocks, plus 4."""
    tree = raw(message)
    content = tree.get("content") if type(tree) is dict else None
    return estimate_blocks(content) + _OVERHEAD


def estimate_system(text: str) -> int:
    """A system prompt: ``ceil(len/4) + 4``."""
    return _quarter(text) + _OVERHEAD


def estimate_tools(specs: Sequence[object] | None) -> int:
    """Tool specs: ``ceil(len(JSON of the list)/4) + 4``, or 0 when there are none."""
    if not specs:
        return 0
    return _quarter(json_text(list(specs))) + _OVERHEAD


def estimate_header(header: object) -> int:
    """A request header: its system prompt (when non-empty) plus its tools."""
    tree = raw(header)
    if type(tree) is not dict:
        return 0
    total = 0
    system = tree.get("system")
    if type(system) is str and system:
        total += estimate_system(system)
    tools = tree.get("tools")
    if type(tools) is list or type(tools) is tuple:
        total += estimate_tools(tools)
    return total
