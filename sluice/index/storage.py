"""Where the index reads and writes: local paths and s3:// URIs, for Lance and for pyarrow alike.

Lance talks to S3 through its own object-store client, not boto3, so the endpoint and
credentials boto3 takes from the environment (AWS_ENDPOINT_URL for moto or LocalStack,
AWS_ACCESS_KEY_ID, ...) are handed to it as storage options. On AWS Batch none of them is
set and both clients use the job role's credentials. Listing and reading the run's Parquet
chunks and commit markers goes through pyarrow's filesystem, configured the same way.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from sluice.aws.s3uri import parse_s3_uri


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def _endpoint(env: Mapping[str, str]) -> str | None:
    return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None


def _region(env: Mapping[str, str]) -> str | None:
    return env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None


def storage_options(uri: str, env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """Lance's storage options for `uri` (object_store's keys), from the environment; None for a local path."""
    if not is_s3(uri):
        return None
    env = os.environ if env is None else env
    opts: dict[str, str] = {}
    endpoint = _endpoint(env)
    if endpoint:
        opts["aws_endpoint"] = endpoint
        opts["allow_http"] = str(endpoint.startswith("http://")).lower()
    region = _region(env)
    if region:
        opts["aws_region"] = region
    for var, key in (
        ("AWS_ACCESS_KEY_ID", "aws_access_key_id"),
        ("AWS_SECRET_ACCESS_KEY", "aws_secret_access_key"),
        ("AWS_SESSION_TOKEN", "aws_session_token"),
    ):
        if env.get(var):
            opts[key] = env[var]
    return opts


@dataclass(frozen=True)
class Entry:
    uri: str
    size: int


class Files:
    """List and read local paths and s3:// URIs through pyarrow.fs (thread-safe)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._env = dict(os.environ if env is None else env)

    @cached_property
    def _s3(self) -> Any:
        from pyarrow import fs

        endpoint = _endpoint(self._env)
        # Generous timeouts and retries: the AWS SDK's defaults (1 s to connect, 3 s a request) fail a
        # whole index build on one slow answer (a busy emulator, a throttled prefix).
        kwargs: dict[str, Any] = {
            "region": _region(self._env) or "us-east-1",
            "connect_timeout": 10,
            "request_timeout": 60,
            "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=8),
        }
        if endpoint:
            scheme, _, host = endpoint.partition("://")
            kwargs |= {"endpoint_override": host.rstrip("/"), "scheme": scheme}
        if self._env.get("AWS_ACCESS_KEY_ID"):
            kwargs |= {
                "access_key": self._env["AWS_ACCESS_KEY_ID"],
                "secret_key": self._env.get("AWS_SECRET_ACCESS_KEY", ""),
                "session_token": self._env.get("AWS_SESSION_TOKEN") or None,
            }
        return fs.S3FileSystem(**kwargs)

    def _fs(self, uri: str) -> tuple[Any, str]:
        """(filesystem, its path for uri)."""
        if is_s3(uri):
            bucket, key = parse_s3_uri(uri, allow_empty_key=True)
            return self._s3, f"{bucket}/{key}".rstrip("/")
        from pyarrow import fs

        return fs.LocalFileSystem(), os.path.abspath(uri)

    def _uri(self, like: str, path: str) -> str:
        return "s3://" + path if is_s3(like) else path

    def walk(self, prefix: str) -> Iterator[Entry]:
        """Every file under `prefix` (recursive); nothing when it does not exist."""
        from pyarrow import fs

        filesystem, path = self._fs(prefix)
        selector = fs.FileSelector(path, recursive=True, allow_not_found=True)
        for info in filesystem.get_file_info(selector):
            if info.type == fs.FileType.File:
                yield Entry(self._uri(prefix, info.path), int(info.size or 0))

    def children(self, prefix: str) -> list[str]:
        """The names of the files and folders directly under `prefix`."""
        from pyarrow import fs

        filesystem, path = self._fs(prefix)
        selector = fs.FileSelector(path, recursive=False, allow_not_found=True)
        return sorted(info.base_name for info in filesystem.get_file_info(selector))

    def read(self, uri: str) -> bytes:
        filesystem, path = self._fs(uri)
        with filesystem.open_input_stream(path) as fh:
            return bytes(fh.read())

    def exists(self, uri: str) -> bool:
        from pyarrow import fs

        filesystem, path = self._fs(uri)
        return bool(filesystem.get_file_info(path).type != fs.FileType.NotFound)

    def is_dir(self, uri: str) -> bool:
        from pyarrow import fs

        filesystem, path = self._fs(uri)
        return bool(filesystem.get_file_info(path).type == fs.FileType.Directory)

    def write(self, uri: str, data: bytes) -> None:
        """Put `data` at `uri` (a local file's folders are created)."""
        filesystem, path = self._fs(uri)
        if not is_s3(uri):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        with filesystem.open_output_stream(path) as fh:
            fh.write(data)

    def remove_tree(self, prefix: str) -> None:
        """Delete everything under `prefix` (nothing there: nothing to do)."""
        if not is_s3(prefix):
            import shutil

            shutil.rmtree(prefix, ignore_errors=True)
            return
        for entry in list(self.walk(prefix)):
            filesystem, path = self._fs(entry.uri)
            filesystem.delete_file(path)

    def open(self, uri: str) -> Any:
        """A seekable file for pyarrow.parquet (reads the footer first, then the row groups)."""
        filesystem, path = self._fs(uri)
        return filesystem.open_input_file(path)
