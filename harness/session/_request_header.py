"""Request-header and request-context folding (reference §10)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from harness.session._events import Event
from harness.session._json import ARRAY, FrozenDict, JsonValue, adopt, raw_of

_CONFIG_FIELDS = ("provider", "model", "reasoningEffort", "temperature", "maxTokens")


def canonical_header(header: JsonValue) -> FrozenDict:
    """Keep ``config``; keep ``adapterDefaults`` only if a marker is true; drop empty
    ``system`` and empty ``tools``."""
    raw: dict[str, Any] = dict(raw_of(header)) if type(raw_of(header)) is dict else {}
    ad = raw.get("adapterDefaults")
    if not (type(ad) is dict and any(v is True for v in ad.values())):
        raw.pop("adapterDefaults", None)
    if "system" in raw and not raw["system"]:
        del raw["system"]
    if type(raw.get("tools")) in ARRAY and not raw["tools"]:
        del raw["tools"]
    return adopt(raw)  # type: ignore[return-value]


def header_equals(a: JsonValue, b: JsonValue) -> bool:
    """Equality of two epoch headers under the reference's rules."""
    ra, rb = raw_of(a), raw_of(b)
    ca, cb = ra.get("config") or {}, rb.get("config") or {}
    for f in _CONFIG_FIELDS:
        if ca.get(f) != cb.get(f) or (f in ca) != (f in cb):
            return False
    if ("stop" in ca) != ("stop" in cb) or ca.get("stop") != cb.get("stop"):
        return False

    def markers(r: dict[str, Any]) -> frozenset[str]:
        ad = r.get("adapterDefaults")
        return frozenset(k for k, v in ad.items() if v is True) if type(ad) is dict else frozenset()

    if markers(ra) != markers(rb):
        return False
    if (ra.get("system") or None) != (rb.get("system") or None):
        return False
    ta, tb = ra.get("tools") or [], rb.get("tools") or []
    if len(ta) != len(tb):
        return False
    return all(orjson.dumps(x) == orjson.dumps(y) for x, y in zip(ta, tb, strict=True))


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
