"""`python -m sluice.index build`: the index stage's job (an AWS Batch CPU job) and its local twin.

    python -m sluice.index build --bucket CONTROL --run RUN [--out INDEX] [--model NAME]
    python -m sluice.index build SOURCE... --out INDEX [--model NAME] [--workers N]
    python -m sluice.index stage train|segment|commit --bucket CONTROL --run RUN [--children N]

With --bucket/--run the run's root in the control bucket is the SOURCE, the index is the
plan's (`RunPlan.index`, from the manifest's output.index) unless --out names one, and the
outcome, a RunIndexed or IndexFailed detail (sluice.contracts), is written beside the index,
<index>/_results/<run>.json (paths.index_result), for the control plane to publish: the stage
reads the run's plan and output and writes under the index only (and, when the plan names it,
output.index.s3_vectors: its vector indexes, sluice.index.vectors). Exit 0 when indexed, 1 when the build
failed (the index is left as it was), 2 for bad arguments. `stage` runs one step of the
distributed build (sluice.index.fleet.stage); `--workers N` runs its three steps on this machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sluice.contracts.events import IndexFailed, RunIndexed
from sluice.contracts.plan import RunPlan
from sluice.errors import SluiceError
from sluice.index.outcome import reason_of, with_vectors, write_result
from sluice.log import logger
from sluice.paths import RunPaths, index_result

if TYPE_CHECKING:
    from sluice.index.build import BuildReport

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def add_build_arguments(p: argparse.ArgumentParser) -> None:
    """The build's arguments, shared by `sluice index build` and this entry point."""
    p.add_argument("sources", nargs="*", metavar="SOURCE", help="a run's folder or output prefix, or Parquet files")
    p.add_argument("--out", metavar="INDEX", help="the index folder (local or s3://)")
    p.add_argument("--model", metavar="NAME", help="index this model of the run only (default: every model)")
    p.add_argument("--json", action="store_true", help="print the build's report as one JSON object")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="train once, index the fragments in N processes, commit once (default 1: the single build)",
    )


def _stage(args: argparse.Namespace) -> int:
    """The index stage of a run in the control bucket: build, then write its outcome beside the index."""
    from sluice.index.build import build
    from sluice.index.storage import Files

    files = Files()
    root = RunPaths.in_bucket(args.bucket, args.run)
    index = args.out
    try:
        plan = RunPlan.model_validate_json(files.read(root.plan))
        index = index or (plan.index.uri if plan.index else None)
        if index is None:
            raise SluiceError(f"run {args.run} has no index (output.index is off): pass --out INDEX to build one")
        report = build([root.root], index, model=args.model, files=files)
        outcome: RunIndexed | IndexFailed = with_vectors(report.indexed(args.run), report, plan, index)
    except Exception as exc:  # any failure is the stage's outcome: reported, the run left as it is
        logger.exception("index stage failed", extra={"run_id": args.run, "index": index})
        outcome = IndexFailed(run_id=args.run, index_uri=index, reason=reason_of(exc)[:1000])
    if index is not None:
        write_result(index_result(index, args.run), outcome)
    print(outcome.model_dump_json())
    return EXIT_OK if isinstance(outcome, RunIndexed) else EXIT_FAIL


def run_build(args: argparse.Namespace) -> int:
    """`build SOURCE... --out INDEX`: print the report; errors go to stderr in one line."""
    from sluice.index.build import build

    if not args.sources or not args.out:
        print("sluice: error: give SOURCE... and --out INDEX (or --bucket and --run)", file=sys.stderr)
        return EXIT_USAGE
    if args.workers < 1:
        print("sluice: error: --workers takes 1 or more", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.workers > 1:
            from sluice.index.fleet import workers

            report = workers.build(args.sources, args.out, workers=args.workers, model=args.model)
        else:
            report = build(args.sources, args.out, model=args.model)
    except SluiceError as exc:
        print(f"sluice: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    summary = report.as_dict()
    if args.json:
        print(json.dumps(summary, indent=2))
        return EXIT_OK
    for t in report.tables:
        merged = ", ".join(t.merged) or "nothing new"
        print(
            f"{t.uri}: {t.rows:,} rows of {t.model} ({t.dim}-d, {t.model_id}), ANN {t.ann}; "
            f"merged {merged} (+{t.inserted:,} new, {t.updated:,} replaced)"
            + (f"; already held {', '.join(t.skipped)}" if t.skipped else "")
        )
    print(f"indexed in {report.seconds:.1f} s: search it with `sluice search {report.index} {query_flag(report)}`")
    return EXIT_OK


def query_flag(report: BuildReport) -> str:
    """The query a user tries first: a text for a text index, an image for an image or video one."""
    text = any(";chunk_tokens=" in t.model_id for t in report.tables)  # a text model_id (sluice.contracts.identity)
    return '--text "..."' if text else "--image FILE"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sluice.index", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build or update an index from a run's output")
    add_build_arguments(b)
    b.add_argument("--bucket", help="the control bucket (with --run: the index stage of that run)")
    b.add_argument("--run", help="the run id (with --bucket)")
    from sluice.index.fleet.stage import add_stage_parser

    add_stage_parser(sub)
    args = p.parse_args(argv)
    if args.cmd == "stage":
        from sluice.index.fleet.stage import run_stage

        return run_stage(args)
    if (args.bucket is None) != (args.run is None):
        p.error("--bucket and --run go together")
    if args.bucket:
        if args.sources:
            p.error("give SOURCE... or --bucket/--run, not both")
        return _stage(args)
    return run_build(args)


if __name__ == "__main__":
    sys.exit(main())
