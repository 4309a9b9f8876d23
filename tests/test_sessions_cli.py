"""`harness sessions` (issue 12 §3): every command on both backends, broken files, a
torn tail, a locked session; exit codes, stdout (JSON parsed) and the files on disk.

The commands run in-process through ``harness.cli.sessions.run`` (each its own
``trio.run``), so these tests are plain functions, not Trio tests.
"""

from __future__ import annotations

import hashlib
import io
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from harness.cli.sessions import (
    EXIT_CORRUPT,
    EXIT_LOCKED,
    EXIT_NEEDS_REPAIR,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    EXIT_VERIFY_FAILED,
    run,
)
from harness.compaction import frame_checkpoint
from harness.persistence import JsonlBackend, SqliteBackend, open_persistence
from harness.runtime import SessionHandle, open_store
from harness.session import EventDraft, RelationalInvariants, ReplaceOp
from tests.helpers import assistant, header, rec, tool_call_block, tool_result, user

REPO = Path(__file__).resolve().parent.parent
BACKENDS = ("jsonl", "sqlite")


# -- building a store ---------------------------------------------------------------------


def closed_turn(turn: int, mid: str, *, tool: str | None = None) -> list[EventDraft]:
    """A completed turn; with ``tool``, step 1 calls it and step 2 answers (chunks first)."""
    drafts = [
        EventDraft("turn/start", {"turn": turn}),
        EventDraft("user/message", user(f"u{mid}", f"question {mid}"), "append"),
        EventDraft("step/start", {"turn": turn, "step": 1}),
    ]
    if tool is not None:
        drafts += [
            EventDraft("assistant/message", assistant(turn, 1, f"a{mid}", [tool_call_block(tool)]), "append"),
            EventDraft("tool/call", {"turn": turn, "step": 1, "callId": tool, "name": "read", "arguments": "{}"}),
            EventDraft("tool/result", tool_result(tool, turn, 1, text=f"contents {mid}"), "append"),
            EventDraft("step/end", {"turn": turn, "step": 1}),
            EventDraft("step/start", {"turn": turn, "step": 2}),
            *[EventDraft("assistant/chunk", {"turn": turn, "step": 2, "index": 0, "delta": {"type": "text", "text": "x"}}) for _ in range(3)],
            EventDraft("assistant/message", assistant(turn, 2, f"b{mid}"), "append"),
            EventDraft("step/end", {"turn": turn, "step": 2}),
        ]
    else:
        drafts += [
            EventDraft("assistant/message", assistant(turn, 1, f"a{mid}"), "append"),
            EventDraft("step/end", {"turn": turn, "step": 1}),
        ]
    drafts.append(EventDraft("turn/end", {"turn": turn, "reason": {"kind": "completed"}}))
    return drafts


def compaction(h: SessionHandle, cid: str) -> list[EventDraft]:
    """A standalone bracket compacting the first three surface nodes."""
    nodes = list(h.surface())[:3]
    at = h.seq
    summary = {
        "compactionId": cid,
        "summary": [{"type": "text", "text": "- the user asked twice"}],
        "shadowedRange": {"start": nodes[0], "end": nodes[-1]},
        "shadowedSeqs": nodes,
        "shadowedTokenCount": 40,
        "provider": "p",
        "model": "m",
    }
    checkpoint = frame_checkpoint([{"type": "text", "text": "- the user asked twice"}], cid, message_id="cp1")
    return [
        EventDraft("compaction/start", {"compactionId": cid, "turn": None}),
        EventDraft("compaction/summary", summary),
        EventDraft("user/message", checkpoint, ReplaceOp(nodes[0], nodes[-1]), [at, at + 1, *nodes]),
        EventDraft("compaction/end", {"compactionId": cid, "turn": None}),
    ]


def open_turn(turn: int) -> list[EventDraft]:
    """A turn a crash interrupted after its tool call was logged."""
    return [
        EventDraft("turn/start", {"turn": turn}),
        EventDraft("user/message", user(f"u{turn}", "and now?"), "append"),
        EventDraft("step/start", {"turn": turn, "step": 1}),
        EventDraft("assistant/message", assistant(turn, 1, f"a{turn}", [tool_call_block("c9")]), "append"),
        EventDraft("tool/call", {"turn": turn, "step": 1, "callId": "c9", "name": "read", "arguments": "{}"}),
    ]


def backend_for(kind: str, root: Path) -> Any:
    return JsonlBackend(root) if kind == "jsonl" else SqliteBackend(root)


