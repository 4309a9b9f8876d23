"""The chunk-row storage codec (reference §10): runs of streamed deltas as one row.

A run of >= 3 consecutive ``assistant/chunk`` delta events of exactly the whitelisted
shape becomes one row (``text-chunks``, ``reasoning-chunks`` or ``tool-call-chunks``);
everything else passes through verbatim. ``decode_storage_record`` expands rows back,
validating them. For any JSON-round-tripped event list,
``expand(pack(x)) == x`` exactly, key presence included.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any, Final

from harness.errors import StorageRowError
from harness.session._events import SAFE_INT_MAX, is_nonneg_safe_int, is_safe_int

_KIND_TAG: Final = {
    "text-delta": "text-chunks",
    "reasoning-delta": "reasoning-chunks",
    "tool-call-delta": "tool-call-chunks",
}
_TAG_KIND: Final = {v: k for k, v in _KIND_TAG.items()}
ROW_TAGS: Final = frozenset(_TAG_KIND)
_ENVELOPE: Final = frozenset({"type", "seq", "time", "data"})
_DATA: Final = frozenset({"turn", "step", "chunk"})
_TEXT_CHUNK: Final = frozenset({"type", "index", "text"})
_TOOL_CHUNK: Final = frozenset({"type", "index", "id", "argumentsDelta"})
_TOOL_CHUNK_NAMED: Final = _TOOL_CHUNK | {"name"}
_ROW_KEYS: Final = frozenset({"type", "seq0", "time0", "data"})


def _number(v: object) -> bool:
    return (type(v) is int or type(v) is float) and math.isfinite(v)


def _member(ev: Any) -> tuple[Any, ...] | None:
    """The run key of a packable chunk event, or None."""
    if type(ev) is not dict or ev.keys() != _ENVELOPE or ev.get("type") != "assistant/chunk":
        return None
    if not is_safe_int(ev["seq"]) or not is_safe_int(ev["time"]):
        return None
    data = ev["data"]
    if type(data) is not dict or data.keys() != _DATA:
        return None
    turn, step, chunk = data["turn"], data["step"], data["chunk"]
    if not _number(turn) or not _number(step) or type(chunk) is not dict:
        return None
    kind = chunk.get("type")
    if kind not in _KIND_TAG or not _number(chunk.get("index")):
        return None
    if kind == "tool-call-delta":
        keys = chunk.keys()
        if keys != _TOOL_CHUNK and keys != _TOOL_CHUNK_NAMED:
            return None
        if type(chunk["id"]) is not str or type(chunk["argumentsDelta"]) is not str:
            return None
        named = "name" in chunk
        if named and type(chunk["name"]) is not str:
            return None
        return (kind, turn, step, chunk["index"], chunk["id"], named, chunk.get("name"))
    if chunk.keys() != _TEXT_CHUNK or type(chunk["text"]) is not str:
        return None
    return (kind, turn, step, chunk["index"])


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    # Compare with types: 1 and 1.0 (and True) must not merge, or decode would differ.
    return len(a) == len(b) and all(type(x) is type(y) and x == y for x, y in zip(a, b, strict=True))


def pack_chunk_runs(records: Iterable[Any]) -> list[Any]:
    """Replace each run of >= 3 packable chunk events with one storage row."""
    out: list[Any] = []
    run: list[Any] = []
    key: tuple[Any, ...] | None = None

    def flush() -> None:
        if len(run) >= 3:
            out.append(_row(key, run))  # type: ignore[arg-type]
        else:
            out.extend(run)
        run.clear()

    for rec in records:
        k = _member(rec)
        if k is not None and run and key is not None and _same(k, key):
            prev = run[-1]
            gap = rec["time"] - prev["time"]
            if rec["seq"] == prev["seq"] + 1 and is_safe_int(gap):
                run.append(rec)
                continue
        flush()
        if k is None:
            out.append(rec)
            key = None
        else:
            run.append(rec)
            key = k
    flush()
    return out


def _row(key: tuple[Any, ...], run: list[Any]) -> dict[str, Any]:
    kind, turn, step, index = key[0], key[1], key[2], key[3]
    first = run[0]
    dt = [run[i]["time"] - run[i - 1]["time"] for i in range(1, len(run))]
    data: dict[str, Any] = {"turn": turn, "step": step, "index": index, "dt": dt}
    if kind == "tool-call-delta":
        data["id"] = key[4]
        if key[5]:
            data["name"] = key[6]
        data["args"] = [r["data"]["chunk"]["argumentsDelta"] for r in run]
    else:
        data["texts"] = [r["data"]["chunk"]["text"] for r in run]
    return {"type": _KIND_TAG[kind], "seq0": first["seq"], "time0": first["time"], "data": data}


def is_storage_row(value: Any) -> bool:
    return type(value) is dict and value.get("type") in ROW_TAGS and "seq0" in value


def decode_storage_record(value: Any) -> list[Any]:
    """Expand one stored record: a row becomes its member events (validated);
    anything else passes through unvalidated as one event."""
    if not (type(value) is dict and value.get("type") in ROW_TAGS):
        return [value]
    return list(_expand(value))


def _bad(tag: str, why: str) -> StorageRowError:
    return StorageRowError(f"malformed {tag} storage row: {why}")


def _expand(row: dict[str, Any]) -> Iterator[dict[str, Any]]:
    tag = row["type"]
    kind = _TAG_KIND[tag]
    if row.keys() != _ROW_KEYS:
        raise _bad(tag, "unexpected envelope keys")
    seq0, time0, data = row["seq0"], row["time0"], row["data"]
    if not is_nonneg_safe_int(seq0):
        raise _bad(tag, "seq0 must be a non-negative safe integer")
    if not is_safe_int(time0):
        raise _bad(tag, "time0 must be a safe integer")
    if type(data) is not dict:
        raise _bad(tag, "data must be an object")
    tool = kind == "tool-call-delta"
    payload_key = "args" if tool else "texts"
    expected = {"turn", "step", "index", "dt", payload_key}
    if tool:
        expected |= {"id"} | ({"name"} if "name" in data else set())
    if data.keys() != expected:
        raise _bad(tag, "unexpected data keys")
    turn, step, index, dt, members = data["turn"], data["step"], data["index"], data["dt"], data[payload_key]
    if not (_number(turn) and _number(step) and _number(index)):
        raise _bad(tag, "turn, step and index must be numbers")
    if type(members) is not list or not members or any(type(m) is not str for m in members):
        raise _bad(tag, f"{payload_key} must be a non-empty list of strings")
    if type(dt) is not list or len(dt) != len(members) - 1 or any(not is_safe_int(d) for d in dt):
        raise _bad(tag, "dt must hold one safe integer gap per member after the first")
    if seq0 + len(members) - 1 > SAFE_INT_MAX:
        raise _bad(tag, "member seqs leave the safe integer range")
    if tool:
        if type(data["id"]) is not str:
            raise _bad(tag, "id must be a string")
        if "name" in data and type(data["name"]) is not str:
            raise _bad(tag, "name must be a string")
    t = time0
    for k, member in enumerate(members):
        if k:
            t += dt[k - 1]
            if not is_safe_int(t):
                raise _bad(tag, "member times leave the safe integer range")
        if tool:
            chunk: dict[str, Any] = {"type": kind, "index": index, "id": data["id"]}
            if "name" in data:
                chunk["name"] = data["name"]
            chunk["argumentsDelta"] = member
        else:
            chunk = {"type": kind, "index": index, "text": member}
        yield {
            "type": "assistant/chunk",
            "seq": seq0 + k,
            "time": t,
            "data": {"turn": turn, "step": step, "chunk": chunk},
        }
