"""`sluice` console script: plan, shard pack/cat, submit, status, output, local, index, search."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from sluice.errors import Rejection, RetriableError, ShardFormatError, SluiceError
from sluice.prepare.offline import add_offline_arguments

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_BROKEN_PIPE = 141  # what a shell reports for a command a closed pipe (SIGPIPE) ended


def _read_chunks(path: str, chunk: int = 8 * 2**20) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        while data := fh.read(chunk):
            yield data


def _s3() -> Any:
    from sluice.aws.clients import client

    return client("s3")


def cmd_plan(args: argparse.Namespace) -> int:
    """Dry run: the manifest Lambda's validation and key scan, then the layout; writes nothing to AWS."""
    from dataclasses import replace

    from sluice.ops.dryrun import DryRun, dry_run
    from sluice.settings import Settings

    settings = Settings.from_env()
    if args.bucket:
        settings = settings.model_copy(update={"default_input_bucket": args.bucket})
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
    summary = dry_run(req, _s3)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_plan(summary)
    errors = [c for c in summary["checks"] if c["status"] == "error"]
    if errors and not args.json:
        print(f"\nsluice: {len(errors)} check(s) failed: the manifest function would reject this run", file=sys.stderr)
    return EXIT_FAIL if errors else EXIT_OK


PLAN_BUCKET_HINT = "or pass --bucket BUCKET (in a JSON manifest, input.bucket)"


def _print_plan(summary: dict[str, Any]) -> None:
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
    for i, j in enumerate(summary["jobs"]):
        print(f"job {i:<11} {j['kind']}: shards {j['shard_offset']}..{j['shard_offset'] + j['shard_count'] - 1}")
    derived = " (derived from keys_per_shard and images/s)" if summary["timeout_derived"] else " (job.timeout_s)"
    print(f"job timeout     {summary['timeout_s']:,} s{derived}")
    print(f"images/s a GPU  {summary['images_per_gpu_s']:g}, {summary['images_per_gpu_s_source']}")
    render_summary(summary, sys.stdout)


def cmd_shard_pack(args: argparse.Namespace) -> int:
    """Key-list file (one key or s3:// URI a line) -> one shard file, keys exactly as given."""
    from sluice.input.sources import Problems, iter_keylist
    from sluice.shards import ShardWriter

    problems = Problems()
    n = 0
    with open(args.out, "wb") as fh:
        writer = ShardWriter(fh, sort=args.sort)
        for bucket, keys in iter_keylist(_read_chunks(args.keylist), args.keylist, ".txt", args.bucket, problems):
            writer.add(bucket, keys)
            n += len(keys)
        problems.raise_if_any()
        stats = writer.close()
    print(f"{args.out}: {stats.n_keys} keys, {stats.n_blocks} blocks, {stats.n_bytes} bytes", file=sys.stderr)
    return EXIT_OK


def cmd_shard_cat(args: argparse.Namespace) -> int:
    """Print a shard's keys (s3:// URIs), one a line; SHARD is a path or an s3:// URI."""
    from sluice.shards import FileSource, ShardReader

    if args.shard.startswith("s3://"):
        from sluice.aws.s3uri import parse_s3_uri

        b, k = parse_s3_uri(args.shard)
        reader = ShardReader(_s3().get_object(Bucket=b, Key=k)["Body"].read())
    else:
        reader = ShardReader(FileSource(args.shard))
    out = sys.stdout
    try:
        for bucket, keys in reader.groups(args.start, args.stop):
            if args.keys_only:
                out.write("".join(k + "\n" for k in keys))
            else:
                prefix = f"s3://{bucket}/"
                out.write("".join(prefix + k + "\n" for k in keys))
        out.flush()
    except BrokenPipeError:  # `sluice shard cat ... | head`: the reader has what it wanted
        _silence_stdout()
    return EXIT_OK


