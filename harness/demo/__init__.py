"""`harness demo`: a short, readable walk through a session."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import trio
import trio.lowlevel

from harness.demo._show import plain
from harness.errors import InvariantError, OpenTurnError, SessionNotLiveError
from harness.persistence import JsonlBackend, Persistence, open_persistence
from harness.runtime import Store, open_store
from harness.session import (
    EventDraft,
    FrozenDict,
    RelationalInvariants,
    ReplaceOp,
    Session,
    interrupted_turn_closers,
    thaw,
)


def _yes(value: bool) -> str:
    return "yes" if value else "NO"


def _text(message: FrozenDict) -> str:
    m: Any = thaw(message)
    parts = []
    for block in m["content"]:
        if block["type"] == "text":
            parts.append(str(block["text"]))
        elif block["type"] == "tool-call":
            parts.append(f"<call {block['name']}({block['arguments']})>")
        elif block["type"] == "tool-result":
            parts.append("<result " + " ".join(str(b["text"]) for b in block["content"]) + ">")
    return " ".join(parts)


def _show_surface(session: Session, title: str) -> None:
    print(f"\n  {title}: surface nodes {list(session.surface)} (generation {session.generation})")
    for message in session.derive_messages():
        role = message["role"]
        print(f"    {role:>9}: {_text(message)[:90]}")


def _user(mid: str, text: str) -> dict[str, object]:
    return {"id": mid, "role": "user", "content": [{"type": "text", "text": text}], "source": {"kind": "user"}}


def _assistant(turn: int, mid: str, blocks: list[dict[str, object]]) -> dict[str, object]:
    return {
        "turn": turn,
        "step": 1,
        "message": {
            "id": mid,
            "role": "assistant",
            "content": blocks,
            "source": {"kind": "model", "provider": "scripted", "model": "demo"},
        },
        "usage": {"inputTokens": 12, "outputTokens": 7},
    }


def make_private_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents owner-only (``0700``, as the backends
    create theirs); an existing directory is left as it is."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            continue  # made meanwhile by someone else: theirs
        d.chmod(0o700)  # mkdir's mode is masked by the umask; owner-only whatever it is


def run_demo(root: str | None = None) -> int:
    from harness.demo._agent import run_agent_story
    from harness.demo._compaction import run_compaction_act

    where = Path(root) if root else Path(tempfile.mkdtemp(prefix="harness-demo-"))  # mkdtemp: 0700
    make_private_dirs(where)
    run_agent_story(where / "agent")
    print("\n== more: the pure session core ==")
    _core_walk()
    print(f"\n== more: sessions as actors on a store, durable under {where / 'store'} ==")
    trio.run(_store_walk, where / "store")
    run_compaction_act(where / "compaction")
    return 0


async def _store_walk(root: Path) -> None:
    backend = JsonlBackend(root)
    async with open_store(validator_factory=RelationalInvariants) as store, open_persistence(store, backend) as persistence:
        await _store_steps(store, persistence)
    async with open_store() as store, open_persistence(store, backend) as persistence:
        print("\n  a new store reloads 'chat' from disk:")
        reloaded = await persistence.load("chat")
        print(f"    {reloaded.seq} events (the {reloaded.seq - 1} written + its new session/end-seed), surface {list(reloaded.surface)}")
        for header in await persistence.list():
            parent = header.get("parentSession")
            lineage = f"a fork of {parent}, starting with a copy of its first {header.get('seedLength')} events" if parent else "no parent"
            print(f"    on disk: {header['id']} ({lineage})")


async def _store_steps(store: Store, persistence: Persistence) -> None:
    if True:
        store.on_created(lambda h: print(f"  [session/created] {h.id}"))
        store.on_disposed(lambda h: print(f"  [session/disposed] {h.id}"))
        chat = await store.create("chat")
        await chat.append("turn/start", {"turn": 1})

        async def writer(name: str, count: int) -> None:
            for i in range(count):
                await chat.append("user/message", _user(f"{name}-{i}", f"{name} says {i}"), surface_op="append")
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            for name in ("alice", "bob", "carol"):
                nursery.start_soon(writer, name, 4)
        await chat.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        order = [str(thaw(e.data)["id"]) for e in chat.events if e.type == "user/message"]
        print(f"  3 tasks appended concurrently; one writer serialised them: seqs 0..{chat.seq - 1}")
        print(f"  interleaving: {' '.join(order)}")

        await chat.append("turn/start", {"turn": 2})
        try:
            await store.fork(chat)
        except OpenTurnError as exc:
            print(f"  fork inside the open turn is refused: {exc.code}: {exc}")
        await chat.append("turn/end", {"turn": 2, "reason": {"kind": "completed"}})
        child = await store.fork(chat, boundary=13, child_id="chat-branch")
        print(
            f"  forked {child.id} from {child.header.parent_session} at seq 13: it starts with a copy of the parent's "
            f"first {child.header.seed_length} events (identical: {_yes(list(child.events)[:14] == list(chat.events)[:14])})"
        )
        await child.append("user/message", _user("branch-1", "a question only the branch sees"), surface_op="append")
        print(f"  parent has {chat.seq} events, child has {child.seq}; the parent is untouched")

        written = list(chat.events)
        surface = chat.surface()
        await store.detach(chat)
        try:
            await chat.append("user/message", _user("late", "too late"), surface_op="append")
        except SessionNotLiveError as exc:
            print(f"  a stale handle is refused: {exc.code}: {exc}")
        reloaded = await persistence.load("chat")
        same = list(reloaded.events)[: len(written)] == written and tuple(reloaded.surface) == surface
        print(f"  reloaded chat from disk: same log and surface as when it was live: {_yes(same)}")
        print("  leaving the store detaches what is still live:")


def _core_walk() -> None:
    clock = iter(range(1_700_000_000_000, 1_800_000_000_000, 250))
    s = Session.create("demo", clock=lambda: next(clock), validator=RelationalInvariants())
    print(f"session {s.id} created; its header record: {plain(s.header.to_record())}")

    s.append_batch(
        [
            EventDraft("turn/start", {"turn": 1}),
            EventDraft("user/message", _user("u1", "What is in /etc/hostname?"), "append"),
            EventDraft("step/start", {"turn": 1, "step": 1}),
            EventDraft(
                "assistant/message",
                _assistant(1, "a1", [{"type": "tool-call", "id": "c1", "name": "read", "arguments": '{"path":"/etc/hostname"}'}]),
                "append",
            ),
            EventDraft("tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "read", "arguments": '{"path":"/etc/hostname"}'}),
        ]
    )
    result = {
        "turn": 1,
        "step": 1,
        "message": {
            "id": "r1",
            "role": "user",
            "content": [{"type": "tool-result", "toolCallId": "c1", "content": [{"type": "text", "text": "build-host-7"}]}],
            "source": {"kind": "tool", "callId": "c1"},
        },
    }
    s.append("tool/result", result, surface_op="append")
    s.append_batch(
        [
            EventDraft("step/end", {"turn": 1, "step": 1}),
            EventDraft("turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
            EventDraft("turn/start", {"turn": 2}),
            EventDraft("user/message", _user("u2", "Thanks. Summarise what we did."), "append"),
        ]
    )
    print(f"\nappended {s.seq} events:")
    for ev in s.events:
        op = "" if ev.surface_op is None else f"  [surface {ev.surface_op if isinstance(ev.surface_op, str) else 'replace'}]"
        print(f"  {ev.seq:3d} {ev.type:<18}{op}")
    _show_surface(s, "before the replace")

    first, last = s.surface[0], s.surface[2]
    shadowed = list(s.surface[0:3])
    summary = s.append(
        "user/message",
        _user("sum1", "[summary] The user asked for /etc/hostname; the read tool returned build-host-7."),
        surface_op=ReplaceOp(first, last),
        source_event_seqs=shadowed,
    )
    print(f"\nreplace at seq {summary.seq}: surface nodes {shadowed} -> [{summary.seq}] (the log keeps all {s.seq} events)")
    _show_surface(s, "after the replace")

    try:
        s.append("turn/start", {"turn": 9})
    except InvariantError as exc:
        print(f"\na bad append is refused and changes nothing: {exc.detail} ({exc.code})")
    print(f"  log still has {s.seq} events")

    closers = interrupted_turn_closers(list(s.events))
    print("\nif the process died now, crash repair would append:")
    for ev in closers:
        print(f"  {ev.seq:3d} {ev.type:<18} {plain(ev.data)}")
