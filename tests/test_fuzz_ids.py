"""Issue 16, ids and metadata: bad input is refused at the door with a typed error
naming it, or accepted and preserved losslessly; either way the runtime serves its
other sessions, shuts down cleanly and loses nothing it acknowledged."""

from __future__ import annotations

import tempfile
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import harness
from harness.agent import Say, ScriptedProvider
from harness.errors import HarnessError, PersistedSessionNotFoundError, SessionIdError
from harness.fuzz import budget, explored
from harness.persistence import JsonlBackend, SqliteBackend, open_persistence
from harness.runtime import open_store
from harness.session import MAX_SESSION_ID_BYTES, RelationalInvariants, check_session_id, thaw
from tests.helpers import user

pytestmark = pytest.mark.fuzz

BACKENDS = ("jsonl", "sqlite")

# The ids a user (or a model choosing a sub-agent's id) may well type.
SPECIAL_IDS: list[object] = [
    "", ".", "..", "a/b", "../etc/passwd", "a\\b", "C:x", "con", "NUL", "aux.txt", "~", "~0041",
    " ", " x ", "a b", "a\x00b", "line\nbreak", "\x7f", "\ud800", "x\udfff", "é",
    unicodedata.normalize("NFD", "é"), "😀", "😀" * 25, "😀" * 26, "é" * 51, "é" * 52,
    "a" * MAX_SESSION_ID_BYTES, "a" * (MAX_SESSION_ID_BYTES + 1), "a" * 300, "a" * 100_000,
    "\u202eevil", "\ufeff", "ǅ", "İ", "ß",
    0, 5, -1, 2**64, 2**70, -(2**70), 1.5, float("nan"), True, None, b"bytes", ["x"], {"id": "x"}, ("x",),
]

ids = st.one_of(
    st.sampled_from(SPECIAL_IDS),
    st.text(min_size=0, max_size=80),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=300),
    st.text(alphabet="abc./\\~-_ \x00\n", min_size=1, max_size=12),
    st.integers(),
)

_SAFE_CWD = "/work/fuzz"
cwds = st.one_of(
    st.just(_SAFE_CWD),
    st.sampled_from(["", "relative", "/", "//", "/a/../b", "/" + "x" * 5000, "/é", "/a\x00b", "/\ud800", 5, None]),
    st.text(max_size=40).map(lambda s: "/" + s),
)
created_ats = st.one_of(
    st.none(), st.sampled_from([0, -1, 2**53 - 1, 2**53, 2**63, 2**64, 2**70, 1.5, -0.0, True, "1"]), st.integers()
)


def _backend(name: str, root: Path) -> Any:
    return JsonlBackend(root / "tree") if name == "jsonl" else SqliteBackend(root / "db.sqlite")


def _names_value(exc: HarnessError, value: object) -> bool:
    text = str(exc)
    if type(value) is str:
        return exc.session_id == value or repr(value[:60]) in text or value in text
    return repr(value) in text


async def _other_session(store: Any) -> Any:
    other = await store.create("other", cwd=_SAFE_CWD)
    await other.append("user/message", user("u-other", "acknowledged"), surface_op="append")
    assert await other.flush()
    return other


lineage = st.fixed_dictionaries(
    {},
    optional={
        "parent_session": st.one_of(st.text(max_size=10), st.sampled_from(["", "\ud800", 5, ["p"], "a" * 300])),
        "seed_length": st.one_of(st.integers(), st.sampled_from([-0.0, 1.0, "3", True])),
        "delegation_depth": st.one_of(st.integers(), st.sampled_from([2**53, -1, 0.5, None])),
        "origin": st.sampled_from(["subagent", "human", "", 1]),
        "agent_preset": st.one_of(st.text(max_size=10), st.sampled_from([7, {"p": 1}, "\ud800"])),
    },
)


