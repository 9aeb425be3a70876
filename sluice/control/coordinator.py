"""From an uploaded manifest to submitted AWS Batch jobs: the one core function the
manifest Lambda calls (and `sluice local` reuses)."""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from urllib.parse import unquote_plus

from botocore.exceptions import BotoCoreError, ClientError

from sluice import modelid
from sluice.aws.clients import Clients
from sluice.aws.errors import AwsFatalError, classify, translate
from sluice.aws.s3io import put_object
from sluice.contracts import ManifestRejected, RunFailed, UploadItem
from sluice.control import outbox, staging
from sluice.control.ledger import Ledger
from sluice.control.notify import EventPublisher
from sluice.errors import Rejection, SubmissionError, TooBigForLambda
from sluice.input.checks import check_manifest, guarded, reading_input
from sluice.input.inventory import CHECKSUM_SUFFIX
from sluice.input.keys import iter_keys
from sluice.input.manifest import parse_manifest, read_manifest_object
from sluice.log import logger
from sluice.models import Manifest, RunPlan
from sluice.paths import MANIFESTS_PREFIX, SCRATCH_TAG, RunPaths
from sluice.plan.layout import build_plan, layout
from sluice.plan.scan import scan, write_shards
from sluice.preflight import Capacity
from sluice.settings import Settings

LAMBDA_CAP_FACTOR = 4  # 20M keys at the default threshold: ~55 CPU-s and ~550 MiB measured, inside the limits


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


def handle_upload(
    bucket: str,
    key: str,
    *,
    version_id: str | None = None,
    etag: str = "",
    sequencer: str | None = None,
    settings: Settings | None = None,
    clients: Clients | None = None,
) -> Outcome:
    """Plan, shard and submit the run an upload under manifests/ asks for."""
    settings = settings or Settings.from_env()
    clients = clients or Clients()
    if not key.startswith(MANIFESTS_PREFIX):
        logger.info("ignoring object outside manifests/", extra={"bucket": bucket, "key": key})
        return Outcome("ignored")
    if key.lower().endswith(CHECKSUM_SUFFIX):
        # An S3 Inventory manifest.checksum copied next to its manifest.json: read with it, not a run.
        logger.info("ignoring an inventory checksum under manifests/", extra={"key": key})
        return Outcome("ignored")
    key = _existing_key(clients.s3, bucket, key)
    version = version_id if version_id and version_id != "null" else f"{etag}:{sequencer or ''}"
    run_id = run_id_for(bucket, key, version)
    manifest_uri = f"s3://{bucket}/{key}"
    ledger = Ledger(clients.dynamodb, settings.runs_table)
    events = EventPublisher(clients.events, settings.event_bus)
    logger.append_keys(run_id=run_id)
    upload = UploadItem(bucket=bucket, key=key, version_id=version_id, etag=etag, sequencer=sequencer)
    if not ledger.claim(run_id, manifest_uri, upload=upload):
        # A redelivery: publish what an earlier delivery decided but could not announce.
        announced = outbox.deliver(ledger, events, ledger.get(run_id))
        logger.info("duplicate delivery: run already claimed", extra={"manifest": manifest_uri, "announced": announced})
        return Outcome("duplicate", run_id)
    try:
        outcome = _decide_upload(run_id, bucket, key, manifest_uri, settings, clients, ledger)
    except BaseException as exc:
        # Transient or unexpected: free the claim so the retried invocation can take it.
        logger.exception("planning failed; releasing the claim for a retry")
        if not ledger.release(run_id, repr(exc)):
            logger.warning("claim not released: the run is past PLANNING; its redelivery finishes it")
        raise
    outbox.deliver(ledger, events, ledger.get(run_id))
    return outcome


