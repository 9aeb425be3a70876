"""`sluice` console script: the top-level parser and the entry point; the commands live in sluice.commands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from sluice.commands import index, local, metrics, model, output, plan, runs, shards
from sluice.commands.common import run, version

# Each adds its commands' subparsers and handlers, in the order `sluice --help` lists them.
REGISTRARS = (
    plan.add_plan,
    plan.add_prepare,
    shards.add_commands,
    plan.add_submit,
    runs.add_commands,
    metrics.add_commands,
    output.add_commands,
    model.add_commands,
    local.add_commands,
    index.add_commands,
)


def build_parser() -> argparse.ArgumentParser:
    """The `sluice` parser: --version and a subparser a command, each with its handler as `func`."""
    p = argparse.ArgumentParser(prog="sluice", description="GPU batch inference on AWS Batch, driven by S3 manifests.")
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for add in REGISTRARS:
        add(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run its command once; what it raises becomes a message and an exit code."""
    args = build_parser().parse_args(argv)
    _quiet_logs(args)
    return run(args.func, args)


def _quiet_logs(args: Any) -> None:
    """A command's own output is for people: the shared JSON loggers say only warnings and errors.

    POWERTOOLS_LOG_LEVEL (or LOG_LEVEL) set in the environment keeps its level; `sluice local run`
    keeps INFO (its in-process handlers' lines go to its log, as in Lambda).
    """
    import logging
    import os

    if os.environ.get("POWERTOOLS_LOG_LEVEL") or os.environ.get("LOG_LEVEL") or getattr(args, "local_cmd", None):
        return
    for name in ("sluice", "sluice-worker"):  # sluice.log's and gpu_worker.log's Powertools loggers
        logging.getLogger(name).setLevel(logging.WARNING)


if __name__ == "__main__":
    sys.exit(main())
