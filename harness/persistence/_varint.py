"""The ``source_event_seqs`` column of the SQLite schema 17 (reference §3): varints.

A list of non-negative safe integers becomes unsigned LEB128 varints (7 bits a byte,
least significant group first, high bit = more follows): the first value as it is,
every later one as the zigzag of its difference from the one before (an ascending
step ``d`` is ``2d``, a descending step ``d`` is ``2d - 1``). An empty list is an empty
BLOB. ``[5, 3, 300]`` is ``05 03 d2 04``: 5; 3 - 5 = -2 -> 3; 300 - 3 = 297 -> 594.

Decoding is strict, as the reference's: a varint of more than 9 bytes or over its
bound (the first value at most 2**53 - 1, a zigzag delta at most twice that), a
non-canonical one (a final zero byte after the first), a truncated one, and a value
leaving 0..2**53 - 1 are refused with :class:`VarintError`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

SAFE_MAX: Final = 2**53 - 1
_ZIGZAG_MAX: Final = 2 * SAFE_MAX
_PREFIX: Final = "malformed source_event_seqs storage value: "


class VarintError(ValueError):
    """A stored ``source_event_seqs`` value is malformed (the reference's wording)."""


def encode_seqs(values: Iterable[object]) -> bytes:
    """Encode a list of non-negative safe integers; anything else raises ``TypeError``."""
    out = bytearray()
    previous = 0
    first = True
    for value in values:
        if type(value) is not int or not 0 <= value <= SAFE_MAX:
            raise TypeError("sourceEventSeqs must contain non-negative safe integers")
        if first:
            n = value
            first = False
        elif value >= previous:
            n = (value - previous) * 2
        else:
            n = (previous - value) * 2 - 1
        previous = value
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
    return bytes(out)


def decode_seqs(data: bytes) -> list[int]:
    """Decode a stored value back to its list (strictly; see the module)."""
    values: list[int] = []
    previous = 0
    pos = 0
    end = len(data)
    while pos < end:
        limit = SAFE_MAX if not values else _ZIGZAG_MAX
        n = 0
        shift = 0
        while True:
            if pos >= end:
                raise VarintError(_PREFIX + "truncated varint")
            byte = data[pos]
            pos += 1
            n |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if shift and not byte & 0x7F:
                    raise VarintError(_PREFIX + "non-canonical varint")
                if n > limit:
                    raise VarintError(_PREFIX + "varint is out of range")
                break
            shift += 7
            if shift > 56:
                raise VarintError(_PREFIX + "varint is out of range")
        if values:
            value = previous + (n >> 1 if not n & 1 else -((n + 1) >> 1))
        else:
            value = n
        if not 0 <= value <= SAFE_MAX:
            raise VarintError(_PREFIX + "decoded seq is out of range")
        values.append(value)
        previous = value
    return values