def _run_create(
    backend_name: str, sid: object, cwd: object, created_at: object, extra: dict[str, Any] | None = None
) -> None:
    meta: dict[str, Any] = {"cwd": cwd, **(extra or {})}
    if created_at is not None:
        meta["created_at"] = created_at

    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            accepted = False
            stored_id = ""
            async with (
                open_store(validator_factory=RelationalInvariants) as store,
                open_persistence(store, _backend(backend_name, root), write_delay=0) as persistence,
            ):
                other = await _other_session(store)
                try:
                    handle = await store.create(sid, **meta)  # type: ignore[arg-type]
                except HarnessError as exc:
                    explored(f"store.create id+meta/{backend_name}/refused")
                    assert exc.code, exc
                    if isinstance(exc, SessionIdError):
                        assert _names_value(exc, sid), (exc, sid)
                    else:
                        assert exc.session_id == sid, (exc, sid)
                else:
                    explored(f"store.create id+meta/{backend_name}/accepted")
                    accepted = True
                    assert sid is None or handle.id == sid
                    stored_id = handle.id  # None asks the store to mint an id
                    await handle.append("user/message", user("u1", "kept"), surface_op="append")
                    assert await handle.flush()
                    header = handle.header.to_record()
                # The runtime still serves the other session.
                await other.append("user/message", user("u-other-2", "after"), surface_op="append")
                assert await other.flush()
            # Clean shutdown happened (no exception left the blocks); the accepted id and
            # its metadata read back exactly.
            backend = _backend(backend_name, root)
            async with open_store() as store, open_persistence(store, backend) as persistence:
                session = await persistence.load("other")
                assert [e.type for e in session.events].count("user/message") == 2
                if accepted:
                    restored = await persistence.load(stored_id)
                    assert restored.id == stored_id
                    got = restored.header.to_record()
                    for key in ("id", "createdAt", "cwd", "parentSession", "seedLength", "origin", "agentPreset"):
                        assert got.get(key) == header.get(key), (key, got, header)
                    kept = [thaw(e.data) for e in restored.events if e.type == "user/message"]
                    assert kept == [user("u1", "kept")]

    trio.run(main)


@pytest.mark.parametrize("backend_name", BACKENDS)
@settings(max_examples=budget(60))
@given(sid=ids, cwd=st.just(_SAFE_CWD), created_at=st.none())
def test_fuzz_session_ids(backend_name: str, sid: object, cwd: object, created_at: object) -> None:
    _run_create(backend_name, sid, cwd, created_at)


@pytest.mark.parametrize("backend_name", BACKENDS)
@settings(max_examples=budget(40))
@given(sid=st.sampled_from(["s", "é", "x" * 200]), cwd=cwds, created_at=created_ats, extra=lineage)
def test_fuzz_session_metadata(
    backend_name: str, sid: object, cwd: object, created_at: object, extra: dict[str, Any]
) -> None:
    _run_create(backend_name, sid, cwd, created_at, extra)


@pytest.mark.parametrize("sid", SPECIAL_IDS, ids=repr)
def test_special_ids_through_the_door(sid: object) -> None:
    """Every id of the list, on both backends: the deterministic regression set."""
    for backend_name in BACKENDS:
        explored("check_session_id/special")
        _run_create(backend_name, sid, _SAFE_CWD, None)


