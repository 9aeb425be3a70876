"""`python -m sluice.index stage train|segment|commit`: the distributed index build as three AWS Batch jobs.

    stage train   --bucket B --run R --children N   merge the run, train, deal fragments (FleetPlan)
    stage segment --bucket B --run R                child AWS_BATCH_JOB_ARRAY_INDEX (absent: 0) of the array
    stage commit  --bucket B --run R                commit the segments, write RunIndexed

`--root DIR` instead of --bucket names a run's folder directly (a local run). The index is the
plan's (RunPlan.index) unless --out names one. Outcomes go where the single job writes them
(paths.index_result): a failed step writes IndexFailed naming the step (a child: "segment child
k of N: ...") and exits 1; train and segment write nothing on success (the control plane ends
the stage on commit's event); commit writes RunIndexed and exits 0. Every step is idempotent.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from sluice.contracts.events import IndexFailed, RunIndexed
from sluice.contracts.plan import RunPlan
from sluice.errors import SluiceError
from sluice.index.outcome import reason_of, with_vectors, write_result
from sluice.log import logger
from sluice.paths import RunPaths, index_result

EXIT_OK, EXIT_FAIL = 0, 1
ARRAY_INDEX = "AWS_BATCH_JOB_ARRAY_INDEX"  # set by AWS Batch in each array child


def add_stage_parser(sub: Any) -> None:
    """The `stage` subcommand's arguments."""
    s = sub.add_parser("stage", help="one step of the distributed index build (train, segment, commit)")
    s.add_argument("step", choices=["train", "segment", "commit"])
    where = s.add_mutually_exclusive_group(required=True)
    where.add_argument("--bucket", help="the control bucket: the run's root is s3://B/runs/R/")
    where.add_argument("--root", metavar="DIR", help="the run's folder (its plan.json), e.g. a local run's")
    s.add_argument("--run", required=True, help="the run id")
    s.add_argument("--out", metavar="INDEX", help="the index folder (default: the plan's output.index)")
    s.add_argument("--children", type=int, metavar="N", help="train: the segment children (the array's size)")
    s.add_argument("--model", metavar="NAME", help="index this model of the run only (default: every model)")


def _step(args: argparse.Namespace, root: str, index: str, plan: RunPlan) -> RunIndexed | None:
    """Run one step; its RunIndexed for commit, None for the others."""
    from sluice.index.fleet import build as fleet
    from sluice.index.fleet.files import read_plan
    from sluice.index.storage import Files

    files = Files()
    if args.step == "train":
        if not args.children or args.children < 1:
            raise SluiceError("stage train needs --children N (1 or more): the segment array's size")
        fleet.train([root], index, args.run, args.children, model=args.model, files=files)
        return None
    fplan = read_plan(files, index if index.endswith("/") else index + "/", args.run)
    if args.step == "segment":
        fleet.segment(fplan, args.child, files)
        return None
    report = fleet.commit(fplan, files)
    return with_vectors(report.indexed(args.run), report, plan, fplan.index_uri)


def _where(args: argparse.Namespace) -> tuple[str, RunPlan, str]:
    """(the run's root, its plan, the index) from the arguments."""
    from sluice.index.storage import Files

    root = RunPaths.in_bucket(args.bucket, args.run) if args.bucket else RunPaths(args.root.rstrip("/") + "/")
    plan = RunPlan.model_validate_json(Files().read(root.plan))
    index = args.out or (plan.index.uri if plan.index else None)
    if index is None:
        raise SluiceError(f"run {args.run} has no index (output.index is off): pass --out INDEX to build one")
    return root.root, plan, index


def _label(args: argparse.Namespace, index: str | None) -> str:
    """The step as a failure names it: "train", "segment child k of N", "commit"."""
    if args.step != "segment":
        return args.step
    children = "?"
    if index is not None:
        try:
            from sluice.index.fleet.files import read_plan
            from sluice.index.storage import Files

            children = str(read_plan(Files(), index if index.endswith("/") else index + "/", args.run).children)
        except Exception:  # the plan itself is what failed: the child's number is still worth naming
            logger.info("index stage: no readable plan to count the children", extra={"run_id": args.run})
    return f"segment child {args.child} of {children}"


def run_stage(args: argparse.Namespace) -> int:
    """One step; its outcome written per the contract; exit 0 or 1."""
    args.child = int(os.environ.get(ARRAY_INDEX) or 0)
    index: str | None = args.out
    try:
        root, plan, index = _where(args)
        indexed = _step(args, root, index, plan)
    except Exception as exc:  # any failure is the step's outcome: reported, the run left as it is
        logger.exception("index stage step failed", extra={"run_id": args.run, "step": args.step, "index": index})
        reason = f"{_label(args, index)}: {reason_of(exc)}"
        failed = IndexFailed(run_id=args.run, index_uri=index, reason=reason[:1000])
        if index is not None:
            write_result(index_result(index, args.run), failed)
        print(failed.model_dump_json())
        return EXIT_FAIL
    if indexed is not None:
        write_result(index_result(index, args.run), indexed)
        print(indexed.model_dump_json())
    return EXIT_OK
