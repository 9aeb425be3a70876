"""The manifest Lambda's core: an uploaded manifest -> a claimed run -> submitted jobs (or the prepare stage).

claim (the run id is a function of the upload, so redeliveries share it; sluice.control.table.ledger)
-> read, parse and check the manifest, resolve its models once (a RunRequest) -> route
(sluice.control.intake.route: planned here, or by the prepare stage) -> submit (sluice.control.submit) or
start the prepare stage (sluice.control.intake.prepared) -> publish the decision's event
(sluice.control.outbox). A bad manifest is rejected and a run that cannot start failed, each with
its event; a transient error frees the claim and raises, so the retried invocation takes it.
`sluice local` calls the same handler.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote_plus

from botocore.exceptions import BotoCoreError, ClientError

from sluice import modelid
from sluice.aws.clients import Clients
from sluice.aws.errors import AwsFatalError, classify, translate
from sluice.aws.s3uri import s3_uri
from sluice.contracts.events import ManifestRejected, RunFailed
from sluice.control import outbox, submit
from sluice.control.context import Context, RunRequest
from sluice.control.intake import prepared, route
from sluice.control.table.items import UploadItem
from sluice.errors import Rejection, SubmissionError
from sluice.input.checks import check_manifest, reading_input
from sluice.input.inventory import CHECKSUM_SUFFIX
from sluice.input.manifest import parse_manifest, read_manifest_object
from sluice.log import logger
from sluice.paths import MANIFESTS_PREFIX
from sluice.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


@dataclass
class Outcome:
    """What handling one upload did."""

    status: str  # submitted | preparing | rejected | duplicate | ignored | failed
    run_id: str | None = None
    reasons: list[str] = field(default_factory=list)
    job_ids: list[str] = field(default_factory=list)
    plan_uri: str | None = None
    total_keys: int = 0
    duplicates: int = 0
    shards: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_id_for(bucket: str, key: str, version: str) -> str:
    """Deterministic run id: the manifest's name plus 64 bits of sha256(bucket, key, version).

    `version` is the S3 version id, or ETag + event sequencer on an unversioned bucket, so
    redeliveries of one upload share an id and a new upload of the same key gets a new one.
    """
    stem = key.rsplit("/", 1)[-1].rsplit(".", 1)[0].lower()
    stem = re.sub(r"[^a-z0-9]+", "-", stem).strip("-")[:32] or "run"
    digest = hashlib.sha256(f"{bucket}\0{key}\0{version}".encode()).hexdigest()[:16]
    return f"{stem}-{digest}"


def handle_upload(upload: UploadItem, *, settings: Settings | None = None, clients: Clients | None = None) -> Outcome:
    """Plan, shard and submit the run an upload under manifests/ asks for: claim -> route -> submit or
    prepare -> publish.

    `settings` and `clients` default to the environment's and lazy ones (injected by tests and
    `sluice local`).
    """
    ctx = Context.build(settings, clients)
    bucket, key = upload.bucket, upload.key
    if not key.startswith(MANIFESTS_PREFIX):
        logger.info("ignoring object outside manifests/", extra={"bucket": bucket, "key": key})
        return Outcome("ignored")
    if key.lower().endswith(CHECKSUM_SUFFIX):
        # An S3 Inventory manifest.checksum copied next to its manifest.json: read with it, not a run.
        logger.info("ignoring an inventory checksum under manifests/", extra={"key": key})
        return Outcome("ignored")
    upload = upload.model_copy(update={"key": _existing_key(ctx.clients.s3, bucket, key)})
    vid = upload.version_id
    run_id = run_id_for(bucket, upload.key, vid if vid and vid != "null" else f"{upload.etag}:{upload.sequencer or ''}")
    manifest_uri = s3_uri(bucket, upload.key)
    logger.append_keys(run_id=run_id)
    claimed = ctx.ledger.claim(run_id, manifest_uri, upload=upload)
    outcome = _claimed(ctx, upload, run_id, manifest_uri) if claimed else Outcome("duplicate", run_id)
    # The one publish step: the decision's event, or, on a redelivery, what an earlier delivery
    # decided but could not announce.
    announced = outbox.deliver(ctx, run_id)
    if not claimed:
        logger.info("duplicate delivery: run already claimed", extra={"manifest": manifest_uri, "announced": announced})
    return outcome


def _claimed(ctx: Context, upload: UploadItem, run_id: str, manifest_uri: str) -> Outcome:
    """The claimed run decided; a transient or unexpected error frees the claim for the retried invocation."""
    try:
        return _decide(ctx, upload, run_id, manifest_uri)
    except BaseException as exc:
        logger.exception("planning failed; releasing the claim for a retry")
        if not ctx.ledger.release(run_id, repr(exc)):
            logger.warning("claim not released: the run is past PLANNING; its redelivery finishes it")
        raise


def _decide(ctx: Context, upload: UploadItem, run_id: str, manifest_uri: str) -> Outcome:
    """Plan and submit, or reject, or fail: the decision and its event go to the ledger together."""
    try:
        return _start(ctx, upload, run_id)
    except Rejection as exc:
        logger.warning("manifest rejected", extra={"manifest": manifest_uri, "reasons": exc.reasons})
        ctx.ledger.mark_rejected(
            run_id, exc.reasons, ManifestRejected(run_id=run_id, manifest=manifest_uri, reasons=exc.reasons)
        )
        return Outcome("rejected", run_id, reasons=exc.reasons)
    except submit.Superseded:
        # A redrive (or the original invocation) recorded the submission first: nothing left to do.
        logger.info("another invocation submitted the run first", extra={"manifest": manifest_uri})
        return Outcome("duplicate", run_id)
    except (SubmissionError, AwsFatalError) as exc:
        # A retry will not help: fail the run with what to check (a missing permission, bucket,
        # queue ...). The user fixes it and uploads the manifest again.
        stage: Literal["plan", "submit"] = "submit" if isinstance(exc, SubmissionError) else "plan"
        logger.error("run cannot start", extra={"reason": str(exc), "stage": stage})
        failed = RunFailed(run_id=run_id, reason=str(exc), shards_failed=[], failed_keys_uri=None, stage=stage)
        ctx.ledger.mark_failed(run_id, str(exc), failed)
        return Outcome("failed", run_id, reasons=[str(exc)])


def _existing_key(s3: S3Client, bucket: str, key: str) -> str:
    """The key as stored: S3 event keys may arrive URL-encoded (space as '+')."""
    decoded = unquote_plus(key)
    if decoded == key:
        return key
    try:
        s3.head_object(Bucket=bucket, Key=key)
        return key
    except (ClientError, BotoCoreError) as exc:
        if classify(exc).retriable:  # a 503 must not make us read the other key and reject the run
            raise translate(exc, f"HEAD s3://{bucket}/{key}") from exc
        return decoded


def _request(ctx: Context, upload: UploadItem, run_id: str) -> RunRequest:
    """The upload read, parsed and checked, its models' ids (artifact and preprocessing) resolved once: the request."""
    settings, s3 = ctx.settings, ctx.clients.s3
    control = settings.control_bucket or upload.bucket
    with reading_input():
        src = read_manifest_object(s3, upload.bucket, upload.key, settings)
        manifest = parse_manifest(src, settings)
        check_manifest(manifest, settings, control=control, s3=s3)
        model_ids = [modelid.identity(m, manifest.input.content, s3) for m in manifest.models]
    return RunRequest.of(run_id, src.uri, manifest, control, model_ids)


def _start(ctx: Context, upload: UploadItem, run_id: str) -> Outcome:
    """Route the run, then plan in the Lambda and submit, or start the prepare stage."""
    started = time.perf_counter()
    req = _request(ctx, upload, run_id)
    routed = route.route(ctx, req)
    if isinstance(routed, route.ToPrepare):
        begun = prepared.start(ctx, req, routed)
        return Outcome("preparing", run_id, job_ids=begun.job_ids, total_keys=routed.spec.input_keys_estimate)
    submitted = submit.submit(ctx, req, routed)
    logger.info(
        "run submitted",
        extra={
            **submitted.model_dump(include={"total_keys", "duplicates", "shards", "job_ids"}),
            "seconds": round(time.perf_counter() - started, 3),
        },
    )
    return Outcome(
        "submitted",
        run_id,
        job_ids=submitted.job_ids,
        plan_uri=req.paths.plan,
        total_keys=routed.total_keys,
        duplicates=routed.duplicates,
        shards=routed.n_shards,
    )
