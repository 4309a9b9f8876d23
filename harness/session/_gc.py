"""How bulk builds cooperate with CPython's cyclic garbage collector (decision 0003).

Two costs are avoidable when a session is built from 10^5 stored events:

* while building, the collector's passes over the ever-growing young generation
  (pausing it removes them: nothing built on these paths is cyclic);
* after building, the young-generation passes over the new objects, which are
  long-lived by construction (a session's log). The first pass alone costs about
  as much as the restore loop. CPython's documented way to move objects out of the
  young generations without scanning them is ``gc.freeze()`` followed by
  ``gc.unfreeze()``: every tracked object goes to the oldest generation, where the
  full collections see it as they would have after two young passes.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_resume = False


@contextmanager
def gc_paused(*, promote: bool = False) -> Iterator[None]:
    """Pause the cyclic collector around a bulk build of acyclic objects.

    Pauses nest and may overlap across threads (session loads run on worker threads):
    the collector resumes when the last pause ends, and only if it was enabled when the
    first began. With ``promote=True``, a block that completes and left more young
    objects than a full young-generation cycle holds (``threshold0 * threshold1``,
    7,000 by default) moves them to the oldest generation before the collector
    resumes: see :func:`promote_young`.
    """
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
        if promote:
            promote_young()
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()


def promote_young() -> bool:
    """Move every object of the young generations to the oldest, without a scan.

    Only when it pays (the young generation holds more than ``threshold0 *
    threshold1`` objects) and is safe: never when the application has frozen objects
    of its own (``gc.unfreeze`` would release them too) or set ``threshold0`` to 0.
    The application's own young objects are promoted as well; for them this only
    means that a garbage cycle among them is found by the next full collection
    rather than a young one. Returns whether it promoted.
    """
    threshold0, threshold1, _ = gc.get_threshold()
    if threshold0 == 0 or gc.get_count()[0] <= threshold0 * threshold1:
        return False
    if gc.get_freeze_count() != 0:
        return False
    gc.freeze()
    gc.unfreeze()
    return True
