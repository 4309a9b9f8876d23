"""An OpenAI-compatible chat-completions provider, streaming over SSE on Trio (httpx).

DeepSeek is the default endpoint (:data:`DEEPSEEK`); any service that speaks
``POST {base_url}/chat/completions`` with ``stream: true`` works with an
:class:`Endpoint` of its own. docs/providers.md describes the mapping and the
decisions (content filter, retries, reasoning replay).

This module is the transport: the provider, its streamed request (connection,
retries, error mapping); the configuration, the request body and the reply mapping
live in ``_openai_config``, ``_openai_request`` and ``_openai_reply``.

The stream is a small class, not an async generator: the connection has to be
released at once when the consumer is cancelled or stops reading, not when a garbage
collector's finalizer gets to it. For the same reason the request body is a plain
iterator and httpx's own chain of body generators is always run to its end (see
``_ChatStream._release``).
"""

from __future__ import annotations

import email.utils
import functools
import logging
import math
import os
import random
import re
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final, Literal, final

import httpx
import orjson
import trio

from harness.providers._errors import (
    ProviderAuthError,
    ProviderConnectionError,
    ProviderRequestError,
    ProviderServerError,
    ProviderTimeoutError,
    TruncatedStreamError,
)
from harness.providers._models import ModelInfo
from harness.providers._openai_config import (
    DEEPSEEK,
    Endpoint,
    ReasoningReplay,
    RetryPolicy,
    Timeouts,
)
from harness.providers._openai_reply import _Item, _ReplyMapper
from harness.providers._openai_request import chat_request_body
from harness.providers._protocol import (
    ContextWindowExceededError,
    ModelRequest,
    ProviderError,
    ProviderStreamError,
    RateLimitedError,
    StreamChunk,
)
from harness.providers._sse import SSEEvent, SSEFormatError, SSEParser

log = logging.getLogger("harness.providers.openai")


#: An error body is read up to this many bytes (the rest is not worth waiting for).
_ERROR_BODY_LIMIT: Final = 64 * 1024


_CONTEXT_MESSAGE = re.compile(
    r"context[ _-]?(length|window)|maximum context|too many tokens|prompt is too long|reduce the length",
    re.IGNORECASE,
)


_CONTEXT_CODES: Final = frozenset({"context_length_exceeded", "context_window_exceeded", "string_above_max_length"})


_RETRYABLE: Final = (RateLimitedError, ProviderServerError, ProviderConnectionError, ProviderTimeoutError, TruncatedStreamError)


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # Building one loads the CA bundle (~30 ms): do it once per process.
    return httpx.create_ssl_context()


