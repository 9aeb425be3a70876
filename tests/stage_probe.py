"""A stand-in stage job for the local executor's tests: records that it ran, checks what it needs, may fail.

    python -m tests.stage_probe DIR NAME [--needs NAME:COUNT ...] [--fail-child K --fail-attempts M]

Writes DIR/NAME-<array index>-<attempt> (the index from AWS_BATCH_JOB_ARRAY_INDEX, absent = 0;
the attempt from AWS_BATCH_JOB_ATTEMPT) holding a sequence number taken from DIR/seq, so a
test sees the order the jobs ran in. Exits 2 when fewer than COUNT files of a needed NAME
exist (it ran before its dependency ended), 1 for child K's first M attempts, else 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("name")
    p.add_argument("--needs", action="append", default=[], metavar="NAME:COUNT")
    p.add_argument("--fail-child", type=int, default=-1)
    p.add_argument("--fail-attempts", type=int, default=0)
    args = p.parse_args(argv)
    out = Path(args.dir)
    child = int(os.environ.get("AWS_BATCH_JOB_ARRAY_INDEX", "0"))
    attempt = int(os.environ.get("AWS_BATCH_JOB_ATTEMPT", "1"))
    for need in args.needs:
        name, count = need.split(":")
        done = {f.name.split("-")[1] for f in out.glob(f"{name}-*") if f.read_text().endswith(" ok")}
        if len(done) < int(count):
            print(f"{args.name}: ran before {name} ended ({len(done)} of {count})", file=sys.stderr)
            return 2
    seq = out / "seq"
    n = int(seq.read_text() or 0) + 1 if seq.exists() else 1  # children at once may share a number
    tmp = out / f".seq-{os.getpid()}"
    tmp.write_text(str(n))
    os.replace(tmp, seq)
    failing = child == args.fail_child and attempt <= args.fail_attempts
    (out / f"{args.name}-{child}-{attempt}").write_text(f"{n} {'failed' if failing else 'ok'}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
