"""Request-header and request-context folding (reference §10)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from harness.session._events import Event
from harness.session._json import (
    ARRAY,
    FrozenDict,
    JsonValue,
    adopt,
    raw_equal,
    raw_of,
    snapshot_raw,
)

_CONFIG_FIELDS = ("provider", "model", "reasoningEffort", "temperature", "maxTokens")


def canonical_header(header: JsonValue | dict[str, Any]) -> FrozenDict:
    """Keep ``config``; keep ``adapterDefaults`` only if a marker is true; drop empty
    ``system`` and empty ``tools``.

    The result is frozen all the way down: a frozen header (from the log) shares its
    immutable tree; a plain ``dict`` is validated and deep-copied first
    (:class:`~harness.errors.NotJsonError` if it is not lossless JSON), so a caller's
    later mutation never reaches the result.
    """
    t = type(header)
    raw: dict[str, Any]
    if t is FrozenDict:
        raw = dict(header._raw)  # type: ignore[union-attr]  # nested raw trees are never mutated: share them
    elif t is dict:
        # Borrowed (or a raw tree of the log, arrays as tuples): copy it whole.
        raw = snapshot_raw(header, "request header", raw_arrays=True)
    else:
        raw = {}
    ad = raw.get("adapterDefaults")
    if not (type(ad) is dict and any(v is True for v in ad.values())):
        raw.pop("adapterDefaults", None)
    if "system" in raw and not raw["system"]:
        del raw["system"]
    if type(raw.get("tools")) in ARRAY and not raw["tools"]:
        del raw["tools"]
    return adopt(raw)  # type: ignore[return-value]


_ABSENT: Any = object()


def header_equals(a: JsonValue, b: JsonValue) -> bool:
    """Equality of two epoch headers under the reference's rules, type-strict like
    JavaScript's ``===`` (``true`` is not ``1``; ``1.0`` is ``1``): config fields
    (``stop`` element-wise; absent differs from empty), the same ``adapterDefaults``
    markers, the same ``system``, tools in order by serialized-JSON equality (key order
    counts; absent equals empty)."""
    ra, rb = raw_of(a), raw_of(b)
    ca, cb = ra.get("config") or {}, rb.get("config") or {}
    for f in (*_CONFIG_FIELDS, "stop"):
        if not raw_equal(ca.get(f, _ABSENT), cb.get(f, _ABSENT)):
            return False

    def markers(r: dict[str, Any]) -> frozenset[str]:
        ad = r.get("adapterDefaults")
        return frozenset(k for k, v in ad.items() if v is True) if type(ad) is dict else frozenset()

    if markers(ra) != markers(rb):
        return False
    if not raw_equal(ra.get("system") or None, rb.get("system") or None):
        return False
    ta, tb = ra.get("tools") or (), rb.get("tools") or ()
    if len(ta) != len(tb):
        return False
    return all(raw_equal(x, y, ordered=True) for x, y in zip(ta, tb, strict=True))


def fold_request_header(events: Iterable[Event], from_: FrozenDict | None = None) -> FrozenDict | None:
    """The latest ``request/header`` snapshot, canonicalised; ``from_`` if there is none."""
    latest = None
    for ev in events:
        if ev.type == "request/header":
            latest = ev
    if latest is None:
        return from_
    data = latest.data
    return canonical_header(data.get("header") if type(data) is FrozenDict else None)
