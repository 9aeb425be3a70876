"""`sluice status`, `sluice runs` and `sluice reconcile`: runs as the runs table records them."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from sluice.commands.common import EXIT_FAIL, EXIT_OK, Invocation, int_from

if TYPE_CHECKING:
    from sluice.commands.common import Subparsers

TABLE_HELP = "runs table (default: SLUICE_RUNS_TABLE or sluice-runs)"


def add_commands(sub: Subparsers) -> None:
    """`sluice status`, `sluice runs` and `sluice reconcile`: their arguments and handlers."""
    status = sub.add_parser("status", help="a run's status and progress (reads the runs table)")
    status.add_argument("run_id", metavar="RUN_ID", help="the run (sluice submit printed it; sluice runs lists them)")
    status.add_argument("--watch", action="store_true", help="refresh until the run is final")
    status.add_argument("--interval", type=float, default=2.0, help=argparse.SUPPRESS)
    status.add_argument("--json", action="store_true", help="print the status as one JSON object")
    status.add_argument("--table", metavar="TABLE", help=TABLE_HELP)
    status.set_defaults(func=cmd_status)
    runs = sub.add_parser("runs", help="recent runs, newest first")
    runs.add_argument("--limit", type=int_from(1), default=20, metavar="N", help="at most N runs (default 20)")
    runs.add_argument("--json", action="store_true", help="print the runs as a JSON list")
    runs.add_argument("--table", metavar="TABLE", help=TABLE_HELP)
    runs.set_defaults(func=cmd_runs)
    _add_reconcile(sub)


def _add_reconcile(sub: Subparsers) -> None:
    """`sluice reconcile [RUN_ID]`: its arguments and handler."""
    rec = sub.add_parser("reconcile", help="settle runs whose Batch events stopped (what the sweep does)")
    rec.add_argument(
        "run_id", nargs="?", metavar="RUN_ID", help="one run (default: every run of the last 15 days that is not final)"
    )
    rec.add_argument(
        "--grace-s",
        type=float,
        default=900,
        metavar="SECONDS",
        help="settle shards of jobs terminal at least this long (default 900)",
    )
    rec.add_argument("--json", action="store_true", help="print what was settled as a JSON list")
    rec.add_argument("--table", metavar="TABLE", help=TABLE_HELP)
    rec.set_defaults(func=cmd_reconcile)


def _ledger(args: argparse.Namespace, inv: Invocation) -> Any:
    """The runs table's Ledger: --table, else the settings' runs table."""
    from sluice.aws.clients import client
    from sluice.control.table.ledger import Ledger

    return Ledger(client("dynamodb"), args.table or inv.settings.runs_table)


def cmd_status(args: argparse.Namespace, inv: Invocation) -> int:
    """A run's status and progress from the ledger."""
    from sluice.ops.status import cmd_status as show

    return show(
        _ledger(args, inv),
        args.run_id,
        watch=args.interval if args.watch else False,
        as_json=args.json,
        beats_table=inv.settings.beats_table,
    )


def cmd_runs(args: argparse.Namespace, inv: Invocation) -> int:
    """Recent runs, newest first."""
    from sluice.ops.status import cmd_runs as show

    return show(_ledger(args, inv), limit=args.limit, as_json=args.json)


def cmd_reconcile(args: argparse.Namespace, inv: Invocation) -> int:
    """Settle runs whose Batch events stopped: what the 5-minute sweep does, now."""
    from sluice.control.context import Context
    from sluice.control.sweep.reconcile import reconcile

    settings = inv.settings
    if args.table:
        settings = settings.model_copy(update={"runs_table": args.table})
    done = reconcile(Context.build(settings), args.run_id, grace_s=args.grace_s)
    if args.json:
        print(json.dumps([r.as_dict() for r in done], indent=2))
    else:
        for r in done:
            print(f"{r.run_id:<40} {r.status:<11} {'; '.join(r.actions) or 'nothing to do'}")
        if not done:
            print(
                "sluice: no run to reconcile" + (f" (no run {args.run_id!r})" if args.run_id else ""), file=sys.stderr
            )
    return EXIT_OK if done or not args.run_id else EXIT_FAIL
