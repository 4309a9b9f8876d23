"""Phase two's input and the checkpoint frame (reference §5.1, §1.1, §5.3).

The summarizer sees the shadowed span exactly as the model saw it last: the latest
request header's system prompt and tools, then the span's derived messages. Because
ranges are anchored at the head of the surface, that is the warm prefix of the last
request, so a provider can reuse its KV cache for everything but the instruction.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from harness.compaction._meter import estimate_message, raw
from harness.errors import SummaryNotSmallerError
from harness.session import FrozenDict, Session, thaw

PREAMBLE: Final = (
    "This is an automatically generated checkpoint condensing an earlier span of the "
    "conversation to free up context. Treat the captured context as established background "
    "and build on it without restating it. Continue the task directly from the messages that "
    "follow, without acknowledging this checkpoint."
)
"""Opens every checkpoint message, before ``<compacted-summary>`` (reference §1.1)."""

_SECTIONS: Final = (
    (
        "Primary Request and Intent",
        "What the user asked for, in their terms, and what they are ultimately after.",
    ),
    ("Key Technical Concepts", "Technologies, frameworks, protocols and design decisions in play."),
    (
        "Files and Code",
        "Each file read, created or changed: its exact path, why it matters, key snippets.",
    ),
    (
        "Errors and Fixes",
        "Each error met, its exact text, and how it was fixed (or that it is unresolved).",
    ),
    ("Pending Jobs", "Work the user asked for that is not done yet."),
    ("Current Work", "Precisely what was being worked on immediately before this checkpoint."),
    (
        "Next Step",
        "The next action, in line with the most recent request; quote it where it matters.",
    ),
    (
        "Critical Context",
        "Anything else needed to continue: constraints, preferences, open questions.",
    ),
)

COMPACTION_INSTRUCTION: Final = "\n".join(
    [
        "You are now acting as a compaction engine for this AI coding assistant. Condense the "
        "conversation ABOVE into a structured checkpoint that replaces it: the assistant will "
        "continue the task from this checkpoint and the messages after it, with no other memory "
        "of what it condenses.",
        "",
        "Output EXACTLY the Markdown structure below: keep every section, in order. Use terse "
        'bullets, not prose paragraphs. Write "(none)" for an empty section — never drop a section.',
        "",
        *(line for title, hint in _SECTIONS for line in (f"## {title}", f"- {hint}", "")),
        "Rules:",
        "- Write concise English engineering prose. Preserve exact file paths, commands, error "
        "strings, identifiers, numeric values, function signatures, and syntax fragments.",
        "- Capture the user's feedback and corrections faithfully, especially where they changed "
        "the direction of the work.",
        "- Do NOT mention this summarization request or the compaction itself.",
        "- Output only the checkpoint text. Do not call any tools.",
        "- If the conversation contains an existing <compacted-summary> block, treat it as a PRIOR "
        "checkpoint: merge its content into one consolidated summary rather than copying it verbatim.",
    ]
)
"""The summarizer's instruction (reference §5.2): composed here from the reference's
description (the original's verbatim text is not part of the reference)."""

SUMMARIZER_PLUGIN: Final = "dsh-compaction-basic"
"""The ``source.plugin`` of the instruction message."""

CHECKPOINT_PLUGIN: Final = "compact"
"""The ``source.plugin`` of a checkpoint message."""


@attrs.frozen(slots=True)
class SummarizationInput:
    """What the summarizer replays: the header's ``system`` and ``tools`` (each
    ``None`` / empty when the header has none) and the shadowed span's messages."""

    system: str | None
    tools: tuple[FrozenDict, ...]
    messages: tuple[FrozenDict, ...]


def summarization_input(session: Session, shadowed_seqs: Iterable[int]) -> SummarizationInput:
    """Build the summarizer's input from the session's latest ``request/header``.

    ``messages`` is the derived message of each seq of ``shadowed_seqs``, in the
    order given (the caller passes them in surface order); an empty assistant
    message derives to nothing and is dropped. The header is the canonical one
    (empty ``system``/``tools`` already dropped); without a header there is no
    system prompt and no tools.
    """
    header = session.request_header()
    system: str | None = None
    tools: tuple[FrozenDict, ...] = ()
    if header is not None:
        value = header.get("system")
        system = value if type(value) is str and value else None
        specs = header.get("tools")
        if isinstance(specs, Sequence) and not isinstance(specs, str):
            tools = tuple(s for s in specs if isinstance(s, FrozenDict))
    messages = []
    for seq in shadowed_seqs:
        message = session.derive_message(seq)
        if message is not None:
            messages.append(message)
    return SummarizationInput(system, tools, tuple(messages))


def checkpoint_source(compaction_id: str, source_command_id: str | None = None) -> dict[str, Any]:
    """``{kind: plugin, plugin: compact, compactionId, sourceCommandId?}``."""
    source: dict[str, Any] = {
        "kind": "plugin",
        "plugin": CHECKPOINT_PLUGIN,
        "compactionId": compaction_id,
    }
    if source_command_id is not None:
        source["sourceCommandId"] = source_command_id
    return source


def frame_checkpoint(
    summary_blocks: Sequence[object],
    compaction_id: str,
    source_command_id: str | None = None,
    *,
    message_id: str | None = None,
) -> dict[str, Any]:
    """The checkpoint ``user/message`` (reference §1.1), as plain JSON.

    Content: ``text "<PREAMBLE>\\n\\n<compacted-summary>"``, the summary blocks
    (copied), ``text "</compacted-summary>"``. ``message_id`` defaults to a fresh
    UUID, as the reference's message helper mints one.
    """
    return {
        "id": message_id if message_id is not None else str(uuid.uuid4()),
        "role": "user",
        "content": [
            {"type": "text", "text": f"{PREAMBLE}\n\n<compacted-summary>"},
            *(thaw(raw(b)) for b in summary_blocks),
            {"type": "text", "text": "</compacted-summary>"},
        ],
        "source": checkpoint_source(compaction_id, source_command_id),
    }


def is_compact_checkpoint_source(src: object) -> bool:
    """True exactly when ``src`` is a source with ``kind: plugin`` and ``plugin: compact``."""
    return (
        isinstance(src, Mapping)
        and src.get("kind") == "plugin"
        and src.get("plugin") == CHECKPOINT_PLUGIN
    )


def check_shrink(framed_message: object, shadowed_token_count: int) -> int:
    """The framed checkpoint's estimated tokens, if below ``shadowed_token_count``.

    Raises :class:`~harness.errors.SummaryNotSmallerError` otherwise (reference
    §5.3): committing it would not free any context.
    """
    framed = estimate_message(framed_message)
    if framed >= shadowed_token_count:
        raise SummaryNotSmallerError(
            f"summary is not smaller than the shadowed content ({framed} estimated framed tokens "
            f">= {shadowed_token_count})"
        )
    return framed
