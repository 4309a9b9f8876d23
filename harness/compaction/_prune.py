"""Phase one: model-free tool-result pruning (reference §4).

A large tool result keeps its first ``headChars`` and last ``tailChars`` text code
points, with :data:`MARKER` between them; the middle is dropped. Each pruned result
is written as a priced pair: ``compaction/prune`` (the shadow price, §1.1) and then
the replacing ``tool/result``, which the session core accepts only if it changes
nothing but the tool-result block's ``content``.

Lengths here are *code points*, not the meter's UTF-16 units: Python slices ``str``
by code point, so a surrogate pair is never split (the session's lossless-JSON rule
rejects lone surrogates, so every astral character is one ``str`` item).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs

from harness.compaction._config import js_str
from harness.compaction._meter import estimate_message, raw
from harness.errors import ToolResultPruneConfigError
from harness.session import Event, EventDraft, ReplaceOp, Session, thaw
from harness.session._json import view

MARKER: Final = "\n\n[... tool result middle pruned ...]\n\n"
"""Inserted once where the middle of a pruned result was dropped."""

MARKER_CHARS: Final = len(MARKER)  # code points (all ASCII): 39

_PREFIX: Final = "ToolResultPruneConfig: "
_KEYS: Final = ("thresholdChars", "headChars", "tailChars")
_SAFE_INT_MAX: Final = 2**53 - 1


def _render(value: object) -> str:
    """``String(v)`` for a JSON value, as the reference interpolates it."""
    if value is None:
        return "null"  # a JSON null; js_str's None is an absent value ("undefined")
    if isinstance(value, Mapping):
        return "[object Object]"
    if isinstance(value, (list, tuple)):
        return ",".join("" if v is None else _render(v) for v in value)
    return js_str(value)


def _check(name: str, value: object, *, minimum: int) -> int:
    # JSON numbers are doubles: 8192.0 is the integer 8192. bool is not a number.
    v = int(value) if type(value) is float and value.is_integer() else value
    if type(v) is int and minimum <= v <= _SAFE_INT_MAX:
        return v
    kind = "a positive integer" if minimum > 0 else "a non-negative integer"
    raise ToolResultPruneConfigError(f"{_PREFIX}{name} ({_render(value)}) must be {kind}")


@attrs.frozen(slots=True)
class ToolResultPruneConfig:
    """Pruning limits, in text code points. Validated on construction, so an
    instance always satisfies ``head + len(MARKER) + tail <= threshold`` (which is
    what makes a pruned result smaller than the threshold, hence never re-pruned).
    """

    threshold_chars: int = 8192
    head_chars: int = 4096
    tail_chars: int = 1024

    def __attrs_post_init__(self) -> None:
        _check("thresholdChars", self.threshold_chars, minimum=1)
        _check("headChars", self.head_chars, minimum=0)
        _check("tailChars", self.tail_chars, minimum=0)
        total = self.head_chars + MARKER_CHARS + self.tail_chars
        if total > self.threshold_chars:
            raise ToolResultPruneConfigError(
                f"{_PREFIX}headChars + marker + tailChars ({total}) must be at most "
                f"thresholdChars ({self.threshold_chars})"
            )


def load_tool_result_prune_config(record: object = None) -> ToolResultPruneConfig:
    """Validate a plain record (e.g. decoded JSON) into a config; ``None`` is ``{}``.

    Checks, first failure wins: an object; unknown keys (in the record's order);
    ``thresholdChars``, ``headChars``, ``tailChars``; then the marker rule. Raises
    :class:`~harness.errors.ToolResultPruneConfigError` with the reference's message.
    """
    if record is None:
        record = {}
    if not isinstance(record, Mapping):
        raise ToolResultPruneConfigError(f"{_PREFIX}config must be an object")
    for key in record:
        if key not in _KEYS:
            raise ToolResultPruneConfigError(
                f'{_PREFIX}unknown key "{key}" (allowed: thresholdChars, headChars, tailChars)'
            )
    defaults = ToolResultPruneConfig()
    threshold = _check(
        "thresholdChars", record.get("thresholdChars", defaults.threshold_chars), minimum=1
    )
    head = _check("headChars", record.get("headChars", defaults.head_chars), minimum=0)
    tail = _check("tailChars", record.get("tailChars", defaults.tail_chars), minimum=0)
    return ToolResultPruneConfig(threshold, head, tail)


def _is_text(block: object) -> bool:
    return type(block) is dict and block.get("type") == "text" and type(block.get("text")) is str


def text_chars(content: object) -> int:
    """The text code points of a content list (non-text blocks count 0)."""
    blocks = raw(content)
    if type(blocks) is not list and type(blocks) is not tuple:
        return 0
    return sum(len(b["text"]) for b in map(raw, blocks) if _is_text(b))


def prune_content(content: Sequence[object], config: ToolResultPruneConfig) -> list[Any] | None:
    """The pruned copy of a tool result's content, or ``None`` when within budget.

    With ``T`` text code points over the text blocks in order, the interval
    ``[head, T - tail)`` is dropped. Non-text blocks stay where they are; each text
    block keeps only its part of the head and of the tail; :data:`MARKER` goes once,
    into the first text block that touches the dropped interval, right after that
    block's kept head; a text block left empty (including one that was empty) is
    dropped. The output holds exactly ``head + len(MARKER) + tail`` text code points,
    which is at most the threshold, so pruning it again returns ``None``.

    The result is plain (mutable, unshared) JSON; ``content`` is not modified.
    """
    blocks = [raw(b) for b in raw(content)]
    total = sum(len(b["text"]) for b in blocks if _is_text(b))
    if total <= config.threshold_chars:
        return None
    head_end = config.head_chars  # the dropped interval is [head_end, tail_start)
    tail_start = total - config.tail_chars
    out: list[Any] = []
    pos = 0
    marked = False
    for block in blocks:
        if not _is_text(block):
            out.append(thaw(block))
            continue
        text: str = block["text"]
        start, end = pos, pos + len(text)
        pos = end
        kept_head = text[: max(0, min(end, head_end) - start)]
        kept_tail = text[max(0, tail_start - start) :] if end > tail_start else ""
        new_text = kept_head
        if not marked and start < tail_start and end > head_end:
            new_text += MARKER
            marked = True
        new_text += kept_tail
        if new_text:
            copy = thaw(block)
            copy["text"] = new_text
            out.append(copy)
    return out


@attrs.frozen(slots=True)
class PrunedResult:
    """One pruned tool result: the shadowed ``original_seq`` and its ``replacement_seq``.

    ``call_id`` is the tool-result block's ``toolCallId`` (``None`` if it has none);
    the char counts are text code points of the block's content before and after.
    """

    original_seq: int
    replacement_seq: int
    call_id: str | None
    chars_before: int
    chars_after: int


@attrs.frozen(slots=True)
class PruneResult:
    """What :func:`prune_session` did: the results pruned, in surface order."""

    pruned: tuple[PrunedResult, ...]
    chars_removed: int


def _prunable_block(data: object) -> tuple[dict[str, Any], Sequence[Any]] | None:
    """The tool-result block of a ``tool/result``'s data and its content, if it has them.

    The session's replacement rule lets only the *first* block's ``content`` change,
    so only that block is considered.
    """
    d = raw(data)
    message = d.get("message") if type(d) is dict else None
    content = message.get("content") if type(message) is dict else None
    if (type(content) is not list and type(content) is not tuple) or not content:
        return None
    block = content[0]
    if type(block) is not dict or block.get("type") != "tool-result":
        return None
    inner = block.get("content")
    if type(inner) is not list and type(inner) is not tuple:
        return None
    return block, inner


def _with_content(data: Any, content: list[Any]) -> dict[str, Any]:
    """``data`` (a stored, raw tool/result) with its tool-result block's ``content``
    replaced: new containers along that one path, every other subtree passed as a
    frozen view of the stored one (the session takes a view's tree as it is, without
    copying it: stored trees are immutable)."""
    out: dict[str, Any] = {k: view(v) for k, v in data.items()}
    message: dict[str, Any] = {k: view(v) for k, v in data["message"].items()}
    blocks: list[Any] = [view(b) for b in data["message"]["content"]]
    block: dict[str, Any] = {k: view(v) for k, v in data["message"]["content"][0].items()}
    block["content"] = content
    blocks[0] = block
    message["content"] = blocks
    out["message"] = message
    return out


def prune_session(
    session: Session,
    config: ToolResultPruneConfig,
    *,
    append: Callable[[tuple[EventDraft, ...]], Sequence[Event]] | None = None,
) -> PruneResult:
    """Prune every over-threshold tool result on the current surface (reference §4).

    Candidates are the ``tool/result`` nodes of a snapshot of the surface taken on
    entry, in surface order; age is not considered (the newest result is pruned
    too). For each one whose prune_content is not ``None``, one ``append_batch``
    writes the priced pair back to back:

    1. ``compaction/prune {shadowedRange: {start: s, end: s}, shadowedSeqs: [s],
       shadowedTokenCount: estimate_message(original message)}``;
    2. a ``tool/result`` whose data is the original's, unchanged except for the
       tool-result block's ``content``, with ``surfaceOp`` ``replace s..s`` and
       ``sourceEventSeqs [s]``.

    One batch per pair (the reference appends them one by one): the session either
    takes both or neither, so a rejected replacement never leaves a dangling price.

    No compaction bracket and no lock check (as in the reference). If the session
    rejects a pair (e.g. its validator finds no open turn), the error propagates;
    the pairs already written stay.

    ``append`` writes one batch (default: ``session.append_batch``); the session actor
    passes its own append so the pairs go through its pre-commit hooks and listeners.
    """
    write = session.append_batch if append is None else append
    removed = 0
    pruned: list[PrunedResult] = []
    type_at, data_at = session.type_at, session.raw_data_at
    for seq in tuple(session.surface):
        if type_at(seq) != "tool/result":
            continue
        found = _prunable_block(data_at(seq))
        if found is None:
            continue
        block, inner = found
        # Most results are small: count their text before building anything.
        total = 0
        for b in inner:
            if type(b) is dict and b.get("type") == "text":
                text = b.get("text")
                if type(text) is str:
                    total += len(text)
        if total <= config.threshold_chars:
            continue
        new_inner = prune_content(inner, config)
        if new_inner is None:
            continue
        data = _with_content(session.raw_data_at(seq), new_inner)
        message = session.derive_message(seq)  # memoised: the meter priced it already
        price = {
            "shadowedRange": {"start": seq, "end": seq},
            "shadowedSeqs": [seq],
            "shadowedTokenCount": 0 if message is None else estimate_message(message),
        }
        _, replacement = write(
            (
                EventDraft("compaction/prune", price),
                EventDraft("tool/result", data, ReplaceOp(seq, seq), (seq,)),
            )
        )
        before, after = total, text_chars(new_inner)
        call_id = block.get("toolCallId")
        pruned.append(
            PrunedResult(
                seq, replacement.seq, call_id if type(call_id) is str else None, before, after
            )
        )
        removed += before - after
    return PruneResult(tuple(pruned), removed)