def _silence_stdout() -> None:
    """Point stdout at /dev/null: its reader is gone, and the interpreter's last flush must not fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def cmd_submit(args: argparse.Namespace) -> int:
    """Upload a manifest or key list to manifests/ of the control bucket; print its run id."""
    from sluice.control.coordinator import run_id_for
    from sluice.paths import MANIFESTS_PREFIX

    path = Path(args.manifest)
    key = f"{MANIFESTS_PREFIX}{args.name or path.name}"
    if not args.no_validate:
        from sluice.ops.dryrun import DryRun, dry_run
        from sluice.settings import Settings

        try:  # what the Lambda would reject is not uploaded (--no-validate skips this)
            req = DryRun(str(path), Settings.from_env(), name=key.rsplit("/", 1)[-1], control=args.bucket)
            summary = dry_run(req, _s3)
            failed = [c for c in summary["checks"] if c["status"] == "error"]
            if failed:  # the preflight: the manifest function rejects these too
                raise Rejection([f"preflight: {c['name']}: {c['advice']}" for c in failed])
        except Rejection as exc:
            print(f"sluice: not uploaded: {path} would be rejected:", file=sys.stderr)
            for r in exc.reasons:
                print(f"  - {r}", file=sys.stderr)
            print("(fix it, or pass --no-validate to upload it as is)", file=sys.stderr)
            return EXIT_FAIL
    resp = _s3().put_object(Bucket=args.bucket, Key=key, Body=path.read_bytes())
    version = resp.get("VersionId") or f"{resp['ETag'].strip(chr(34))}:"
    run_id = run_id_for(args.bucket, key, version)
    if args.json:
        print(
            json.dumps({"run_id": run_id, "manifest": f"s3://{args.bucket}/{key}", "version_id": resp.get("VersionId")})
        )
    else:
        print(f"uploaded s3://{args.bucket}/{key}")
        print(
            f"run id   {run_id}"
            + ("" if resp.get("VersionId") else "  (unversioned bucket: the id depends on the event sequencer)")
        )
    return EXIT_OK


def _ledger(args: argparse.Namespace) -> Any:
    from sluice.aws.clients import client
    from sluice.control.ledger import Ledger
    from sluice.settings import Settings

    return Ledger(client("dynamodb"), args.table or Settings.from_env().runs_table)


def cmd_status(args: argparse.Namespace) -> int:
    """A run's status and progress from the ledger."""
    from sluice.ops.status import cmd_status as show

    return show(_ledger(args), args.run_id, watch=args.watch, as_json=args.json, interval=args.interval)


def cmd_runs(args: argparse.Namespace) -> int:
    """Recent runs, newest first."""
    from sluice.ops.status import cmd_runs as show

    return show(_ledger(args), limit=args.limit, as_json=args.json)


def cmd_reconcile(args: argparse.Namespace) -> int:
    """Settle runs whose Batch events stopped: what the 5-minute sweep does, now."""
    from sluice.control.context import Context
    from sluice.control.reconcile import reconcile
    from sluice.settings import Settings

    settings = Settings.from_env()
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


def cmd_metrics(args: argparse.Namespace) -> int:
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


def cmd_output_sql(args: argparse.Namespace) -> int:
    """Print the duckdb query that reads a run and the runs it completes as one set (docs/incremental.md)."""
    from sluice.ops.recipe import sql_for_run

    if args.local:
        print(sql_for_run(args.run_id, local=args.local))
        return EXIT_OK
    from sluice.settings import Settings

    print(sql_for_run(args.run_id, bucket=args.bucket or Settings.from_env().control_bucket, s3=_s3()))
    return EXIT_OK


def cmd_prepare(args: argparse.Namespace) -> int:
    """`sluice prepare`: a bare key without --bucket is refused once, up front; a rejected run leaves no prepare/."""
    from sluice.prepare.offline import offline_main

    if not args.bucket:
        _refuse_bare_keys(args.keylist)
    work = Path(args.out, "prepare")
    fresh = not work.exists()
    try:
        return offline_main(args)
    except Rejection:
        if fresh:  # the folder this command wrote for its workers: nothing of the user's is in it
            shutil.rmtree(work, ignore_errors=True)
        raise


