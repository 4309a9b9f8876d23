"""The OpenAI-compatible provider's configuration: the :class:`Endpoint` (DeepSeek's is
:data:`DEEPSEEK`), :class:`Timeouts` and the :class:`RetryPolicy`."""

from __future__ import annotations

import random
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal, TypeAlias

import attrs

ReasoningReplay: TypeAlias = Literal["never", "tool-calls", "always"]


def _frozen_windows(windows: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType(dict(windows))


def _frozen_headers(headers: Mapping[str, Mapping[str, str]]) -> Mapping[str, Mapping[str, str]]:
    return MappingProxyType({k: MappingProxyType(dict(v)) for k, v in headers.items()})


@attrs.frozen
class Endpoint:
    """Where a provider talks to and what it knows about the service's models.

    ``api_key_env`` names the environment variable holding the key (read when the
    provider is built; ``None``: no key). ``context_windows`` maps model names to their
    windows (``ModelInfo.context_window``). ``reasoning_replay``: which reasoning is sent
    back as ``reasoning_content`` (see docs/providers.md). ``purpose_headers`` adds
    headers to requests of a given ``ModelRequest.purpose`` (the reference's DeepSeek
    adapter flags compaction requests).
    """

    name: str
    base_url: str
    default_model: str
    api_key_env: str | None = None
    context_windows: Mapping[str, int] = attrs.field(factory=dict, converter=_frozen_windows)
    reasoning_replay: ReasoningReplay = "never"
    purpose_headers: Mapping[str, Mapping[str, str]] = attrs.field(factory=dict, converter=_frozen_headers)


DEEPSEEK: Final = Endpoint(
    name="deepseek",
    base_url="https://api.deepseek.com",
    default_model="deepseek-chat",
    api_key_env="DEEPSEEK_API_KEY",
    context_windows={"deepseek-chat": 128_000, "deepseek-reasoner": 128_000},
    reasoning_replay="tool-calls",
    purpose_headers={"compaction": {"x-deepseek-harness-compact": "1"}},
)


@attrs.frozen
class Timeouts:
    """Seconds. ``read`` is an idle timeout: the longest silence between two reads of
    the stream (keep-alive comments count as traffic). ``close`` bounds releasing a
    connection (shielded) when a stream ends or is cancelled."""

    connect: float = 10.0
    read: float = 300.0
    write: float = 30.0
    pool: float = 10.0
    close: float = 5.0


@attrs.frozen
class RetryPolicy:
    """Bounded retries of a request that failed before any chunk was yielded: HTTP 429,
    408 and 5xx, connection failures, timeouts, a stream cut before its first chunk.

    The n-th retry (n = 0, 1, ...) waits ``min(max_delay, initial_delay * 2**n)``, less
    up to ``jitter`` of it at random; a ``Retry-After`` (or ``retry-after-ms``) the
    service sent is waited instead, unless it is longer than ``max_retry_after``: then
    the error is raised at once, carrying ``retry_after_ms`` for the caller to decide.
    ``max_retries=0`` disables retries.
    """

    max_retries: int = 3
    initial_delay: float = 0.5
    max_delay: float = 20.0
    jitter: float = 0.2
    max_retry_after: float = 60.0

    def __attrs_post_init__(self) -> None:
        if self.max_retries < 0 or self.initial_delay < 0 or self.max_delay < 0 or not 0 <= self.jitter <= 1:
            raise ValueError(f"invalid retry policy {self!r}")

    def delay(self, retry: int, retry_after: float | None, rng: random.Random) -> float | None:
        """Seconds to wait before retry number ``retry`` (0-based); ``None``: do not."""
        if retry >= self.max_retries:
            return None
        if retry_after is not None:
            return None if retry_after > self.max_retry_after else max(0.0, retry_after)
        base: float = min(self.max_delay, self.initial_delay * 2.0**retry)
        return base * (1.0 - self.jitter * rng.random())
