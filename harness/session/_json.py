"""Lossless JSON: validation, snapshots, and the read-only views over frozen trees.

Representation (decision 0002): an accepted JSON value is stored as a *raw tree* of
plain ``dict``/``list``/scalars that nothing ever mutates once adopted. Users only see
it through :class:`FrozenDict` and :class:`FrozenList`, read-only views that wrap a raw
container in O(1) and wrap nested containers on access. Because the raw tree is plain
Python, ``orjson`` serialises it at C speed and restore mode can adopt decoded trees
without walking or copying them. The append hot path keeps most values as their
compact JSON instead (:func:`encode_storable_fast`, decision 0023): the same values
accepted, the bytes orjson writes for the copy, nothing for the cyclic collector.

Accepted values (the reference's ``isJsonValue`` mapped to Python): ``None``, ``bool``,
``str`` (valid Unicode, no lone surrogates, so it encodes as UTF-8), ``int`` in the
range orjson can write (-2**63 .. 2**64-1), finite ``float`` except ``-0.0``,
``list``, ``dict`` with ``str`` keys, and our own frozen views. Exact types only:
subclasses, tuples, sets and other objects are rejected, and so are cycles (a
container that is its own ancestor). Shared non-cyclic references are accepted and
copied separately. All walks are iterative: depth is limited only by memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeAlias, final, overload

import orjson

from harness.errors import NotJsonError

_dumps = orjson.dumps
_loads = orjson.loads
_NEWLINE = orjson.OPT_APPEND_NEWLINE

if TYPE_CHECKING:
    JsonValue: TypeAlias = "bool | int | float | str | FrozenList | FrozenDict | None"
    """A frozen JSON value as stored in events and headers."""
else:
    JsonValue = Any

RawJson: TypeAlias = Any
"""A plain (mutable-typed, never mutated) JSON tree: dict/list/scalars."""

ARRAY = (list, tuple)
"""Raw arrays are lists (decoded by orjson) or tuples (made by snapshots: CPython stops
tracking a tuple of atomic values, and a dict of such tuples, in the cyclic collector,
so frozen payloads cost the collector nothing once they survive a collection)."""

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1


class _Invalid(Exception):
    """Internal: the walk found a non-JSON value (turned into NotJsonError by callers)."""


class _Deep(_Invalid):
    """Internal: the walk went deeper than its ``max_depth``."""


MAX_STORABLE_DEPTH = 200
"""How deep an event's data may nest (containers, the outermost counting 1). orjson
writes at most 254 levels and a stored record wraps the data in one or two more: a
deeper payload would be accepted in memory and then fail every write-behind flush
(issue 16). 200 leaves room for the envelope; see ``docs/limits.md``."""


def _valid_str(s: str) -> bool:
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _valid_scalar(value: object, t: type) -> bool:
    # `t` is `type(value)`; called only for non-container types.
    if t is str:
        return _valid_str(value)  # type: ignore[arg-type]
    if t is bool or value is None:
        return True
    if t is int:
        return _INT_MIN <= value <= _INT_MAX  # type: ignore[operator]
    if t is float:
        return math.isfinite(value) and not (value == 0.0 and math.copysign(1.0, value) < 0)  # type: ignore[arg-type]
    return False


class _TooDeep(Exception):
    """Internal: the recursive fast path gave up; the iterative walk takes over."""


_FAST_DEPTH = 48


def _copy_fast(value: Any, depth: int) -> Any:
    # Recursive copy for the common, shallow payload. Bounded depth means a cycle
    # can only show up as _TooDeep, so this path needs no ancestor tracking.
    t = type(value)
    if t is dict:
        if depth > _FAST_DEPTH:
            raise _TooDeep
        out: dict[str, Any] = {}
        for k, v in value.items():
            if type(k) is not str or not (k.isascii() or _valid_str(k)):
                raise _Invalid
            vt = type(v)
            if vt is str:
                if not (v.isascii() or _valid_str(v)):
                    raise _Invalid
                out[k] = v
            elif vt is int and _INT_MIN <= v <= _INT_MAX:
                out[k] = v
            else:
                out[k] = _copy_fast(v, depth + 1)
        return out
    if t is list:
        if depth > _FAST_DEPTH:
            raise _TooDeep
        lst: list[Any] = []
        append = lst.append
        for v in value:
            vt = type(v)
            if vt is str:
                if not (v.isascii() or _valid_str(v)):
                    raise _Invalid
                append(v)
            elif vt is int and _INT_MIN <= v <= _INT_MAX:
                append(v)
            else:
                append(_copy_fast(v, depth + 1))
        return tuple(lst)
    if t is FrozenDict or t is FrozenList:
        if not _view_fits(value, MAX_STORABLE_DEPTH - depth):
            raise _TooDeep  # the exact verdict is the iterative walk's (storable or not)
        return value._raw
    if _valid_scalar(value, t):
        return value
    raise _Invalid


def _raw_depth(raw: object) -> int:
    """How many containers deep the raw tree ``raw`` nests (a scalar: 0; ``{}``: 1).
    Iterative: a raw tree from a snapshot has no cycle and any depth."""
    if type(raw) not in (dict, list, tuple):
        return 0
    deepest = 1
    stack: list[tuple[Any, int]] = [(raw, 1)]
    while stack:
        node, level = stack.pop()
        children = node.values() if type(node) is dict else node
        for v in children:
            vt = type(v)
            if vt is dict or vt is list or vt is tuple:
                if level + 1 > deepest:
                    deepest = level + 1
                stack.append((v, level + 1))
    return deepest


def _view_depth(v: Any) -> int:
    """The depth of a frozen view's raw tree (see :func:`_raw_depth`), computed once
    per view object: a view shared into a value counts its own levels too, so the
    storable depth rule holds for data that nests a view (stop 34's reviewer: a
    deep value made with ``freeze`` and nested in appended data was stored past the rule, and
    past orjson's 254 levels every flush failed)."""
    try:
        depth: int = v._depth
    except AttributeError:
        depth = _raw_depth(v._raw)
        object.__setattr__(v, "_depth", depth)
    return depth


def _orjson_levels() -> int | None:
    """How many nested containers orjson writes (254 in the versions we know), or
    ``None`` if that is not what the probe finds: then :func:`_view_fits` walks."""
    def deep(n: int) -> list[Any]:
        value: list[Any] = []
        for _ in range(n - 1):
            value = [value]
        return value

    try:
        _dumps(deep(254))
    except orjson.JSONEncodeError:
        return None
    try:
        _dumps(deep(255))
    except orjson.JSONEncodeError:
        return 254
    return None


_ORJSON_LEVELS: Final = _orjson_levels()


def _view_fits(v: Any, budget: int) -> bool:
    """Whether frozen view ``v``'s raw tree nests at most ``budget`` containers.

    A known depth (:func:`_view_depth` kept it) answers at once. Otherwise orjson
    answers in C: wrapped in ``254 - budget`` arrays, the tree encodes exactly when it
    is at most ``budget`` deep (orjson writes 254 levels and refuses the 255th; the
    limit is probed at import, and without it, or for a refusal, the walk decides).
    Views are made afresh on every read of event data, so a per-object cache rarely
    hits: re-appending a 5,000-tool list read from an event paid a 7.6 ms walk per
    append (the first reviewer), against 1.3-2.4 ms for this encode."""
    try:
        known: int = v._depth
    except AttributeError:
        pass
    else:
        return known <= budget
    try:
        if v._bound <= budget:  # an earlier encode showed it is at most that deep
            return True
    except AttributeError:
        pass
    if _encodes_within(v._raw, budget):
        object.__setattr__(v, "_bound", budget)
        return True
    return _view_depth(v) <= budget


def _encodes_within(raw: object, budget: int) -> bool:
    """True if orjson shows the raw tree ``raw`` nests at most ``budget`` containers
    (see :func:`_view_fits`); False means "ask the walk", not "too deep"."""
    levels = _ORJSON_LEVELS
    if levels is None or not 0 <= budget <= levels:
        return False
    wrapped: Any = raw
    for _ in range(levels - budget):
        wrapped = [wrapped]
    try:
        _dumps(wrapped)
    except orjson.JSONEncodeError:
        return False  # too deep, or anything else: the walk gives the verdict
    return True


def raw_storable_depth(raw: object) -> bool:
    """Whether an event's data as an :class:`Event` holds it (a raw tree, a frozen
    view, or its JSON bytes, decision 0023) nests at most
    :data:`MAX_STORABLE_DEPTH` containers: for events a caller built, which no
    append measured (a ``create`` seed of :class:`Event` objects)."""
    t = type(raw)
    if t is FrozenDict or t is FrozenList:
        return _view_fits(raw, MAX_STORABLE_DEPTH)
    if t is dict or t is list or t is tuple:
        return _encodes_within(raw, MAX_STORABLE_DEPTH) or _raw_depth(raw) <= MAX_STORABLE_DEPTH
    return True  # a scalar, or bytes this harness encoded (checked as they were made)


def _snapshot_raw(value: object) -> RawJson:
    """Validate ``value`` and return a fresh raw tree (views are unwrapped, not copied).

    Raises :class:`_Invalid` on the first non-JSON value.
    """
    try:
        return _copy_fast(value, 0)
    except _TooDeep:
        return _snapshot_iterative(value)


def _snapshot_iterative(value: object, tuples: bool = False, max_depth: int | None = None) -> RawJson:
    # ``tuples``: also take tuples as arrays (a raw tree's frozen arrays), copied as lists.
    # ``max_depth``: raise _Deep past that many nested containers (None: no limit).
    limit = max_depth if max_depth is not None else -1
    t = type(value)
    if t is FrozenDict or t is FrozenList:
        if limit >= 0 and not _view_fits(value, limit):
            raise _Deep
        return value._raw  # type: ignore[attr-defined]
    if t is tuple and tuples:
        t = list
    elif t is not dict and t is not list:
        if _valid_scalar(value, t):
            return value
        raise _Invalid
    root_out: dict[str, Any] | list[Any] = {} if t is dict else []
    on_path = {id(value)}
    # Each frame: (source container, its copy, the live iterator over the source).
    stack: list[tuple[Any, Any, Iterator[Any]]] = [
        (value, root_out, iter(value.items()) if t is dict else iter(value))  # type: ignore[attr-defined, call-overload]
    ]
    while stack:
        src, dst, it = stack[-1]
        descended = False
        if type(dst) is dict:
            for k, v in it:
                if type(k) is not str or not _valid_str(k):
                    raise _Invalid
                vt = type(v)
                if vt is tuple and tuples:
                    vt = list
                if vt is dict or vt is list:
                    if id(v) in on_path:
                        raise _Invalid
                    if len(stack) == limit:
                        raise _Deep
                    child: Any = {} if vt is dict else []
                    dst[k] = child
                    on_path.add(id(v))
                    stack.append((v, child, iter(v.items()) if vt is dict else iter(v)))
                    descended = True
                    break
                if vt is FrozenDict or vt is FrozenList:
                    if limit >= 0 and not _view_fits(v, limit - len(stack)):
                        raise _Deep
                    dst[k] = v._raw
                elif _valid_scalar(v, vt):
                    dst[k] = v
                else:
                    raise _Invalid
        else:
            append = dst.append
            for v in it:
                vt = type(v)
                if vt is tuple and tuples:
                    vt = list
                if vt is dict or vt is list:
                    if id(v) in on_path:
                        raise _Invalid
                    if len(stack) == limit:
                        raise _Deep
                    child = {} if vt is dict else []
                    append(child)
                    on_path.add(id(v))
                    stack.append((v, child, iter(v.items()) if vt is dict else iter(v)))
                    descended = True
                    break
                if vt is FrozenDict or vt is FrozenList:
                    if limit >= 0 and not _view_fits(v, limit - len(stack)):
                        raise _Deep
                    append(v._raw)
                elif _valid_scalar(v, vt):
                    append(v)
                else:
                    raise _Invalid
        if not descended:
            stack.pop()
            on_path.discard(id(src))
    return root_out


def snapshot_raw(value: object, what: str = "value", *, raw_arrays: bool = False) -> RawJson:
    """Validate and deep-copy ``value`` into a raw tree; :class:`NotJsonError` if invalid.

    ``raw_arrays``: ``value`` may be a raw tree, whose arrays can be tuples (a slower walk).
    """
    try:
        return _snapshot_iterative(value, True) if raw_arrays else _snapshot_raw(value)
    except _Invalid:
        raise NotJsonError(f"{what} is not losslessly JSON-serializable") from None


def try_snapshot_raw(value: object) -> tuple[bool, RawJson]:
    """Like :func:`snapshot_raw` but returns ``(ok, raw)`` instead of raising."""
    try:
        return True, _snapshot_raw(value)
    except _Invalid:
        return False, None


class SnapshotRefused(Exception):
    """Internal: :func:`snapshot_storable_fast` could not copy the value as it is.

    Either it is not JSON or it nests past the fast walk's depth: the caller asks
    :func:`try_snapshot_storable` for the verdict (and the copy of a deep value)."""


def snapshot_storable_fast(value: object) -> RawJson:
    """The append hot path's validating copy: the raw copy of a storable ``value``
    of the common (shallow) shapes, or :class:`SnapshotRefused`.

    No result tuple and no wrapper frame per value (issue 26): the caller handles
    the rare refusal with :func:`try_snapshot_storable`, which gives the exact
    reason. The fast walk gives up past ``_FAST_DEPTH`` (< ``MAX_STORABLE_DEPTH``)
    levels, so what it copies needs no depth check."""
    try:
        return _copy_fast(value, 0)
    except (_TooDeep, _Invalid):
        raise SnapshotRefused from None


def _check_fast(value: Any, depth: int) -> None:
    # The type walk of :func:`encode_storable_fast`: everything the copy refuses
    # that orjson would write anyway (tuples, subclasses, enums, UUIDs, dataclasses,
    # NaN, infinities, -0.0, fragments). What orjson itself refuses as it encodes
    # (non-str and subclass keys, lone surrogates, integers past 64 bits) is left to
    # it: str and int values cost one type test here.
    t = type(value)
    if t is dict:
        if depth > _FAST_DEPTH:
            raise _TooDeep
        for v in value.values():
            vt = type(v)
            if vt is not str and vt is not int:
                _check_fast(v, depth + 1)
        return
    if t is list:
        if depth > _FAST_DEPTH:
            raise _TooDeep
        for v in value:
            vt = type(v)
            if vt is not str and vt is not int:
                _check_fast(v, depth + 1)
        return
    if t is str or t is int or t is bool or value is None:
        return
    if t is FrozenDict or t is FrozenList:
        if not _view_fits(value, MAX_STORABLE_DEPTH - depth):
            raise _TooDeep
        return
    if t is float and math.isfinite(value) and not (value == 0.0 and math.copysign(1.0, value) < 0):
        return
    raise _Invalid


def _unview(value: object) -> RawJson:
    # orjson's ``default``: reached only for our views (the walk refused the rest).
    t = type(value)
    if t is FrozenDict or t is FrozenList:
        return value._raw  # type: ignore[attr-defined]
    raise TypeError


def encode_storable_fast(value: object) -> bytes:
    """The append hot path's snapshot of a storable ``value`` of the common (shallow)
    shapes, as its compact JSON (decision 0023), or :class:`SnapshotRefused`.

    Accepts exactly what :func:`snapshot_storable_fast` accepts, and the bytes are
    what orjson writes for that copy: a walk refuses by type what orjson would write
    anyway, and orjson refuses the rest while it encodes. The caller owns the bytes,
    so the caller's later mutation of ``value`` never reaches them, and the cyclic
    collector never visits them. A refusal is not a verdict: the caller asks
    :func:`try_snapshot_storable` for it (and for the copy of a deep value)."""
    try:
        _check_fast(value, 0)
        # Sliced: orjson's result keeps its whole output buffer (4 KiB for a bench
        # message of 445 bytes, as tracemalloc counts it), and the log keeps these
        # bytes for the session's life. A slice is an exact-size copy (~30 ns).
        return _dumps(value, default=_unview, option=_NEWLINE)[:-1]
    except (_TooDeep, _Invalid, TypeError):  # orjson.JSONEncodeError is a TypeError
        raise SnapshotRefused from None


def try_snapshot_storable(value: object, max_depth: int = MAX_STORABLE_DEPTH) -> tuple[str | None, RawJson]:
    """Like :func:`try_snapshot_raw` for a value that must also be storable:
    ``(None, raw)``, or ``(why, None)`` with ``why`` ``"not JSON"`` or ``"too deep"``
    (more than ``max_depth`` nested containers, the outermost counting 1)."""
    try:
        # The fast path gives up past _FAST_DEPTH (< MAX_STORABLE_DEPTH) levels: a
        # payload it copies needs no depth check, so the common append pays nothing.
        return None, _copy_fast(value, 0)
    except _TooDeep:
        pass
    except _Invalid:
        return "not JSON", None
    try:
        return None, _snapshot_iterative(value, max_depth=max_depth)
    except _Deep:
        return "too deep", None
    except _Invalid:
        return "not JSON", None


def is_json(value: object) -> bool:
    """Whether ``value`` is lossless JSON (the same rules as :func:`freeze`)."""
    return try_snapshot_raw(value)[0]


def view(raw: RawJson) -> JsonValue:
    """Wrap a raw tree in its read-only view (scalars are returned as they are)."""
    t = type(raw)
    if t is dict:
        return FrozenDict._wrap(raw)
    if t is list or t is tuple:
        return FrozenList._wrap(raw)
    return raw  # type: ignore[no-any-return]


def freeze(value: object) -> JsonValue:
    """Snapshot mode: validate ``value``, copy it, and return the frozen view.

    The caller keeps ownership of ``value``; later mutation of it never reaches the
    result. Frozen views inside ``value`` are shared, not copied (they cannot change).
    """
    return view(snapshot_raw(value))


def adopt(raw: RawJson) -> JsonValue:
    """Restore mode: take ownership of a freshly decoded tree without walking it.

    The caller transfers ownership: it must hold no other reference it will mutate.
    ``orjson`` output is lossless JSON by construction, so no walk is needed.
    """
    return view(raw)


def raw_of(value: JsonValue) -> RawJson:
    """The raw tree behind a frozen value (for serialisation; never mutate it)."""
    t = type(value)
    if t is FrozenDict or t is FrozenList:
        return value._raw  # type: ignore[union-attr]
    return value


def thaw(value: JsonValue | RawJson) -> Any:
    """A fresh, mutable deep copy as plain dicts and lists (iterative)."""
    raw = raw_of(value)
    t = type(raw)
    if t is not dict and t is not list and t is not tuple:
        return raw
    root: Any = {} if t is dict else []
    stack: list[tuple[Any, Any]] = [(raw, root)]
    while stack:
        src, dst = stack.pop()
        if type(src) is dict:
            for k, v in src.items():
                vt = type(v)
                if vt is dict or vt is list or vt is tuple:
                    child: Any = {} if vt is dict else []
                    dst[k] = child
                    stack.append((v, child))
                else:
                    dst[k] = v
        else:
            for v in src:
                vt = type(v)
                if vt is dict or vt is list or vt is tuple:
                    child = {} if vt is dict else []
                    dst.append(child)
                    stack.append((v, child))
                else:
                    dst.append(v)
    return root


ABSENT: Final[Any] = object()
"""A key a JSON object does not have (JavaScript's ``undefined``; ``None`` is ``null``):
pass it as the default of ``.get`` where a message must tell the two apart."""


def js_string(value: object) -> str:
    """JavaScript's ``String(value)`` of a JSON value, as the reference interpolates
    one into an error message (``None`` is JSON ``null``, :data:`ABSENT` is
    ``undefined``). ``true``/``false``; an integral float as an
    integer (``2.0`` is ``2``); an array's elements joined by ``,`` (``null`` as the
    empty string); an object as ``[object Object]``."""
    if value is None:
        return "null"
    if value is ABSENT:
        return "undefined"
    if value is True:
        return "true"
    if value is False:
        return "false"
    t = type(value)
    if t is str:
        return value  # type: ignore[return-value]
    if t is float:
        f: float = value  # type: ignore[assignment]
        if math.isnan(f):
            return "NaN"
        if math.isinf(f):
            return "Infinity" if f > 0 else "-Infinity"
        if f.is_integer() and abs(f) < 1e21:
            return str(int(f))
        mantissa, e, exponent = repr(f).partition("e")
        # JS writes no leading zero in an exponent: 1e-7, not 1e-07.
        return f"{mantissa}e{exponent[0]}{exponent[1:].lstrip('0') or '0'}" if e else mantissa
    if isinstance(value, Mapping):
        return "[object Object]"
    if t in ARRAY or t is FrozenList:
        return ",".join("" if item is None else js_string(item) for item in value)  # type: ignore[attr-defined]
    return str(value)


def shown_safe_int(value: object) -> str:
    """:func:`js_string` of a value refused as a safe integer, except that an integral
    float shows its fraction (``2.0``): the reference takes it as the integer, so only
    this port refuses it, and ``got 2`` would not say why."""
    if type(value) is float and value.is_integer():
        return repr(value)
    return js_string(value)


def raw_equal(a: RawJson, b: RawJson, *, ordered: bool = False) -> bool:
    """Deep equality of two JSON values under JSON's rules, safe at any depth.

    Type-strict where Python's ``==`` is not: a boolean is not a number (``true != 1``,
    ``false != 0``); numbers compare by value (``1 == 1.0``: JSON, and the reference's
    JavaScript, has one number type); a tuple equals the list it froze. Object key
    order is irrelevant unless ``ordered`` (the reference's serialized-JSON equality,
    used for request-header tools). Frozen views compare by their raw trees.
    """
    if a is b:
        return True
    try:
        # Identical JSON text is equal JSON, whatever the container types: orjson is
        # C-fast and writes tuples as arrays. It refuses views, non-JSON values and very
        # deep trees, and writes NaN and the infinities as null (a borrowed value may
        # hold them): the walk decides those, and every text that differs.
        text = orjson.dumps(a)
        if text == orjson.dumps(b) and b"null" not in text:
            return True
    except orjson.JSONEncodeError:
        pass
    return _raw_equal_iterative(a, b, ordered)


def _raw_equal_iterative(a: RawJson, b: RawJson, ordered: bool) -> bool:
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        tx, ty = type(x), type(y)
        if tx is FrozenDict or tx is FrozenList:
            x = x._raw
            tx = type(x)
        if ty is FrozenDict or ty is FrozenList:
            y = y._raw
            ty = type(y)
        if tx is dict:
            if ty is not dict or len(x) != len(y):
                return False
            if ordered:
                if list(x) != list(y):
                    return False
            elif x.keys() != y.keys():
                return False
            stack.extend((v, y[k]) for k, v in x.items())
        elif tx is list or tx is tuple:
            if (ty is not list and ty is not tuple) or len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
        elif ty is dict or ty is list or ty is tuple:
            return False
        elif tx is bool or ty is bool:
            if tx is not ty or x is not y:
                return False
        elif (tx is int or tx is float) and (ty is int or ty is float):
            if x != y:
                return False
        elif tx is not ty or x != y:
            return False
    return True


def _unwrap_other(other: object) -> tuple[bool, Any]:
    t = type(other)
    if t is FrozenDict or t is FrozenList:
        return True, other._raw  # type: ignore[attr-defined]
    if t is dict or t is list:
        return True, other
    return False, None


class _ReadOnlyView:
    """What both views share: no attribute writes, no hashing, pickling via thaw."""

    __slots__ = ()
    _raw: Any

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __len__(self) -> int:
        return len(self._raw)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({thaw(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (thaw(self),))


@final
class FrozenDict(_ReadOnlyView, Mapping[str, "JsonValue"]):
    """A read-only view of a JSON object. Mutation attempts raise ``TypeError``.

    Equal to another ``FrozenDict`` or a plain ``dict`` with the same content.
    ``orjson`` cannot serialise it directly: use :func:`raw_of` (or :func:`thaw`).
    """

    __slots__ = ("_bound", "_depth", "_raw")  # _bound, _depth: see _view_fits (unset until asked)
    _raw: dict[str, Any]

    def __init__(self, value: Mapping[str, object] | None = None) -> None:
        raw = snapshot_raw({} if value is None else dict(value) if type(value) is not dict else value)
        object.__setattr__(self, "_raw", raw)

    @classmethod
    def _wrap(cls, raw: dict[str, Any]) -> FrozenDict:
        self = object.__new__(cls)
        object.__setattr__(self, "_raw", raw)
        return self

    def __getitem__(self, key: str) -> JsonValue:
        v = self._raw[key]
        t = type(v)
        if t is dict:
            return FrozenDict._wrap(v)
        if t is list or t is tuple:
            return FrozenList._wrap(v)
        return v  # type: ignore[no-any-return]

    def __contains__(self, key: object) -> bool:
        return key in self._raw

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __eq__(self, other: object) -> bool:
        ok, raw = _unwrap_other(other)
        if not ok:
            return NotImplemented
        return type(raw) is dict and raw_equal(self._raw, raw)

    __hash__ = None  # type: ignore[assignment]



@final
class FrozenList(_ReadOnlyView, Sequence["JsonValue"]):
    """A read-only view of a JSON array. Mutation attempts raise ``TypeError``."""

    __slots__ = ("_bound", "_depth", "_raw")  # _bound, _depth: see _view_fits (unset until asked)
    _raw: list[Any] | tuple[Any, ...]

    def __init__(self, value: Sequence[object] = ()) -> None:
        raw = snapshot_raw(value if type(value) is list else list(value))
        object.__setattr__(self, "_raw", raw)

    @classmethod
    def _wrap(cls, raw: list[Any] | tuple[Any, ...]) -> FrozenList:
        self = object.__new__(cls)
        object.__setattr__(self, "_raw", raw)
        return self

    @overload
    def __getitem__(self, index: int) -> JsonValue: ...
    @overload
    def __getitem__(self, index: slice) -> FrozenList: ...
    def __getitem__(self, index: int | slice) -> JsonValue | FrozenList:
        if isinstance(index, slice):
            return FrozenList._wrap(self._raw[index])
        v = self._raw[index]
        t = type(v)
        if t is dict:
            return FrozenDict._wrap(v)
        if t is list or t is tuple:
            return FrozenList._wrap(v)
        return v  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[JsonValue]:
        for v in self._raw:
            t = type(v)
            if t is dict:
                yield FrozenDict._wrap(v)
            elif t is list or t is tuple:
                yield FrozenList._wrap(v)
            else:
                yield v

    def __eq__(self, other: object) -> bool:
        ok, raw = _unwrap_other(other)
        if not ok:
            return NotImplemented
        return type(raw) in ARRAY and raw_equal(self._raw, raw)

    __hash__ = None  # type: ignore[assignment]

