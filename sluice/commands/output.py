"""`sluice output sql RUN_ID`: the duckdb query that reads a run's output (docs/incremental.md)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from sluice.commands.common import EXIT_OK, Invocation

if TYPE_CHECKING:
    from sluice.commands.common import Subparsers


def add_commands(sub: Subparsers) -> None:
    """`sluice output sql`: its arguments and handler."""
    output = sub.add_parser("output", help="read a run's output").add_subparsers(
        dest="output_cmd", required=True, metavar="sql"
    )
    osql = output.add_parser(
        "sql", help="the duckdb query reading a run and the runs it completes (input.since_run) as one set"
    )
    osql.add_argument("run_id", metavar="RUN_ID", help="the run (with input.since_run: the newest of its lineage)")
    osql.add_argument("--bucket", metavar="BUCKET", help="the control bucket (default: SLUICE_CONTROL_BUCKET)")
    osql.add_argument("--local", metavar="DIR", help="a `sluice local run --out DIR` folder instead of S3")
    osql.set_defaults(func=cmd_output_sql)


def cmd_output_sql(args: argparse.Namespace, inv: Invocation) -> int:
    """Print the duckdb query that reads a run and the runs it completes as one set (docs/incremental.md)."""
    from sluice.ops.recipe import sql_for_run

    if args.local:
        print(sql_for_run(args.run_id, local=args.local))
        return EXIT_OK
    print(sql_for_run(args.run_id, bucket=args.bucket or inv.settings.control_bucket, s3=inv.s3()))
    return EXIT_OK
