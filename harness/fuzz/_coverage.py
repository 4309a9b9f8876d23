"""The coverage-guided run of one target, in its own process (libFuzzer exits the
process when it is done): ``python -m harness.fuzz._coverage TARGET SECONDS WORKDIR
[SEED_DIR ...]``.

New inputs go to ``WORKDIR/corpus`` (the first corpus directory, the one libFuzzer
writes), crashes to ``WORKDIR/crash-*``; the seed directories are only read.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    import atheris  # type: ignore[import-untyped, import-not-found, unused-ignore]

    target_name, seconds, workdir, *seeds = argv
    # Coverage feedback from the code under test only (the readers, the session core,
    # the restore): instrumenting everything loaded costs more start-up than a CI run has.
    with atheris.instrument_imports(include=["harness.persistence", "harness.session"]):
        from harness.fuzz._targets import make_target

    target, _cleanup = make_target(target_name)
    corpus = Path(workdir, "corpus")
    corpus.mkdir(parents=True, exist_ok=True)
    args = [
        sys.argv[0],
        f"-max_total_time={int(seconds)}",
        f"-artifact_prefix={Path(workdir).as_posix()}/",
        "-timeout=20",
        "-rss_limit_mb=2048",
        "-max_len=65536",
        "-print_final_stats=1",
        str(corpus),
        *seeds,
    ]
    atheris.Setup(args, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv[1:])