def test_the_300_character_id_is_refused_by_create_not_by_the_flush() -> None:
    """The crash of issue 16: ``rt.create`` said yes to a 300-character id and the
    first write-behind flush died with "file name too long", taking the runtime (and
    every other session) down with an ExceptionGroup at close."""
    sid = "a" * 300

    async def main(root: str) -> None:
        provider = ScriptedProvider([[Say("hello")], [Say("again")]])
        async with harness.open_runtime(root, provider=provider) as rt:
            other = await rt.create("other", cwd="/work")
            with pytest.raises(SessionIdError) as info:
                await rt.create(sid, cwd="/work")
            assert info.value.code == "INVALID_SESSION_ID"
            assert info.value.session_id == sid
            assert "300 bytes" in str(info.value) and repr("a" * 60) in str(info.value)
            result = await other.run_turn("still there?")
            assert result.kind == "completed"
        async with harness.open_runtime(root, provider=provider) as rt:
            again = await rt.resume("other")
            assert (await again.run_turn("and now?")).kind == "completed"

    with tempfile.TemporaryDirectory() as root:
        trio.run(main, root)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_two_spellings_of_one_name_are_two_sessions(backend_name: str) -> None:
    """NFC and NFD spell "é" differently: two ids, two sessions, each read back with
    its own spelling (the JSONL path encoding is per UTF-16 unit, so they never share
    a file, also on a normalising file system)."""
    nfc, nfd = "caf\u00e9", unicodedata.normalize("NFD", "caf\u00e9")
    assert nfc != nfd

    async def main(root: Path) -> None:
        async with (
            open_store() as store,
            open_persistence(store, _backend(backend_name, root), write_delay=0) as persistence,
        ):
            for sid, text in ((nfc, "composed"), (nfd, "decomposed")):
                h = await store.create(sid, cwd=_SAFE_CWD)
                await h.append("user/message", user("u1", text), surface_op="append")
                assert await h.flush()
        async with open_store() as store, open_persistence(store, _backend(backend_name, root)) as persistence:
            listed = sorted(h["id"] for h in await persistence.list())
            assert listed == sorted([nfc, nfd])
            for sid, text in ((nfc, "composed"), (nfd, "decomposed")):
                s = await persistence.load(sid)
                assert s.id == sid
                assert thaw(s.events[0].data)["content"][0]["text"] == text

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, Path(tmp))


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_lookups_with_bad_ids_are_typed(backend_name: str) -> None:
    """get/load/prepare/inspect/read_from/read_raw/delete/append of a non-string, an
    unhashable or a lone-surrogate id: a typed error (they raised TypeError,
    UnicodeEncodeError and OverflowError from the backends), and the runtime goes on."""
    bad: list[object] = [5, None, ["x"], 2**70, "\ud800", ""]

    async def main(root: Path) -> None:
        async with (
            open_store() as store,
            open_persistence(store, _backend(backend_name, root), write_delay=0) as persistence,
        ):
            other = await _other_session(store)
            calls = {
                "load": persistence.load,
                "prepare": persistence.prepare,
                "inspect": persistence.inspect,
                "delete": persistence.delete,
                "wait_retired": persistence.wait_retired,
                "read_from": lambda s: persistence.read_from(s, 0),
                "read_raw": persistence.read_raw,
                "append": lambda s: persistence.append(s, []),
            }
            for sid in bad:
                for name, call in calls.items():
                    explored(f"persistence.{name} bad id")
                    with pytest.raises(HarnessError) as info:
                        await call(sid)
                    assert isinstance(info.value, SessionIdError), (name, sid, info.value)
                    assert _names_value(info.value, sid) or sid == "", (name, info.value)
            # Longer than any stored id can be: "not found", where the JSONL lookup
            # raised OSError (ENAMETOOLONG) probing for a flat-layout file.
            for sid in ("a" * 300, "é" * 60):
                for name in ("load", "prepare", "inspect", "read_from", "delete"):
                    explored(f"persistence.{name} bad id")
                    with pytest.raises(PersistedSessionNotFoundError):
                        await calls[name](sid)
            await other.append("user/message", user("u2"), surface_op="append")
            assert await other.flush()
        await _check_other_len(_backend(backend_name, root), 2)

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, Path(tmp))


async def _check_other_len(backend: Any, n: int) -> None:
    async with open_store() as store, open_persistence(store, backend) as persistence:
        types = [e.type for e in (await persistence.load("other")).events]
        assert types.count("user/message") == n


def test_agent_loop_get_of_an_unhashable_id_is_none() -> None:
    async def main() -> None:
        async with harness.open_runtime(provider=ScriptedProvider([])) as rt:
            assert rt.get(["x"]) is None  # type: ignore[arg-type]
            assert rt.get("nobody") is None

    trio.run(main)


@settings(max_examples=budget(300))
@given(st.text(max_size=120))
def test_check_session_id_agrees_with_the_jsonl_path_encoding(sid: str) -> None:
    """The id limit is the JSONL path segment's length: whatever the door accepts,
    ``encode_segment`` names in at most 255 bytes, and vice versa."""
    from harness.persistence import encode_segment

    explored("check_session_id/vs encode_segment")
    try:
        check_session_id(sid)
    except SessionIdError:
        ok = False
    else:
        ok = True
    if not sid or any(c < " " or c == "\x7f" for c in sid) or not _utf8(sid):
        assert not ok
        return
    assert ok == (len(encode_segment(sid).encode()) <= MAX_SESSION_ID_BYTES)


def _utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
