"""JSONL on-disk interop (issue 11 §2): the zstd encoding, layout refusals, header
details, and differential runs of the same operations over every encoding.

Reference: ``shared/reference/persistence-resume.md`` §1 and §2.9.
"""

from __future__ import annotations

import errno
import functools
import itertools
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import harness.persistence._zstd as zstd_module
from harness.errors import (
    HarnessError,
    PersistenceArgumentError,
    SessionCorruptionError,
    SessionFormatUnsupportedError,
    SessionLogExistsError,
    StorageIOError,
)
from harness.faults import FaultyFiles, PowerLossFiles, SimulatedCrash
from harness.persistence import Backend, JsonlBackend, SqliteBackend, open_persistence
from harness.persistence._backend import header_line
from harness.persistence._jsonl import StorageLayoutError
from harness.persistence._zstd import MAGIC, ZstdUnavailableError, scan_frames
from harness.runtime import open_store
from harness.session import EventDraft, event_to_record
from tests.helpers import assistant, rec, tool_call_block, tool_result, user

HAVE_ZSTD = True
try:
    import zstandard
except ImportError:  # pragma: no cover - the test extra installs it
    HAVE_ZSTD = False

needs_zstd = pytest.mark.skipif(not HAVE_ZSTD, reason="the optional zstandard package is not installed")

H: dict[str, Any] = {"version": 0, "id": "s", "createdAt": 1, "cwd": "/w"}
MAGIC_BYTES = MAGIC.to_bytes(4, "little")


# -- builders ----------------------------------------------------------------------------------