def _refuse_bare_keys(path: str) -> None:
    """Rejection naming --bucket when the key list's first lines hold a bare key (every line would say so)."""
    from sluice.input.sources import KEYLIST_SUFFIXES, Problems, keylist_pairs

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
    bare = next((r for r in problems.reasons if "bare key" in r), None)
    if bare:
        where = bare.split(": bare key", 1)[0]
        key = bare.split("bare key ", 1)[1].split(" but", 1)[0]
        raise Rejection(
            f"{where}: bare key {key} but no bucket: pass --bucket BUCKET (the bucket the keys are in), or write "
            "s3://bucket/key lines"
        )


def cmd_local_run(args: argparse.Namespace) -> int:
    """Run Sluice locally on moto (the embedded default)."""
    from sluice.local.run import run_local

    if args.decode == "gpu" and (why := _no_cuda()):  # refused before anything starts
        print(f"sluice: --decode gpu needs a CUDA GPU with nvJPEG and {why}: use --decode cpu or auto", file=sys.stderr)
        return EXIT_USAGE
    return run_local(args)


def _no_cuda() -> str | None:
    """Why this machine's workers cannot decode on a CUDA GPU (None: they can); torch stays in gpu_worker."""
    try:
        from gpu_worker.decode.nvjpeg import cuda_problem
    except ImportError:
        return "torch is not installed, so CUDA is not available"
    return cuda_problem()


