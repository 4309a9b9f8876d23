"""Reading a stored session (:func:`load_view`) and describing it: one line per event
(:func:`describe`) and the timeline of turns, compactions and forks."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from harness.cli.sessions._common import EXIT_USAGE, CliError, Ctx, _fail
from harness.cli.sessions._out import _json_default, _one_line

if TYPE_CHECKING:
    from harness.errors import HarnessError



class View:
    """A session as a load would see it: the header record, the stored events and the
    closers a load would append (raw records, read-only), the torn tail a repair would
    cut, and the restored session (``None`` if the log reads but does not restore:
    ``restore_error`` says why)."""

    def __init__(
        self,
        meta: dict[str, Any],
        records: list[dict[str, Any]],
        stored: int,
        torn_at: int | None,
        torn_bytes: int | None,
        path: str | None,
        session: Any,
        restore_error: HarnessError | None,
    ) -> None:
        self.meta = meta
        self.records = records
        self.stored = stored
        self.torn_at = torn_at
        self.torn_bytes = torn_bytes
        self.path = path
        self.session = session
        self.restore_error = restore_error

    @property
    def id(self) -> str:
        return str(self.meta["id"])

    @property
    def closers(self) -> list[dict[str, Any]]:
        return self.records[self.stored :]

    def torn_json(self, kind: str) -> dict[str, Any] | None:
        if self.torn_at is None:
            return None
        if kind == "sqlite":
            return {"atSeq": self.torn_at}
        return {"atByte": self.torn_at, "bytes": self.torn_bytes}

    def torn_text(self, kind: str) -> str:
        if self.torn_at is None:
            return ""
        if kind == "sqlite":
            return f"torn tail from seq {self.torn_at}"
        return f"torn tail of {self.torn_bytes} bytes at byte {self.torn_at}"


def _check_id(value: str, what: str = "session id") -> str:
    if not value or not value.strip() or any(ord(ch) < 32 for ch in value):
        raise CliError(f"bad {what} {value!r}: an id is a non-empty string without control characters", code="USAGE", exit_code=EXIT_USAGE)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # Bytes of the command line that are not UTF-8 arrive as lone surrogates
        # (surrogateescape); both backends would raise UnicodeEncodeError on them.
        raise CliError(f"bad {what} {value!r}: not valid UTF-8", code="USAGE", exit_code=EXIT_USAGE) from None
    return value


async def load_view(ctx: Ctx, session_id: str) -> View:
    """``Persistence.load`` (no lock, nothing written: the stored events, the closers a
    load appends, restored), and the backend's own read of the same revision (the
    stored length, a torn tail). A log that reads but does not restore is shown
    through ``Persistence.inspect`` instead, with the load's error kept."""
    import trio

    from harness.errors import HarnessError, SessionCorruptionError
    from harness.persistence import header_record
    from harness.session import END_SEED, event_to_record, raw_of

    p = ctx.p
    backend = p.backend
    _check_id(session_id)
    session: Any = None
    restore_error: HarnessError | None = None
    try:
        async with ctx.progress.step(f"reading {session_id}"):
            for _ in range(3):
                before = await trio.to_thread.run_sync(backend.revision, session_id)
                try:
                    session = await p.read_session(session_id)
                    restore_error = None
                except SessionCorruptionError as exc:
                    session, restore_error = None, exc
                stored = await trio.to_thread.run_sync(backend.load, session_id)
                if stored.revision == before:
                    break
            count = len(stored.records)
            meta = header_record(stored.header)
            del stored.records[:]
            if session is not None:
                # The records behind the session's events (read-only; arrays may be tuples).
                records = [event_to_record(e) for e in session.events]
                if records and records[-1]["type"] == END_SEED and records[-1]["seq"] >= count:
                    records.pop()  # appended in memory by the restore, never stored
            else:
                try:
                    insp = await p.inspect(session_id)
                except HarnessError:
                    assert restore_error is not None
                    raise restore_error from None  # the log does not read: the load's error
                records = [raw_of(r) for r in insp.events]
            count = min(count, len(records))
            path = p.locate(meta)
    except HarnessError as exc:
        _fail(exc)
    torn_bytes: int | None = None
    if stored.truncate_to is not None and ctx.root.kind == "jsonl" and path is not None:
        try:
            size = (await trio.Path(path).stat()).st_size
            torn_bytes = max(size - stored.truncate_to, 0)
        except OSError:
            torn_bytes = None
    return View(meta, records, count, stored.truncate_to, torn_bytes, path, session, restore_error)