def turn_records(start: int, turn: int, *, close: bool = True, chunks: int = 4, noise: str = "") -> list[dict[str, Any]]:
    """One turn as stored records from seq ``start``: a user message, streamed chunks
    (packed into one row when ``chunks >= 3``), an assistant message with a tool call,
    the tool call, and (``close``) its result and the step and turn ends."""
    out: list[dict[str, Any]] = []

    def add(type_: str, data: Any, **extra: Any) -> None:
        out.append(rec(type_, start + len(out), data, **extra))

    call = f"c{turn}"
    add("turn/start", {"turn": turn})
    add("user/message", user(f"u{turn}", f"question {turn}"), surfaceOp="append")
    add("step/start", {"turn": turn, "step": 1})
    for i in range(chunks):
        add("assistant/chunk", {"turn": turn, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": f"t{i}{noise}"}})
    add("assistant/message", assistant(turn, 1, f"a{turn}", [tool_call_block(call)]), surfaceOp="append")
    add("tool/call", {"turn": turn, "step": 1, "callId": call, "name": "read", "arguments": "{}"})
    if close:
        add("tool/result", tool_result(call, turn), surfaceOp="append")
        add("step/end", {"turn": turn, "step": 1})
        add("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
    return out


def noise(n: int, seed: int = 7) -> str:
    """Incompressible printable text: a zstd frame of it spans several blocks."""
    rng = random.Random(seed)
    return "".join(chr(33 + rng.randrange(90)) for _ in range(n)).replace("\\", "/").replace('"', "'")


def plaintext(data: bytes) -> bytes:
    """The decoded text of a whole ``.jsonl.zstd`` file (no torn frame allowed)."""
    frames, torn = scan_frames(data)
    assert torn is None
    d = zstandard.ZstdDecompressor()
    return b"".join(d.decompressobj().decompress(data[s:e]) for s, e in frames)


def frame(text: bytes, **kwargs: Any) -> bytes:
    return zstandard.ZstdCompressor(write_checksum=True, **kwargs).compress(text)


def raw_frame(text: bytes, *, block: int = 1000) -> bytes:
    """A frame built by hand from raw (stored) blocks, no checksum: what any
    conforming producer may emit, decodable without a compressor's help."""
    out = bytearray(MAGIC_BYTES + bytes([0x00, 0x38]))  # no single segment; window 2**17
    pieces = [text[i : i + block] for i in range(0, len(text), block)] or [b""]
    for k, piece in enumerate(pieces):
        last = 1 if k == len(pieces) - 1 else 0
        out += ((len(piece) << 3) | last).to_bytes(3, "little") + piece
    return bytes(out)


def zstd_backend(root: Path, **kwargs: Any) -> JsonlBackend:
    return JsonlBackend(root, compression="zstd", **kwargs)


def write_zstd(root: Path, content: bytes, header: dict[str, Any] | None = None) -> Path:
    d = JsonlBackend(root).session_dir(header or H)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "session.jsonl.zstd"
    path.write_bytes(content)
    return path


def lines(records: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


# -- item 1: duplicate ids across project directories --------------------------------------------


@pytest.mark.parametrize("compression", ["none", pytest.param("zstd", marks=needs_zstd)])
def test_list_refuses_an_id_in_two_project_directories(tmp_path: Path, compression: str) -> None:
    a = JsonlBackend(tmp_path / "a", compression=compression)
    b = JsonlBackend(tmp_path / "b", compression=compression)
    a.materialize({**H, "cwd": "/one"}, turn_records(0, 1))
    b.materialize({**H, "cwd": "/two"}, turn_records(0, 1))
    # Move b's project directory next to a's: one id, two project directories.
    (tmp_path / "b" / "--two--").rename(tmp_path / "a" / "--two--")
    fresh = JsonlBackend(tmp_path / "a", compression=compression)
    message = 'duplicate JSONL session id "s" appears in multiple project directories'
    with pytest.raises(SessionCorruptionError, match=message):
        fresh.list_headers()
    with pytest.raises(SessionCorruptionError, match=message):
        fresh.load("s")


# -- item 2: the flat legacy layout --------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zstd"])
@pytest.mark.parametrize("compression", ["none", pytest.param("zstd", marks=needs_zstd)])
def test_flat_layout_files_are_recognised_and_refused(tmp_path: Path, compression: str, suffix: str) -> None:
    JsonlBackend(tmp_path, compression=compression).materialize({**H, "id": "ok"}, turn_records(0, 1))
    flat = tmp_path / "--w--" / f"s{suffix}"
    flat.write_bytes(header_line(H))
    message = f'session artifact "{flat}" uses the unsupported flat-file layout; use a separate root or move it'
    backend = JsonlBackend(tmp_path, compression=compression)
    for op in (backend.list_headers, lambda: backend.load("s"), lambda: backend.load("ok")):
        with pytest.raises(StorageLayoutError, match=re.escape(message)) as info:
            op()
        assert info.value.code == "STORAGE_LAYOUT_UNSUPPORTED"
    # Also a targeted lookup on a backend that already checked the root (memoised).
    checked = JsonlBackend(tmp_path / "other", compression=compression)
    checked.list_headers()
    (tmp_path / "other" / "--x--").mkdir(parents=True)
    (tmp_path / "other" / "--x--" / f"t{suffix}").write_bytes(b"")
    with pytest.raises(StorageLayoutError, match="flat-file layout"):
        checked.load("t")
    with pytest.raises(StorageLayoutError, match="flat-file layout"):
        checked.materialize({**H, "id": "t", "cwd": "/y"}, turn_records(0, 1))


# -- item 3: the zstd encoding -------------------------------------------------------------------


def test_compression_is_validated() -> None:
    with pytest.raises(PersistenceArgumentError, match='must be "none" or "zstd"'):
        JsonlBackend("/nonexistent", compression="gzip")


def test_missing_zstandard_is_a_typed_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zstd_module, "_codec", None)
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import raises ImportError
    with pytest.raises(ZstdUnavailableError, match=r'needs the optional dependency "zstandard".*trio-harness\[zstd\]') as info:
        JsonlBackend(tmp_path, compression="zstd")
    assert info.value.code == "ZSTD_UNAVAILABLE"
    # A plain backend works without it, and meeting a zstd file is a clear refusal.
    write_zstd(tmp_path, b"\x28\xb5\x2f\xfd")
    with pytest.raises(StorageLayoutError, match='configured for compression "none"'):
        JsonlBackend(tmp_path).list_headers()


@needs_zstd
def test_zstd_framing_matches_the_reference(tmp_path: Path) -> None:
    b = zstd_backend(tmp_path)
    first = turn_records(0, 1)
    second = turn_records(len(first), 2, chunks=0)
    third = turn_records(len(first) + len(second), 3)
    b.materialize(H, first)
    path = b.locate("s")
    assert path == tmp_path / "--w--" / "s" / "session.jsonl.zstd" == b.log_path(H)
    assert not (path.parent / "session.jsonl").exists()
    before = path.read_bytes()
    b.append("s", second)
    b.append("s", third)
    data = path.read_bytes()
    assert data.startswith(before)  # appends never rewrite bytes
    frames, torn = scan_frames(data)
    assert torn is None and len(frames) == 4  # the header alone, then one frame per batch
    for start, _ in frames:
        assert data[start : start + 4] == MAGIC_BYTES and data[start + 4] & 0x04  # checksummed
    d = zstandard.ZstdDecompressor()
    texts = [d.decompressobj().decompress(data[s:e]) for s, e in frames]
    assert texts[0] == header_line(H)
    # Logically identical to the plain encoding, byte for byte (packed rows included).
    plain = JsonlBackend(tmp_path / "plain")
    plain.materialize(H, first)
    plain.append("s", second)
    plain.append("s", third)
    assert b"".join(texts) == (plain.locate("s") or Path()).read_bytes()
    assert b'"text-chunks"' in texts[1]
    assert b.load("s").records == first + second + third
    assert b.list_headers() == plain.list_headers()
    assert b.read_raw("s") == b"".join(texts)


@needs_zstd
@pytest.mark.parametrize(
    "producer",
    ["no-content-size", "raw-blocks", "multi-block", "cli", "cli-no-checksum"],
)
def test_zstd_files_from_other_producers_open(tmp_path: Path, producer: str) -> None:
    """Frames written elsewhere (the TypeScript original uses libzstd through Node) open
    here: with or without content size or checksum, stored or compressed blocks."""
    records = turn_records(0, 1) + turn_records(12, 2, noise=noise(200_000) if producer == "multi-block" else "")
    texts = [header_line(H), lines(records[:5]), lines(records[5:])]
    if producer in ("cli", "cli-no-checksum"):
        if shutil.which("zstd") is None:
            pytest.skip("no zstd command")
        flags = ["--no-check"] if producer == "cli-no-checksum" else []
        encode: Callable[[bytes], bytes] = lambda t: subprocess.run(  # noqa: E731
            ["zstd", "-q", "-c", *flags], input=t, capture_output=True, check=True
        ).stdout
    elif producer == "raw-blocks":
        encode = raw_frame
    else:
        encode = lambda t: frame(t, write_content_size=producer != "no-content-size")  # noqa: E731
    write_zstd(tmp_path, b"".join(encode(t) for t in texts))
    b = zstd_backend(tmp_path)
    assert [h["id"] for h in b.list_headers()] == ["s"]
    stored = b.load("s")
    assert stored.records == records and stored.truncate_to is None
    # ... and we append to them in our framing.
    more = turn_records(len(records), 3)
    b.append("s", more)
    assert zstd_backend(tmp_path).load("s").records == records + more


@needs_zstd
def test_frame_scanner_structure() -> None:
    """The structural scan, as the reference's ``scanZstdFrames`` spec pins it."""
    assert scan_frames(b"") == ([], None)
    assert scan_frames(MAGIC_BYTES[:2]) == ([], 0)
    assert scan_frames(MAGIC_BYTES) == ([], 0)
    with pytest.raises(SessionCorruptionError, match="invalid frame magic at byte 0"):
        scan_frames(bytes(4))
    with pytest.raises(SessionCorruptionError, match="reserved frame-header bit at byte 4"):
        scan_frames(MAGIC_BYTES + bytes([0x08]))
    assert scan_frames(MAGIC_BYTES + bytes([0x00])) == ([], 0)  # window descriptor missing
    assert scan_frames(MAGIC_BYTES + bytes([0x20, 0x00, 0x01, 0x00])) == ([], 0)  # 2 of 3 block-header bytes
    raw5 = ((5 << 3) | 1).to_bytes(3, "little")
    assert scan_frames(MAGIC_BYTES + bytes([0x20, 0x00]) + raw5 + b"\x01\x02") == ([], 0)
    with pytest.raises(SessionCorruptionError, match="reserved block type at byte 6"):
        scan_frames(MAGIC_BYTES + bytes([0x20, 0x00, 0x07, 0x00, 0x00]))

    def empty(descriptor: int) -> bytes:
        fcs_flag, single = descriptor >> 6, descriptor & 0x20
        fcs = (1 if single else 0) if fcs_flag == 0 else 1 << fcs_flag
        var = bytes((0 if single else 1) + [0, 1, 2, 4][descriptor & 3] + fcs)
        return MAGIC_BYTES + bytes([descriptor]) + var + b"\x01\x00\x00" + (bytes(4) if descriptor & 4 else b"")

    for descriptor in (0x00, 0x21, 0x42, 0x83, 0xE3, 0x24):
        f = empty(descriptor)
        assert scan_frames(f) == ([(0, len(f))], None)
    assert scan_frames(empty(0x24)[:-1]) == ([], 0)  # torn inside the checksum
    rle = MAGIC_BYTES + bytes([0x20, 0x01]) + ((1 << 3) | (1 << 1) | 1).to_bytes(3, "little") + b"A"
    two = MAGIC_BYTES + bytes([0x20, 0x00]) + b"\x00\x00\x00" + b"\x01\x00\x00"
    assert scan_frames(rle + two) == ([(0, len(rle)), (len(rle), len(rle) + len(two))], None)
    assert scan_frames(rle + two, 1) == ([(0, len(rle))], None)
    with pytest.raises(SessionCorruptionError, match=f"invalid frame magic at byte {len(rle)}"):
        scan_frames(rle + b"\x00" * 8)  # garbage after a complete frame is not a torn tail


def torn_frame(text: bytes, accepts: Callable[[bytes], bool]) -> bytes:
    """A prefix of ``frame(text)`` that is structurally incomplete and whose best-effort
    decoding satisfies ``accepts`` (the reference's ``tornFrame`` test helper)."""
    whole = frame(text)
    for end in [len(whole) - 1, len(whole) - 4, *(int(len(whole) * r) for r in (0.9, 0.75, 0.6, 0.5, 0.4, 0.25))]:
        cut = whole[:end]
        if scan_frames(cut) != ([], 0):
            continue
        try:
            decoded = zstandard.ZstdDecompressor().decompressobj().decompress(cut)
        except zstandard.ZstdError:
            continue
        if accepts(decoded):
            return cut
    raise AssertionError("could not produce the requested torn frame")


@needs_zstd
def test_torn_final_frame_keeps_its_complete_records_and_repair_rewrites_them(tmp_path: Path) -> None:
    b = zstd_backend(tmp_path)
    b.materialize(H, turn_records(0, 1))
    path = b.locate("s")
    assert path is not None
    committed = path.read_bytes()
    open_turn = turn_records(12, 2, close=False, chunks=1, noise=noise(300_000))  # the chunk is huge
    text = lines(open_turn)
    cut = torn_frame(text, lambda d: d.count(b"\n") >= 3 and not d.endswith(b"\n"))
    with open(path, "ab") as f:
        f.write(cut)
    stored = b.load("s")
    assert stored.truncate_to == len(committed)  # the torn frame's start
    recovered = stored.records[12:]
    assert recovered and recovered == open_turn[: len(recovered)]
    assert len(recovered) < len(open_turn)
    closers = [rec("step/end", 12 + len(recovered), {"turn": 2, "step": 1})]
    b.commit_repair("s", stored.truncate_to, closers)
    data = path.read_bytes()
    assert data.startswith(committed)
    frames, torn = scan_frames(data)
    assert torn is None and len(frames) == 3  # header, batch, recovered + closers
    again = zstd_backend(tmp_path).load("s")  # a fresh instance: nothing cached
    assert again.records == stored.records + closers and again.truncate_to is None


@needs_zstd
def test_repair_from_a_fresh_instance_rereads_the_torn_frame(tmp_path: Path) -> None:
    b = zstd_backend(tmp_path)
    b.materialize(H, turn_records(0, 1))
    path = b.locate("s")
    assert path is not None
    text = lines(turn_records(12, 2, close=False, chunks=1, noise=noise(300_000)))
    with open(path, "ab") as f:
        f.write(torn_frame(text, lambda d: d.count(b"\n") >= 2))
    stored = b.load("s")
    other = zstd_backend(tmp_path)  # never loaded it: the repair reads the frame again
    other.commit_repair("s", stored.truncate_to, [])
    assert zstd_backend(tmp_path).load("s").records == stored.records
    with pytest.raises(Exception, match="repair is stale"):
        zstd_backend(tmp_path).commit_repair("s", 5, [])


@needs_zstd
@pytest.mark.parametrize("tear", ["magic", "checksum"])
def test_torn_frame_edges(tmp_path: Path, tear: str) -> None:
    b = zstd_backend(tmp_path)
    first = turn_records(0, 1)
    b.materialize(H, first)
    path = b.locate("s")
    assert path is not None
    committed = path.read_bytes()
    second = turn_records(12, 2)
    tail = MAGIC_BYTES[:2] if tear == "magic" else frame(lines(second))[:-1]
    with open(path, "ab") as f:
        f.write(tail)
    stored = b.load("s")
    assert stored.truncate_to == len(committed)
    assert stored.records == first + (second if tear == "checksum" else [])
    b.commit_repair("s", stored.truncate_to, [])
    assert path.read_bytes()[: len(committed)] == committed
    assert zstd_backend(tmp_path).load("s").records == stored.records
    if tear == "magic":
        assert path.read_bytes() == committed  # nothing to write back


@needs_zstd
def test_complete_frames_must_be_whole_and_valid(tmp_path: Path) -> None:
    header = frame(header_line(H))
    good = frame(lines(turn_records(0, 1)))
    cases: dict[str, tuple[bytes, str]] = {
        "torn-record": (header + good + frame(b'{"type":"turn/start"'), "complete frame contains a torn JSONL record"),
        "bad-line": (
            header + frame(b"garbage\n") + frame(lines(turn_records(0, 1, close=False))),
            "complete frame contains a torn JSONL record",
        ),
        "bad-line-then-turn-end-frame": (header + frame(b"garbage\n") + good, "unparsable committed event at line 1"),
        "bad-line-then-turn-end": (
            header + frame(lines(turn_records(0, 1)[:2]) + b"garbage\n" + lines(turn_records(0, 1)[2:])),
            "unparsable committed event at line 3",
        ),
        "checksum": (header + good[:-1] + bytes([good[-1] ^ 0xFF]), f"frame at byte {len(header)} failed validation"),
        "two-line-header": (frame(header_line(H) + b'{"type":"turn/start"}\n'), "first frame is not exactly one header line"),
        "empty-header": (frame(b""), "first frame is not exactly one header line"),
        "no-frame": (MAGIC_BYTES, "empty or header-less Zstandard session log"),
        "bad-magic": (header + b"\x00" * 16, f"invalid frame magic at byte {len(header)}"),
    }
    for name, (content, message) in cases.items():
        write_zstd(tmp_path / name, content)
        with pytest.raises(SessionCorruptionError, match=message) as info:
            zstd_backend(tmp_path / name).load("s")
        assert info.value.session_id == "s", name


@needs_zstd
def test_zstd_listing_reads_only_header_frames(tmp_path: Path) -> None:
    for sid, content in {
        "empty": b"",
        "partial": MAGIC_BYTES,
        "not-header": frame(b'{"type":"turn/start"}\n'),
    }.items():
        write_zstd(tmp_path, content, {**H, "id": sid})
    b = zstd_backend(tmp_path)
    assert b.list_headers() == []
    # A large header spanning reads, and a corrupt event frame listing never decodes.
    big = {**H, "id": "big", "cwd": "/w/" + "x" * 24_000}
    b.materialize(big, turn_records(0, 1))
    path = b.locate("big")
    assert path is not None
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert [h["id"] for h in zstd_backend(tmp_path).list_headers()] == ["big"]
    with pytest.raises(SessionCorruptionError, match="failed validation"):
        zstd_backend(tmp_path).load("big")
    write_zstd(tmp_path, frame(header_line({**H, "id": "two"}) + b"{}\n"), {**H, "id": "two"})
    with pytest.raises(SessionCorruptionError, match="first frame is not exactly one header line"):
        zstd_backend(tmp_path).list_headers()
    (tmp_path / "--w--" / "two" / "session.jsonl.zstd").unlink()
    bad = bytearray(frame(header_line({**H, "id": "bad"})))
    bad[-1] ^= 0xFF
    write_zstd(tmp_path, bytes(bad), {**H, "id": "bad"})
    with pytest.raises(SessionCorruptionError, match="header frame failed validation"):
        zstd_backend(tmp_path).list_headers()


@needs_zstd
def test_a_root_holds_one_encoding(tmp_path: Path) -> None:
    JsonlBackend(tmp_path / "plain").materialize(H, turn_records(0, 1))
    zstd_backend(tmp_path / "packed").materialize(H, turn_records(0, 1))
    for root, backend, configured, found in (
        (tmp_path / "plain", zstd_backend(tmp_path / "plain"), "zstd", "session.jsonl"),
        (tmp_path / "packed", JsonlBackend(tmp_path / "packed"), "none", "session.jsonl.zstd"),
    ):
        path = root / "--w--" / "s" / found
        message = (
            f'session artifact "{path}" uses {found[7:]}, but this backend is configured for compression '
            f'"{configured}"; use a separate root or select the matching compression mode'
        )
        for op in (backend.list_headers, lambda b=backend: b.load("s")):
            with pytest.raises(StorageLayoutError) as info:
                op()
            assert str(info.value) == message
    # The targeted checks also apply after a first (memoised) root scan passed.
    b = zstd_backend(tmp_path / "late")
    assert b.list_headers() == []
    JsonlBackend(tmp_path / "late").materialize(H, turn_records(0, 1))
    with pytest.raises(StorageLayoutError, match='configured for compression "zstd"'):
        b.load("s")
    with pytest.raises(StorageLayoutError, match='configured for compression "zstd"'):
        b.materialize(H, turn_records(0, 1))
    with pytest.raises(StorageLayoutError, match='configured for compression "zstd"'):
        b.list_headers()


@needs_zstd
def test_zstd_first_write_and_rollback_discipline(tmp_path: Path) -> None:
    b = zstd_backend(tmp_path)
    b.materialize(H, turn_records(0, 1))
    with pytest.raises(SessionLogExistsError):
        zstd_backend(tmp_path).materialize(H, turn_records(0, 1))
    path = b.locate("s")
    assert path is not None and not list(path.parent.glob("*.tmp"))
    before = path.read_bytes()

    class FailFsync(FaultyFiles):
        def fsync(self, fd: int) -> None:
            raise OSError(errno.EIO, "injected fsync failure")

    with pytest.raises(StorageIOError):
        zstd_backend(tmp_path, files=FailFsync()).append("s", turn_records(12, 2))
    assert path.read_bytes() == before  # the whole frame rolled back
    b.append("s", turn_records(12, 2))
    assert zstd_backend(tmp_path).load("s").records == turn_records(0, 1) + turn_records(12, 2)


@needs_zstd
def test_zstd_first_write_whose_directory_fsync_failed_is_completed(tmp_path: Path) -> None:
    dry = FaultyFiles(kinds={"link", "fsync_dir"})
    zstd_backend(tmp_path / "dry", files=dry).materialize(H, turn_records(0, 1))
    files = FaultyFiles(kinds={"link", "fsync_dir"}, fail_at=[k for k, _ in dry.ops].index("link") + 2)
    b = zstd_backend(tmp_path / "r", files=files)
    with pytest.raises(StorageIOError, match="injected fsync_dir failure"):
        b.materialize(H, turn_records(0, 1))
    retry = turn_records(0, 1) + turn_records(12, 2)  # the retry carries more than was linked
    b.materialize(H, retry)
    path = b.locate("s")
    assert path is not None and len(scan_frames(path.read_bytes())[0]) == 3  # header, linked, rest
    assert zstd_backend(tmp_path / "r").load("s").records == retry


# -- the fault layer sees every zstd file step ------------------------------------------------


def zstd_scenario(backend: JsonlBackend, acked: list[dict[str, Any]]) -> None:
    """Lock, first write, two appends, a repair (truncate + frame), release."""
    lease = backend.acquire_writer(H)
    try:
        for batch in (turn_records(0, 1), turn_records(12, 2, close=False)):
            if not acked:
                backend.materialize(H, batch)
            else:
                backend.append("s", batch)
            acked.extend(batch)
        # Another writer died mid-frame (outside the fault layer, as a crash would).
        with open(backend.locate("s") or Path(), "ab") as f:
            f.write(frame(lines([rec("feedback/record", len(acked), {"lost": True})]))[:-2])
        stored = backend.load("s")
        assert stored.truncate_to is not None and len(stored.records) == len(acked) + 1
        n = len(stored.records)
        closers = [rec("tool/result", n, tool_result("c2", 2), surfaceOp="append"), rec("step/end", n + 1, {"turn": 2, "step": 1})]
        backend.commit_repair("s", stored.truncate_to, closers)
        acked.extend(stored.records[len(acked) :] + closers)
    finally:
        lease.release()


@needs_zstd
def test_failing_each_zstd_file_operation_is_typed_and_loses_nothing(tmp_path: Path) -> None:
    dry = FaultyFiles()
    zstd_scenario(zstd_backend(tmp_path / "dry", files=dry), [])
    assert {kind for kind, _ in dry.ops} >= {"open", "write", "fsync", "ftruncate", "link", "mkdir", "unlink", "lock", "fsync_dir"}
    assert any(p.endswith("session.jsonl.zstd") for kind, p in dry.ops if kind == "write")
    for k in range(1, dry.count + 1):
        root = tmp_path / f"k{k}"
        files = FaultyFiles(fail_at=k, error=errno.ENOSPC)
        acked: list[dict[str, Any]] = []
        try:
            zstd_scenario(zstd_backend(root, files=files), acked)
        except HarnessError as exc:
            assert isinstance(exc, StorageIOError), (k, files.injected, exc)
        assert files.injected and files.injected[0][0] == k
        if acked:
            stored = zstd_backend(root).load("s")
            assert stored.records[: len(acked)] == acked, (k, files.injected)
            if stored.truncate_to is not None:  # only the external torn frame, unrepaired
                assert files.injected[0][1] in ("open", "ftruncate", "fsync"), (k, files.injected)
                assert stored.records[len(acked) :] == [rec("feedback/record", len(acked), {"lost": True})]


@needs_zstd
def test_power_loss_at_every_zstd_point_keeps_what_was_acknowledged(tmp_path: Path) -> None:
    dry = PowerLossFiles()
    zstd_scenario(zstd_backend(tmp_path / "dry", files=dry), [])
    torn = 0
    for k in range(1, dry.count + 1):
        for seed in range(4):
            root = tmp_path / f"k{k}-{seed}"
            files = PowerLossFiles(crash_at=k)
            acked: list[dict[str, Any]] = []
            with pytest.raises(SimulatedCrash):
                zstd_scenario(zstd_backend(root, files=files), acked)
            files.apply(random.Random(seed))
            try:
                stored = zstd_backend(root).load("s")
            except HarnessError:
                assert not acked, (k, seed)  # only a never-acknowledged first write may vanish
                continue
            assert stored.records[: len(acked)] == acked, (k, seed, files.crash_op)
            torn += stored.truncate_to is not None
    assert torn  # some power cuts tore a frame: the repairable case


# -- item 4: format errors name the raw log --------------------------------------------------------


@pytest.mark.parametrize("compression", ["none", pytest.param("zstd", marks=needs_zstd)])
@pytest.mark.parametrize("version", [3, -1])
def test_format_errors_end_with_the_raw_log_path(tmp_path: Path, compression: str, version: int) -> None:
    line = orjson.dumps({"type": "session", **H, "version": version, "delegationDepth": 0}) + b"\n"
    b = JsonlBackend(tmp_path, compression=compression)
    d = b.session_dir(H)
    d.mkdir(parents=True)
    path = d / b.transcript
    path.write_bytes(frame(line) if compression == "zstd" else line)
    with pytest.raises(SessionFormatUnsupportedError) as info:
        b.load("s")
    assert str(info.value).startswith(f'session "s" uses log format v{version}')
    assert str(info.value).endswith(f" (raw log: {path})")
    assert b.list_headers() == []  # a listing skips it


# -- item 6: a header value -0 ---------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["none", pytest.param("zstd", marks=needs_zstd)])
@pytest.mark.parametrize(
    ("field", "literal"), [("createdAt", b"-0"), ("delegationDepth", b"-0"), ("createdAt", b"-0.0"), ("delegationDepth", b"-0e0")]
)
def test_negative_zero_header_values_are_refused(tmp_path: Path, compression: str, field: str, literal: bytes) -> None:
    values = {"createdAt": b"1", "delegationDepth": b"0", field: literal}
    line = (
        b'{"type":"session","version":0,"id":"s","createdAt":' + values["createdAt"]
        + b',"cwd":"/w-0","delegationDepth":' + values["delegationDepth"] + b"}\n"
    )
    assert orjson.loads(line)[field] == 0  # what a plain decode would accept
    root = tmp_path / "r"
    b = JsonlBackend(root, compression=compression)
    d = b.session_dir({**H, "cwd": "/w-0"})
    d.mkdir(parents=True)
    (d / b.transcript).write_bytes(frame(line) if compression == "zstd" else line)
    with pytest.raises(SessionCorruptionError, match="corrupt session log: first line is not a session header"):
        b.load("s")
    assert b.list_headers() == []  # skipped, as the reference's listing does
    # The same header with a real zero (and "-0" inside a string) is fine.
    ok = line.replace(b":" + literal, b":0")
    (d / b.transcript).write_bytes(frame(ok) if compression == "zstd" else ok)
    assert JsonlBackend(root, compression=compression).load("s").header[field] == 0


async def test_negative_zero_seed_length_fails_restore(tmp_path: Path) -> None:
    line = b'{"type":"session","version":0,"id":"s","createdAt":1,"cwd":"/w","seedLength":-0,"delegationDepth":0}\n'
    b = JsonlBackend(tmp_path)
    d = b.session_dir(H)
    d.mkdir(parents=True)
    (d / "session.jsonl").write_bytes(line)
    assert b.list_headers()[0]["seedLength"] == 0  # listed (the reference's parser accepts it) ...
    async with open_store() as store, open_persistence(store, b) as p:
        with pytest.raises(SessionCorruptionError, match="seedLength"):  # ... refused on restore
            await p.load("s")


# -- item 7: differential runs ---------------------------------------------------------------------

# Every backend the differential tests run the same operations through. SQLite is used
# only through its public backend API (it is being reworked): extend this table, and
# DIFF_TORN for backends whose files can be torn by hand, as backends are added.
DIFF_BACKENDS: dict[str, Callable[[Path], Backend]] = {
    "jsonl": lambda root: JsonlBackend(root / "jsonl"),
    "jsonl-zstd": lambda root: JsonlBackend(root / "jsonl-zstd", compression="zstd"),
    "sqlite": lambda root: SqliteBackend(root / "sessions.sqlite"),
}
DIFF_TORN = ("jsonl", "jsonl-zstd")


def _kinds(kinds: tuple[str, ...]) -> list[str]:
    return [k for k in kinds if HAVE_ZSTD or k != "jsonl-zstd"]


def close(backend: Backend) -> None:
    if isinstance(backend, SqliteBackend):
        backend.close()


@pytest.fixture
def open_backends(tmp_path: Path) -> Iterator[Callable[[str], Backend]]:
    opened: list[Backend] = []

    def make(kind: str) -> Backend:
        backend = DIFF_BACKENDS[kind](tmp_path)
        opened.append(backend)
        return backend

    yield make
    for backend in opened:
        close(backend)


def test_backend_operations_agree(open_backends: Callable[[str], Backend]) -> None:
    results: dict[str, Any] = {}
    for kind in _kinds(tuple(DIFF_BACKENDS)):
        b = open_backends(kind)
        lease = b.acquire_writer(H)
        try:
            b.materialize(H, turn_records(0, 1), lease=lease)
            revisions = [b.revision("s")]
            b.append("s", turn_records(12, 2, chunks=0), lease=lease)
            revisions.append(b.revision("s"))
            b.append("s", turn_records(20, 3, close=False), lease=lease)
            revisions.append(b.revision("s"))
            b.materialize({**H, "id": "t", "cwd": "/other"}, turn_records(0, 1), lease=None)
        finally:
            lease.release()
        assert len(set(revisions)) == 3, kind
        stored = b.load("s")
        headers = sorted(b.list_headers(), key=lambda h: h["id"])
        results[kind] = (stored.header, stored.records, stored.truncate_to, headers)
    first = next(iter(results.values()))
    for kind, result in results.items():
        assert result == first, kind


def _tear(kind: str, backend: JsonlBackend, text: bytes) -> bytes:
    """Append a torn write of ``text`` to ``s``: zstd a torn frame, plain the same
    plaintext prefix that frame decodes to. Returns that prefix."""
    path = backend.locate("s")
    assert path is not None
    cut = torn_frame(text, lambda d: d.count(b"\n") >= 3 and not d.endswith(b"\n"))
    prefix: bytes = zstandard.ZstdDecompressor().decompressobj().decompress(cut)
    with open(path, "ab") as f:
        f.write(cut if kind == "jsonl-zstd" else prefix)
    return prefix


@needs_zstd
async def test_torn_tail_load_and_resume_agree(open_backends: Callable[[str], Backend]) -> None:
    """Create, append batches, tear the last one, load, list, prepare and publish
    through ``open_persistence``, append, close: the same logical outcome with either
    encoding (records, surface, repair) and the same decoded JSONL text on disk."""
    outcome: dict[str, Any] = {}
    for kind in _kinds(DIFF_TORN):
        backend = open_backends(kind)
        assert isinstance(backend, JsonlBackend)
        clock = functools.partial(next, itertools.count(1_700_000_000_000))
        async with open_store(clock=clock) as store, open_persistence(store, backend, write_delay=60) as p:
            s = await store.create("s", cwd="/w")
            for turn in (1, 2):
                await s.append_batch(
                    [
                        EventDraft("turn/start", {"turn": turn}),
                        EventDraft("user/message", user(f"u{turn}"), "append"),
                        EventDraft("turn/end", {"turn": turn, "reason": {"kind": "completed"}}),
                    ]
                )
                await s.flush()
            await store.detach(s)
            await p.wait_retired("s")
        prefix = _tear(kind, backend, lines(turn_records(6, 3, close=False, chunks=1, noise=noise(300_000))))
        stored = backend.load("s")
        async with open_store(clock=clock) as store, open_persistence(store, backend) as p:
            listed = await p.list()
            cold = await p.read_session("s")
            prep = await p.prepare("s")
            repaired = prep.repaired
            handle = await p.publish(prep)
            await handle.append("feedback/record", {"after": "resume"})
            await handle.flush()
            live = [event_to_record(e) for e in handle.events]
            surface = tuple(handle.surface())
            messages = list(await handle.derive_messages())
        path = backend.locate("s")
        assert path is not None
        data = path.read_bytes()
        text = plaintext(data) if kind == "jsonl-zstd" else data
        outcome[kind] = {
            "records": stored.records,
            "torn": stored.truncate_to is not None,
            "listed": listed,
            "cold": _strip_time([event_to_record(e) for e in cold.events]),
            "repaired": repaired,
            "live": _strip_time(live),
            "surface": surface,
            "messages": messages,
            "text": [_strip_time([orjson.loads(x)])[0] for x in text.splitlines()],
            "prefix": prefix,
        }
        reloaded = type(backend)(backend.root, compression=backend.compression).load("s")
        assert reloaded.records == live and reloaded.truncate_to is None, kind
    plain, packed = outcome["jsonl"], outcome["jsonl-zstd"]
    assert plain == packed
    assert plain["torn"] and plain["repaired"] >= 2  # (tool/result,) step/end, turn/end
    assert len(plain["records"]) > 6  # complete records of the torn write were kept
    assert [r["type"] for r in plain["live"][-2:]] == ["session/end-seed", "feedback/record"]


async def test_persistence_round_trip_agrees_across_backends(open_backends: Callable[[str], Backend]) -> None:
    """The same live-session operations through ``open_persistence`` on every backend:
    the same listing, stored records, restored events and surface."""
    outcome: dict[str, Any] = {}
    for kind in _kinds(tuple(DIFF_BACKENDS)):
        backend = open_backends(kind)
        async with open_store() as store, open_persistence(store, backend, write_delay=60) as p:
            s = await store.create("s", cwd="/w")
            await s.append_batch([EventDraft(r["type"], r["data"], r.get("surfaceOp")) for r in turn_records(0, 1)])
            await s.flush()
            await s.append_batch([EventDraft(r["type"], r["data"], r.get("surfaceOp")) for r in turn_records(12, 2, close=False)])
            await s.flush()
            await store.detach(s)
            await p.wait_retired("s")
            listed = await p.list()
            prep = await p.prepare("s")
            repaired = prep.repaired
            handle = await p.publish(prep)
            await handle.flush()
            events = [event_to_record(e) for e in handle.events]
            surface = tuple(handle.surface())
        stored = backend.load("s").records
        outcome[kind] = ([{k: v for k, v in h.items() if k != "createdAt"} for h in listed], repaired, _strip_time(events), surface, _strip_time(stored))
        assert _strip_time(stored) == _strip_time(events), kind
    first = next(iter(outcome.values()))
    for kind, result in outcome.items():
        assert result == first, kind
    assert first[1] == 3  # tool/result, step/end, turn/end closed the open turn


def _strip_time(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Wall-clock times differ between runs; everything else must not (compared as
    JSON: a live record may hold tuples where a stored one holds lists)."""
    return [{k: v for k, v in orjson.loads(orjson.dumps(r)).items() if k != "time"} for r in records]

