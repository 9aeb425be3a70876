"""`sluice plan`, `sluice prepare` and `sluice submit`: a run checked, prepared or uploaded from this machine."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.aws.s3uri import s3_uri
from sluice.commands.common import EXIT_FAIL, EXIT_OK, Invocation, int_from
from sluice.errors import Rejection
from sluice.prepare.offline import add_offline_arguments

if TYPE_CHECKING:
    from sluice.commands.common import Subparsers

PLAN_BUCKET_HINT = "or pass --bucket BUCKET (in a JSON manifest, input.bucket)"


def add_plan(sub: Subparsers) -> None:
    """`sluice plan MANIFEST`: its arguments and handler."""
    plan = sub.add_parser(
        "plan", help="dry run and preflight: keys, shards, job layout, every limit the run meets, cost (no AWS writes)"
    )
    plan.add_argument(
        "manifest", metavar="MANIFEST", help="a local file or s3:// URI (.json manifest or .txt/.csv/.jsonl key list)"
    )
    plan.add_argument(
        "--bucket", metavar="BUCKET", help="bucket for bare keys (SLUICE_DEFAULT_INPUT_BUCKET's role in the Lambda)"
    )
    plan.add_argument(
        "--model",
        metavar="URI",
        help="model of a key list or manifest that names none (SLUICE_DEFAULT_MODEL_URI's role in the Lambda)",
    )
    plan.add_argument("--json", action="store_true", help="print one JSON object (checks, cost, layout)")
    plan.add_argument(
        "--assume-keys",
        type=int_from(1),
        metavar="N",
        help="plan N unique keys with the manifest's layout, without reading the input (capacity planning)",
    )
    _add_capacity_arguments(plan)
    plan.set_defaults(func=cmd_plan)


def _add_capacity_arguments(plan: argparse.ArgumentParser) -> None:
    """`sluice plan`'s what-ifs: the GPU's rate, its instance type, who decodes, the input's size."""
    plan.add_argument(
        "--images-per-gpu-s",
        type=float,
        metavar="N",
        help="measured images/s per GPU (python -m gpu_worker.autotune) instead of the table's estimate",
    )
    plan.add_argument(
        "--instance-type",
        metavar="TYPE",
        help="plan for this GPU instance type (g6e.xlarge): its vCPUs per GPU and its price "
        "(default: the first of SLUICE_GPU_INSTANCE_TYPES)",
    )
    plan.add_argument(
        "--decode", choices=("auto", "cpu", "gpu"), help="job.decode for this plan: who decodes JPEGs (docs/decode.md)"
    )
    plan.add_argument(
        "--decode-per-core-s",
        type=float,
        metavar="N",
        help="measured CPU decode images/s per core (python -m gpu_worker.autotune) instead of the assumption",
    )
    plan.add_argument(
        "--input-gb",
        type=float,
        metavar="N",
        help="the input's size in GB, for the cross-Region transfer cost (default: an assumed size an object)",
    )


def add_prepare(sub: Subparsers) -> None:
    """`sluice prepare KEYLIST --out DIR`: its arguments (sluice.prepare.offline's) and handler."""
    prep = sub.add_parser(
        "prepare", help="the prepare stage on this machine, no AWS: key list -> shards and plan.json (N workers)"
    )
    add_offline_arguments(prep)
    prep.set_defaults(func=cmd_prepare)


def add_submit(sub: Subparsers) -> None:
    """`sluice submit MANIFEST --bucket BUCKET`: its arguments and handler."""
    submit = sub.add_parser("submit", help="upload a manifest to a deployed Sluice and print the run id")
    submit.add_argument("manifest", metavar="MANIFEST", help="a .json manifest or .txt/.csv/.jsonl key list")
    submit.add_argument(
        "--bucket", required=True, metavar="BUCKET", help="the control bucket (stack output ControlBucketName)"
    )
    submit.add_argument("--name", metavar="NAME", help="object name under manifests/ (default: the file's name)")
    submit.add_argument(
        "--no-validate",
        action="store_true",
        help="upload without first running `sluice plan`'s checks and key scan here",
    )
    submit.add_argument("--json", action="store_true", help="print run_id, manifest and version_id as JSON")
    submit.set_defaults(func=cmd_submit)