def _d(rec: dict[str, Any]) -> dict[str, Any]:
    data = rec.get("data")
    return data if isinstance(data, dict) else {}


def _message_text(message: Any, limit: int = 400) -> str:
    if not isinstance(message, dict):
        return ""
    parts: list[str] = []
    content = message.get("content")
    for block in content if isinstance(content, list | tuple) else ():
        if not isinstance(block, dict):
            continue
        t = block.get("type")
        if t == "text":
            parts.append(str(block.get("text", "")))
        elif t == "tool-call":
            parts.append(f"→ {block.get('name')}({_one_line(str(block.get('arguments', '')))[:60]})")
        elif t == "tool-result":
            inner = block.get("content")
            texts = [str(b.get("text", "")) for b in inner if isinstance(b, dict)] if isinstance(inner, list | tuple) else []
            parts.append(("ERROR " if block.get("isError") else "") + " ".join(texts))
        elif t in ("reasoning", "thinking"):
            parts.append("(reasoning)")
        else:
            parts.append(f"<{t}>")
        if sum(len(x) for x in parts) > limit:
            break
    return _one_line(" ".join(parts))


def _is_checkpoint(message: Any) -> bool:
    source = message.get("source") if isinstance(message, dict) else None
    return isinstance(source, dict) and source.get("kind") == "plugin" and source.get("plugin") == "compact"


