"""A model file, without torch: its local copy (s3:// downloaded once) and its spec.

The spec is the sidecar `<file>.json` or the embedded `sluice.json`; an s3:// model's sidecar
is downloaded with it when it exists, and any failure to read one other than "not found"
stops the worker (read_sidecar). The node fetches the file and each rank reads the input
size before anything imports torch, so the rank's loaders can size their buffers and start
fetching while the model loads. TorchScript and torch.export files are zip archives that
keep extra files under `<archive>/extra/`, so the embedded spec is one zip member away.
"""

from __future__ import annotations

import json
import os
import re
import time
import zipfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_worker.decode.preprocess import Preprocess, from_spec
from gpu_worker.errors import ConfigError, WorkerError
from sluice.aws.errors import AwsFailure, AwsFatalError, AwsRetriableError, Kind

if TYPE_CHECKING:
    from sluice.aws.store import ObjectStore

META_NAME = "sluice.json"
# A spec without mean/std normalises as ImageNet models do (torchvision's and timm's defaults).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Reads of a model's sidecar, each on top of the control client's own retries (gpu_worker.sources.clients:
# adaptive, 10 attempts), with SIDECAR_BACKOFF_S, twice that, ... between them.
SIDECAR_ATTEMPTS = 3
SIDECAR_BACKOFF_S = 1.0
# The worker uses the first six; the rest describe the artifact (docs/models.md) and are kept as read;
# a text artifact's (gpu_worker.kinds.textmodel) come last.
SPEC_KEYS = {
    "name",
    "image_size",
    "mean",
    "std",
    "output_dim",
    "precision",  # bf16 | fp32: whether bf16 autocast passed the export's check
    "bf16_min_cosine",
    "version",
    "source",
    "format",
    "weights_sha256",
    "exported_with",
    "kinds",
    "context_length",
    "pad_id",
    "inputs",
    "prefix_ids",
    "suffix_ids",
    "overlap_tokens",
    "pooling",
    "lengths",  # the padded lengths a traced text model takes (chunks are padded to their batch's longest)
    "lower_case",
    "normalize",
    "reference",  # what the export compared the file with (sentence-transformers' encode), and how close
    "preprocess",  # the library's image pipeline (gpu_worker.decode.preprocess); absent: the legacy one
    # an audio artifact's (gpu_worker.kinds.audiomodel): its rate, default window, input length, padding
    "sample_rate",
    "window_s",
    "input_samples",
    "pad",
    "min_samples",
    "features",
}


def embedded_spec(path: str) -> bytes | None:
    """The `sluice.json` extra file inside a TorchScript / torch.export archive, if any."""
    try:
        with zipfile.ZipFile(path) as zf:
            for name in zf.namelist():
                if name.endswith("/extra/" + META_NAME):
                    return zf.read(name)
    except (OSError, zipfile.BadZipFile):
        return None
    return None


def parse_spec(path: str, embedded: str | bytes | None) -> dict[str, Any]:
    """The spec of the model file at `path`: its sidecar if present, else `embedded`, else {}."""
    sidecar = Path(path + ".json")
    raw: str | bytes | None = sidecar.read_bytes() if sidecar.is_file() else (embedded or None)
    if not raw:
        return {}
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"model spec for {path} is not JSON: {exc}") from None
    if not isinstance(meta, dict) or set(meta) - SPEC_KEYS:
        raise ConfigError(f"model spec for {path}: expected an object with keys among {sorted(SPEC_KEYS)}")
    for k in ("mean", "std"):
        if k in meta and (not isinstance(meta[k], list) or len(meta[k]) != 3):
            raise ConfigError(f"model spec for {path}: {k} must be a list of 3 numbers")
    try:
        from_spec(meta.get("preprocess"), int(meta.get("image_size", 224)))
    except ValueError as exc:
        raise ConfigError(f"model spec for {path}: {exc}; export the model again (sluice model export)") from None
    why = torch_problem(meta)
    if why:
        raise ConfigError(f"model {path}: {why}")
    return meta


def release(version: str) -> tuple[int, ...]:
    """The release numbers of a version string: "2.14.1+cu130" -> (2, 14, 1); () when it has none."""
    m = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(p) for p in m.group().split(".")) if m else ()