@final
class OpenAICompatibleProvider:
    """A :class:`~harness.providers.ModelProvider` for an OpenAI-compatible
    chat-completions endpoint, DeepSeek's by default.

    The API key comes from ``api_key`` or the endpoint's environment variable
    (``DEEPSEEK_API_KEY``); it is sent as a bearer token and never logged, never put in
    an error message (a service echoing it is redacted) nor in a session.

    The HTTP client (a connection pool) is created on first use; :meth:`aclose` (or
    ``async with``) closes it. ``transport`` replaces the network (tests);
    ``trust_env`` lets httpx read proxy settings from the environment.
    """

    def __init__(
        self,
        endpoint: Endpoint = DEEPSEEK,
        *,
        model: str | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        context_windows: Mapping[str, int] | None = None,
        timeouts: Timeouts | None = None,
        retry: RetryPolicy | None = None,
        reasoning_replay: ReasoningReplay | None = None,
        headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        trust_env: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.name = endpoint.name
        self.model = model or endpoint.default_model
        self.base_url = (base_url or endpoint.base_url).rstrip("/")
        if api_key is None and endpoint.api_key_env:
            api_key = os.environ.get(endpoint.api_key_env) or None
        self._api_key = api_key
        windows = {**endpoint.context_windows, **(context_windows or {})}
        for m, w in windows.items():
            if type(w) is not int or w <= 0:
                raise ValueError(f"context window of {self.name}/{m} must be a positive integer, got {w!r}")
        self.context_windows: Mapping[str, int] = windows
        self.timeouts = timeouts or Timeouts()
        self.retry = retry or RetryPolicy()
        self.reasoning_replay: ReasoningReplay = reasoning_replay or endpoint.reasoning_replay
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}
        self.extra_body = dict(extra_body or {})
        self._trust_env = trust_env
        self._transport = transport
        self._rng = rng or random.Random()
        self._client: httpx.AsyncClient | None = None

    def __repr__(self) -> str:  # never the key
        key = "set" if self._api_key else "missing"
        return f"<OpenAICompatibleProvider {self.name}/{self.model} at {self.base_url} (api key {key})>"

    # -- model info ---------------------------------------------------------------------------

    @property
    def context_window(self) -> int | None:
        """The configured window of :attr:`model` (``None``: unknown)."""
        return self.context_windows.get(self.model)

    @property
    def has_api_key(self) -> bool:
        return bool(self._api_key)

    def model_info(self, model: str | None = None) -> ModelInfo:
        m = model or self.model
        return ModelInfo(self.name, m, self.context_windows.get(m))

    def catalog_windows(self) -> dict[tuple[str, str], int]:
        """Every configured window keyed for :class:`~harness.providers.ModelCatalog`:
        ``ModelCatalog(p.catalog_windows(), [p])`` answers per model."""
        return {(self.name, m): w for m, w in self.context_windows.items()}

    def with_model(self, model: str) -> OpenAICompatibleProvider:
        """The same endpoint, key and settings for another model (its own client)."""
        return OpenAICompatibleProvider(
            self.endpoint,
            model=model,
            api_key=self._api_key,
            base_url=self.base_url,
            context_windows=self.context_windows,
            timeouts=self.timeouts,
            retry=self.retry,
            reasoning_replay=self.reasoning_replay,
            headers=self.headers,
            extra_body=self.extra_body,
            trust_env=self._trust_env,
            transport=self._transport,
            rng=self._rng,
        )

    # -- streaming ----------------------------------------------------------------------------

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """Stream a reply to ``request`` (see the module docs for the mapping).

        Nothing happens until the first ``__anext__``, which sends the request (with
        the retries of :attr:`retry`). Every ``__anext__`` is a checkpoint.

        Cancellation: a cancelled ``__anext__`` closes the HTTP connection before
        ``Cancelled`` propagates (shielded, bounded by ``timeouts.close``); ``aclose``
        does the same for a stream abandoned half-read.
        """
        return _ChatStream(self, request)

    async def aclose(self) -> None:
        """Close the connection pool (idempotent). Cancellation: shielded, bounded by
        ``timeouts.close``."""
        client, self._client = self._client, None
        if client is not None:
            with trio.CancelScope(shield=True, deadline=trio.current_time() + self.timeouts.close):
                await client.aclose()

    async def __aenter__(self) -> OpenAICompatibleProvider:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            t = self.timeouts
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(connect=t.connect, read=t.read, write=t.write, pool=t.pool),
                trust_env=self._trust_env,
                verify=_ssl_context(),
                transport=self._transport,
            )
        return self._client

    def _request_headers(self, purpose: str | None) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream",
            # A compressed event stream would be buffered by the decoder: ask for none.
            "accept-encoding": "identity",
            "user-agent": "trio-harness",
        }
        headers.update(self.headers)
        if purpose is not None:
            headers.update(self.endpoint.purpose_headers.get(purpose, {}))
        if self._api_key:
            headers["authorization"] = f"Bearer {self._api_key}"
        return headers

    def _redact(self, text: str) -> str:
        key = self._api_key
        return text.replace(key, "[redacted]") if key and len(key) >= 4 else text


