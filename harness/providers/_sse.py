"""An incremental Server-Sent Events parser (the WHATWG event-stream format).

Bytes go in as they arrive, in pieces cut anywhere (mid-line, between ``\\r`` and
``\\n``); complete events come out. Lines end with ``\\r\\n``, ``\\n`` or ``\\r``; a blank
line dispatches the event; ``:`` lines are comments (keep-alives); ``data`` lines of
one event are joined with ``\\n``. Lines are decoded once complete, so a multi-byte
UTF-8 character split across reads is never cut. At the end of the stream an event
without its blank line is discarded, as the format says.
"""

from __future__ import annotations

from typing import Final

import attrs

_CR: Final = 13
_LF: Final = 10


@attrs.frozen
class SSEEvent:
    event: str
    data: str


class SSEFormatError(ValueError):
    """A line or an event grew beyond the parser's bound."""


class SSEParser:
    """Feed bytes with :meth:`feed`, end with :meth:`close`; both return the events
    completed. ``comments`` counts comment lines seen (keep-alives)."""

    def __init__(self, *, max_event_bytes: int = 8 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self._scan = 0  # self._buf[:self._scan] holds no line terminator
        self._data: list[str] = []
        self._size = 0
        self._event = ""
        self._max = max_event_bytes
        self._first = True
        self.comments = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        buf = self._buf
        buf += chunk
        out: list[SSEEvent] = []
        start = 0
        n = len(buf)
        # The search for the pending line's end resumes where the last feed's stopped:
        # a long line in small reads is scanned once, not once per read (issue 24 §2).
        scan = self._scan
        while start < n:
            lf = buf.find(b"\n", scan)
            cr = buf.find(b"\r", scan, lf if lf >= 0 else n)
            if cr >= 0:
                if cr + 1 == n:
                    scan = cr
                    break  # a lone \r at the end: wait, it may be half of \r\n
                end, nxt = cr, cr + 2 if buf[cr + 1] == _LF else cr + 1
            elif lf >= 0:
                end, nxt = lf, lf + 1
            else:
                scan = n
                break
            self._line(bytes(buf[start:end]), out)
            start = scan = nxt
        del buf[:start]  # a bytearray drops its head in O(1)
        self._scan = scan - start
        if len(buf) > self._max:
            raise SSEFormatError(f"an event-stream line exceeds {self._max} bytes")
        return out

    def close(self) -> list[SSEEvent]:
        """The end of the stream: a pending line (a lone ``\\r``-terminated one, or one
        without terminator) is taken; an event not closed by a blank line is dropped."""
        out: list[SSEEvent] = []
        if self._buf.endswith(b"\r"):
            self._line(bytes(self._buf[:-1]), out)
        self._buf.clear()
        self._scan = 0
        self._data = []
        self._event = ""
        return out

    def _line(self, raw: bytes, out: list[SSEEvent]) -> None:
        if self._first:
            self._first = False
            if raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
        if not raw:
            if self._data:
                out.append(SSEEvent(self._event or "message", "\n".join(self._data)))
            self._data = []
            self._size = 0
            self._event = ""
            return
        line = raw.decode("utf-8", errors="replace")
        if line.startswith(":"):
            self.comments += 1
            return
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._size += len(raw)
            if self._size > self._max:
                raise SSEFormatError(f"an event-stream event exceeds {self._max} bytes")
            self._data.append(value)
        elif field == "event":
            self._event = value
        # "id" and "retry" (reconnection) mean nothing to a one-shot request.
