"""Fuzzing of every entry point (issue 16, ``docs/limits.md``).

Two halves:

* Property-based fuzz tests (``tests/test_fuzz_*.py``, marker ``fuzz``) feed
  Hypothesis-generated ids, metadata, events, files, provider streams and CLI
  arguments to the public entry points. Their example budget comes from
  :func:`budget` (``HARNESS_FUZZ`` = ``dev``, ``ci`` or ``long``), and each example
  reports itself with :func:`explored` so that a run prints the cases explored per
  entry point.
* A coverage-guided fuzzer (atheris, i.e. libFuzzer) over the JSONL reader and the
  SQLite row decoder (:mod:`harness.fuzz._targets`), seeded from the corpus kept in
  ``tests/fuzz_corpus/``.

``harness fuzz`` (or ``python -m harness.fuzz``) runs both: ``--budget ci`` is the
bounded CI section, ``--budget long --seconds N`` the on-demand run.

The oracle everywhere: an input is refused with a typed
:class:`~harness.errors.HarnessError`, or accepted and preserved losslessly; in both
cases the runtime still serves its other sessions, shuts down cleanly, and loses
nothing it acknowledged.
"""

from __future__ import annotations

from harness.fuzz._budget import BUDGETS, budget, explored, explored_counts

__all__ = ["BUDGETS", "budget", "explored", "explored_counts"]
