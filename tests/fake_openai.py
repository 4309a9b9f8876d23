"""A scripted OpenAI-compatible chat-completions server on loopback (Trio + h11), for tests.

Each ``POST .../chat/completions`` takes the next reply of the script:

* :class:`Stream` — an SSE body written in pieces (one HTTP chunk per write): split per
  event, every ``n`` bytes (cutting events, JSON and UTF-8 sequences anywhere) or at
  given offsets, with a delay between writes; it then ends cleanly (``close``; or
  ``linger``: complete, but the connection stays open until the client closes it), cuts
  the connection mid-body (``abort``), goes silent until the client leaves (``stall``)
  or keeps streaming deltas, ignoring that the client left, until a write fails
  (``endless``);
* :class:`Status` — an HTTP error reply with a body and headers.

The server records every request (headers and JSON body) and every connection: whether
it completed its reply, and when it saw the client disconnect (:attr:`Conn.gone`).
Every reply carries ``connection: close``, so each request is one connection.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Literal

import attrs
import h11
import orjson
import trio


@attrs.frozen
class Stream:
    events: Sequence[dict[str, Any] | str]
    done: bool = True  # append "data: [DONE]"
    split: int | Sequence[int] | None = None
    delay: float = 0.0
    end: Literal["close", "linger", "abort", "stall", "endless"] = "close"
    status: int = 200
    content_type: str = "text/event-stream"
    headers: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen
class Status:
    status: int
    body: dict[str, Any] | str = ""
    headers: Mapping[str, str] = attrs.field(factory=dict)


Reply = Stream | Status


@attrs.define
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: Any


@attrs.define
class Conn:
    request: Request | None = None
    reply: Reply | None = None
    completed: bool = False  # the reply was written to its scripted end
    gone: trio.Event = attrs.field(factory=trio.Event)  # the client disconnected
    writes: int = 0


def sse(event: dict[str, Any] | str) -> bytes:
    if isinstance(event, str):
        return event.encode()
    return b"data: " + orjson.dumps(event) + b"\n\n"


def body_of(reply: Stream) -> bytes:
    data = b"".join(sse(e) for e in reply.events)
    return data + (b"data: [DONE]\n\n" if reply.done else b"")


def pieces_of(reply: Stream) -> list[bytes]:
    if reply.split is None:
        out = [sse(e) for e in reply.events]
        return out + ([b"data: [DONE]\n\n"] if reply.done else [])
    data = body_of(reply)
    if isinstance(reply.split, int):
        n = reply.split
        return [data[i : i + n] for i in range(0, len(data), n)]
    cuts = [0, *sorted(reply.split), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(cuts) if b > a]


class FakeOpenAI:
    """The server. Start it with :func:`fake_openai`; extend :attr:`script` at will."""

    def __init__(self, script: Sequence[Reply] = ()) -> None:
        self.script: list[Reply] = list(script)
        self.requests: list[Request] = []
        self.conns: list[Conn] = []
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, stream: trio.SocketStream) -> None:
        conn = Conn()
        self.conns.append(conn)
        h = h11.Connection(h11.SERVER)
        try:
            request = await self._read_request(stream, h)
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
            conn.gone.set()
            return
        if request is None:
            conn.gone.set()
            return
        conn.request = request
        self.requests.append(request)
        reply: Reply = self.script.pop(0) if self.script else Status(500, {"error": {"message": "fake: no reply scripted"}})
        conn.reply = reply
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch, stream, conn)
            try:
                await self._reply(stream, h, conn, reply)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                conn.gone.set()
            finally:
                nursery.cancel_scope.cancel()  # the watcher first: our own close is not the client leaving
                with trio.CancelScope(shield=True):
                    await stream.aclose()

    async def _read_request(self, stream: trio.SocketStream, h: h11.Connection) -> Request | None:
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                if not data:
                    return None
                h.receive_data(data)
            elif isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
        assert head is not None
        headers = {k.decode().lower(): v.decode() for k, v in head.headers}
        try:
            parsed: Any = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            parsed = bytes(body)
        return Request(head.method.decode(), head.target.decode(), headers, parsed)

    async def _watch(self, stream: trio.SocketStream, conn: Conn) -> None:
        """The client's side of the connection: EOF (or a reset) means it left."""
        try:
            while await stream.receive_some(65536):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        conn.gone.set()

    async def _reply(self, stream: trio.SocketStream, h: h11.Connection, conn: Conn, reply: Reply) -> None:
        if isinstance(reply, Status):
            body = reply.body if isinstance(reply.body, str) else orjson.dumps(reply.body).decode()
            data = body.encode()
            kind = "text/plain" if isinstance(reply.body, str) else "application/json"
            headers = [("content-type", kind), ("content-length", str(len(data))), ("connection", "close")]
            headers += list(reply.headers.items())
            await stream.send_all(h.send(h11.Response(status_code=reply.status, headers=headers)) or b"")
            await stream.send_all(h.send(h11.Data(data=data)) or b"")
            await stream.send_all(h.send(h11.EndOfMessage()) or b"")
            conn.completed = True
            return
        headers = [("content-type", reply.content_type), ("transfer-encoding", "chunked"), ("connection", "close")]
        headers += list(reply.headers.items())
        await stream.send_all(h.send(h11.Response(status_code=reply.status, headers=headers)) or b"")
        for piece in pieces_of(reply):
            if conn.gone.is_set():
                return  # the client left: a polite server stops
            await stream.send_all(h.send(h11.Data(data=piece)) or b"")
            conn.writes += 1
            if reply.delay:
                await trio.sleep(reply.delay)
            else:
                await trio.lowlevel.checkpoint()
        if reply.end in ("close", "linger"):
            await stream.send_all(h.send(h11.EndOfMessage()) or b"")
            conn.completed = True
            if reply.end == "linger":
                await conn.gone.wait()  # the client must close the connection itself
        elif reply.end == "abort":
            conn.completed = True  # cut on purpose, mid-body
        elif reply.end == "stall":
            await conn.gone.wait()
        else:  # endless: deltas until a write fails, whatever the client did
            n = 0
            while True:
                n += 1
                chunk = {"choices": [{"index": 0, "delta": {"content": f"la{n} "}, "finish_reason": None}]}
                await stream.send_all(h.send(h11.Data(data=sse(chunk))) or b"")
                conn.writes += 1
                await trio.sleep(reply.delay or 0.01)


