"""A model file, without torch: its local copy (s3:// downloaded once) and its spec.

The spec is the sidecar `<file>.json` or the embedded `sluice.json`. The node fetches the
file and each rank reads the input size before anything imports torch, so the rank's
loaders can size their buffers and start fetching while the model loads. TorchScript and torch.export files are
zip archives that keep extra files under `<archive>/extra/`, so the embedded spec is one
zip member away.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

from gpu_worker.errors import ConfigError

META_NAME = "sluice.json"
# The worker uses the first five; the rest describe the artifact (docs/models.md) and are kept as read.
SPEC_KEYS = {
    "name",
    "image_size",
    "mean",
    "std",
    "output_dim",
    "version",
    "source",
    "format",
    "weights_sha256",
    "exported_with",
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
    return meta


def input_size(uri: str, plan_size: int) -> int:
    """The side the model's input must have: its spec's image_size, else the plan's."""
    if uri.startswith("builtin:"):
        return plan_size
    meta = parse_spec(uri, embedded_spec(uri))
    return int(meta.get("image_size", plan_size))


def resolve_uri(uri: str, work_dir: str, store: Any) -> str:
    """A local path for the model: s3:// objects (and their .json sidecar) are downloaded once."""
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
    try:
        sidecar = store.get(uri + ".json")
    except Exception:
        sidecar = None
    if sidecar is not None:
        with open(local + ".json", "wb") as fh:
            fh.write(sidecar)
    return local
