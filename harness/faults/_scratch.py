"""Where an attempt keeps its scratch files (:func:`scratch_dir`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from harness.faults._backends import BACKENDS, uses_files

#: Where the attempts of the statement-faulted kinds keep their scratch files, when it
#: is a writable directory with room to spare (a tmpfs on Linux).
MEMORY_SCRATCH: Final = Path("/dev/shm")
_ROOM: Final = 256 * 1024 * 1024


def scratch_dir(kind: str) -> str | None:
    """The directory the built-in scenarios on backend ``kind`` make their attempts'
    scratch directories in (``Settings.scratch``); ``None``: the system's temporary
    directory.

    SQLite's and PostgreSQL's attempts use :data:`MEMORY_SCRATCH` where it can take them.
    Their faults are injected at statements and their crashes stop the world at a
    statement (the file is then reopened, never power-cut), so no verdict depends on
    the disk, and an fsync in memory costs nothing: the campaign's SQLite attempts run
    about a third faster. The JSONL kinds stay on the real disk: their rounds sync with
    ``syncfs``, which a tmpfs is left out of (decision 0014), so memory would explore
    another path than the one users run."""
    if kind not in BACKENDS or uses_files(kind):  # the file-faulted kinds stay on the disk
        return None
    try:
        st = os.statvfs(MEMORY_SCRATCH)
    except OSError:
        return None
    if st.f_bavail * st.f_frsize < _ROOM or not os.access(MEMORY_SCRATCH, os.W_OK | os.X_OK):
        return None
    return str(MEMORY_SCRATCH)