def _decide_upload(
    run_id: str, bucket: str, key: str, manifest_uri: str, settings: Settings, clients: Clients, ledger: Ledger
) -> Outcome:
    """Plan and submit, or reject, or fail: the decision and its event go to the ledger together."""
    try:
        return _plan_and_submit(run_id, bucket, key, settings, clients, ledger)
    except Rejection as exc:
        logger.warning("manifest rejected", extra={"manifest": manifest_uri, "reasons": exc.reasons})
        ledger.mark_rejected(
            run_id, exc.reasons, ManifestRejected(run_id=run_id, manifest=manifest_uri, reasons=exc.reasons)
        )
        return Outcome("rejected", run_id, reasons=exc.reasons)
    except (SubmissionError, AwsFatalError) as exc:
        # A retry will not help: fail the run with what to check (a missing permission, bucket,
        # queue ...). The user fixes it and uploads the manifest again.
        stage: Literal["plan", "submit"] = "submit" if isinstance(exc, SubmissionError) else "plan"
        logger.error("run cannot start", extra={"reason": str(exc), "stage": stage})
        failed = RunFailed(run_id=run_id, reason=str(exc), shards_failed=[], failed_keys_uri=None, stage=stage)
        ledger.mark_failed(run_id, str(exc), failed)
        return Outcome("failed", run_id, reasons=[str(exc)])


def _existing_key(s3: Any, bucket: str, key: str) -> str:
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


def _plan_and_submit(
    run_id: str,
    bucket: str,
    key: str,
    settings: Settings,
    clients: Clients,
    ledger: Ledger,
) -> Outcome:
    started = time.perf_counter()
    control = settings.control_bucket or bucket
    with reading_input():
        src = read_manifest_object(clients.s3, bucket, key, settings)
        manifest = parse_manifest(src, settings)
        check_manifest(manifest, settings, control=control, s3=clients.s3)
        model_ids = [modelid.resolve(m.uri, clients.s3) for m in manifest.models]
        routed = staging.route(
            run_id, src.uri, manifest, control, settings, clients.s3, model_ids=model_ids, ledger=ledger
        )
    if routed is None:
        try:
            plan = _write_plan(run_id, src.uri, manifest, control, settings, clients.s3, model_ids)
        except TooBigForLambda as exc:  # the estimate was low (long lines sampled first): prepare after all
            with reading_input():
                routed = staging.route(
                    run_id,
                    src.uri,
                    manifest,
                    control,
                    settings,
                    clients.s3,
                    at_least=exc.keys_seen,
                    model_ids=model_ids,
                )
            if routed is None:
                raise
    if routed is not None:
        spec, input_bytes = routed
        prepared = staging.start(run_id, src.uri, manifest, spec, input_bytes, settings, clients, ledger)
        return Outcome("preparing", run_id, job_ids=prepared.job_ids, total_keys=spec.input_keys_estimate)
    plan_uri = RunPaths.in_bucket(plan.control_bucket, run_id).plan
    submitted = staging.submit_plan(run_id, src.uri, plan, plan_uri, manifest.job.queue, settings, clients, ledger)
    job_ids = submitted.job_ids
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
        job_ids=job_ids,
        plan_uri=plan_uri,
        total_keys=plan.total_keys,
        duplicates=plan.duplicates,
        shards=plan.n_shards,
    )


def _write_plan(
    run_id: str, manifest_uri: str, manifest: Manifest, control: str, settings: Settings, s3: Any, model_ids: list[str]
) -> RunPlan:
    """Pass 1 and 2 over the keys: shards under runs/<run>/shards/, then plan.json (written last)."""
    # Inline keys are bounded by the manifest's size; anything else stops at LAMBDA_CAP_FACTOR x
    # the routing threshold, so a low estimate cannot push the Lambda past its memory or time.
    cap = None if manifest.input.keys is not None else settings.prepare_over_keys * LAMBDA_CAP_FACTOR
    keys = guarded(iter_keys(manifest, s3, settings))
    with scan(keys, max_keys=settings.max_keys, spill_dir=settings.spill_dir, lambda_cap=cap) as sc:
        lay = layout(sc.unique_keys, manifest, settings.max_array_size)
        plan = build_plan(
            run_id=run_id,
            manifest=manifest,
            manifest_uri=manifest_uri,
            control_bucket=control,
            total_keys=sc.unique_keys,
            duplicates=sc.duplicates,
            lay=lay,
            images_per_gpu_s=Capacity.from_settings(settings).rate,
            model_ids=model_ids,
        )
        write_shards(sc, lay, lambda i, data: put_object(s3, plan.shard_uri(i), data, tagging=SCRATCH_TAG))
    put_object(
        s3, RunPaths.in_bucket(control, run_id).plan, plan.model_dump_json(indent=2).encode(), "application/json"
    )
    return plan
