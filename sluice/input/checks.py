"""The checks of a parsed manifest that need the settings or S3, and the one way reading input fails.

`check_manifest` runs before anything is planned (in the manifest Lambda, in `sluice plan` /
`sluice submit`, and in `sluice local run` before any server starts): output prefix, job queue,
model URI (a HEAD), the kinds its spec names and its text window, inventory checksum. A manifest
that would only fail later on Batch is rejected here, with every reason at once.

`reading_input` / `guarded` classify each exception raised while reading input, once: a
rejection stays one; a transient AWS error (sluice.aws.errors) is re-raised as RetriableError so
the event is retried; any other AWS error is a rejection saying what to check; anything
unforeseen is the generic rejection "unexpected error while reading the input: <type>:
<message>", logged with its traceback, so bad input never becomes a retry loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from sluice.aws.errors import AwsFatalError, Kind, classify
from sluice.aws.s3uri import parse_s3_uri
from sluice.contracts.manifest import Manifest
from sluice.contracts.sections import file_kinds, text_room
from sluice.errors import Rejection, RetriableError, TooBigForLambda
from sluice.log import logger
from sluice.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

T = TypeVar("T")
# Raised on purpose while reading input; each already means what it says.
_DECIDED = (Rejection, RetriableError, TooBigForLambda, AwsFatalError)


def input_error(exc: BaseException) -> BaseException:
    """What an exception raised while reading input becomes (sluice.aws.errors's classification for AWS errors)."""
    if isinstance(exc, _DECIDED):
        return exc
    if isinstance(exc, ClientError | BotoCoreError):
        failure = classify(exc)
        if failure.retriable:
            return RetriableError(f"{failure.describe('reading the input')}; will retry")
        return Rejection(f"cannot read the input: {failure.describe('S3')}")
    if isinstance(exc, MemoryError):
        return Rejection("the input needs more memory than the function has: split it into several manifests")
    logger.exception("unexpected error while reading the input")
    return Rejection(f"unexpected error while reading the input: {type(exc).__name__}: {str(exc)[:300]}")


@contextlib.contextmanager
def reading_input() -> Iterator[None]:
    """Around code that reads the manifest or its input: exceptions leave as input_error has them."""
    try:
        yield
    except Exception as exc:
        mapped = input_error(exc)
        if mapped is exc:
            raise
        raise mapped from exc


def guarded(items: Iterable[T]) -> Iterator[T]:
    """`items`, with what reading them raises classified (what the consumer raises passes untouched)."""
    with reading_input():
        yield from items


def _queue_name(queue: str) -> str:
    """A job queue's name from its name or ARN (arn:aws:batch:<region>:<account>:job-queue/<name>)."""
    return queue.rsplit("/", 1)[-1] if queue.startswith("arn:") else queue


def _queue_problem(manifest: Manifest, settings: Settings) -> str | None:
    queue = manifest.job.queue
    if queue is None:
        return None
    mnp, gpu = _queue_name(settings.mnp_job_queue), _queue_name(settings.job_queue)
    allowed = [mnp] if manifest.job.mode == "multinode" else [gpu, mnp]
    if _queue_name(queue) in allowed:
        return None
    why = "multi-node jobs run only on the On-Demand MNP queue" if manifest.job.mode == "multinode" else ""
    return (
        f"job.queue: {queue[:100]!r} is not one of Sluice's job queues ({', '.join(allowed)}); "
        + (why or "the completion function hears only its own queues' events, so the run would never end")
        + ": leave job.queue out for the default"
    )


def _output_problem(manifest: Manifest, settings: Settings, control: str | None) -> str | None:
    prefix = manifest.output.prefix
    if prefix is None:
        return None
    bucket, _ = parse_s3_uri(prefix, allow_empty_key=True)  # the model validated it
    allowed = ([control] if control else []) + list(settings.allowed_output_buckets)
    if control is None and not settings.allowed_output_buckets:
        return None  # a local `sluice plan` that does not know the control bucket
    if bucket in allowed:
        return None
    return (
        f"output.prefix: bucket {bucket!r} is not the control bucket or an allowed output bucket "
        f"({', '.join(allowed)}; SLUICE_ALLOWED_OUTPUT_BUCKETS): the workers may write only there; leave "
        "output.prefix out for runs/<run>/output/ in the control bucket"
    )


def _model_problem(uri: str, field: str, settings: Settings, s3: S3Client | None) -> str | None:
    if uri.startswith("builtin:"):
        return None  # the model validated the name
    if not uri.startswith("s3://"):
        if settings.local_mode:
            return None
        return (
            f"{field}: {uri[:100]!r} is a local path, which Batch workers cannot read: upload the model and give "
            "its s3:// URI (local paths work only in local mode, SLUICE_LOCAL_MODE=1)"
        )
    if s3 is None:
        return None
    bucket, key = parse_s3_uri(uri)
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except (ClientError, BotoCoreError, OSError) as exc:
        failure = classify(exc)
        if failure.retriable:
            raise RetriableError(f"{failure.describe(f'HEAD {uri}')}; will retry") from exc
        if failure.kind is Kind.NOT_FOUND:
            return f"{field}: {uri} does not exist: upload the model first"
        if failure.kind is Kind.DENIED:
            # S3 answers 403 for a missing object too when the role may not read it: this role's
            # rights are not the workers', so only "does not exist" is a verdict.
            logger.warning("model not checked: access denied", extra={"model": uri})
            return None
        return f"{field}: {failure.describe(uri)}"
    return None


def _spec_of(uri: str, s3: S3Client | None) -> dict[str, object] | None:
    """A model file's sidecar spec, or None when there is none or it cannot be read now (the worker checks)."""
    from sluice.modelid import read_sidecar

    try:
        return read_sidecar(uri, s3)
    except RetriableError:
        return None  # not one to read here: the worker checks the file's own spec


def _spec_problems(manifest: Manifest, i: int, s3: S3Client | None) -> list[str]:
    """A model file whose spec names kinds without the input's, or a text window under input.chunk_tokens.

    Builtins: Manifest checks their kinds, and the builtin text model takes any window the manifest allows.
    """
    m, kind = manifest.models[i], manifest.input.kind
    if m.uri.startswith("builtin:"):
        return []
    spec = _spec_of(m.uri, s3)
    if spec is None:
        return []
    where = "model.uri" if len(manifest.models) == 1 else f"model[{i}].uri"
    kinds = file_kinds(spec)
    if kind not in kinds:
        return [
            f"{where}: {m.uri} embeds {' or '.join(kinds)} (its spec), but input.kind is {kind!r}: "
            f"pick a model for {kind}"
        ]
    room, chunk = text_room(spec), manifest.input.chunk_tokens
    if kind == "text" and room is not None and chunk is not None and chunk > room:
        return [
            f"input.chunk_tokens: {chunk} is over the {room} tokens the context of {where} {m.uri} holds "
            f"(its spec): give input.chunk_tokens at most {room}, or leave it out for the model's own window"
        ]
    return []


def _unnamed_model_problems(manifest: Manifest, settings: Settings) -> list[str]:
    """A deployed run embeds with the model it names: no silent stand-in (local mode keeps it, warned about)."""
    if settings.local_mode:
        return []
    stand_in = "builtin:reference-text" if manifest.input.kind == "text" else "builtin:reference-cnn"
    return [
        f"{field}: no model given, and a deployed run does not embed with the builtin stand-in (untrained "
        "weights): export a real model (sluice model export hf:NAME --out s3://BUCKET/models/NAME.pt, "
        f"docs/models.md) and set {field} to its s3:// URI (or the stack's SLUICE_DEFAULT_MODEL_URI, for key "
        f"lists); to test the pipeline, name the stand-in ({field}: {stand_in})"
        for field in manifest.unnamed_models
    ]


def check_manifest(manifest: Manifest, settings: Settings, *, control: str | None, s3: S3Client | None = None) -> None:
    """Reject what the manifest dooms to fail: every reason at once. `s3`: None skips the S3 checks."""
    reasons = [
        r
        for r in (
            *_unnamed_model_problems(manifest, settings),
            _queue_problem(manifest, settings),
            _output_problem(manifest, settings, control),
            *(
                _model_problem(m.uri, "model.uri" if len(manifest.models) == 1 else f"model[{i}].uri", settings, s3)
                for i, m in enumerate(manifest.models)
            ),
            *(r for i in range(len(manifest.models)) for r in _spec_problems(manifest, i, s3)),
        )
        if r
    ]
    if reasons:
        raise Rejection(reasons)
    if manifest.input.inventory is not None and s3 is not None:
        from sluice.input.inventory import read_report  # checksum, format and schema before any routing

        read_report(s3, manifest.input.inventory, settings)