def _checkpoint_summary(message: Any) -> str:
    """The summary inside a framed checkpoint (the frame's preamble and tags dropped)."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list | tuple) and len(content) >= 3:
        inner = {"content": content[1:-1]}
        return _message_text(inner)
    return _message_text(message)


def _replace_range(rec: dict[str, Any]) -> tuple[Any, Any] | None:
    op = rec.get("surfaceOp")
    if isinstance(op, dict) and op.get("op") == "replace":
        return op.get("start"), op.get("end")
    return None


def _short(value: Any) -> str:
    return str(value)[:8]


def _error_text(error: Any) -> str:
    if isinstance(error, str):
        return error
    if isinstance(error, dict):
        code = error.get("code")
        message = error.get("message", "")
        return f"{code}: {message}" if code else str(message)
    return _one_line(str(error))


def _owner(d: dict[str, Any]) -> str:
    turn = d.get("turn")
    return "standalone" if turn is None else f"turn {turn}"


def _reason(d: dict[str, Any]) -> tuple[str, str]:
    """(kind, text) of a ``turn/end`` reason."""
    reason = d.get("reason")
    kind = str(reason.get("kind")) if isinstance(reason, dict) else "?"
    if kind == "interrupted":
        return kind, "interrupted (crash repair)"
    if kind == "aborted" and isinstance(reason, dict):
        cause = reason.get("reason")
        why = cause.get("kind") if isinstance(cause, dict) else None
        return kind, f"aborted ({why})" if why else "aborted"
    if kind == "error" and isinstance(reason, dict):
        return kind, f"error: {_error_text(reason.get('error'))}"
    return kind, kind


def describe(rec: dict[str, Any]) -> tuple[str, str]:
    """(style, text) of one event for the timeline."""
    t = rec.get("type")
    d = _d(rec)
    if t == "turn/start":
        return "bold", f"turn {d.get('turn')} begins"
    if t == "turn/end":
        kind, text = _reason(d)
        style = {"completed": "bold green", "interrupted": "bold yellow", "aborted": "bold yellow", "error": "bold red"}
        return style.get(kind, "bold"), f"turn {d.get('turn')} {text}"
    if t == "step/start":
        return "", f"step {d.get('step')} begins"
    if t == "step/end":
        return "", f"step {d.get('step')} ends"
    if t == "user/message":
        span = _replace_range(rec)
        if span is not None and _is_checkpoint(rec.get("data")):
            source = d.get("source") if isinstance(d.get("source"), dict) else {}
            cid = _short(source.get("compactionId")) if isinstance(source, dict) else "?"
            return "cyan", f"| checkpoint {cid} replaces {span[0]}..{span[1]}: {_checkpoint_summary(d)}"
        return "", f"user: {_message_text(d)}"
    if t == "assistant/message":
        return "", f"assistant: {_message_text(d.get('message'))}"
    if t == "assistant/chunk":
        return "dim", "chunk"
    if t == "tool/call":
        return "", f"call {d.get('callId')} {d.get('name')}({_one_line(str(d.get('arguments', '')))[:60]})"
    if t == "tool/result":
        message = d.get("message")
        source = message.get("source") if isinstance(message, dict) else None
        call = source.get("callId") if isinstance(source, dict) else "?"
        span = _replace_range(rec)
        if span is not None:
            return "cyan", f"| pruned result of {call} replaces {span[0]}..{span[1]}"
        error = d.get("error")
        if isinstance(error, dict) and error.get("code"):
            return "red", f"result of {call}: ERROR {error.get('code')}"
        return "", f"result of {call}: {_message_text(message)}"
    if t == "request/header":
        header = d.get("header") if isinstance(d.get("header"), dict) else {}
        config = header.get("config") if isinstance(header, dict) else None
        target = f" {config.get('provider')}/{config.get('model')}" if isinstance(config, dict) else ""
        return "dim", f"request header ({d.get('reason')}){target}"
    if t == "request/context":
        return "dim", "request context"
    if t == "compaction/start":
        return "magenta", f"[ compaction {_short(d.get('compactionId'))} begins ({_owner(d)})"
    if t == "compaction/summary":
        r = d.get("shadowedRange") if isinstance(d.get("shadowedRange"), dict) else {}
        seqs = d.get("shadowedSeqs")
        n = len(seqs) if isinstance(seqs, list | tuple) else "?"
        start, end = (r.get("start"), r.get("end")) if isinstance(r, dict) else ("?", "?")
        # A range is by surface position: after an earlier compaction its checkpoint (a
        # later seq) stands first, so start > end is right and is said so.
        order = " in surface order" if isinstance(start, int) and isinstance(end, int) and start > end else ""
        return "magenta", f"| summary shadows {start}..{end}{order} ({n} surface nodes, ~{d.get('shadowedTokenCount')} tokens)"
    if t == "compaction/end":
        cid = _short(d.get("compactionId"))
        if "error" in d:
            return "red", f"] compaction {cid} failed: {_error_text(d.get('error'))}"
        return "magenta", f"] compaction {cid} committed ({_owner(d)})"
    if t == "compaction/prune":
        r = d.get("shadowedRange") if isinstance(d.get("shadowedRange"), dict) else {}
        start, end = (r.get("start"), r.get("end")) if isinstance(r, dict) else ("?", "?")
        return "magenta", f"prune shadows {start}..{end} (~{d.get('shadowedTokenCount')} tokens)"
    if t == "session/end-seed":
        return "dim", "end of seed"
    if t == "command/run":
        return "", f"/{d.get('name')} {_one_line(str(d.get('args', '')))}".rstrip()
    if t == "command/done":
        return "", f"{d.get('kind')}: {_one_line(str(d.get('text', '')))}"
    import orjson

    return "dim", orjson.dumps(rec.get("data"), default=_json_default).decode()


class Timeline:
    """Events with their nesting, surface state and repair marks; turns; brackets."""

    def __init__(self, view: View, surface: set[int] | None) -> None:
        self.entries: list[dict[str, Any]] = []
        self.turns: list[dict[str, Any]] = []
        self.compactions: list[dict[str, Any]] = []
        turn: dict[str, Any] | None = None
        in_step = False
        bracket: dict[str, Any] | None = None
        for i, rec in enumerate(view.records):
            t = rec.get("type")
            d = _d(rec)
            seq = rec.get("seq")
            closer = i >= view.stored
            depth = (1 if turn is not None else 0) + (1 if in_step else 0)
            if t == "turn/start":
                depth = 0
                turn = {"turn": d.get("turn"), "start": seq, "end": None, "outcome": None, "repair": None}
                self.turns.append(turn)
                in_step = False
            elif t == "turn/end":
                depth = 0
                kind, _ = _reason(d)
                if turn is None or turn.get("turn") != d.get("turn"):
                    turn = {"turn": d.get("turn"), "start": None, "end": None, "outcome": None, "repair": None}
                    self.turns.append(turn)
                turn["end"] = seq
                turn["outcome"] = kind
                if closer:
                    turn["repair"] = "pending"
                elif kind == "interrupted":
                    turn["repair"] = "durable"
                turn = None
                in_step = False
            elif t == "step/start":
                depth = 1 if turn is not None else 0
                in_step = True
            elif t == "step/end":
                depth = 1 if turn is not None else 0
                in_step = False
            if t == "compaction/start":
                bracket = {
                    "compactionId": d.get("compactionId"),
                    "owner": d.get("turn"),
                    "start": seq,
                    "end": None,
                    "status": "open",
                    "shadowedRange": None,
                    "shadowedSeqs": None,
                    "shadowedTokenCount": None,
                    "checkpoint": None,
                    "error": None,
                }
                self.compactions.append(bracket)
            elif bracket is not None and d.get("compactionId") == bracket["compactionId"]:
                if t == "compaction/summary":
                    bracket["shadowedRange"] = d.get("shadowedRange")
                    bracket["shadowedSeqs"] = d.get("shadowedSeqs")
                    bracket["shadowedTokenCount"] = d.get("shadowedTokenCount")
                elif t == "compaction/end":
                    bracket["end"] = seq
                    bracket["status"] = "failed" if "error" in d else "committed"
                    if "error" in d:
                        bracket["error"] = _error_text(d.get("error"))
                    bracket = None
            if bracket is not None and t == "user/message" and _replace_range(rec) is not None:
                source = d.get("source")
                if isinstance(source, dict) and source.get("compactionId") == bracket["compactionId"]:
                    bracket["checkpoint"] = seq
            style, text = describe(rec)
            on: str | None = None
            if surface is not None and "surfaceOp" in rec:
                on = "on" if seq in surface else "shadowed"
            self.entries.append(
                {
                    "seq": seq,
                    "type": t,
                    "time": rec.get("time"),
                    "depth": depth,
                    "text": text,
                    "style": style,
                    "surface": on,
                    "closer": closer,
                }
            )
        for b in self.compactions:
            if b["status"] == "open":
                # A start left open by a crash: stale once a later end-seed exists.
                later = [r for r in view.records if r.get("type") == "session/end-seed" and (r.get("seq") or 0) > b["start"]]
                b["status"] = "stale" if later else "open"


def _fmt_time(ms: Any, *, full: bool = True) -> str:
    if not isinstance(ms, int | float):
        return "?"
    try:
        moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ") if full else moment.strftime("%H:%M:%S.") + f"{int(ms) % 1000:03d}"


def _lineage(meta: dict[str, Any]) -> str:
    parent = meta.get("parentSession")
    if parent is None:
        return "-"
    seed = meta.get("seedLength")
    if meta.get("origin") == "subagent":
        return f"subagent of {parent} (depth {meta.get('delegationDepth')})"
    if isinstance(seed, int):
        return f"fork of {parent}@{seed - 1}" if seed > 0 else f"fork of {parent} (empty prefix)"
    return f"child of {parent}"