def cmd_plan(args: argparse.Namespace, inv: Invocation) -> int:
    """Dry run: the manifest Lambda's validation and key scan, then the layout; writes nothing to AWS."""
    from dataclasses import replace

    from sluice.ops.dryrun import DryRun, dry_run

    settings = inv.settings
    if args.bucket:
        settings = settings.model_copy(update={"default_input_bucket": args.bucket})
    if args.model:
        settings = settings.model_copy(update={"default_model_uri": args.model})
    if args.images_per_gpu_s:
        settings = settings.model_copy(update={"images_per_gpu_s": args.images_per_gpu_s})
    if args.instance_type:  # the first GPU type is the one planned and priced
        settings = settings.model_copy(update={"gpu_instance_types": args.instance_type})
    control = settings.control_bucket
    if control is None and args.manifest.startswith("s3://"):
        control = args.manifest[5:].split("/", 1)[0]  # a manifest already in its control bucket
    req = DryRun(args.manifest, settings, control=control, bucket_hint=PLAN_BUCKET_HINT, assume_keys=args.assume_keys)
    req = replace(req, decode=args.decode, decode_per_core_s=args.decode_per_core_s)
    if args.input_gb:
        req = replace(req, input_bytes=int(args.input_gb * 1e9))
    summary = dry_run(req, inv.s3)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_plan(summary)
    errors = [c for c in summary["checks"] if c["status"] == "error"]
    if errors and not args.json:
        print(f"\nsluice: {len(errors)} check(s) failed: the manifest function would reject this run", file=sys.stderr)
    return EXIT_FAIL if errors else EXIT_OK


def _print_plan(summary: dict[str, Any]) -> None:
    """The plan as text: keys, mode, shards, jobs, timeout, rate, then the preflight table and cost."""
    from sluice.ops.plan_report import render_summary

    print(f"manifest        {summary['manifest']}")
    if summary["assumed"]:
        print(f"unique keys     {summary['unique_keys']:,}  (assumed: --assume-keys; the input was not read)")
    else:
        print(
            f"unique keys     {summary['unique_keys']:,}  "
            f"(seen {summary['keys_seen']:,}, duplicates removed {summary['duplicates_removed']:,})"
        )
        print(f"buckets         {', '.join(summary['buckets'])}")
    if summary.get("incremental"):
        inc = summary["incremental"]
        print(f"since run       {inc['since_run']}  (lineage {', '.join(inc['lineage'] or ['not checked'])})")
        print(f"                {inc['note']}")
    print(
        f"mode            {summary['mode']}" + ("" if summary["spot_allowed"] else "  (On-Demand: MNP cannot use Spot)")
    )
    print(f"shards          {summary['shards']:,} x <= {summary['keys_per_shard']:,} keys")
    if summary.get("keys_per_shard_why"):
        print(f"                {summary['keys_per_shard_why']}")
    for i, j in enumerate(summary["jobs"]):
        print(f"job {i:<11} {j['kind']}: shards {j['shard_offset']}..{j['shard_offset'] + j['shard_count'] - 1}")
    derived = " (derived from keys_per_shard and images/s)" if summary["timeout_derived"] else " (job.timeout_s)"
    print(f"job timeout     {summary['timeout_s']:,} s{derived}")
    audio = summary.get("audio")
    if audio:
        print(
            f"audio files     {audio['seconds_per_file']:g} s, {audio['windows_per_file']} windows each (a planning "
            f"guess); one core decodes {audio['decode_s_per_core']:g} s of audio a second"
        )
    rate = (
        f"files/s a GPU   {summary['images_per_gpu_s']:.3g}"
        if audio
        else f"images/s a GPU  {summary['images_per_gpu_s']:g}"
    )
    print(f"{rate}, {summary['images_per_gpu_s_source']}")
    render_summary(summary, sys.stdout)


