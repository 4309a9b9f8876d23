"""The pure, synchronous session core: events, lossless JSON, header, surface, repair.

Nothing here imports Trio: everything that can be decided synchronously is a plain
function or class, testable without an event loop.
"""

from harness.session._append_types import AppendValidator, Clock, EventDraft, wall_clock_ms
from harness.session._chunks import decode_storage_record, is_storage_row, pack_chunk_runs
from harness.session._derive import EventLog, MessageList, derive_event_message
from harness.session._event_codec import (
    adopt_event,
    is_append_surface_event,
    is_replacement_surface_event,
    is_surface_eligible_type,
    is_surface_event,
    record_to_event,
    snapshot_event,
    storage_record_to_events,
)
from harness.session._events import (
    APPEND,
    CORE_EVENT_TYPES,
    END_SEED,
    KNOWN_EVENT_TYPES,
    SURFACE_TYPES,
    Event,
    ReplaceOp,
    SurfaceOp,
    event_to_record,
)
from harness.session._gc import gc_paused, promote_young
from harness.session._header import (
    MAX_SESSION_ID_BYTES,
    SESSION_FORMAT_VERSION,
    SessionHeader,
    check_lookup_id,
    check_session_id,
)
from harness.session._invariants import RelationalInvariants, Trace
from harness.session._json import (
    FrozenDict,
    FrozenList,
    JsonValue,
    adopt,
    freeze,
    is_json,
    raw_of,
    thaw,
)
from harness.session._planning import AppendPlan
from harness.session._repair import closers_for_records, interrupted_turn_closers
from harness.session._request_header import canonical_header, fold_request_header, header_equals
from harness.session._seeding import decode_records
from harness.session._session import Session
from harness.session._surface import Replacement, SurfaceFold, SurfaceNodes, fold_surface

__all__ = [
    "APPEND",
    "CORE_EVENT_TYPES",
    "END_SEED",
    "KNOWN_EVENT_TYPES",
    "MAX_SESSION_ID_BYTES",
    "SESSION_FORMAT_VERSION",
    "SURFACE_TYPES",
    "AppendPlan",
    "AppendValidator",
    "Clock",
    "Event",
    "EventDraft",
    "EventLog",
    "FrozenDict",
    "FrozenList",
    "JsonValue",
    "MessageList",
    "RelationalInvariants",
    "ReplaceOp",
    "Replacement",
    "Session",
    "SessionHeader",
    "SurfaceFold",
    "SurfaceNodes",
    "SurfaceOp",
    "Trace",
    "adopt",
    "adopt_event",
    "canonical_header",
    "check_lookup_id",
    "check_session_id",
    "closers_for_records",
    "decode_records",
    "decode_storage_record",
    "derive_event_message",
    "event_to_record",
    "fold_request_header",
    "fold_surface",
    "freeze",
    "gc_paused",
    "header_equals",
    "interrupted_turn_closers",
    "is_append_surface_event",
    "is_json",
    "is_replacement_surface_event",
    "is_storage_row",
    "is_surface_eligible_type",
    "is_surface_event",
    "pack_chunk_runs",
    "promote_young",
    "raw_of",
    "record_to_event",
    "snapshot_event",
    "storage_record_to_events",
    "thaw",
    "wall_clock_ms",
]
