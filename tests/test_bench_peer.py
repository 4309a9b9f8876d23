"""W20 (harness/bench/_peer.py): the Agents SDK's ``SQLiteSession`` and the harness's
SDK sessions store the same conversation; every form must store every item it was
given (a benchmark of a path that drops items measures nothing), and the rows say so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="the OpenAI Agents SDK is not installed")

from harness.bench import _peer


def test_the_conversation_alternates_user_and_assistant_items() -> None:
    conv = _peer.items(4)
    assert [i["role"] for i in conv] == ["user", "assistant", "user", "assistant"]
    assert conv[1]["type"] == "message" and conv[1]["content"][0]["type"] == "output_text"


@pytest.mark.parametrize("batch", [1, 50])
def test_every_form_stores_every_item(batch: int) -> None:
    count = 5 if batch == 1 else 120  # 3 calls of 50, the last one short
    times = _peer.measure(batch, count, 2)
    assert set(times) == set(_peer.FORMS)
    assert all(len(t) == 2 and all(x > 0 for x in t) for t in times.values())


def test_a_form_that_loses_items_fails_the_measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _peer._run

    def lossy(form: str, where: Path, calls: list[list[dict[str, Any]]]) -> tuple[float, int]:
        dt, stored = real(form, where, calls)
        return dt, stored - 1 if form == "trio-jsonl" else stored

    monkeypatch.setattr(_peer, "_run", lossy)
    with pytest.raises(AssertionError, match="W20 trio-jsonl: 10 items stored, expected 11"):
        _peer.measure(1, 10, 1, ("sdk", "trio-jsonl"))


def test_the_rows_compare_each_form_with_the_sdk() -> None:
    rows = {r.key: r for r in _peer.w20(100, 2)}
    assert set(rows) == {f"W20-{form}-{b}" for form in _peer.FORMS for b in _peer.SHAPES}
    for row in rows.values():
        assert row.extra["items"] == 100 and row.extra["runs"] == 2
        assert row.extra["vs_sdk"] > 0 and row.floor_ms is not None and row.floor_ms > 0
    assert rows["W20-sdk-50"].extra["vs_sdk"] == 1.0
    assert rows["W20-trio-sqlite-1"].extra["per_call"] == 1


def test_without_the_sdk_the_rows_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_peer, "unavailable", lambda: "the OpenAI Agents SDK is not installed")
    rows = _peer.w20(100, 1)
    assert len(rows) == len(_peer.FORMS) * len(_peer.SHAPES)
    assert all(r.extra == {"unavailable": "the OpenAI Agents SDK is not installed"} for r in rows)


@pytest.mark.parametrize("form", [f for f in _peer.FORMS if f != "sdk"])
def test_each_harness_form_stores_on_the_backend_it_names(form: str, tmp_path: Path) -> None:
    # open_runtime(root) alone is JSONL: a "-sqlite" form must name its backend, or it
    # measures JSONL in a directory called sessions.db.
    _, stored = _peer._run(form, tmp_path, _peer._calls(_peer.items(3), 2))
    assert stored == 4
    if form.endswith("-sqlite"):
        db = tmp_path / "sessions.db"
        assert db.is_file() and db.read_bytes()[:16] == b"SQLite format 3\x00"
    else:
        assert list((tmp_path / "sessions").rglob("session.jsonl"))


def test_a_harness_form_counts_the_items_on_disk(tmp_path: Path) -> None:
    # The count is read back by a fresh runtime from the files, not from the writing
    # session's in-memory log: items that never reached the disk are not counted.
    assert _peer._run("trio-jsonl", tmp_path, _peer._calls(_peer.items(3), 1))[1] == 4
    for log in (tmp_path / "sessions").rglob("session.jsonl"):
        lines = log.read_bytes().splitlines(keepends=True)
        last = max(i for i, line in enumerate(lines) if b'"openai-agents/item"' in line)
        log.write_bytes(b"".join(lines[:last]))  # the last item lost (and what followed it)
    assert _peer._stored(tmp_path, "jsonl") == 3