@asynccontextmanager
async def fake_openai(script: Sequence[Reply] = ()) -> AsyncIterator[FakeOpenAI]:
    """Serve on an ephemeral loopback port for the duration of the block."""
    server = FakeOpenAI(script)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
        server.port = listeners[0].socket.getsockname()[1]
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()


# -- chunk builders -------------------------------------------------------------------------------


def chunk(
    *,
    content: str | None = None,
    reasoning: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str | None = None,
    role: str | None = None,
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "model": "deepseek-chat",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def usage(prompt: int = 11, completion: int = 7) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def text_events(text: str, *, pieces: int = 3, reasoning: str | None = None, finish: str = "stop") -> list[dict[str, Any]]:
    """A reply streaming ``reasoning`` then ``text`` in about ``pieces`` deltas each."""
    out = [chunk(role="assistant", content="")]
    for part, key in ((reasoning, "reasoning"), (text, "content")):
        if part:
            size = max(1, -(-len(part) // pieces))
            for i in range(0, len(part), size):
                out.append(chunk(**{key: part[i : i + size]}))
    out.append(chunk(content="", finish=finish))
    out.append(usage())
    return out


def call_events(
    calls: Sequence[tuple[str, str, str]], *, text: str | None = None, fragment: int = 4
) -> list[dict[str, Any]]:
    """A reply calling tools: ``(id, name, arguments JSON)`` each, the arguments cut into
    ``fragment``-character pieces (the first piece arrives with the id and name)."""
    out = [chunk(role="assistant", content="")]
    if text:
        out.append(chunk(content=text))
    for index, (cid, name, args) in enumerate(calls):
        pieces = [args[i : i + fragment] for i in range(0, len(args), fragment)] or [""]
        out.append(chunk(tool_calls=[{"index": index, "id": cid, "type": "function", "function": {"name": name, "arguments": pieces[0]}}]))
        for p in pieces[1:]:
            out.append(chunk(tool_calls=[{"index": index, "function": {"arguments": p}}]))
    out.append(chunk(finish="tool_calls"))
    out.append(usage())
    return out
