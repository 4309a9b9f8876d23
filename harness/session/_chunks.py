"""The chunk-row storage codec (reference §10): runs of streamed deltas as one row.

A run of >= 3 consecutive ``assistant/chunk`` delta events of exactly the whitelisted
shape becomes one row (``text-chunks``, ``reasoning-chunks`` or ``tool-call-chunks``);
everything else passes through verbatim. ``decode_storage_record`` expands rows back,
validating them. For any JSON-round-tripped event list,
``expand(pack(x)) == x`` exactly, key presence included.

A record whose ``type`` is not a string (or whose chunk ``type`` is not one) is never a
row: it passes through both directions untouched, whatever its type's Python type.

The SQLite schema 17 bounds its rows (reference §3): ``pack_chunk_runs(...,
max_members=1024, max_data_bytes=1 MiB)`` splits a run into rows of at most that many
members whose ``data`` serialises to at most that many UTF-8 bytes (a member that fits
in no row of three stays a plain event), and :func:`decode_chunk_row` checks a row's
``3..1024`` members.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any, Final

import orjson

from harness.errors import StorageRowError
from harness.session._events import SAFE_INT_MAX, is_nonneg_safe_int, is_safe_int

_KIND_TAG: Final = {
    "text-delta": "text-chunks",
    "reasoning-delta": "reasoning-chunks",
    "tool-call-delta": "tool-call-chunks",
}
_TAG_KIND: Final = {v: k for k, v in _KIND_TAG.items()}
# Tuples, not sets: ``x in ROW_TAGS`` compares by equality (at C speed) and never
# hashes ``x``, so a ``type`` that is a list or a dict is simply not a tag (a frozenset
# would raise ``TypeError: unhashable type``).
ROW_TAGS: Final = tuple(_TAG_KIND)
_KINDS: Final = tuple(_KIND_TAG)
_ENVELOPE: Final = frozenset({"type", "seq", "time", "data"})
_DATA: Final = frozenset({"turn", "step", "chunk"})
_TEXT_CHUNK: Final = frozenset({"type", "index", "text"})
_TOOL_CHUNK: Final = frozenset({"type", "index", "id", "argumentsDelta"})
_TOOL_CHUNK_NAMED: Final = _TOOL_CHUNK | {"name"}
_ROW_KEYS: Final = frozenset({"type", "seq0", "time0", "data"})
MIN_ROW_MEMBERS: Final = 3


def _number(v: object) -> bool:
    return (type(v) is int or type(v) is float) and math.isfinite(v)


def _member(ev: Any) -> tuple[Any, ...] | None:
    """The run key of a packable chunk event, or None."""
    if type(ev) is not dict or ev.keys() != _ENVELOPE or ev.get("type") != "assistant/chunk":
        return None
    if not is_nonneg_safe_int(ev["seq"]) or not is_safe_int(ev["time"]):
        return None
    data = ev["data"]
    if type(data) is not dict or data.keys() != _DATA:
        return None
    turn, step, chunk = data["turn"], data["step"], data["chunk"]
    if not _number(turn) or not _number(step) or type(chunk) is not dict:
        return None
    kind = chunk.get("type")
    if kind not in _KINDS or not _number(chunk.get("index")):
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


def pack_chunk_runs(
    records: Iterable[Any], *, max_members: int | None = None, max_data_bytes: int | None = None
) -> list[Any]:
    """Replace each run of >= 3 packable chunk events with one storage row.

    ``max_members`` / ``max_data_bytes`` bound every row (SQLite; see the module): a
    longer or larger run becomes several rows, greedily, largest first."""
    out: list[Any] = []
    run: list[Any] = []
    key: tuple[Any, ...] | None = None
    bounded = max_members is not None or max_data_bytes is not None

    def flush() -> None:
        if len(run) < MIN_ROW_MEMBERS:
            out.extend(run)
        elif bounded:
            _emit_bounded(out, key, run, max_members, max_data_bytes)  # type: ignore[arg-type]
        else:
            out.append(_row(key, run))  # type: ignore[arg-type]
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


def _data_bytes(row: dict[str, Any]) -> int:
    return len(orjson.dumps(row["data"]))


def _emit_bounded(
    out: list[Any], key: tuple[Any, ...], run: list[Any], max_members: int | None, max_bytes: int | None
) -> None:
    """The reference's bounded emission: from each offset, the largest prefix of at most
    ``max_members`` members whose row fits ``max_bytes`` (binary search when the
    largest does not); where not even three members fit, one plain event."""
    offset = 0
    n = len(run)
    while n - offset >= MIN_ROW_MEMBERS:
        high = n - offset if max_members is None else min(n - offset, max_members)
        largest = _row(key, run[offset : offset + high])
        if max_bytes is None or _data_bytes(largest) <= max_bytes:
            out.append(largest)
            offset += high
            continue
        low, high = MIN_ROW_MEMBERS, high - 1
        accepted: dict[str, Any] | None = None
        taken = 0
        while low <= high:
            middle = (low + high) // 2
            candidate = _row(key, run[offset : offset + middle])
            if _data_bytes(candidate) <= max_bytes:
                accepted, taken = candidate, middle
                low = middle + 1
            else:
                high = middle - 1
        if accepted is None:
            out.append(run[offset])
            offset += 1
        else:
            out.append(accepted)
            offset += taken
    out.extend(run[offset:])


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


def decode_chunk_row(tag: str, seq0: object, time0: object, data: object, *, max_members: int) -> list[Any]:
    """Expand one bounded row given by its parts (a SQLite packed row: the ``type``,
    ``seq``, ``time`` columns and the parsed ``data``): validated as
    :func:`decode_storage_record` does, and its members must number
    ``3..max_members``. Raises :class:`StorageRowError`."""
    if tag not in ROW_TAGS:
        raise _bad(tag, "packed discriminator requires a chunk tag")
    return list(_expand({"type": tag, "seq0": seq0, "time0": time0, "data": data}, max_members))


def _bad(tag: str, why: str) -> StorageRowError:
    return StorageRowError(f"malformed {tag} storage row: {why}")


def _expand(row: dict[str, Any], max_members: int | None = None) -> Iterator[dict[str, Any]]:
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
    if max_members is not None and not MIN_ROW_MEMBERS <= len(members) <= max_members:
        raise _bad(tag, f"{payload_key} must contain {MIN_ROW_MEMBERS}..{max_members} strings")
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