def cmd_submit(args: argparse.Namespace, inv: Invocation) -> int:
    """Upload a manifest or key list to manifests/ of the control bucket; print its run id."""
    from sluice.control.intake.coordinator import run_id_for
    from sluice.paths import MANIFESTS_PREFIX

    path = Path(args.manifest)
    key = f"{MANIFESTS_PREFIX}{args.name or path.name}"
    if not args.no_validate and not _would_pass(path, key, args.bucket, inv):
        return EXIT_FAIL
    resp = inv.s3().put_object(Bucket=args.bucket, Key=key, Body=path.read_bytes())
    version = resp.get("VersionId") or f"{resp['ETag'].strip(chr(34))}:"
    run_id = run_id_for(args.bucket, key, version)
    if args.json:
        print(json.dumps({"run_id": run_id, "manifest": s3_uri(args.bucket, key), "version_id": resp.get("VersionId")}))
    else:
        print(f"uploaded s3://{args.bucket}/{key}")
        print(
            f"run id   {run_id}"
            + ("" if resp.get("VersionId") else "  (unversioned bucket: the id depends on the event sequencer)")
        )
    return EXIT_OK


def _would_pass(path: Path, key: str, bucket: str, inv: Invocation) -> bool:
    """`sluice plan`'s checks before an upload: what the Lambda would reject is said here and not uploaded."""
    from sluice.ops.dryrun import DryRun, dry_run

    try:
        req = DryRun(str(path), inv.settings, name=key.rsplit("/", 1)[-1], control=bucket)
        summary = dry_run(req, inv.s3)
        failed = [c for c in summary["checks"] if c["status"] == "error"]
        if failed:  # the preflight: the manifest function rejects these too
            raise Rejection([f"preflight: {c['name']}: {c['advice']}" for c in failed])
    except Rejection as exc:
        print(f"sluice: not uploaded: {path} would be rejected:", file=sys.stderr)
        for r in exc.reasons:
            print(f"  - {r}", file=sys.stderr)
        print("(fix it, or pass --no-validate to upload it as is)", file=sys.stderr)
        return False
    return True


def cmd_prepare(args: argparse.Namespace, inv: Invocation) -> int:
    """`sluice prepare`: a bare key without --bucket is refused once, up front; a rejected run leaves no prepare/."""
    from sluice.prepare.offline import offline_main

    if not args.bucket:
        _refuse_bare_keys(args.keylist)
    work = Path(args.out, "prepare")
    fresh = not work.exists()
    try:
        return offline_main(args, inv.settings)
    except Rejection:
        if fresh:  # the folder this command wrote for its workers: nothing of the user's is in it
            shutil.rmtree(work, ignore_errors=True)
        raise


def _refuse_bare_keys(path: str) -> None:
    """Rejection naming --bucket when the key list's first lines hold a bare key (every line would say so)."""
    from sluice.input.sources import BARE_KEY, KEYLIST_SUFFIXES, Problems, keylist_pairs

    name = os.path.basename(path)
    kind = next((k for k in KEYLIST_SUFFIXES if name.lower().endswith(k)), ".txt")
    try:
        with open(path, "rb") as fh:
            head = fh.read(64 * 1024)
    except OSError:
        return  # offline_main says what is wrong with the path
    head = head[: head.rfind(b"\n") + 1] or head  # whole lines only
    problems = Problems()
    with contextlib.suppress(Rejection):
        for _ in keylist_pairs([head], path, kind, None, problems):
            pass
    bare = next((p for p in problems.details if p.code == BARE_KEY), None)
    if bare:
        raise Rejection(
            f"{bare.where}: bare key {bare.key!r} but no bucket: pass --bucket BUCKET (the bucket the keys are in), "
            "or write s3://bucket/key lines"
        )