def cmd_model_export(args: argparse.Namespace) -> int:
    """A torchvision / timm / open_clip / Hugging Face model -> a Sluice model file + spec (local or s3://)."""
    try:  # torch and the model libraries: the `export` extra, imported only for this command
        from gpu_worker.export import ExportError, export
    except ImportError as exc:
        print(f"sluice: error: {exc}; install the export extra: pip install 'sluice[export]'", file=sys.stderr)
        return EXIT_FAIL
    try:
        result = export(
            args.spec, args.out, pretrained=not args.no_pretrained, fmt=args.format, image_size=args.image_size
        )
    except ExportError as exc:
        print(f"sluice: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except Exception as exc:
        if args.no_pretrained or not _download_failed(exc):
            raise
        print(
            f"sluice: error: {args.spec}: its pretrained weights could not be downloaded ({type(exc).__name__}: "
            f"{str(exc)[:200]}): export on a machine that reaches the internet (workers never download), or pass "
            "--no-pretrained for random weights of the same architecture (a test, not real embeddings)",
            file=sys.stderr,
        )
        return EXIT_FAIL
    spec = result.spec
    use = (
        f"set the manifest's model.uri to {result.uri}"
        if result.uri.startswith("s3://")
        else "copy both files to S3 and set the manifest's model.uri to the file's s3:// URI (docs/models.md)"
    )
    if "text" in spec.get("kinds", ()):  # a text artifact: for input.kind text (docs/kinds.md)
        print(
            f"{result.uri} (text, {spec['format']}): {spec['name']} {spec['version']}, {spec['context_length']} "
            f"tokens -> {spec['output_dim']}-d, tokenizer inside, max |exported - eager| {result.max_abs_diff:.2e}"
            f'\nspec: {result.uri}.json; {use}, with "input": {{..., "kind": "text"}}'
        )
        return EXIT_OK
    print(
        f"{result.uri} ({spec['format']}): {spec['name']} {spec['version']}, {spec['image_size']} px -> "
        f"{spec['output_dim']}-d, weights sha256 {spec['weights_sha256'][:16]}..., max |exported - eager| "
        f"{result.max_abs_diff:.2e}\nspec: {result.uri}.json; {use}"
    )
    if "precision" in spec:  # bf16 autocast on GPU, or fp32 when it changed the embeddings
        low = f"bf16 vs fp32: lowest cosine {spec['bf16_min_cosine']:.5f} on sample inputs"
        kept = "bf16 autocast on GPU" if spec["precision"] == "bf16" else "fp32 kept (bf16 is below 0.999)"
        print(f"precision: {kept}; {low}")
    if result.text is not None:  # a CLIP-style model: `sluice search --text` (docs/models.md, "Text tower")
        print(f"text tower: {result.uri}.text.pt, .text.json, .tokenizer.json ({result.text.output_dim}-d)")
    return EXIT_OK


def _version() -> str:
    """The installed package's version (the source tree's, when run from a checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sluice")
    except PackageNotFoundError:
        return "(not installed)"


def _download_failed(exc: BaseException) -> bool:
    """Whether an export failed downloading weights: urllib (torchvision) or huggingface_hub (timm, open_clip, hf)."""
    import socket
    import urllib.error

    names = {t.__name__ for t in type(exc).__mro__}
    offline = {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectError", "ConnectTimeout"}
    return isinstance(exc, urllib.error.URLError | ConnectionError | socket.gaierror | TimeoutError) or bool(
        names & offline
    )


def _int_from(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= low, with the limit in the error."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"{n} is too small: use {low} or more")
        return n

    return parse


def _fraction(text: str) -> float:
    """An argparse type: a number from 0 to 1."""
    try:
        f = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= f <= 1.0:
        raise argparse.ArgumentTypeError(f"{f} is outside 0..1 (0.05 means 5% of a shard's keys)")
    return f


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sluice", description="GPU batch inference on AWS Batch, driven by S3 manifests.")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    plan = sub.add_parser(
        "plan", help="dry run and preflight: keys, shards, job layout, every limit the run meets, cost (no AWS writes)"
    )
    plan.add_argument(
        "manifest", metavar="MANIFEST", help="a local file or s3:// URI (.json manifest or .txt/.csv/.jsonl key list)"
    )
    plan.add_argument(
        "--bucket", metavar="BUCKET", help="bucket for bare keys (SLUICE_DEFAULT_INPUT_BUCKET's role in the Lambda)"
    )
    plan.add_argument("--json", action="store_true", help="print one JSON object (checks, cost, layout)")
    plan.add_argument(
        "--assume-keys",
        type=_int_from(1),
        metavar="N",
        help="plan N unique keys with the manifest's layout, without reading the input (capacity planning)",
    )
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
    plan.set_defaults(func=cmd_plan)

    prep = sub.add_parser(
        "prepare", help="the prepare stage on this machine, no AWS: key list -> shards and plan.json (N workers)"
    )
    add_offline_arguments(prep)
    prep.set_defaults(func=cmd_prepare)

    shard = sub.add_parser("shard", help="pack or print shard files").add_subparsers(
        dest="shard_cmd", required=True, metavar="pack|cat"
    )
    pack = shard.add_parser("pack", help="key-list file -> shard file")
    pack.add_argument("keylist", metavar="KEYLIST", help="a key list: one key or s3:// URI a line")
    pack.add_argument("out", metavar="FILE", help="the shard file to write")
    pack.add_argument("--bucket", metavar="BUCKET", help="bucket for bare keys")
    pack.add_argument("--sort", action="store_true", help="sort keys within each bucket (smaller file)")
    pack.set_defaults(func=cmd_shard_pack)
    cat = shard.add_parser("cat", help="print a shard's keys")
    cat.add_argument("shard", metavar="SHARD", help="path or s3:// URI")
    cat.add_argument("--start", type=int, default=0, metavar="N", help="first key position to print (default 0)")
    cat.add_argument(
        "--stop", type=int, default=None, metavar="N", help="print keys before this position (default: to the end)"
    )
    cat.add_argument("--keys-only", action="store_true", help="print bare keys, not s3:// URIs")
    cat.set_defaults(func=cmd_shard_cat)

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

    status = sub.add_parser("status", help="a run's status and progress (reads the runs table)")
    status.add_argument("run_id", metavar="RUN_ID", help="the run (sluice submit printed it; sluice runs lists them)")
    status.add_argument("--watch", action="store_true", help="refresh until the run is final")
    status.add_argument("--interval", type=float, default=2.0, help=argparse.SUPPRESS)
    status.add_argument("--json", action="store_true", help="print the status as one JSON object")
    status.add_argument("--table", metavar="TABLE", help="runs table (default: SLUICE_RUNS_TABLE or sluice-runs)")
    status.set_defaults(func=cmd_status)
    runs = sub.add_parser("runs", help="recent runs, newest first")
    runs.add_argument("--limit", type=_int_from(1), default=20, metavar="N", help="at most N runs (default 20)")
    runs.add_argument("--json", action="store_true", help="print the runs as a JSON list")
    runs.add_argument("--table", metavar="TABLE", help="runs table (default: SLUICE_RUNS_TABLE or sluice-runs)")
    runs.set_defaults(func=cmd_runs)

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
    rec.add_argument("--table", metavar="TABLE", help="runs table (default: SLUICE_RUNS_TABLE or sluice-runs)")
    rec.set_defaults(func=cmd_reconcile)

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

    model = sub.add_parser("model", help="model artifacts for the worker").add_subparsers(
        dest="model_cmd", required=True, metavar="export"
    )
    mexp = model.add_parser(
        "export", help="torchvision / timm / open_clip / hf model -> TorchScript or .pt2 file + spec (docs/models.md)"
    )
    mexp.add_argument(
        "spec",
        metavar="SPEC",
        help="torchvision:NAME, timm:NAME, open_clip:MODEL/TAG or hf:REPO (e.g. timm:vit_small_patch16_224)",
    )
    mexp.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="file path or s3:// URI (*.pt2 for torch.export); ending in /: a folder",
    )
    mexp.add_argument(
        "--no-pretrained", action="store_true", help="random weights, same architecture (tests; needs no internet)"
    )
    mexp.add_argument("--format", choices=["torchscript", "pt2"], help="default: pt2 if --out ends in .pt2")
    mexp.add_argument("--image-size", type=_int_from(8), metavar="N", help="input side (default: the weights' own)")
    mexp.set_defaults(func=cmd_model_export)

    local = sub.add_parser("local", help="run Sluice on this machine against moto").add_subparsers(
        dest="local_cmd", required=True, metavar="run"
    )
    run = local.add_parser("run", help="the embedded default: a whole run on a local moto server")
    src = run.add_mutually_exclusive_group()
    src.add_argument("--demo", type=_int_from(1), metavar="N", help="generate N varied demo JPEGs (default 200)")
    src.add_argument("--images", metavar="DIR", help="upload the files in DIR (subfolders kept as key prefixes)")
    src.add_argument(
        "--texts", metavar="DIR", help="like --images, for a text run: .txt, .md, .rst files (docs/kinds.md)"
    )
    src.add_argument("--demo-texts", type=_int_from(1), metavar="N", help="generate N demo texts, some long")
    src.add_argument("--videos", metavar="DIR", help="like --images, for a video run: .mp4, .mov, .mkv, .webm files")
    src.add_argument("--demo-videos", type=_int_from(1), metavar="N", help="generate N short demo MP4s")
    run.add_argument(
        "--manifest",
        metavar="FILE",
        help="run this manifest; the other flags are applied on top of it (or refused). Without input it reads "
        "the --images/--demo upload",
    )
    run.add_argument(
        "--since-run",
        metavar="RUN_ID",
        help="an incremental run on an earlier run of the emulator (--endpoint-url): embed only what is new or "
        "changed in its input (--images DIR: uploaded over it), with its models (docs/incremental.md)",
    )
    run.add_argument("--mode", choices=["array", "multinode"], default=None, help="default: array")
    run.add_argument("--shards", type=_int_from(1), metavar="N", help="array children (default: min(4, cores))")
    run.add_argument("--nodes", type=_int_from(1), metavar="N", help="multi-node parallel nodes (default 2)")
    run.add_argument("--ranks", type=_int_from(1), default=1, metavar="N", help="CPU ranks per worker (default 1)")
    run.add_argument(
        "--slots", type=_int_from(0), default=0, metavar="N", help="workers running at once (default 0: cores)"
    )
    run.add_argument(
        "--max-failed-fraction",
        type=_fraction,
        metavar="F",
        help="a shard fails when more than this fraction of its keys fail for their data (default 0.05)",
    )
    run.add_argument(
        "--prepare-workers",
        type=_int_from(1),
        metavar="N",
        help="shard the input with the prepare job's N workers, whatever its size (default: SLUICE_PREPARE_OVER_KEYS "
        "decides)",
    )
    run.add_argument(
        "--image-size",
        type=_int_from(8),
        metavar="N",
        help="model input side (default 128; an exported model's spec gives its own)",
    )
    run.add_argument(
        "--model",
        action="append",
        metavar="[NAME=]URI",
        help="embed with this model (a `sluice model export` file, a local path or s3:// URI, or builtin:NAME); "
        "repeat for several models in one pass, NAME= naming each one's output (default builtin:reference-cnn)",
    )
    run.add_argument(
        "--out",
        metavar="DIR",
        default="sluice-output",
        help="write the run's Parquet output, failures and worker logs to DIR/<run id>/ (default ./sluice-output); "
        "nothing already in DIR is touched",
    )
    run.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    run.add_argument("--keep", action="store_true", help="leave the moto server running and print its endpoint")
    run.add_argument("--endpoint-url", metavar="URL", help="use this running AWS emulator (moto server, LocalStack)")
    run.add_argument("--no-prometheus", action="store_true", help="do not start a local Prometheus for metrics")
    run.add_argument(
        "--decode",
        choices=("auto", "cpu", "gpu"),
        help="job.decode: who decodes JPEGs (gpu: nvJPEG, refused without CUDA; docs/decode.md)",
    )
    run.add_argument("--pid-file", help=argparse.SUPPRESS)
    run.set_defaults(func=cmd_local_run)
    _add_index_commands(sub)
    return p


def _add_index_commands(sub: Any) -> None:
    """`sluice index build` and `sluice search` (sluice.ops.index_cli; docs/index.md)."""
    from sluice.ops.index_cli import add_index_parsers

    add_index_parsers(sub)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except Rejection as exc:
        print("manifest rejected:", file=sys.stderr)
        for r in exc.reasons:
            print(f"  - {r}", file=sys.stderr)
        return EXIT_FAIL
    except RetriableError as exc:  # what a Lambda retries; a command gives up at once and says so
        where = os.environ.get("AWS_ENDPOINT_URL")
        print(
            f"sluice: error: {str(exc).removesuffix('; will retry')} (not retried: check "
            + (f"that {where} is up" if where else "your network and the AWS region")
            + ", then run the command again)",
            file=sys.stderr,
        )
        return EXIT_FAIL
    except (ShardFormatError, SluiceError, FileNotFoundError, IsADirectoryError) as exc:
        print(f"sluice: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except (ClientError, BotoCoreError) as exc:
        print(f"sluice: AWS error: {exc} (check credentials, region and AWS_ENDPOINT_URL)", file=sys.stderr)
        return EXIT_FAIL
    except BrokenPipeError:  # the reader of stdout went away before the command finished
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except (OSError, RuntimeError) as exc:  # unreachable Prometheus, PromQL errors, ...
        print(f"sluice: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        print("sluice: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