def make_store(kind: str, tmp: Path) -> Path:
    """``done``: two turns, a compaction, a third turn; ``crashed``: a turn left open by a
    crash; ``child``: a fork of ``done`` after turn 1. Returns the store root."""
    root = tmp / ("jsonl" if kind == "jsonl" else "store.db")
    if kind == "jsonl":
        root.mkdir()

    async def build() -> None:
        backend = backend_for(kind, root)
        try:
            async with open_store(validator_factory=RelationalInvariants) as store, open_persistence(store, backend) as p:
                done = await store.create("done", cwd="/work", created_at=1_700_000_000_000)
                await done.append_batch(closed_turn(1, "1", tool="c1"))
                await done.append_batch(closed_turn(2, "2"))
                await done.append_batch(compaction(done, "cmp-1"))
                await done.append_batch(closed_turn(3, "3"))
                child = await store.fork(done, 13, "child")
                await child.append_batch(closed_turn(2, "c"))
                crashed = await store.create("crashed", cwd="/work", created_at=1_700_000_001_000)
                await crashed.append_batch(closed_turn(1, "x"))
                await crashed.append_batch(open_turn(2))
                for h in (done, child, crashed):
                    await h.flush()
                    await store.detach(h)
                for sid in ("done", "child", "crashed"):
                    await p.wait_retired(sid)
        finally:
            if isinstance(backend, SqliteBackend):
                backend.close()

    trio.run(build)
    return root


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    kind: str = request.param
    return kind, make_store(kind, tmp_path)


# -- running the command --------------------------------------------------------------------


class Result:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code = code
        self.out = out
        self.err = err

    @property
    def json(self) -> Any:
        return orjson.loads(self.out)


def cli(root: Path | None, *args: str) -> Result:
    out, err = io.StringIO(), io.StringIO()
    argv = ["sessions", *(["--root", str(root)] if root is not None else []), *args]
    with redirect_stdout(out), redirect_stderr(err):
        code = run(argv)
    return Result(code, out.getvalue(), err.getvalue())


def tree_digest(root: Path) -> dict[str, str]:
    """Every file's bytes under a JSONL root (lock files aside: a probe may rewrite
    them), or the SQLite database file's."""
    if root.is_file():
        return {root.name: hashlib.sha256(root.read_bytes()).hexdigest()}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith(".lock")
    }


def transcript(root: Path, sid: str) -> Path:
    (path,) = root.glob(f"*/{sid}/session.jsonl")
    return path


@contextmanager
def held(kind: str, root: Path, sid: str) -> Iterator[None]:
    """A live store in another thread holds ``sid``'s writer lock (a preparation)."""
    ready = threading.Event()
    release = threading.Event()
    errors: list[BaseException] = []

    async def holder() -> None:
        backend = backend_for(kind, root)
        try:
            async with open_store() as store, open_persistence(store, backend) as p:
                prep = await p.prepare(sid)
                ready.set()
                await trio.to_thread.run_sync(release.wait)
                await prep.dispose()
        finally:
            if isinstance(backend, SqliteBackend):
                backend.close()

    def main() -> None:
        try:
            trio.run(holder)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
            ready.set()

    thread = threading.Thread(target=main)
    thread.start()
    ready.wait(10)
    try:
        assert not errors, errors
        yield
    finally:
        release.set()
        thread.join(10)
    assert not errors, errors


# -- list / show / inspect / export ------------------------------------------------------------


def test_list(store: tuple[str, Path]) -> None:
    kind, root = store
    before = tree_digest(root)
    r = cli(root, "list", "--json")
    assert r.code == EXIT_OK, r.err
    doc = r.json
    assert doc["backend"] == kind and doc["unreadable"] == []
    by_id = {s["id"]: s for s in doc["sessions"]}
    assert set(by_id) == {"done", "child", "crashed"}
    assert by_id["done"]["cwd"] == "/work" and by_id["done"]["createdAt"] == 1_700_000_000_000
    assert by_id["child"]["parentSession"] == "done" and by_id["child"]["seedLength"] == 14
    assert by_id["child"]["lineage"] == "fork of done@13"
    assert "events" not in by_id["done"]
    r = cli(root, "list", "--events", "--json")
    by_id = {s["id"]: s for s in r.json["sessions"]}
    assert (by_id["done"]["status"], by_id["crashed"]["status"]) == ("ok", "needs-repair")
    assert by_id["crashed"]["events"] == 11 + 3  # stored + the closers a load would append
    text = cli(root, "list", "--events")
    assert text.code == EXIT_OK
    assert "fork of done@13" in text.out and "needs-repair" in text.out
    assert "\x1b[" not in text.out  # not a terminal: no colour
    assert tree_digest(root) == before


