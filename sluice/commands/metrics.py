"""`sluice metrics RUN_ID`: a run's throughput, GPU utilization and data-wait from AMP or Prometheus."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from sluice.commands.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, Invocation

if TYPE_CHECKING:
    from sluice.commands.common import Subparsers


def add_commands(sub: Subparsers) -> None:
    """`sluice metrics`: its arguments and handler."""
    metrics = sub.add_parser("metrics", help="a run's throughput, GPU utilization and data-wait (AMP/Prometheus)")
    metrics.add_argument("run_id", metavar="RUN_ID", help="the run whose workers pushed the metrics")
    metrics.add_argument(
        "--url", metavar="URL", help="Prometheus or AMP workspace URL (default: SLUICE_PROMETHEUS_URL)"
    )
    metrics.add_argument(
        "--since-minutes",
        type=float,
        default=24 * 60,
        metavar="MINUTES",
        help="how far back to look for the run (default 1440, a day)",
    )
    metrics.add_argument("--plot", metavar="FILE", help="also write a chart (PNG)")
    metrics.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    metrics.set_defaults(func=cmd_metrics)


def cmd_metrics(args: argparse.Namespace, inv: Invocation) -> int:
    """A run's throughput, GPU utilization and data-wait from AMP or Prometheus."""
    from sluice.ops.metrics import PromClient, fetch, plot, render

    url = args.url or os.environ.get("SLUICE_PROMETHEUS_URL")
    if not url:
        print(
            "sluice: give --url (AMP: https://aps-workspaces.<region>.amazonaws.com/workspaces/<id>/, "
            "local: the URL `sluice local run` printed) or set SLUICE_PROMETHEUS_URL",
            file=sys.stderr,
        )
        return EXIT_USAGE
    m = fetch(PromClient(url), args.run_id, since_s=args.since_minutes * 60)
    if not m.found:
        why = f"no metrics for run {args.run_id!r} in the last {args.since_minutes:g} minutes at {url}"
        if args.json:
            print(json.dumps({"run_id": args.run_id, "found": False, "error": why}))
        else:
            print(
                f"sluice: {why} (check the run id, --since-minutes, and that its workers push there)", file=sys.stderr
            )
        return EXIT_FAIL
    if args.json:
        print(json.dumps(m.summary()))
    else:
        render(m)
    if args.plot:
        plot(m, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return EXIT_OK
