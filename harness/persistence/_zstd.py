"""Zstandard framing for the JSONL backend's ``compression="zstd"`` (reference §1.3).

A ``session.jsonl.zstd`` file is a concatenation of independent, checksummed Zstandard
frames: frame 1 holds only the header line; every durable batch (the first one too)
is exactly one more frame. Appending is appending a frame; a crash can only tear the
last one, which :func:`scan_frames` finds without decompressing anything.

The codec is the optional ``zstandard`` package (``pip install "trio-harness[zstd]"``),
imported on first use: without it, asking for ``compression="zstd"`` raises
:class:`ZstdUnavailableError`. Everything here is blocking and pure (no file I/O):
the backend reads and writes the bytes itself, through its fault-injectable file layer.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, Final

from harness.errors import SessionCorruptionError, ZstdUnavailableError

#: The Zstandard frame magic number (little-endian on disk: ``28 B5 2F FD``).
MAGIC: Final = 0xFD2FB528
#: What the reference writes: Node's ``zstdCompress`` default level.
LEVEL: Final = 3

_HEADER_CHUNK: Final = 8192


def scan_frames(data: bytes, max_frames: int | None = None) -> tuple[list[tuple[int, int]], int | None]:
    """``(frames, torn_start)``: the ``(start, end)`` byte ranges of the structurally
    complete frames of ``data``, in order, and where an incomplete final frame starts
    (``None`` if the data ends at a frame boundary). Nothing is decompressed: frame
    headers and block headers are walked as the format lays them out.

    Raises :class:`SessionCorruptionError` for an invalid magic number at a frame
    boundary, a reserved frame-header bit or a reserved block type (the reference's
    ``scanZstdFrames``: skippable frames are refused as bad magic). Stops after
    ``max_frames`` complete frames (then ``torn_start`` is ``None``).
    """
    frames: list[tuple[int, int]] = []
    n = len(data)
    off = 0
    while off < n:
        start = off
        if n - off < 4:
            return frames, start
        if int.from_bytes(data[off : off + 4], "little") != MAGIC:
            raise SessionCorruptionError(f"corrupt Zstandard session log: invalid frame magic at byte {off}")
        off += 4
        if off == n:
            return frames, start
        descriptor = data[off]
        off += 1
        if descriptor & 0x18:
            raise SessionCorruptionError(
                f"corrupt Zstandard session log: reserved frame-header bit at byte {off - 1}"
            )
        content_size_flag = descriptor >> 6
        single_segment = descriptor & 0x20
        dictionary_flag = descriptor & 0x03
        dictionary_bytes = 4 if dictionary_flag == 3 else dictionary_flag
        if content_size_flag == 0:
            content_size_bytes = 1 if single_segment else 0
        else:
            content_size_bytes = 1 << content_size_flag
        rest = (0 if single_segment else 1) + dictionary_bytes + content_size_bytes
        if n - off < rest:
            return frames, start
        off += rest
        while True:
            if n - off < 3:
                return frames, start
            block = data[off] | data[off + 1] << 8 | data[off + 2] << 16
            off += 3
            block_type = (block >> 1) & 0x03
            if block_type == 0x03:
                raise SessionCorruptionError(
                    f"corrupt Zstandard session log: reserved block type at byte {off - 3}"
                )
            payload = 1 if block_type == 0x01 else block >> 3  # an RLE block stores one byte
            if n - off < payload:
                return frames, start
            off += payload
            if block & 1:  # the frame's last block
                break
        if descriptor & 0x04:  # content checksum
            if n - off < 4:
                return frames, start
            off += 4
        frames.append((start, off))
        if max_frames is not None and len(frames) >= max_frames:
            return frames, None
    return frames, None


def check_header_frame(plaintext: bytes) -> None:
    """Frame 1 must be exactly one ``\\n``-terminated line (the header)."""
    if not plaintext or plaintext.find(b"\n") != len(plaintext) - 1:
        raise SessionCorruptionError("corrupt Zstandard session log: first frame is not exactly one header line")


class ZstdCodec:
    """Compress and decompress single frames with ``zstandard`` (thread-safe: every
    worker thread gets its own compression and decompression contexts)."""

    def __init__(self, module: Any) -> None:
        self._zstd = module
        self._local = threading.local()

    def _compressor(self) -> Any:
        c = getattr(self._local, "compressor", None)
        if c is None:
            c = self._zstd.ZstdCompressor(level=LEVEL, write_checksum=True, write_content_size=True)
            self._local.compressor = c
        return c

    def _decompressor(self) -> Any:
        d = getattr(self._local, "decompressor", None)
        if d is None:
            d = self._zstd.ZstdDecompressor()
            self._local.decompressor = d
        return d

    def frame(self, plaintext: bytes) -> bytes:
        """One independent, checksummed frame holding ``plaintext``."""
        out: bytes = self._compressor().compress(plaintext)
        return out

    def decode_frame(self, data: bytes, start: int, end: int) -> bytes:
        """The plaintext of the complete frame ``data[start:end]``, checksum verified;
        :class:`SessionCorruptionError` if it does not decode to exactly its end."""
        try:
            obj = self._decompressor().decompressobj()
            out: bytes = obj.decompress(data[start:end])
            ok = bool(obj.eof) and not obj.unused_data
        except Exception as exc:  # zstandard.ZstdError: bad data, bad checksum
            raise SessionCorruptionError(
                f"corrupt Zstandard session log: frame at byte {start} failed validation"
            ) from exc
        if not ok:
            raise SessionCorruptionError(f"corrupt Zstandard session log: frame at byte {start} failed validation")
        return out

    def decode_frames(self, data: bytes, frames: list[tuple[int, int]]) -> list[bytes]:
        return [self.decode_frame(data, start, end) for start, end in frames]

    def decode_prefix(self, data: bytes) -> bytes:
        """Best effort: whatever plaintext the incomplete frame ``data`` yields
        (``b""`` if it yields none or does not decode). Its checksum, if any, is
        never reached, so nothing here is verified: the caller keeps only complete
        lines that continue the log."""
        try:
            out: bytes = self._decompressor().decompressobj().decompress(data)
        except Exception:
            return b""
        return out


_codec: ZstdCodec | None = None
_codec_lock = threading.Lock()


def load_codec() -> ZstdCodec:
    """The process-wide codec; imports ``zstandard`` on first use.

    Raises :class:`ZstdUnavailableError` if it is not installed."""
    global _codec
    with _codec_lock:
        if _codec is None:
            try:
                module = importlib.import_module("zstandard")
            except ImportError as exc:
                raise ZstdUnavailableError(
                    'JSONL compression "zstd" needs the optional dependency "zstandard", which is not '
                    'installed: pip install "trio-harness[zstd]" (or use compression="none")'
                ) from exc
            _codec = ZstdCodec(module)
        return _codec


def read_header_frame(codec: ZstdCodec, f: Any) -> bytes | None:
    """The header line (without its newline) of an open ``.jsonl.zstd`` file, reading
    only as far as its first frame. ``None`` if the file ends before that frame is
    complete (empty or half-written: a listing skips it); raises
    :class:`SessionCorruptionError` for bad framing, a header frame that does not
    decode, or one that is not exactly one line."""
    buf = b""
    while True:
        chunk: bytes = f.read(_HEADER_CHUNK)
        if not chunk:
            return None
        buf += chunk
        frames, _ = scan_frames(buf, 1)
        if frames:
            start, end = frames[0]
            try:
                plaintext = codec.decode_frame(buf, start, end)
            except SessionCorruptionError as exc:
                raise SessionCorruptionError(
                    "corrupt Zstandard session log: header frame failed validation"
                ) from exc.__cause__
            check_header_frame(plaintext)
            return plaintext[:-1]