def test_show_timeline(store: tuple[str, Path]) -> None:
    kind, root = store
    before = tree_digest(root)
    r = cli(root, "show", "done", "--json")
    assert r.code == EXIT_OK, r.err
    doc = r.json
    assert doc["closers"] == 0 and doc["restoreError"] is None and doc["tornTail"] is None
    assert [t["outcome"] for t in doc["turns"]] == ["completed"] * 3
    (bracket,) = doc["compactions"]
    assert bracket["status"] == "committed" and bracket["compactionId"] == "cmp-1"
    assert bracket["shadowedRange"] == {"start": 1, "end": 5} and bracket["checkpoint"] == 22
    events = {e["seq"]: e for e in doc["events"]}
    assert events[1]["surface"] == "shadowed" and events[22]["surface"] == "on" and events[11]["surface"] == "on"
    assert events[0]["depth"] == 0 and events[2]["depth"] == 1 and events[3]["depth"] == 2
    assert "checkpoint cmp-1 replaces 1..5" in events[22]["text"]
    text = cli(root, "show", "done").out
    assert "[ compaction cmp-1 begins (standalone)" in text
    assert "] compaction cmp-1 committed" in text
    assert "… 3 assistant/chunk" in text
    assert "1 compactions (1 committed)" in text and "shadowed 1..5, checkpoint at 22" in text
    # The crashed session: the closers a load would append are marked.
    doc = cli(root, "show", "crashed", "--json").json
    assert doc["storedEvents"] == 11 and doc["closers"] == 3
    assert [e["type"] for e in doc["events"] if e["closer"]] == ["tool/result", "step/end", "turn/end"]
    assert doc["turns"][-1] == {"turn": 2, "start": 6, "end": 13, "outcome": "interrupted", "repair": "pending"}
    text = cli(root, "show", "crashed").out
    assert "crash repair: a load would append these 3 closers" in text
    assert "result of c9: ERROR TOOL_OUTCOME_UNKNOWN" in text
    assert "needs repair: harness sessions repair crashed" in text
    assert tree_digest(root) == before


def test_show_surface(store: tuple[str, Path]) -> None:
    _, root = store
    r = cli(root, "show", "done", "--surface", "--json")
    assert r.code == EXIT_OK, r.err
    doc = r.json
    first = doc["messages"][0]
    assert first["seq"] == 22 and first["checkpoint"] and first["replaces"] == {"start": 1, "end": 5}
    assert [m["seq"] for m in doc["messages"]] == doc["nodes"] == [22, 11, 15, 17, 25, 27]
    text = cli(root, "show", "done", "--surface").out
    assert "[checkpoint replaces 1..5] - the user asked twice" in text
    assert "question 3" in text