class _Body(httpx.AsyncByteStream):
    """The request body. httpx's own byte streams iterate with an async generator,
    which a cancellation during the upload would leave suspended for the garbage
    collector; this iterator is a plain object."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _Once(self._data)


class _Once:
    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data

    def __aiter__(self) -> _Once:
        return self

    async def __anext__(self) -> bytes:
        data, self._data = self._data, None
        if data is None:
            raise StopAsyncIteration
        return data


async def _exhaust(raw: AsyncIterator[bytes]) -> None:
    """Read ``raw`` to its end or its first failure (see ``_ChatStream._release``)."""
    try:
        while True:
            await raw.__anext__()
    except (StopAsyncIteration, httpx.HTTPError):
        pass


class _ChatStream:
    """One streamed request. See :meth:`OpenAICompatibleProvider.stream`."""

    def __init__(self, provider: OpenAICompatibleProvider, request: ModelRequest) -> None:
        self._p = provider
        self._request = request
        self._response: httpx.Response | None = None
        self._raw: AsyncIterator[bytes] | None = None
        self._parser = SSEParser()
        self._mapper = _ReplyMapper(provider.name)
        self._pending: deque[_Item] = deque()
        self._retries = 0
        self._yielded = False
        self._ended = False  # nothing more will be read: done, failed or closed
        self._complete = False  # [DONE] was read: the body's end may be drained

    def __aiter__(self) -> _ChatStream:
        return self

    async def __anext__(self) -> StreamChunk:
        try:
            await trio.lowlevel.checkpoint()
            while not self._pending:
                if self._ended:
                    raise StopAsyncIteration
                await self._fill()
            item = self._pending.popleft()
            if isinstance(item, ProviderError):
                self._ended = True
                self._pending.clear()
                raise item
            self._yielded = True
            return item
        except BaseException:
            # Cancelled, failed or finished: the connection goes now, not at aclose.
            await self._release()
            raise

    async def aclose(self) -> None:
        """Stop reading and release the connection (idempotent).

        Cancellation: the release is shielded, so a cancelled caller still leaves no
        connection open; ``Cancelled`` is delivered at its next checkpoint."""
        self._ended = True
        self._pending.clear()
        await self._release()

    async def _release(self, *, drain: bool = False) -> None:
        """Let the response go. ``drain``: the body is complete (``[DONE]`` was read),
        so read its end first, bounded, and the connection may go back to the pool;
        otherwise it is closed at once.

        httpx reads a body through a chain of async generators. One left suspended
        would be finalized by the garbage collector (a ``ResourceWarning``, and a task
        scheduled at a moment nobody chose), so the chain is always run to its end:
        after the close, one more read on the closed connection fails through it.

        Shielded: a cancelled consumer must still close the socket (the service would
        go on generating, and billing, a reply nobody reads). Bounded by
        ``timeouts.close``: a close cannot hang the caller.
        """
        raw, response = self._raw, self._response
        self._raw = self._response = None
        if raw is None and response is None:
            return
        grace = self._p.timeouts.close
        with trio.CancelScope(shield=True):
            if drain and raw is not None:
                with trio.move_on_after(min(grace, 1.0)):
                    await _exhaust(raw)
            with trio.move_on_after(grace):
                try:
                    if response is not None:
                        await response.aclose()
                finally:
                    if raw is not None:
                        await _exhaust(raw)

    # -- reading ------------------------------------------------------------------------------

    async def _fill(self) -> None:
        """Read until something is pending or the stream ended (one read at most)."""
        if self._raw is None:
            await self._open()
            return
        try:
            data = await self._raw.__anext__()
        except StopAsyncIteration:
            self._events(self._parser.close())
            self._end()
            return
        except httpx.HTTPError as exc:
            if self._mapper.finish is not None:
                self._end()  # cut after the finish reason: the reply is complete
                return
            error = self._transport_error(exc, started=True)
            if await self._retry(error):
                return
            raise error from exc
        try:
            events = self._parser.feed(data)
        except SSEFormatError as exc:
            raise ProviderStreamError(f"{self._p.name}: {exc}") from exc
        self._events(events)
        if self._ended:
            await self._release(drain=self._complete)

    def _end(self) -> None:
        if not self._ended:
            self._pending.extend(self._mapper.end())
            self._ended = True

    def _events(self, events: list[SSEEvent]) -> None:
        for event in events:
            if self._ended:
                return
            if event.data == "[DONE]":
                self._complete = True
                self._end()
                continue
            try:
                payload = orjson.loads(event.data)
            except orjson.JSONDecodeError:
                self._fail(ProviderStreamError(f"{self._p.name}: malformed stream event: {self._p._redact(event.data[:200])!r}"))
                return
            if not isinstance(payload, dict):
                self._fail(ProviderStreamError(f"{self._p.name}: unexpected stream event {type(payload).__name__}"))
                return
            if event.event == "error" or payload.get("error"):
                self._fail(self._error(None, {}, payload))
                return
            items = self._mapper.feed(payload)
            self._pending.extend(items)
            if any(isinstance(item, ProviderError) for item in items):
                self._ended = True
                return

    def _fail(self, error: ProviderError) -> None:
        self._pending.append(error)
        self._ended = True

    # -- the request --------------------------------------------------------------------------

    async def _open(self) -> None:
        p = self._p
        body = orjson.dumps(chat_request_body(self._request, reasoning_replay=p.reasoning_replay, extra_body=p.extra_body))
        headers = p._request_headers(self._request.purpose)
        if "authorization" not in headers:
            env = p.endpoint.api_key_env
            hint = f": set {env}" if env else ""
            raise ProviderAuthError(f"{p.name}: no API key configured{hint}")
        client = p._http()
        url = f"{p.base_url}/chat/completions"
        while True:
            try:
                http_request = client.build_request("POST", url, headers=headers, content=body)
                http_request.stream = _Body(body)
                response = await client.send(http_request, stream=True)
            except httpx.HTTPError as exc:
                error = self._transport_error(exc, started=False)
                if await self._retry(error):
                    continue
                raise error from exc
            self._response = response
            kind = response.headers.get("content-type", "")
            if 200 <= response.status_code < 300 and "text/event-stream" in kind:
                self._raw = response.aiter_raw()
                self._parser = SSEParser()
                self._mapper = _ReplyMapper(p.name)
                return
            payload = await self._error_body(response)
            if 200 <= response.status_code < 300:
                # A reply that is not an event stream: an error object, or a service
                # that ignored ``stream: true``.
                if isinstance(payload, dict) and payload.get("error"):
                    raise self._error(None, response.headers, payload)
                got = kind or "no content type"
                raise ProviderStreamError(f"{p.name}: expected an event stream, got {got}", status=response.status_code)
            error = self._error(response.status_code, response.headers, payload)
            if await self._retry(error):
                continue
            raise error

    async def _error_body(self, response: httpx.Response) -> Any:
        """The start of an error reply's body (JSON when it parses); the response is
        released afterwards."""
        data = bytearray()
        raw = self._raw = response.aiter_raw()
        try:
            while len(data) < _ERROR_BODY_LIMIT:
                data += await raw.__anext__()
        except (StopAsyncIteration, httpx.HTTPError):
            pass  # what arrived is all there is
        await self._release()
        text = bytes(data[:_ERROR_BODY_LIMIT]).decode("utf-8", errors="replace")
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            return text

    async def _retry(self, error: ProviderError) -> bool:
        """Wait and return True when ``error`` may be retried: nothing was yielded yet,
        it is transient, the budget and the service's ``Retry-After`` allow it."""
        if self._yielded or self._pending or not isinstance(error, _RETRYABLE):
            return False
        retry_after = None if error.retry_after_ms is None else error.retry_after_ms / 1000
        delay = self._p.retry.delay(self._retries, retry_after, self._p._rng)
        if delay is None:
            return False
        self._retries += 1
        log.warning(
            "%s; retry %d of %d in %.2f s", error, self._retries, self._p.retry.max_retries, delay
        )
        await self._release()
        await trio.sleep(delay)
        return True

    # -- errors -------------------------------------------------------------------------------

    def _transport_error(self, exc: httpx.HTTPError, *, started: bool) -> ProviderError:
        name = self._p.name
        where = self._p.base_url
        if isinstance(exc, httpx.TimeoutException):
            phase: Literal["connect", "read", "write", "pool"] = (
                "connect"
                if isinstance(exc, httpx.ConnectTimeout)
                else "write"
                if isinstance(exc, httpx.WriteTimeout)
                else "pool"
                if isinstance(exc, httpx.PoolTimeout)
                else "read"
            )
            what = {
                "connect": f"connecting to {where} timed out",
                "read": f"the stream from {where} was silent for {self._p.timeouts.read:g} s",
                "write": f"sending the request to {where} timed out",
                "pool": "no connection was free in the pool",
            }[phase]
            return ProviderTimeoutError(f"{name}: {what}", phase=phase)
        if isinstance(exc, httpx.ConnectError):
            return ProviderConnectionError(f"{name}: cannot connect to {where}: {self._p._redact(str(exc))}")
        if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
            if started:
                return TruncatedStreamError(f"{name}: the connection closed mid-stream: {self._p._redact(str(exc))}")
            return ProviderConnectionError(f"{name}: the connection to {where} failed: {self._p._redact(str(exc))}")
        return ProviderStreamError(f"{name}: transport failed: {self._p._redact(repr(exc))}")

    def _error(self, status: int | None, headers: Mapping[str, str], payload: Any) -> ProviderError:
        """The typed error for an HTTP error reply (or an error object in the stream)."""
        name = self._p.name
        message, code = _error_fields(payload)
        message = self._p._redact(message)[:2000]
        text = f"{name}: HTTP {status}: {message}" if status is not None else f"{name}: {message}"
        retry_after_ms = _retry_after_ms(headers)
        kw: dict[str, Any] = {"status": status, "retry_after_ms": retry_after_ms}
        if status in (401, 403) or code in ("invalid_api_key", "authentication_error"):
            return ProviderAuthError(text, **kw)
        if status == 429 or code in ("rate_limit_exceeded", "rate_limit_error"):
            return RateLimitedError(text, **kw)
        if status == 413 or code in _CONTEXT_CODES or (status in (None, 400, 422) and _CONTEXT_MESSAGE.search(message)):
            return ContextWindowExceededError(text, **kw)
        if status is None or status == 408 or status >= 500:
            return ProviderServerError(text, **kw)
        return ProviderRequestError(text, **kw)


def _error_fields(payload: Any) -> tuple[str, str | None]:
    """``(message, code)`` of an error body: ``{"error": {"message", "code"|"type"}}``,
    ``{"error": "..."}``, ``{"message": ...}`` or plain text."""
    if isinstance(payload, dict):
        err = payload.get("error", payload)
        if isinstance(err, str):
            return err, None
        if isinstance(err, dict):
            message = err.get("message") or err.get("msg") or orjson.dumps(err).decode()
            code = err.get("code") or err.get("type")
            return str(message), str(code) if code is not None else None
    text = str(payload).strip()
    return (text or "(no body)"), None


def _retry_after_ms(headers: Mapping[str, str]) -> int | None:
    """``retry-after-ms`` (OpenAI), else ``Retry-After`` in seconds or as an HTTP date."""
    raw = headers.get("retry-after-ms")
    if raw is not None:
        try:
            value = float(raw)
            if math.isfinite(value) and value >= 0:
                return int(value)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return int(max(0.0, seconds) * 1000)
