"""Building an unpublished session from stored records (restore mode)."""

from __future__ import annotations

from typing import Any

from harness.errors import HarnessError, SessionCorruptionError, SessionFormatUnsupportedError
from harness.persistence._backend import StoredLog
from harness.session import Session, thaw


def build_session(session_id: str, header: dict[str, Any], records: list[Any]) -> Session:
    """Restore mode over stored records (adopted, not copied); a validation failure
    becomes :class:`SessionCorruptionError` (format refusals pass through)."""
    try:
        return Session.restore(session_id, records, header)  # pauses the collector itself
    except SessionFormatUnsupportedError:
        raise
    except HarnessError as exc:
        raise SessionCorruptionError(
            f'stored session "{session_id}" failed validation: {exc}', session_id=session_id
        ) from exc


def check_restores(session_id: str, stored: StoredLog, records: list[Any], closers: list[Any]) -> None:
    """Refuse (as :func:`build_session`) a stored log that does not restore, before
    anything is written to it: the session is built from the records and the closers
    and dropped."""
    build_session(session_id, stored.header, [*records, *(thaw(c) for c in closers)])
