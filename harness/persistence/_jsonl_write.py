"""The JSONL backend's writes: the atomic first write, appends with rollback by
truncation, group rounds, the torn-tail repair and delete."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeGuard

import orjson

from harness.errors import (
    PersistedSessionNotFoundError,
    PersistenceError,
    RecordEncodingError,
    SessionIdInUseError,
    SessionLogExistsError,
    StorageIOError,
)
from harness.persistence._backend import (
    GroupWrite,
    WriterLease,
    header_line,
    unwritten_after_failure,
)
from harness.persistence._jsonl_lock import _FlockLease, _JsonlLocking
from harness.persistence._jsonl_logs import BUDGET, OpenLog
from harness.persistence._jsonl_read import _JsonlReading, _revision
from harness.session import pack_chunk_runs
from harness.session._chunks import MIN_ROW_MEMBERS


class _JsonlWriting(_JsonlReading, _JsonlLocking):
    """The writing part of :class:`~harness.persistence._jsonl.JsonlBackend`."""

    # -- writing ---------------------------------------------------------------------------

    def _encode(self, session_id: str, records: list[dict[str, Any]]) -> bytes:
        """The batch as JSONL bytes, or :class:`RecordEncodingError` naming the first
        record that cannot be stored (never a raw ``TypeError`` from orjson)."""
        dumps = orjson.dumps
        try:
            if len(records) == 1:  # a durable single append: no join, no scan
                return dumps(records[0], option=orjson.OPT_APPEND_NEWLINE)
            # Fewer records than a packed row's members: nothing can pack (a durable
            # single append skips the scan).
            rows = pack_chunk_runs(records) if self.pack_chunks and len(records) >= MIN_ROW_MEMBERS else records
            # Not OPT_APPEND_NEWLINE, although it spares a copy per line: orjson's own
            # output buffers, kept alive together until the join, are malloc blocks
            # (not pymalloc), and a 100k-record batch then wrote 2x slower (W5-write).
            return b"".join(dumps(r) + b"\n" for r in rows)
        except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
            raise _encoding_error(session_id, records, exc) from exc

    def _batch_payload(self, session_id: str, records: list[dict[str, Any]], prefix: bytes = b"") -> bytes:
        """One batch as it is appended: its lines (after ``prefix``, lines already
        encoded), or with zstd one frame holding them. ``b""`` for nothing."""
        text = prefix + self._encode(session_id, records) if records else prefix
        if self._codec is None or not text:
            return text
        return self._codec.frame(text)

    def _first_payload(self, header: dict[str, Any], records: list[dict[str, Any]]) -> bytes:
        """The first write: the header line and the first batch (zstd: the header alone
        in frame 1, the batch in frame 2)."""
        line = header_line(header)
        if self._codec is None:
            return line + self._encode(header["id"], records)
        return self._codec.frame(line) + self._batch_payload(header["id"], records)

    def materialize(
        self, header: dict[str, Any], records: list[dict[str, Any]], *, lease: WriterLease | None = None
    ) -> None:
        """First write: header + first batch become visible atomically; never overwrites.

        The id must be new under the whole root (any project directory): checked under
        the root lock, so two processes cannot both create it. A retry after a failed
        directory fsync recognises the log this backend linked itself and completes it.
        ``lease`` is accepted for protocol symmetry (the ``flock`` is the exclusion).
        """
        sid = header["id"]
        sdir = self.session_dir(header)
        final = sdir / self.transcript
        payload = self._first_payload(header, records)
        self._check_root()
        try:
            self._makedirs(sdir)
            with self._root_lock(sid):
                if self._finish_unsynced_link(sid, header, final, records):
                    return
                self._refuse_existing(sid, final)
                self._link_new(sid, sdir, final, payload, len(records))
        except OSError as exc:
            raise StorageIOError(f'writing session "{sid}" to "{final}" failed: {exc}', session_id=sid) from exc
        self._paths[sid] = final

    def _refuse_existing(self, sid: str, final: Path) -> None:
        for path in self._transcripts(sid):
            if path == final:
                raise SessionLogExistsError(
                    f'refusing to materialize "{sid}": a log already exists on disk (load/resume it instead)',
                    session_id=sid,
                )
            raise SessionIdInUseError(
                f'refusing to materialize "{sid}" at "{final}": a session with this id already exists '
                f'at "{path}" (ids are unique under a store root; load/resume it or choose another id)',
                session_id=sid,
                path=str(path),
            )

    def _link_new(self, sid: str, sdir: Path, final: Path, payload: bytes, n_records: int) -> None:
        tmp = sdir / f"{final.name}.{secrets.token_hex(6)}.tmp"
        fd = self.files.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                self.files.write(fd, payload)
                self.files.fsync(fd)
            finally:
                self.files.close(fd)
            try:
                self.files.link(str(tmp), str(final))
            except FileExistsError:
                raise SessionLogExistsError(
                    f'refusing to materialize "{sid}": a log already exists on disk (load/resume it instead)',
                    session_id=sid,
                ) from None
            # From here the log is ours even if the directory fsync fails: remember it,
            # so that the retry finishes the job instead of refusing "our" file.
            self._unsynced_links[sid] = (final, os.stat(final).st_ino, n_records)
            self.files.fsync_dir(str(sdir))
            del self._unsynced_links[sid]
        finally:
            with contextlib.suppress(OSError):
                self.files.unlink(str(tmp))

    def _finish_unsynced_link(
        self, sid: str, header: dict[str, Any], final: Path, records: list[dict[str, Any]]
    ) -> bool:
        """Complete a first write whose link landed but whose directory fsync failed:
        if ``final`` is still the inode we linked and holds exactly the header and the
        first ``n`` records of this (retried) batch, fsync the directory again and
        append the rest. False if there is no such write to complete."""
        entry = self._unsynced_links.get(sid)
        if entry is None:
            return False
        path, ino, n = entry
        try:
            same = path == final and final.stat().st_ino == ino and len(records) >= n
        except FileNotFoundError:
            same = False
        expected = self._first_payload(header, records[:n]) if same else b""
        if not same or final.read_bytes() != expected:
            del self._unsynced_links[sid]  # not ours any more: the normal refusal applies
            return False
        self.files.fsync_dir(str(final.parent))
        del self._unsynced_links[sid]
        self._paths[sid] = final
        if len(records) > n:
            self._append_bytes(sid, final, self._batch_payload(sid, records[n:]))
        return True

    def append(self, session_id: str, records: list[dict[str, Any]], *, lease: WriterLease | None = None) -> None:
        """Append one batch and fsync; on failure truncate back and raise.

        If a rollback itself failed earlier, the torn bytes it left are truncated (and
        fsynced) first; while that fails, appends fail closed rather than land behind
        garbage that a later load would cut off as a torn tail. With this backend's
        ``lease`` the log's descriptor may stay open for the next append (decision 0019).
        """
        if not records:
            return
        self._append_bytes(
            session_id, self._append_path(session_id), self._batch_payload(session_id, records), lease
        )

    def _append_path(self, session_id: str) -> Path:
        """Where to append: the log this instance last wrote or found, taken on trust
        (no ``stat``: :meth:`_open_log` finds out if it is gone and locates it again),
        else located; :class:`PersistedSessionNotFoundError` if there is none."""
        path = self._paths.get(session_id) or self.locate(session_id)
        if path is None:
            raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
        return path

    def _open_log(self, session_id: str, path: Path) -> tuple[Path, int]:
        """Open ``path`` to append: the path opened (another one if the remembered log
        is gone and the session is found elsewhere) and its descriptor. A log that is
        gone and found nowhere is :class:`PersistedSessionNotFoundError`, as
        :meth:`locate` answers (the ``stat`` it made before every append told the same
        thing, one syscall earlier and without closing the race this closes)."""
        flags = os.O_WRONLY | os.O_APPEND
        try:
            try:
                return path, self.files.open(str(path), flags)
            except FileNotFoundError:
                if self._paths.get(session_id) == path:
                    del self._paths[session_id]
                found = self.locate(session_id)
                if found is None:
                    raise PersistedSessionNotFoundError(
                        f'session "{session_id}" not found', session_id=session_id
                    ) from None
                return found, self.files.open(str(found), flags)
        except OSError as exc:
            raise StorageIOError(f'opening session "{session_id}" failed: {exc}', session_id=session_id) from exc

    def _append_bytes(
        self, session_id: str, path: Path, payload: bytes, lease: WriterLease | None = None
    ) -> None:
        path, fd, size, _, kept = self._open_and_write(session_id, path, payload, lease)
        try:
            try:
                self.files.fsync(fd)
            except OSError as exc:
                raise self._roll_back(session_id, path, fd, size, exc) from exc
        finally:
            self._done_with(fd, kept, lease)

    def _keeps_logs(self, lease: WriterLease | None) -> TypeGuard[_FlockLease]:
        """Whether ``lease`` may keep this backend's log descriptors: a ``flock`` lease
        taken through the same files layer (one of another layer keeps nothing)."""
        return type(lease) is _FlockLease and lease.files is self.files

    def _kept_log(self, lease: WriterLease | None, path: Path) -> tuple[OpenLog, os.stat_result] | None:
        """The descriptor ``lease`` kept for ``path``, if a ``stat`` of ``path`` still
        names the inode it opened (what opening ``path`` would give: a log deleted,
        replaced or moved away since is not written behind), with that ``stat``; else
        ``None``, any kept descriptor closed (decision 0019)."""
        if not self._keeps_logs(lease):
            return None
        log = lease.take_log()
        if log is None:
            return None
        spath = str(path)
        if log.path == spath:
            try:
                st = os.stat(spath)
            except OSError:
                pass  # gone (or unreadable): opened by name below, which tells
            else:
                if st.st_ino == log.ino and st.st_dev == log.dev:
                    return log, st
        log.close(self.files)
        return None

    def _done_with(self, fd: int, kept: OpenLog | None, lease: WriterLease | None) -> None:
        """After a batch (whatever its outcome): keep its descriptor for the lease's
        next append, or close it."""
        if kept is not None:
            if type(lease) is _FlockLease and lease.keep_log(kept):
                return
            kept.close(self.files)
            return
        with contextlib.suppress(OSError):
            self.files.close(fd)

    def _open_and_write(
        self, session_id: str, path: Path, payload: bytes, lease: WriterLease | None = None
    ) -> tuple[Path, int, int, int, OpenLog | None]:
        """Open the log (:meth:`_open_log`; or use the descriptor ``lease`` kept for it,
        :meth:`_kept_log`), settle a torn tail, write ``payload``: the path opened, the
        descriptor, the size to roll back to, the file's ``st_dev`` and the
        :class:`OpenLog` to keep (``None``: close the descriptor). A failed write is
        rolled back (and raised); the caller fsyncs, rolls back a failed fsync
        (:meth:`_roll_back`) and ends with :meth:`_done_with`."""
        found = self._kept_log(lease, path) if lease is not None else None
        kept: OpenLog | None
        if found is not None:
            kept, st = found
            fd = kept.fd
        else:
            path, fd = self._open_log(session_id, path)
            kept = None
        try:
            if found is None:
                st = os.fstat(fd)
                if self._keeps_logs(lease) and BUDGET.take():
                    kept = OpenLog(str(path), fd, st.st_dev, st.st_ino)
            size = self._settle_torn_tail(session_id, path, fd, st.st_size)
            try:
                self.files.write(fd, payload)
            except OSError as exc:
                raise self._roll_back(session_id, path, fd, size, exc) from exc
        except BaseException:
            self._done_with(fd, kept, lease)
            raise
        return path, fd, size, st.st_dev, kept

    def _roll_back(self, session_id: str, path: Path, fd: int, size: int, exc: OSError) -> StorageIOError:
        """After a failed write or fsync: truncate back to ``size`` and fsync; the error
        to raise. If that fails too, no append may land behind the bytes left until a
        truncate to ``size`` succeeds (see :meth:`_settle_torn_tail`)."""
        try:
            self.files.ftruncate(fd, size)
            self.files.fsync(fd)
        except OSError as rollback:
            self._torn[session_id] = size
            return StorageIOError(
                f'failed to roll back append to "{path}": {exc}; rollback: {rollback} '
                f"(later appends truncate back to byte {size} first)",
                session_id=session_id,
            )
        return StorageIOError(f'appending to session "{session_id}" failed (rolled back): {exc}', session_id=session_id)

    def write_group(self, writes: Sequence[GroupWrite]) -> list[BaseException | None]:
        """Several sessions' batches as one round (group commit, :func:`write_each`'s
        contract): every append is written, then all of them are made durable together
        (:meth:`OsFiles.sync_round`: one ``syncfs`` per filesystem for many files, else
        fsyncs issued together; :attr:`group_sync`); a batch whose write or fsync failed is rolled back
        by truncation exactly as :meth:`append` rolls back, and fails alone (each fsync
        covers one file). A first write is :meth:`materialize`, unchanged (temp file,
        fsync, link, directory fsync), in its place in the round. Batches of one
        session land in the order given: a session seen again starts a new round, and a
        batch behind a failed batch of its session is not written (it would leave a gap)."""
        results: list[BaseException | None] = [None] * len(writes)
        if len(writes) == 1:  # one batch (a durable single append): no session splitting
            self._write_round(writes, (0,), results)
            return results
        failed: dict[str, BaseException] = {}
        start = 0
        while start < len(writes):
            seen: set[str] = set()
            end = start
            while end < len(writes) and writes[end].session_id not in seen:
                seen.add(writes[end].session_id)
                end += 1
            todo: list[int] = []
            for i in range(start, end):
                earlier = failed.get(writes[i].session_id)
                if earlier is None:
                    todo.append(i)
                else:  # behind a failed batch of its session: writing it would leave a gap
                    results[i] = unwritten_after_failure(self, writes[i].session_id, earlier)
            self._write_round(writes, todo, results)
            for i in range(start, end):
                err = results[i]
                if err is not None:
                    failed.setdefault(writes[i].session_id, err)
            start = end
        return results

    def _write_round(self, writes: Sequence[GroupWrite], indexes: Sequence[int], results: list[BaseException | None]) -> None:
        # index, (path, fd, size before, st_dev, descriptor kept)
        written: list[tuple[int, tuple[Path, int, int, int, OpenLog | None]]] = []
        try:
            for i in indexes:
                w = writes[i]
                try:
                    if not w.materialized:
                        self.materialize(w.header, w.records, lease=w.lease)
                    elif w.records:
                        sid = w.session_id
                        path = self._append_path(sid)
                        payload = self._batch_payload(sid, w.records)
                        written.append((i, self._open_and_write(sid, path, payload, w.lease)))
                except Exception as exc:
                    results[i] = exc
            fds = [one[1] for _, one in written]
            # Each fd was opened (a kept one: validated) before its own write: fds[0]
            # before all of the round's writes, as OsFiles.syncfs needs to hear of
            # their writeback errors (a kept descriptor hears of those since its last
            # sync, a superset).
            if self.group_sync == "auto":
                synced = self.files.sync_round(fds, [one[3] for _, one in written])
            else:
                synced = self.files.fsync_each(fds)
            for (i, (path, fd, size, _, _)), err in zip(written, synced, strict=True):
                if err is not None:
                    rolled = self._roll_back(writes[i].session_id, path, fd, size, err)
                    rolled.__cause__ = err
                    results[i] = rolled
        finally:
            for i, (_, fd, _, _, kept) in written:
                self._done_with(fd, kept, writes[i].lease)

    def _settle_torn_tail(self, session_id: str, path: Path, fd: int, size: int) -> int:
        """The size to append at: the file's ``size``, after truncating the bytes a
        failed rollback left behind (if any). Raises (fail closed) if that truncate
        fails."""
        good = self._torn.get(session_id)
        if good is None:
            return size
        try:
            if size > good:
                self.files.ftruncate(fd, good)
            self.files.fsync(fd)
        except OSError as exc:
            raise StorageIOError(
                f'session "{session_id}": {size - good} byte(s) of a failed append after byte {good} of '
                f'"{path}" could not be truncated ({exc}); refusing to append behind them',
                session_id=session_id,
            ) from exc
        del self._torn[session_id]
        return min(size, good)

    def commit_repair(
        self,
        session_id: str,
        truncate_to: int | None,
        records: list[dict[str, Any]],
        *,
        lease: WriterLease | None = None,
    ) -> None:
        """Truncate a torn tail (fsync), then append the closers as one batch.

        With zstd, ``truncate_to`` is where a torn final frame starts: the complete
        records the last :meth:`load` recovered from it are written back ahead of the
        closers, in one new frame (reference §1.4). Two durable steps, not atomic: a
        crash between them just re-repairs next time.
        """
        path = self.locate(session_id)
        if path is None:
            raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
        recovered = b""
        if self._codec is not None and truncate_to is not None:
            recovered = self._recovered_lines(session_id, path, truncate_to)
        payload = self._batch_payload(session_id, records, prefix=recovered)
        if truncate_to is not None:
            try:
                fd = self.files.open(str(path), os.O_WRONLY)
                try:
                    self.files.ftruncate(fd, truncate_to)
                    self.files.fsync(fd)
                finally:
                    with contextlib.suppress(OSError):
                        self.files.close(fd)
            except OSError as exc:
                raise StorageIOError(f'repairing session "{session_id}" failed: {exc}', session_id=session_id) from exc
            good = self._torn.get(session_id)
            if good is not None and truncate_to <= good:
                del self._torn[session_id]  # the repair cut the failed append's bytes too
        if payload:
            self._append_bytes(session_id, path, payload)
        self._recovered.pop(session_id, None)

    def _recovered_lines(self, session_id: str, path: Path, truncate_to: int) -> bytes:
        """The lines recovered from the torn frame at ``truncate_to`` by the last load,
        if the file is still as that load read it; else read it again."""
        entry = self._recovered.get(session_id)
        try:
            current = _revision(path)
        except FileNotFoundError:
            current = None
        if entry is None or entry[0] != truncate_to or entry[1] != current:
            stored = self.load(session_id)
            entry = self._recovered.get(session_id)
            if stored.truncate_to != truncate_to or entry is None or entry[0] != truncate_to:
                raise PersistenceError(
                    f'session "{session_id}": repair is stale: the torn tail of "{path}" no longer starts '
                    f"at byte {truncate_to}",
                    session_id=session_id,
                )
        return entry[2]

    def delete(self, session_id: str) -> None:
        """Remove the log (durably: the directory is fsynced).

        The session directory and its ``writer.lock`` stay: unlinking a lock file that
        another process may have open would let two processes lock two inodes."""
        path = self.locate(session_id)
        if path is None:
            raise PersistedSessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
        try:
            self.files.unlink(str(path))
            self._paths.pop(session_id, None)
            self._unsynced_links.pop(session_id, None)
            self._torn.pop(session_id, None)
            self.files.fsync_dir(str(path.parent))
        except OSError as exc:
            raise StorageIOError(f'deleting session "{session_id}" failed: {exc}', session_id=session_id) from exc


def _encoding_error(session_id: str, records: list[dict[str, Any]], exc: Exception) -> RecordEncodingError:
    """Name the first record (by seq) that does not encode."""
    for r in records:
        try:
            orjson.dumps(r)
        except (TypeError, ValueError) as one:
            return RecordEncodingError(
                f'session "{session_id}": event seq {r.get("seq")} ({r.get("type")}) cannot be stored: {one}',
                session_id=session_id,
            )
    return RecordEncodingError(f'session "{session_id}": a batch cannot be stored: {exc}', session_id=session_id)
