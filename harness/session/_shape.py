"""Seed/load-only message and request-header shape checks (reference §6.3).

``Session.append`` does not run these (the reference relies on that); seeds,
restores and persistence loads do. All checks read raw trees and never copy.
"""

from __future__ import annotations

from typing import Any

from harness.errors import EventError
from harness.session._events import ASSISTANT_MESSAGE, TOOL_RESULT, USER_MESSAGE
from harness.session._json import ARRAY, RawJson

_ADAPTER_KEYS = frozenset({"reasoningEffort", "maxTokens"})


def _nonempty_str(v: object) -> bool:
    return type(v) is str and v != ""


def check_request_header(index: int, data: RawJson) -> None:
    header = data.get("header") if type(data) is dict else None
    config = header.get("config") if type(header) is dict else None
    if type(config) is not dict or not _nonempty_str(config.get("provider")) or not _nonempty_str(
        config.get("model")
    ):
        raise EventError(f"seed request/header at index {index} lacks provider/model")
    if "reasoningEffort" in config and not _nonempty_str(config["reasoningEffort"]):
        raise EventError(f"seed request/header at index {index} has an invalid reasoningEffort")
    if "adapterDefaults" in header:  # type: ignore[operator]
        ad = header["adapterDefaults"]  # type: ignore[index]
        if (
            type(ad) is not dict
            or not ad.keys() <= _ADAPTER_KEYS
            or any(v is not True or k not in config for k, v in ad.items())
        ):
            raise EventError(f"seed request/header at index {index} has invalid adapterDefaults")


def check_message_shape(type_: str, data: RawJson, *, index: int = -1, seq: int = -1) -> None:
    """Raise :class:`EventError` if a message event's message is malformed.

    Errors name ``seed <type> at index <i>`` (seeds) or ``session event at seq <s>``.
    """
    if _shape_ok(type_, data):
        return
    subject = f"seed {type_} at index {index}" if index >= 0 else f"session event at seq {seq}"
    _raise_shape(subject, type_, data)


def _shape_ok(type_: str, data: RawJson) -> bool:
    # The fast, allocation-free yes; the slow path below finds the exact message.
    try:
        _raise_shape("", type_, data)
    except EventError:
        return False
    return True


def _raise_shape(subject: str, type_: str, data: RawJson) -> None:
    if type_ == USER_MESSAGE:
        message = data
    else:
        message = data.get("message") if type(data) is dict else None
    if type(message) is not dict or not _nonempty_str(message.get("id")):
        raise EventError(f"{subject} lacks an identified message")
    role = "assistant" if type_ == ASSISTANT_MESSAGE else "user"
    if message.get("role") != role:
        raise EventError(f'{subject} message must have role "{role}"')
    source = message.get("source")
    if type(source) is not dict or not _nonempty_str(source.get("kind")):
        raise EventError(f"{subject} message has invalid source")
    content: Any = message.get("content")
    if type(content) not in ARRAY:
        raise EventError(f"{subject} message has invalid content")
    if type_ == ASSISTANT_MESSAGE:
        if (
            source["kind"] != "model"
            or not _nonempty_str(source.get("provider"))
            or not _nonempty_str(source.get("model"))
        ):
            raise EventError(f"{subject} message must have model source")
    elif type_ == TOOL_RESULT:
        call_id = source.get("callId")
        if source["kind"] != "tool" or not _nonempty_str(call_id):
            raise EventError(f"{subject} message must have tool source")
        if (
            len(content) != 1
            or type(content[0]) is not dict
            or content[0].get("type") != "tool-result"
            or type(content[0].get("content")) not in ARRAY
        ):
            raise EventError(f"{subject} message must contain one tool-result block")
        if content[0].get("toolCallId") != call_id:
            raise EventError(f"{subject} message has mismatched tool call ids")


MESSAGE_TYPES = frozenset({USER_MESSAGE, ASSISTANT_MESSAGE, TOOL_RESULT})
