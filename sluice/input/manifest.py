"""Read the uploaded manifest object and parse it into a Manifest.

The upload is a run manifest (.json), a key list (.txt / .csv / .jsonl: a manifest with
default settings is implied) or an S3 Inventory manifest.json. Every problem becomes a
Rejection reason naming the field and why; the keys the manifest names are streamed by
sluice.input.keys.iter_keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from sluice.aws.s3uri import s3_uri
from sluice.contracts.manifest import Manifest
from sluice.contracts.sections import InputSpec
from sluice.errors import Rejection
from sluice.input import strictjson
from sluice.input.sources import KEYLIST_SUFFIXES, get_chunks, s3_error
from sluice.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


@dataclass(frozen=True)
class ManifestSource:
    """The uploaded object that started a run (`path`: a local file the CLI read instead)."""

    bucket: str
    key: str
    body: bytes
    path: str | None = None

    @property
    def uri(self) -> str:
        return s3_uri(self.bucket, self.key)

    @property
    def name(self) -> str:
        """How reasons name it: the local path, or the s3:// URI."""
        return self.path or self.uri


def _pydantic_reasons(exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors():
        loc = list(err["loc"])
        if loc[:1] == ["model"] and loc[1:2] in (["object"], ["list"]):
            del loc[1]  # the tag of Manifest.model's union (one model or a list), not a field
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or "manifest"
        where = where if len(where) <= 200 else where[:197] + "..."  # a field name may be any length
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see docs/manifest.md)"
        elif err["type"] in _TYPE_ERRORS:
            msg = f"{msg}, not {_shown(err.get('input'))}"
        out.append(f"{where}: {msg}")
    return out


# Strict types: a bool is no number and "10" is no integer; the reason shows what was written.
_TYPE_ERRORS = frozenset(
    {"int_type", "float_type", "string_type", "list_type", "model_type", "dict_type", "int_from_float", "bool_type"}
)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, list | dict):
        return "a list" if isinstance(value, list) else "an object"
    return repr(value)[:40]


def parse_manifest(src: ManifestSource, settings: Settings) -> Manifest:
    """Parse the uploaded object into a Manifest; a plain key list gets default settings."""
    lower = src.key.lower()
    if lower.endswith(KEYLIST_SUFFIXES):
        return _implied(src, settings, key_list=src.uri, bucket=settings.default_input_bucket)
    if len(src.body) > settings.max_manifest_bytes:
        raise Rejection(
            f"{src.name}: manifest is {len(src.body)} bytes, over the {settings.max_manifest_bytes}-byte "
            "limit (SLUICE_MAX_MANIFEST_BYTES): put the keys in a key-list object and name it in input.key_list"
        )
    if not lower.endswith(".json"):
        raise Rejection(
            f"{src.name}: unsupported manifest type; upload a .json run manifest or a "
            ".txt/.csv/.jsonl key list under manifests/"
        )
    doc = strictjson.loads(src.body, src.name)
    if isinstance(doc, dict) and "sourceBucket" in doc and "files" in doc:
        # An S3 Inventory manifest.json dropped as is: run over its listing.
        return _implied(src, settings, inventory=src.uri)
    if not isinstance(doc, dict):
        raise Rejection(f"{src.name}: a manifest is a JSON object, not {type(doc).__name__}")
    try:
        return Manifest.model_validate(_default_model(doc, settings))
    except ValidationError as exc:
        raise Rejection(_pydantic_reasons(exc)) from exc


def _default_model(doc: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """A manifest that names no model gets the stack's SLUICE_DEFAULT_MODEL_URI (when set), as if written."""
    uri = settings.default_model_uri
    model = doc.get("model")
    if uri is None or (model is not None and not (isinstance(model, dict) and "uri" not in model)):
        return doc
    return {**doc, "model": {**(model or {}), "uri": uri}}


def _implied(src: ManifestSource, settings: Settings, **spec: Any) -> Manifest:
    """The manifest an upload that is not one implies (a key list, an inventory's manifest.json)."""
    model = {"model": {"uri": settings.default_model_uri}} if settings.default_model_uri else {}
    try:
        return Manifest.model_validate({"version": 1, "input": InputSpec(**spec), **model})
    except ValidationError as exc:  # the object's own name (a control character), SLUICE_DEFAULT_INPUT_BUCKET
        raise Rejection([f"{src.name}: {r}" for r in _pydantic_reasons(exc)]) from exc


def read_manifest_object(s3: S3Client, bucket: str, key: str, settings: Settings) -> ManifestSource:
    """Fetch the uploaded manifest (bounded by the size limits before reading the body)."""
    what = s3_uri(bucket, key)
    if key.lower().endswith(KEYLIST_SUFFIXES):
        # Key lists are streamed later (by the Lambda up to SLUICE_MAX_KEYLIST_BYTES, else by the
        # prepare job); here only their existence matters.
        try:
            s3.head_object(Bucket=bucket, Key=key)
        except (ClientError, BotoCoreError) as exc:
            raise s3_error(exc, what) from exc
        return ManifestSource(bucket, key, b"")
    chunks = get_chunks(s3, bucket, key, settings.max_manifest_bytes, "SLUICE_MAX_MANIFEST_BYTES")
    return ManifestSource(bucket, key, b"".join(chunks))