def torch_problem(meta: dict[str, Any], running: str | None = None) -> str | None:
    """Why this worker's torch cannot be trusted with an artifact the spec says a newer torch exported (None: fine).

    A file saved by a newer torch may use operators or a format an older one lacks, and fail
    part way or load differently: refused up front, naming both versions.
    """
    exported = str((meta.get("exported_with") or {}).get("torch", ""))
    here = running if running is not None else _installed_torch()
    if not exported or not here or release(exported) <= release(here):
        return None
    return (
        f"exported with torch {exported}, but this worker runs torch {here}: run a worker image built "
        f"with torch {exported} or newer, or export the model again with torch {here}"
    )


def _installed_torch() -> str:
    """The installed torch's version, read without importing torch ("" when none is installed)."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""


def input_preprocess(uri: str, plan_size: int) -> Preprocess:
    """How images become the model's input: its spec's image_size (else the plan's) and `preprocess`."""
    if uri.startswith("builtin:"):
        return from_spec(None, plan_size)
    meta = parse_spec(uri, embedded_spec(uri))
    return from_spec(meta.get("preprocess"), int(meta.get("image_size", plan_size)))


def resolve_uri(uri: str, work_dir: str, store: ObjectStore) -> str:
    """A local path for the model: s3:// objects (and their .json sidecar, when there is one) are downloaded once."""
    if uri.startswith("builtin:") or not uri.startswith("s3://"):
        return uri
    name = uri.rsplit("/", 1)[-1] or "model"
    local = os.path.join(work_dir, "model", name)
    os.makedirs(os.path.dirname(local), exist_ok=True)
    try:
        data = store.get(uri)
    except Exception as exc:
        raise ConfigError(f"cannot download model {uri}: {exc}") from None
    with open(local, "wb") as fh:
        fh.write(data)
    sidecar = read_sidecar(store, uri + ".json")
    if sidecar is not None:
        with open(local + ".json", "wb") as fh:
            fh.write(sidecar)
    return local


def read_sidecar(store: ObjectStore, uri: str, *, sleep: Callable[[float], None] = time.sleep) -> bytes | None:
    """The sidecar spec at `uri` (s3://), or None when S3 says it does not exist.

    Only "does not exist" means no sidecar: any other failure would silently swap the model's
    preprocessing for the defaults. A transient error (throttling, 5xx) is retried, on top of
    the control client's own retries, then fails the attempt (WorkerError); anything else is a
    ConfigError saying what to check. S3 answers 403 rather than 404 for a missing key to a role
    that may not list the bucket, so a 403 is settled by listing that key: absent, no sidecar.
    """
    for attempt in range(SIDECAR_ATTEMPTS):
        try:
            return store.get(uri)
        except (AwsFatalError, AwsRetriableError) as exc:
            failure = exc.failure
            if not failure.retriable or attempt == SIDECAR_ATTEMPTS - 1:
                _no_sidecar(store, uri, failure)
                return None
            sleep(SIDECAR_BACKOFF_S * 2**attempt)
    raise AssertionError("unreachable")  # pragma: no cover


def _no_sidecar(store: ObjectStore, uri: str, failure: AwsFailure) -> None:
    """Return when `failure` means `uri` does not exist; raise what it means otherwise."""
    what = f"reading the model spec {uri}"
    if failure.kind is Kind.NOT_FOUND:
        return
    if failure.retriable:
        raise WorkerError(f"{failure.describe(what)}: still failing after {SIDECAR_ATTEMPTS} tries; run the job again")
    if failure.kind is Kind.DENIED:
        if _listed_absent(store, uri):
            return
        raise ConfigError(
            f"{failure.describe(what)}; S3 also answers 403 for a missing object to a role that may not list "
            "its bucket: upload the sidecar, or grant the job role s3:ListBucket on the model's prefix "
            "(template.yaml, WorkerRole)"
        )
    raise ConfigError(failure.describe(what))


def _listed_absent(store: ObjectStore, uri: str) -> bool:
    """True when a listing of `uri` shows it does not exist; False when it exists or the listing fails too."""
    try:
        return uri not in store.list(uri)
    except (AwsFatalError, AwsRetriableError):
        return False
