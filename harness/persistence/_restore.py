"""Building an unpublished session from stored records (restore mode)."""

from __future__ import annotations

from typing import Any

from harness.errors import HarnessError, SessionCorruptionError, SessionFormatUnsupportedError
from harness.session import Session


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