def test_inspect_and_export(store: tuple[str, Path], tmp_path: Path) -> None:
    _, root = store
    before = tree_digest(root)
    r = cli(root, "inspect", "crashed", "--json")
    assert r.code == EXIT_OK, r.err
    doc = r.json
    assert doc["meta"]["type"] == "session" and doc["meta"]["id"] == "crashed"
    assert len(doc["events"]) == 14 and doc["storedEvents"] == 11 and doc["closers"] == 3
    assert doc["events"][11]["data"]["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
    assert doc["events"][11]["sourceEventSeqs"] == [10]
    text = cli(root, "inspect", "crashed").out
    assert "# 3 closers a load would append (not stored):" in text
    # export: the stored records, by default without the closers
    r = cli(root, "export", "crashed")
    assert r.code == EXIT_OK
    lines = [orjson.loads(x) for x in r.out.splitlines()]
    assert lines[0]["type"] == "session" and len(lines) == 1 + 11
    assert [x["seq"] for x in lines[1:]] == list(range(11))
    r = cli(root, "export", "crashed", "--format", "json", "--closers")
    assert len(r.json["events"]) == 14 and r.json["meta"]["id"] == "crashed"
    target = tmp_path / "out.jsonl"
    r = cli(root, "export", "done", "-o", str(target), "--json")
    assert r.code == EXIT_OK and r.json["events"] == 30
    assert len(target.read_bytes().splitlines()) == 31
    again = cli(root, "export", "done", "-o", str(target))
    assert again.code == EXIT_REFUSED and "exists (pass --force" in again.err
    assert cli(root, "export", "done", "-o", str(target), "--force").code == EXIT_OK
    assert tree_digest(root) == before


def test_export_to_a_directory_is_refused_with_or_without_force(store: tuple[str, Path], tmp_path: Path) -> None:
    """-o DIR said "exists (pass --force to overwrite it)", and with --force failed with
    STORAGE_IO "Is a directory": a directory is not a file, --force or not."""
    _, root = store
    target = tmp_path / "out"
    target.mkdir()
    for force in ((), ("--force",)):
        r = cli(root, "export", "done", "-o", str(target), *force)
        assert r.code == EXIT_USAGE, r.err
        assert r.err == f'harness sessions export: error: "{target}" is a directory, not a file: -o names the file to write [NOT_A_FILE]\n'
        assert "--force" not in r.err
        r = cli(root, "export", "done", "-o", str(target), "--json", *force)
        assert r.json["error"] == {"code": "NOT_A_FILE", "message": f'"{target}" is a directory, not a file: -o names the file to write', "exit": EXIT_USAGE}
    assert list(target.iterdir()) == []


# -- verify / repair -------------------------------------------------------------------------


def test_verify_all_and_one(store: tuple[str, Path]) -> None:
    _, root = store
    before = tree_digest(root)
    r = cli(root, "verify", "--json")
    assert r.code == EXIT_NEEDS_REPAIR, r.out + r.err  # "crashed" needs repair, nothing failed
    by_id = {s["id"]: s for s in r.json["sessions"]}
    assert by_id["done"]["status"] == "ok" and by_id["child"]["status"] == "ok"
    assert by_id["crashed"]["status"] == "needs-repair"
    assert [w["code"] for w in by_id["crashed"]["warnings"]] == ["PENDING_REPAIR"]
    # --strict: a pending repair fails
    r = cli(root, "verify", "crashed", "--strict", "--json")
    assert r.code == EXIT_VERIFY_FAILED and r.json["sessions"][0]["status"] == "failed"
    r = cli(root, "verify", "nobody")
    assert r.code == EXIT_NOT_FOUND and 'session "nobody" not found' in r.err
    assert tree_digest(root) == before


def test_repair_writes_the_closers(store: tuple[str, Path]) -> None:
    kind, root = store
    r = cli(root, "repair", "crashed", "--json")
    assert r.code == EXIT_OK, r.err
    doc = r.json
    assert doc["repaired"] and doc["events"] == 14 and doc["tornTail"] is None
    assert [c["type"] for c in doc["closers"]] == ["tool/result", "step/end", "turn/end"]
    assert doc["closers"][-1]["data"]["reason"] == {"kind": "interrupted"}
    r = cli(root, "verify", "crashed", "--strict", "--json")
    assert r.code == EXIT_OK and r.json["sessions"][0]["status"] == "ok"
    show = cli(root, "show", "crashed", "--json").json
    assert show["closers"] == 0 and show["turns"][-1]["repair"] == "durable"
    if kind == "jsonl":
        assert len(transcript(root, "crashed").read_bytes().splitlines()) == 1 + 14
    r = cli(root, "repair", "done")
    assert r.code == EXIT_OK and "done: nothing to repair (30 events)" in r.out


def test_torn_tail_jsonl(tmp_path: Path) -> None:
    root = make_store("jsonl", tmp_path)
    path = transcript(root, "done")
    good = path.read_bytes()
    path.write_bytes(good + b'{"type":"turn/start","seq":30,"ti')
    before = tree_digest(root)
    r = cli(root, "verify", "done", "--json")
    # A torn tail is what a crash leaves: a warning, with its own exit code.
    assert r.code == EXIT_NEEDS_REPAIR
    (s,) = r.json["sessions"]
    assert s["status"] == "needs-repair" and s["tornTail"] == {"atByte": len(good), "bytes": 33}
    assert [w["code"] for w in s["warnings"]] == ["TORN_TAIL"]
    assert cli(root, "verify", "done", "--strict").code == EXIT_VERIFY_FAILED
    assert "torn tail of 33 bytes" in cli(root, "show", "done").out
    assert tree_digest(root) == before  # nothing changed before the repair
    r = cli(root, "repair", "done", "--json")
    assert r.code == EXIT_OK and r.json["tornTail"] == {"atByte": len(good), "bytes": 33} and r.json["closers"] == []
    assert path.read_bytes() == good
    assert cli(root, "verify", "done", "--strict").code == EXIT_OK


def test_corrupt_line_before_a_turn_end(tmp_path: Path) -> None:
    root = make_store("jsonl", tmp_path)
    path = transcript(root, "done")
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = b"this is not json\n"  # a record of turn 1, before its turn/end
    path.write_bytes(b"".join(lines))
    before = tree_digest(root)
    r = cli(root, "verify", "--json")
    assert r.code == EXIT_VERIFY_FAILED
    by_id = {s["id"]: s for s in r.json["sessions"]}
    assert by_id["done"]["problems"][0]["code"] == "SESSION_CORRUPT"
    assert by_id["crashed"]["ok"] and by_id["child"]["ok"]
    # The child's parent no longer reads: a warning, not a failure.
    assert [w["code"] for w in by_id["child"]["warnings"]] == ["PARENT_UNREADABLE"]
    for command in (("show", "done"), ("inspect", "done"), ("export", "done"), ("repair", "done"), ("fork", "done@3")):
        r = cli(root, *command)
        assert r.code == EXIT_CORRUPT, command
        assert r.err.count("\n") == 1 and "[SESSION_CORRUPT]" in r.err, r.err
    r = cli(root, "show", "done", "--json")
    assert r.json["error"]["code"] == "SESSION_CORRUPT" and r.json["error"]["exit"] == EXIT_CORRUPT
    assert tree_digest(root) == before


def test_unsupported_version_jsonl(tmp_path: Path) -> None:
    root = make_store("jsonl", tmp_path)
    path = transcript(root, "done")
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"version":0', b'"version":3', 1))
    r = cli(root, "show", "done")
    assert r.code == EXIT_CORRUPT and "[SESSION_FORMAT_UNSUPPORTED]" in r.err and "newer harness" in r.err
    # The listing skips a header it cannot read; list and verify still report the file.
    r = cli(root, "list", "--json")
    assert r.code == EXIT_OK and {s["id"] for s in r.json["sessions"]} == {"child", "crashed"}
    (bad,) = r.json["unreadable"]
    assert bad["id"] == "done" and bad["code"] == "SESSION_FORMAT_UNSUPPORTED"
    r = cli(root, "verify", "--json")
    assert r.code == EXIT_VERIFY_FAILED
    failed = [s for s in r.json["sessions"] if not s["ok"]]
    assert [(s["id"], s["problems"][0]["code"]) for s in failed] == [("done", "SESSION_FORMAT_UNSUPPORTED")]


def test_sqlite_corrupt_row_and_unsupported_version(tmp_path: Path) -> None:
    root = make_store("sqlite", tmp_path)
    db = sqlite3.connect(root)
    with db:
        db.execute("UPDATE events SET data = '{bad' WHERE session_id = 'done' AND seq = 3")  # before turn 1's end
        db.execute("UPDATE events SET type = 'step/start' WHERE session_id = 'crashed' AND seq = 4")
    db.close()
    before = tree_digest(root)
    r = cli(root, "verify", "--json")
    assert r.code == EXIT_VERIFY_FAILED
    by_id = {s["id"]: s for s in r.json["sessions"]}
    assert by_id["done"]["problems"][0]["code"] == "SESSION_CORRUPT"
    assert "invalid committed physical row at seq 3" in by_id["done"]["problems"][0]["message"]
    assert by_id["crashed"]["problems"][0]["code"] == "INVARIANT_VIOLATED"
    assert "step/start 1 while step 1 is still open" in by_id["crashed"]["problems"][0]["message"]
    assert [w["code"] for w in by_id["child"]["warnings"]] == ["PARENT_UNREADABLE"]
    for command in (("show", "done"), ("inspect", "done"), ("export", "done"), ("repair", "done")):
        r = cli(root, *command)
        assert r.code == EXIT_CORRUPT and "[SESSION_CORRUPT]" in r.err, (command, r.err)
    assert tree_digest(root) == before
    db = sqlite3.connect(root)
    with db:
        db.execute("UPDATE sessions SET version = 2 WHERE id = 'crashed'")
    db.close()
    r = cli(root, "show", "crashed")
    assert r.code == EXIT_CORRUPT and "[SESSION_FORMAT_UNSUPPORTED]" in r.err and "log format v2" in r.err
    # The SQLite listing refuses the whole store over one such row (JSONL skips it).
    r = cli(root, "list", "--json")
    assert r.code == EXIT_CORRUPT and r.json["error"]["code"] == "SESSION_FORMAT_UNSUPPORTED"
    assert cli(root, "show", "child").code == EXIT_OK


def test_invariant_violation_is_a_verification_failure(tmp_path: Path) -> None:
    """A log the store accepted without the invariants: verify replays them over it."""
    root = tmp_path / "jsonl"
    root.mkdir()

    async def build() -> None:
        async with open_store() as store, open_persistence(store, JsonlBackend(root)) as p:
            h = await store.create("loose", cwd="/w")
            await h.append("step/start", {"turn": 1, "step": 1})  # no turn is open
            await h.flush()
            await store.detach(h)
            await p.wait_retired("loose")

    trio.run(build)
    r = cli(root, "verify", "loose")
    assert r.code == EXIT_VERIFY_FAILED
    assert "INVARIANT_VIOLATED" in r.out and "step/start in turn 1 but open turn is null" in r.out


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_log_that_reads_but_does_not_restore(kind: str, tmp_path: Path) -> None:
    """Stored by another producer: every line reads, but a message has no id. ``show``
    still draws the timeline (through inspect) and says why a load refuses it."""
    root = tmp_path / ("jsonl" if kind == "jsonl" else "store.db")
    if kind == "jsonl":
        root.mkdir()
    backend = backend_for(kind, root)
    try:
        bad = {**user("x"), "id": ""}
        backend.materialize(header("odd", cwd="/w"), [rec("turn/start", 0, {"turn": 1}), rec("user/message", 1, bad, surfaceOp="append")])
    finally:
        if isinstance(backend, SqliteBackend):
            backend.close()
    r = cli(root, "show", "odd", "--json")
    assert r.code == EXIT_OK, r.err
    assert r.json["restoreError"]["code"] == "SESSION_CORRUPT" and r.json["surface"] is None
    assert [e["type"] for e in r.json["events"]] == ["turn/start", "user/message", "turn/end"]
    assert "does not restore: SESSION_CORRUPT" in cli(root, "show", "odd").out
    r = cli(root, "show", "odd", "--surface")
    assert r.code == EXIT_CORRUPT and "[SESSION_CORRUPT]" in r.err
    r = cli(root, "verify", "--json")
    assert r.code == EXIT_VERIFY_FAILED
    assert r.json["sessions"][0]["problems"][0]["code"] == "SESSION_CORRUPT"


# -- lineage ----------------------------------------------------------------------------------


def test_lineage_mismatch_and_missing_parent(tmp_path: Path) -> None:
    root = make_store("jsonl", tmp_path)
    path = transcript(root, "child")
    path.write_bytes(path.read_bytes().replace(b"question 1", b"question X"))
    r = cli(root, "verify", "child", "--json")
    assert r.code == EXIT_VERIFY_FAILED
    (s,) = r.json["sessions"]
    assert s["problems"] == [{"code": "LINEAGE_MISMATCH", "message": 'event 1 differs from parent "done"\'s event 1'}]
    assert cli(root, "rm", "done", "--yes").code == EXIT_OK
    # The parent deleted: nothing to compare against; its absence is a warning (a fork
    # holds its own copy of the prefix), a failure with --strict.
    r = cli(root, "verify", "child", "--json")
    (s,) = r.json["sessions"]
    assert r.code == EXIT_OK and s["status"] == "ok" and s["problems"] == []
    assert [w["code"] for w in s["warnings"]] == ["PARENT_NOT_FOUND"]
    assert cli(root, "verify", "child", "--strict").code == EXIT_VERIFY_FAILED


# -- fork ------------------------------------------------------------------------------------


def test_fork(store: tuple[str, Path]) -> None:
    kind, root = store
    r = cli(root, "fork", "done@13", "--to", "branch", "--json")
    assert r.code == EXIT_OK, r.err
    doc = r.json
    assert doc["id"] == "branch" and doc["seedLength"] == 14 and doc["events"] == 15
    assert doc["meta"]["parentSession"] == "done" and doc["meta"]["cwd"] == "/work"
    r = cli(root, "verify", "branch", "--strict", "--json")
    assert r.code == EXIT_OK, r.out
    exported = [orjson.loads(x) for x in cli(root, "export", "branch").out.splitlines()]
    assert exported[0]["parentSession"] == "done" and exported[0]["seedLength"] == 14
    assert [e["type"] for e in exported[-2:]] == ["turn/end", "session/end-seed"]
    if kind == "jsonl":
        assert transcript(root, "branch").exists()
    # A prefix ending inside an open turn, past the stored log, onto an existing id.
    r = cli(root, "fork", "done@3", "--json")
    assert r.code == EXIT_REFUSED and r.json["error"]["code"] == "OPEN_TURN"
    assert 'fork boundary 3 in session "done" ends inside open turn 1' in r.err
    r = cli(root, "fork", "crashed@10")
    assert r.code == EXIT_REFUSED and "[OPEN_TURN]" in r.err
    r = cli(root, "fork", "crashed@11")
    assert r.code == EXIT_REFUSED and "[INVALID_BOUNDARY]" in r.err and "last stored seq: 10" in r.err
    r = cli(root, "fork", "done@13", "--to", "child")
    assert r.code == EXIT_REFUSED and "[SESSION_ALREADY_EXISTS]" in r.err
    # A minted id; the whole log when no seq is given.
    r = cli(root, "fork", "done", "--json")
    assert r.code == EXIT_OK and r.json["id"].startswith("session-") and r.json["seedLength"] == 30
    assert cli(root, "fork", "nobody@1").code == EXIT_NOT_FOUND
    assert cli(root, "fork", "done@x").code == EXIT_USAGE


# -- locks and rm ----------------------------------------------------------------------------


def test_locked_session(store: tuple[str, Path]) -> None:
    kind, root = store
    with held(kind, root, "crashed"):
        before = tree_digest(root)
        for command in (("repair", "crashed"), ("rm", "crashed", "--yes")):
            r = cli(root, *command)
            assert r.code == EXIT_LOCKED, (command, r.err)
            assert r.err.count("\n") == 1 and "[SESSION_LOCKED]" in r.err
            assert 'session "crashed" is already open for writing by' in r.err
        # Reading needs no lock: verify, show and fork still work.
        r = cli(root, "verify", "crashed", "--json")
        assert r.code == EXIT_OK and r.json["sessions"][0]["status"] == "ok"  # the holder repaired it
        assert cli(root, "show", "crashed").code == EXIT_OK
        assert tree_digest(root) == before
        assert cli(root, "fork", "crashed@13", "--to", "side").code == EXIT_OK  # the old spelling of --new-id
    assert cli(root, "rm", "-y", "crashed").code == EXIT_OK


def test_rm(store: tuple[str, Path]) -> None:
    kind, root = store
    # Without a terminal to ask on, rm refuses unless --yes, and deletes nothing.
    r = cli(root, "rm", "done")
    assert r.code == EXIT_USAGE and "pass --yes" in r.err and "[CONFIRMATION_REQUIRED]" in r.err
    assert "done" in {s["id"] for s in cli(root, "list", "--json").json["sessions"]}
    r = cli(root, "rm", "done", "--json", "--yes")
    assert r.code == EXIT_OK, r.err
    assert r.json["deleted"] == "done" and r.json["children"] == ["child"]
    ids = {s["id"] for s in cli(root, "list", "--json").json["sessions"]}
    assert ids == {"child", "crashed"}
    if kind == "jsonl":
        assert not list(root.glob("*/done/session.jsonl"))
    r = cli(root, "rm", "done", "--yes")
    assert r.code == EXIT_NOT_FOUND and r.err.startswith("harness sessions rm: error: ")


@pytest.mark.parametrize("kind", BACKENDS)
def test_rm_deletes_a_log_whose_events_do_not_read(kind: str, tmp_path: Path) -> None:
    """docs/cli.md said rm of a log that does not read is refused (exit 5), but a corrupt
    body (SESSION_CORRUPT, as verify reports it) is deleted: Persistence.delete takes
    the writer lock with the listing's header (on purpose: rm is how such a log goes).
    It still asks first; a header that does not read is what rm refuses (exit 5)."""
    root = make_store(kind, tmp_path)
    if kind == "jsonl":
        path = transcript(root, "done")
        lines = path.read_bytes().splitlines(keepends=True)
        lines[3] = b"this is not json\n"  # a record of turn 1, before its turn/end
        path.write_bytes(b"".join(lines))
    else:
        db = sqlite3.connect(root)
        with db:
            db.execute("UPDATE events SET data = '{bad' WHERE session_id = 'done' AND seq = 3")
        db.close()
    r = cli(root, "verify", "done", "--json")
    assert r.code == EXIT_VERIFY_FAILED and r.json["sessions"][0]["problems"][0]["code"] == "SESSION_CORRUPT"
    r = cli(root, "rm", "done")
    assert r.code == EXIT_USAGE and "[CONFIRMATION_REQUIRED]" in r.err  # asked first, as for any log
    r = cli(root, "rm", "done", "--yes", "--json")
    assert r.code == EXIT_OK, r.err
    assert r.json["deleted"] == "done" and r.json["children"] == ["child"]
    assert {s["id"] for s in cli(root, "list", "--json").json["sessions"]} == {"child", "crashed"}
    assert cli(root, "verify", "done").code == EXIT_NOT_FOUND
    if kind == "jsonl":
        assert not path.exists()
        # A transcript whose header does not read is not listed, and rm refuses it.
        crashed = transcript(root, "crashed")
        data = crashed.read_bytes().replace(b'"version":0', b'"version":3', 1)
        crashed.write_bytes(data)
        r = cli(root, "rm", "crashed", "--yes")
        assert r.code == EXIT_CORRUPT and r.err.count("\n") == 1 and "[SESSION_FORMAT_UNSUPPORTED]" in r.err, r.err
        assert crashed.read_bytes() == data


# -- the store root and usage ----------------------------------------------------------------


def test_bad_roots_and_usage(tmp_path: Path) -> None:
    r = cli(tmp_path / "missing", "list")
    assert r.code == EXIT_NOT_FOUND and "does not exist" in r.err
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    r = cli(empty, "list", "--json")
    assert r.code == EXIT_CORRUPT and r.json["error"]["code"] == "NOT_A_STORE"
    assert empty.read_bytes() == b""  # never initialised by a reading command
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"hello, this is not a database at all" * 10)
    r = cli(junk, "verify")
    assert r.code == EXIT_CORRUPT and "not a SQLite database" in r.err
    assert cli(tmp_path, "list", "--backend", "sqlite").code == EXIT_USAGE
    assert cli(junk, "list", "--backend", "jsonl").code == EXIT_USAGE
    assert cli(tmp_path, "show", "").code == EXIT_USAGE
    assert cli(tmp_path, "frobnicate").code == EXIT_USAGE  # Click
    # An empty JSONL root lists nothing.
    r = cli(tmp_path, "list", "--json")
    assert r.code == EXIT_OK and r.json["sessions"] == []
    assert cli(tmp_path, "show", "nobody").code == EXIT_NOT_FOUND


