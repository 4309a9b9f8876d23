"""Typed failures of a remote model provider (HTTP), beyond the protocol's own.

They complete the :class:`ProviderError` family of ``_protocol`` for providers that talk
to a service: who refused (auth, the request, the server), how the transport failed
(unreachable, timed out), and how a stream ended wrong (truncated, filtered). Every one
carries ``status`` (the HTTP status, when there was one) and ``retry_after_ms`` (when
the service said when to come back). Nothing here imports a transport library.
"""

from __future__ import annotations

from typing import Literal

from harness.providers._protocol import ProviderError, ProviderStreamError

TimeoutPhase = Literal["connect", "read", "write", "pool"]


class ProviderAuthError(ProviderError):
    """The service refused the credentials (HTTP 401/403), or none were configured.

    Never retried: the same key fails the same way."""

    code = "PROVIDER_AUTH_FAILED"


class ProviderRequestError(ProviderError):
    """The service refused the request itself (a 4xx other than auth, rate limit and
    context length: a bad parameter, an unknown model, an exhausted balance). Not
    retried."""

    code = "PROVIDER_REQUEST_REJECTED"


class ProviderServerError(ProviderError):
    """The service failed (HTTP 5xx, or a reply it interrupted for lack of capacity),
    and the bounded retries did not get past it."""

    code = "PROVIDER_SERVER_ERROR"


class ProviderConnectionError(ProviderError):
    """The service could not be reached (refused, reset before a response, DNS)."""

    code = "PROVIDER_UNREACHABLE"


class ProviderTimeoutError(ProviderError):
    """A transport timeout: ``phase`` says which (``connect``; ``read``: the stream was
    silent longer than the idle timeout; ``write``; ``pool``: no connection free)."""

    code = "PROVIDER_TIMEOUT"

    def __init__(
        self,
        message: str,
        *,
        phase: TimeoutPhase,
        status: int | None = None,
        retry_after_ms: int | None = None,
    ) -> None:
        super().__init__(message, status=status, retry_after_ms=retry_after_ms)
        self.phase = phase


class ContentFilteredError(ProviderError):
    """The service stopped the reply with ``finish_reason: content_filter``.

    An error, not a finish: the protocol's finishes are ``stop``, ``tool-calls`` and
    ``length``, and a filtered reply is not a completed one. The turn ends ``error``
    with this code; the partial reply is not committed."""

    code = "CONTENT_FILTERED"


class TruncatedStreamError(ProviderStreamError):
    """The stream ended without a finish reason: the body ended (or the connection
    closed) before the service said the reply was complete."""

    code = "PROVIDER_STREAM_TRUNCATED"