def test_zstd_root_is_detected(tmp_path: Path) -> None:
    pytest.importorskip("zstandard")
    root = tmp_path / "z"
    root.mkdir()

    async def build() -> None:
        async with open_store() as store, open_persistence(store, JsonlBackend(root, compression="zstd")) as p:
            h = await store.create("z1", cwd="/w")
            await h.append_batch(closed_turn(1, "1"))
            await h.flush()
            await store.detach(h)
            await p.wait_retired("z1")

    trio.run(build)
    r = cli(root, "list", "--json")
    assert r.code == EXIT_OK and r.json["compression"] == "zstd" and r.json["sessions"][0]["id"] == "z1"
    r = cli(root, "verify", "--strict", "--compression", "none")
    assert r.code == EXIT_CORRUPT and "[STORAGE_LAYOUT_UNSUPPORTED]" in r.err


def test_colour_and_the_module_entry_point(store: tuple[str, Path]) -> None:
    _, root = store
    r = cli(root, "show", "done", "--color", "always")
    assert "\x1b[1msession done\x1b[0m" in r.out
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "HARNESS_SESSIONS_ROOT": str(root)}
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli.sessions", "list", "--json"], capture_output=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    assert {s["id"] for s in orjson.loads(done.stdout)["sessions"]} == {"done", "child", "crashed"}


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_terminal_and_never_with_no_color(store: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.cli.sessions import main, parse

    _, root = store
    args = parse(["sessions", "--root", str(root), "show", "done", "--width", "100"])
    monkeypatch.delenv("NO_COLOR", raising=False)
    tty = _Tty()
    assert main(args, stdout=tty, stderr=io.StringIO()) == EXIT_OK
    assert "\x1b[1msession done" in tty.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    tty = _Tty()
    assert main(args, stdout=tty, stderr=io.StringIO()) == EXIT_OK
    assert "\x1b[" not in tty.getvalue() and "session done" in tty.getvalue()


# -- issue 25: one store root, exit codes, usage, clipping ---------------------------------------


def test_every_command_defaults_to_the_one_store_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --root, `harness sessions` reads the root `harness chat` writes:
    $HARNESS_SESSIONS_ROOT, else $XDG_DATA_HOME/trio-harness/sessions (it refused to
    run without --root or the variable before)."""
    from harness.cli.chat import default_root as chat_root

    monkeypatch.delenv("HARNESS_SESSIONS_ROOT", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    root = tmp_path / "data" / "trio-harness" / "sessions"
    assert chat_root() == root
    r = cli(None, "list")
    assert r.code == EXIT_NOT_FOUND and str(root) in r.err  # names the default it looked at
    root.parent.mkdir(parents=True)
    make_store("jsonl", tmp_path).rename(root)
    r = cli(None, "list", "--json")
    assert r.code == EXIT_OK and {x["id"] for x in r.json["sessions"]} == {"done", "child", "crashed"}
    monkeypatch.setenv("HARNESS_SESSIONS_ROOT", str(tmp_path / "elsewhere"))
    assert "elsewhere" in cli(None, "list").err
    out = io.StringIO()
    with redirect_stdout(out):
        assert run(["sessions", "--help"]) == EXIT_OK
    assert "elsewhere" in out.getvalue()  # --help prints the root in force


def test_the_group_help_is_dedented_before_the_store_root_is_appended(monkeypatch: pytest.MonkeyPatch) -> None:
    """The group's indented docstring was joined to the appended root line undedented,
    so Click wrapped it as "stored sessions of a store         root"."""
    monkeypatch.setenv("HARNESS_SESSIONS_ROOT", "/srv/sessions")  # not wrapped: no hyphen
    out = io.StringIO()
    with redirect_stdout(out):
        assert run(["sessions", "--help"]) == EXIT_OK
    text = out.getvalue()
    description = text[text.index("\n\n") : text.index("Options:")]
    lines = [line for line in description.splitlines() if line.strip()]
    assert lines and all(line.startswith("  ") and "  " not in line.strip() for line in lines), description
    assert " ".join(line.strip() for line in lines) == (
        "List, show, verify, repair, fork, export and remove stored sessions of a store root: a JSONL directory, "
        "a SQLite file or a PostgreSQL URL. Store root without --root: /srv/sessions."
    )


def test_a_subcommand_bad_flag_prints_that_subcommand_usage(store: tuple[str, Path]) -> None:
    _, root = store
    r = cli(root, "show", "done", "--bogus")
    assert r.code == EXIT_USAGE
    assert "Usage: harness sessions show [OPTIONS] ID" in r.err and "--bogus" in r.err


def test_verify_detail_is_not_clipped_into_a_pipe(tmp_path: Path) -> None:
    """A pipe gets the whole problem text (it was cut at 120 columns); --width still
    clips, as a terminal's width does."""
    root = make_store("jsonl", tmp_path)
    path = transcript(root, "done")
    path.write_bytes(path.read_bytes() + b'{"type":"turn/start","seq":30,"ti')
    long_id_root = root
    r = cli(long_id_root, "verify", "done")
    assert r.code == EXIT_NEEDS_REPAIR
    (line,) = [x for x in r.out.splitlines() if "TORN_TAIL" in x]
    assert len(line) > 60 and not line.endswith("…") and line.endswith("the next repair cuts it")
    r = cli(long_id_root, "verify", "done", "--width", "40")
    (line,) = [x for x in r.out.splitlines() if "TORN_TAIL" in x]
    assert line.endswith("…") and len(line) <= 40
